"""Inclusive cumulative product along the last axis of values near 1, one program per row (a scan)."""
import torch

from cumprod import cumprod as entry  # noqa: F401

family = "scan"


def inputs(m, n, dtype=torch.float32):
    # 1 + 0.01 * randn: products of up to a few thousand terms stay within a factor of ~10 of 1
    return (1 + 0.01 * torch.randn(m, n, dtype=dtype),)


def reference(x):
    return torch.cumprod(x, dim=-1)


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=65536, n=256), dict(m=32768, n=512), dict(m=16384, n=1024), dict(m=4096, n=4096),
         dict(m=16384, n=1000), dict(m=32768, n=1024, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=129, n=1000), dict(m=5, n=33, dtype=torch.float16)]
heldout_ranges = {"m": (3, 129), "n": (7, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
