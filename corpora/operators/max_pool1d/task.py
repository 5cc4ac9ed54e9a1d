"""1-D max pooling over the last axis of (N, C, L), window and stride 4 (pooling), exact."""
import torch

from max_pool1d import max_pool1d as entry  # noqa: F401

family = "pooling"


def inputs(n, c, length, dtype=torch.float32):
    return (torch.randn(n, c, length, dtype=dtype),)


def reference(x):
    return torch.nn.functional.max_pool1d(x, 4)


def bytes(n, c, length, dtype=torch.float32):
    return (n * c * length + n * c * (length // 4)) * torch.empty((), dtype=dtype).element_size()


# The maximum is one of the inputs: exact in every dtype.
tolerances = {"atol": 0.0, "rtol": 0.0}
cases = [dict(n=32, c=256, length=4096), dict(n=16, c=64, length=65536), dict(n=128, c=512, length=512),
         dict(n=64, c=128, length=4099), dict(n=8, c=1024, length=8192),
         dict(n=32, c=256, length=8192, dtype=torch.float16)]
heldout = [dict(n=1, c=1, length=4), dict(n=3, c=5, length=1003), dict(n=2, c=3, length=77, dtype=torch.bfloat16)]
heldout_ranges = {"n": (1, 3), "c": (1, 5), "length": (4, 1003)}  # drawn per run (harness/task.py): the span the held-out cases cover
