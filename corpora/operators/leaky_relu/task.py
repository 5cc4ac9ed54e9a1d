"""Leaky ReLU (negative slope 0.01), elementwise: an activation, memory-bound."""
import torch

from leaky_relu import leaky_relu as entry  # noqa: F401

family = "activation"


def inputs(n, dtype=torch.float32):
    return (torch.randn(n, dtype=dtype),)


def reference(x):
    return torch.nn.functional.leaky_relu(x, negative_slope=0.01)


def bytes(n, dtype=torch.float32):
    return 2 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 24), dict(n=1 << 25), dict(n=1 << 26), dict(n=50_000_017),
         dict(n=1 << 26, dtype=torch.float16), dict(n=1 << 26, dtype=torch.bfloat16)]
heldout = [dict(n=1), dict(n=17), dict(n=100_003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 100003)}  # drawn per run (harness/task.py): the span the held-out cases cover
