"""AXPY out = a * x + y with a Python float scalar a (out of place), elementwise."""
import torch

from axpy import axpy as entry  # noqa: F401

family = "elementwise"


def inputs(n, a=1.7, dtype=torch.float32):
    return (a, torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype))


def reference(a, x, y):
    return a * x + y


def bytes(n, a=1.7, dtype=torch.float32):
    return 3 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 24), dict(n=1 << 25), dict(n=1 << 26), dict(n=50_000_017, a=-0.3),
         dict(n=1 << 26, dtype=torch.float16), dict(n=1 << 26, dtype=torch.bfloat16)]
heldout = [dict(n=1), dict(n=17, a=2.5), dict(n=100_003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 100003)}  # drawn per run (harness/task.py): the span the held-out cases cover
