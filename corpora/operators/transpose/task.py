"""Out-of-place 2-D transpose: layout change, memory-bound, exact."""
import torch

from transpose import transpose as entry  # noqa: F401

family = "transpose/layout"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    return x.t().contiguous()


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=2048, n=2048), dict(m=4096, n=4096), dict(m=8192, n=2048), dict(m=1024, n=16384),
         dict(m=8192, n=8192, dtype=torch.float16)]
heldout = [dict(m=1, n=1), dict(m=33, n=65), dict(m=1000, n=3, dtype=torch.float16)]
heldout_ranges = {"m": (1, 1000), "n": (1, 65)}  # drawn per run (harness/task.py): the span the held-out cases cover
