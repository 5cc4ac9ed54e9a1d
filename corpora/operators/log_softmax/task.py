"""Row-wise log-softmax over the last axis (softmax family)."""
import torch

from log_softmax import log_softmax as entry  # noqa: F401

family = "softmax"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    return torch.log_softmax(x.to(torch.float64), dim=-1)


# The speed stand-in: the reference above computes in a wider type for accuracy.
def eager(x):
    return torch.log_softmax(x, dim=-1)


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=4096, n=512), dict(m=4096, n=2048), dict(m=2048, n=4096), dict(m=1024, n=8192),
         dict(m=8192, n=1024, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=129, n=1000)]
heldout_ranges = {"m": (3, 129), "n": (7, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
