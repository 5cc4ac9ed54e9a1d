"""Softplus log(1 + exp(x)) with torch's threshold 20 (x itself above it): an activation."""
import torch

from softplus import softplus as entry  # noqa: F401

family = "activation"


def inputs(n, dtype=torch.float32):
    # spread 10: about 2% of the values lie above the threshold 20, and many far below 0
    return (10 * torch.randn(n, dtype=dtype),)


def reference(x):
    return torch.nn.functional.softplus(x, beta=1.0, threshold=20.0)


def bytes(n, dtype=torch.float32):
    return 2 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 24), dict(n=1 << 25), dict(n=1 << 26), dict(n=50_000_017),
         dict(n=1 << 26, dtype=torch.float16)]
heldout = [dict(n=1), dict(n=17), dict(n=100_003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 100003)}  # drawn per run (harness/task.py): the span the held-out cases cover
