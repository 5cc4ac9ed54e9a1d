"""Layer normalization over the last axis with weight and bias (forward)."""
import torch

from layer_norm import layer_norm as entry  # noqa: F401

family = "normalization"


def inputs(m, n, dtype=torch.float16):
    return (torch.randn(m, n, dtype=dtype), torch.rand(n, dtype=dtype) + 0.5, torch.randn(n, dtype=dtype))


def reference(x, weight, bias):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def bytes(m, n, dtype=torch.float16):
    return (2 * m * n + 2 * n) * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=4096, n=1024), dict(m=8192, n=2048), dict(m=4096, n=4096), dict(m=2048, n=8192),
         dict(m=16384, n=768), dict(m=4096, n=1024, dtype=torch.float32)]
heldout = [dict(m=5, n=33), dict(m=100, n=1000, dtype=torch.float32)]
heldout_ranges = {"m": (5, 100), "n": (33, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
