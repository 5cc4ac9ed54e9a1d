"""1-D average pooling over the last axis, window and stride 4 (pooling)."""
import torch

from avg_pool1d import avg_pool1d as entry  # noqa: F401

family = "pooling"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    return torch.nn.functional.avg_pool1d(x.unsqueeze(1), 4).squeeze(1)


def bytes(m, n, dtype=torch.float32):
    return (m * n + m * (n // 4)) * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=1024, n=4096), dict(m=4096, n=4096), dict(m=512, n=65536), dict(m=8192, n=8192),
         dict(m=4096, n=8192, dtype=torch.float16)]
heldout = [dict(m=1, n=4), dict(m=7, n=1003)]
heldout_ranges = {"m": (1, 7), "n": (4, 1003)}  # drawn per run (harness/task.py): the span the held-out cases cover
