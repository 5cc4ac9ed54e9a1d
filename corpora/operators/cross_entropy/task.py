"""Per-row cross-entropy loss (no reduction) from logits and class targets (a loss)."""
import torch

from cross_entropy import cross_entropy as entry  # noqa: F401

family = "loss"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype), torch.randint(0, n, (m,)))


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits.to(torch.float64), target, reduction="none")


# The speed stand-in: the reference above computes in a wider type for accuracy.
def eager(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, reduction="none")


def bytes(m, n, dtype=torch.float32):
    return m * n * torch.empty((), dtype=dtype).element_size() + 12 * m


tolerances = {"atol": 1e-4, "rtol": 1e-4}
cases = [dict(m=4096, n=1024), dict(m=4096, n=4096), dict(m=1024, n=16384), dict(m=512, n=32768),
         dict(m=4096, n=8192, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=129, n=1000)]
heldout_ranges = {"m": (3, 129), "n": (7, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
