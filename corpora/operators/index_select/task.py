"""out = x[idx]: rows of a 2-D tensor gathered by an int64 index vector (gather/index), exact."""
import torch

from index_select import index_select as entry  # noqa: F401

family = "gather/index"


def inputs(rows, k, dim, dtype=torch.float32):
    return (torch.randn(rows, dim, dtype=dtype), torch.randint(0, rows, (k,)))


def reference(x, idx):
    return torch.index_select(x, 0, idx)


def bytes(rows, k, dim, dtype=torch.float32):
    return 2 * k * dim * torch.empty((), dtype=dtype).element_size() + 8 * k


cases = [dict(rows=100000, k=32768, dim=1024), dict(rows=50000, k=65536, dim=512), dict(rows=16384, k=8192, dim=4096),
         dict(rows=1000000, k=262144, dim=128), dict(rows=30000, k=20000, dim=1500),
         dict(rows=100000, k=32768, dim=2048, dtype=torch.float16)]
heldout = [dict(rows=1, k=1, dim=1), dict(rows=3, k=10, dim=5), dict(rows=1000, k=77, dim=1100, dtype=torch.bfloat16)]
heldout_ranges = {"rows": (1, 1000), "k": (1, 77), "dim": (1, 1100)}  # drawn per run (harness/task.py): the span the held-out cases cover
