"""RMS norm over the last axis with a weight, one program per row."""
import torch

from rms_norm import rms_norm as entry  # noqa: F401

family = "normalization"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype), torch.randn(n, dtype=dtype))


def reference(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def bytes(m, n, dtype=torch.float32):
    return (2 * m * n + n) * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=4096, n=1024), dict(m=8192, n=2048), dict(m=2048, n=4096), dict(m=1024, n=8192),
         dict(m=8192, n=4096, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=129, n=1000), dict(m=64, n=3000, dtype=torch.float16)]
heldout_ranges = {"m": (3, 129), "n": (7, 3000)}  # drawn per run (harness/task.py): the span the held-out cases cover
