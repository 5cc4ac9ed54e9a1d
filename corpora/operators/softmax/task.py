"""Row-wise softmax over the last axis, one program per row."""
import torch

from softmax import softmax as entry  # noqa: F401

family = "softmax"


def inputs(m, n, dtype=torch.float32):
    return (torch.randn(m, n, dtype=dtype),)


def reference(x):
    return torch.softmax(x, dim=-1)


def bytes(m, n, dtype=torch.float32):
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


cases = [dict(m=4096, n=512), dict(m=4096, n=1024), dict(m=8192, n=2048), dict(m=2048, n=4096),
         dict(m=1024, n=8192), dict(m=8192, n=1024, dtype=torch.float16)]
heldout = [dict(m=3, n=7), dict(m=129, n=1000), dict(m=64, n=3000, dtype=torch.float16)]
heldout_ranges = {"m": (3, 129), "n": (7, 3000)}  # drawn per run (harness/task.py): the span the held-out cases cover
