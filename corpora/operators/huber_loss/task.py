"""Per-row mean Huber (smooth-L1) loss with delta 1.0: reduction='none', then the mean over the last axis."""
import torch

from huber_loss import huber_loss as entry  # noqa: F401

family = "loss"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype))


def reference(x, y):
    return torch.nn.functional.huber_loss(x, y, reduction="none", delta=1.0).mean(dim=-1)


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size() + 4 * m


tolerances = {"atol": 1e-5, "rtol": 1e-4}
cases = [dict(m=4096, n=4096), dict(m=1024, n=65536), dict(m=65536, n=1024), dict(m=8192, n=8192),
         dict(m=10000, n=5000), dict(m=8192, n=8192, dtype=torch.float16)]
heldout = [dict(m=3, n=1), dict(m=5, n=33), dict(m=77, n=5000), dict(m=9, n=1500, dtype=torch.bfloat16)]
heldout_ranges = {"m": (3, 77), "n": (1, 5000)}  # drawn per run (harness/task.py): the span the held-out cases cover
