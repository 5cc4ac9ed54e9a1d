"""Clamp to [lo, hi] with scalar bounds (kernel arguments), elementwise, exact."""
import torch

from clamp import clamp as entry  # noqa: F401

family = "elementwise"


def inputs(n, lo=-0.5, hi=0.75, dtype=torch.float32):
    return (torch.randn(n, dtype=dtype), lo, hi)


def reference(x, lo, hi):
    return torch.clamp(x, lo, hi)


def bytes(n, lo=-0.5, hi=0.75, dtype=torch.float32):
    return 2 * n * torch.empty((), dtype=dtype).element_size()


# Bounds exactly representable in every dtype: clamping is a selection, so the result is exact.
tolerances = {"atol": 0.0, "rtol": 0.0}
cases = [dict(n=1 << 24), dict(n=1 << 25), dict(n=1 << 26), dict(n=50_000_017, lo=-2.0, hi=1.5),
         dict(n=1 << 26, dtype=torch.float16), dict(n=1 << 26, dtype=torch.bfloat16)]
heldout = [dict(n=1), dict(n=17, lo=0.0, hi=0.25), dict(n=100_003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 100003)}  # drawn per run (harness/task.py): the span the held-out cases cover
