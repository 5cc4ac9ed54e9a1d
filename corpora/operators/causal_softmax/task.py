"""Causally masked row softmax of (m, n) attention scores: row i keeps columns j <= i % n, the rest are 0.

The m rows are stacked (batch * heads) blocks of n query rows against n keys, so row i is query
position i % n; column 0 is always visible, so no row is fully masked.
"""
import torch

from causal_softmax import causal_softmax as entry  # noqa: F401

family = "softmax"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    m, n = x.shape
    masked = torch.arange(n, device=x.device)[None, :] > (torch.arange(m, device=x.device) % n)[:, None]
    return torch.softmax(x.masked_fill(masked, float("-inf")), dim=-1)


def bytes(m, n, dtype=torch.float32):
    # the visible entries must be read (sum over rows of i % n + 1), every entry written
    full, rest = divmod(m, n)
    visible = full * n * (n + 1) // 2 + rest * (rest + 1) // 2
    return (visible + m * n) * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=32 * 1024, n=1024), dict(m=16 * 2048, n=2048), dict(m=8 * 4096, n=4096), dict(m=64 * 512, n=512),
         dict(m=16 * 1000, n=1000), dict(m=32 * 2048, n=2048, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=10, n=3), dict(m=129, n=100), dict(m=64, n=300, dtype=torch.float16)]
heldout_ranges = {"m": (3, 129), "n": (3, 300)}  # drawn per run (harness/task.py): the span the held-out cases cover
