"""Residual add then layer norm over the last axis: layer_norm(x + r) with weight and bias, fused."""
import torch

from add_layer_norm import add_layer_norm as entry  # noqa: F401

family = "fused composite"


def inputs(m, n, dtype=torch.float16):
    return (torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype), torch.rand(n, dtype=dtype) + 0.5,
            torch.randn(n, dtype=dtype))


def reference(x, residual, weight, bias):
    return torch.nn.functional.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps=1e-5)


def bytes(m, n, dtype=torch.float16):
    return (3 * m * n + 2 * n) * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=16384, n=1024), dict(m=8192, n=2048), dict(m=8192, n=4096), dict(m=4096, n=8192),
         dict(m=32768, n=768), dict(m=8192, n=3000), dict(m=8192, n=1024, dtype=torch.float32)]
heldout = [dict(m=5, n=33), dict(m=100, n=1000, dtype=torch.float32), dict(m=3, n=7, dtype=torch.bfloat16)]
heldout_ranges = {"m": (3, 100), "n": (7, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
