"""(B, M, N) -> (B, N, M) contiguous: a batched transpose (layout change), memory-bound, exact."""
import torch

from permute_3d import permute_3d as entry  # noqa: F401

family = "transpose/layout"


def inputs(b, m, n, dtype=torch.float32):
    return (torch.randn(b, m, n, dtype=dtype),)


def reference(x):
    return x.permute(0, 2, 1).contiguous()


def bytes(b, m, n, dtype=torch.float32):
    return 2 * b * m * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(b=16, m=1024, n=1024), dict(b=8, m=2048, n=2048), dict(b=256, m=128, n=1024), dict(b=4, m=4096, n=2048),
         dict(b=12, m=1000, n=1500), dict(b=16, m=2048, n=2048, dtype=torch.float16)]
heldout = [dict(b=1, m=1, n=1), dict(b=3, m=33, n=65), dict(b=2, m=1000, n=3, dtype=torch.float16)]
heldout_ranges = {"b": (1, 3), "m": (1, 1000), "n": (1, 65)}  # drawn per run (harness/task.py): the span the held-out cases cover
