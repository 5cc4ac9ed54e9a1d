"""Inference batch norm on (N, C, L): per-channel running mean/var, weight and bias, eps 1e-5."""
import torch

from batch_norm import batch_norm as entry  # noqa: F401

family = "normalization"


def inputs(n, c, length, dtype=torch.float32):
    # activations in `dtype`, per-channel statistics and affine parameters in fp32 (as under autocast)
    return (torch.randn(n, c, length, dtype=dtype), 0.1 * torch.randn(c), torch.rand(c) + 0.5,
            torch.rand(c) + 0.5, torch.randn(c))


def reference(x, running_mean, running_var, weight, bias):
    return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=1e-5)


def bytes(n, c, length, dtype=torch.float32):
    return 2 * n * c * length * torch.empty((), dtype=dtype).element_size() + 4 * 4 * c


cases = [dict(n=32, c=256, length=4096), dict(n=64, c=512, length=1024), dict(n=8, c=64, length=65536),
         dict(n=16, c=1024, length=3000), dict(n=256, c=2048, length=128),
         dict(n=32, c=256, length=8192, dtype=torch.float16)]
heldout = [dict(n=1, c=1, length=1), dict(n=3, c=5, length=33), dict(n=2, c=7, length=1500, dtype=torch.float16)]
heldout_ranges = {"n": (1, 3), "c": (1, 7), "length": (1, 1500)}  # drawn per run (harness/task.py): the span the held-out cases cover
