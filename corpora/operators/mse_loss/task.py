"""Per-row mean squared error between two matrices (a loss)."""
import torch

from mse_loss import mse_loss as entry  # noqa: F401

family = "loss"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype))


def reference(x, y):
    return ((x.to(torch.float64) - y.to(torch.float64)) ** 2).mean(dim=-1)


# The speed stand-in: the reference above computes in a wider type for accuracy.
def eager(x, y):
    return ((x - y) ** 2).mean(dim=-1)


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size() + 4 * m


tolerances = {"atol": 1e-5, "rtol": 1e-4}
cases = [dict(m=4096, n=4096), dict(m=1024, n=65536), dict(m=65536, n=1024), dict(m=8192, n=8192),
         dict(m=8192, n=8192, dtype=torch.float16)]
heldout = [dict(m=3, n=1), dict(m=77, n=5000)]
heldout_ranges = {"m": (3, 77), "n": (1, 5000)}  # drawn per run (harness/task.py): the span the held-out cases cover
