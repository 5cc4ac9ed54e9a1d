"""Exact (erf) GELU, elementwise: an activation, memory-bound."""
import torch

from gelu import gelu as entry  # noqa: F401

family = "activation"


def inputs(n, dtype=torch.float32):
    return (torch.randn(n, dtype=dtype),)


def reference(x):
    return torch.nn.functional.gelu(x)


def bytes(n, dtype=torch.float32):
    return 2 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 20), dict(n=1 << 22), dict(n=1 << 24), dict(n=1 << 26), dict(n=1 << 24, dtype=torch.float16)]
heldout = [dict(n=1), dict(n=1000003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 1000003)}  # drawn per run (harness/task.py): the span the held-out cases cover
