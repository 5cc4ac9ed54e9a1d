"""SwiGLU's gate: silu(a) * b, fused (an elementwise composite)."""
import torch

from silu_mul import silu_mul as entry  # noqa: F401

family = "fused composite"


def inputs(n, dtype=torch.float32):
    return (torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype))


def reference(a, b):
    return torch.nn.functional.silu(a) * b


def bytes(n, dtype=torch.float32):
    return 3 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 20), dict(n=1 << 22), dict(n=1 << 24), dict(n=1 << 26), dict(n=1 << 24, dtype=torch.float16)]
heldout = [dict(n=1), dict(n=1000003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 1000003)}  # drawn per run (harness/task.py): the span the held-out cases cover
