"""out = x + y, fp32 and fp16 vectors: the memory-bound reference point (copy-bandwidth roofline)."""
import torch

from vector_add import vector_add as entry  # noqa: F401

family = "elementwise"


def inputs(n, dtype=torch.float32):
    return (torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype))


def reference(x, y):
    return x + y


def bytes(n, dtype=torch.float32):
    return 3 * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=1 << 20), dict(n=1 << 22), dict(n=1 << 24), dict(n=1 << 26), dict(n=1 << 27),
         dict(n=1 << 26, dtype=torch.float16)]
heldout = [dict(n=1), dict(n=1000003), dict(n=4097, dtype=torch.float16)]
heldout_ranges = {"n": (1, 1000003)}  # drawn per run (harness/task.py): the span the held-out cases cover
