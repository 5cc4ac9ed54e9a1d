"""Maximum over the last axis, one program per row (a reduction), exact."""
import torch

from row_max import row_max as entry  # noqa: F401

family = "reduction"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    return x.amax(dim=-1)


def bytes(m, n, dtype=torch.float32):
    return (m * n + m) * torch.empty((), dtype=dtype).element_size()


# The maximum is one of the inputs: exact in every dtype.
tolerances = {"atol": 0.0, "rtol": 0.0}
cases = [dict(m=8192, n=4096), dict(m=1024, n=65536), dict(m=65536, n=1024), dict(m=16384, n=8192),
         dict(m=10000, n=5000), dict(m=8192, n=8192, dtype=torch.float16)]
heldout = [dict(m=3, n=1), dict(m=5, n=33), dict(m=77, n=5000), dict(m=9, n=1500, dtype=torch.bfloat16)]
heldout_ranges = {"m": (3, 77), "n": (1, 5000)}  # drawn per run (harness/task.py): the span the held-out cases cover
