"""zeros(bins, d).index_add_(0, idx, src): rows of src summed into bins by int64 index, fp32 atomics."""
import torch

from index_add import index_add as entry  # noqa: F401

family = "gather/scatter"


def inputs(k, bins, dim):
    return (torch.randn(k, dim), torch.randint(0, bins, (k,)), bins)


def reference(src, idx, bins):
    return torch.zeros(bins, src.shape[1], dtype=src.dtype, device=src.device).index_add_(0, idx, src)


def bytes(k, bins, dim):
    return 4 * k * dim + 8 * k + 4 * bins * dim


# Atomic adds land in any order: the fp32 sums differ from the ordered one by rounding.
tolerances = {"atol": 1e-4, "rtol": 1e-4}
cases = [dict(k=65536, bins=8192, dim=512), dict(k=32768, bins=32768, dim=1024), dict(k=16384, bins=1024, dim=4096),
         dict(k=262144, bins=65536, dim=128), dict(k=20000, bins=5000, dim=1500)]
heldout = [dict(k=1, bins=1, dim=1), dict(k=10, bins=3, dim=5), dict(k=300, bins=17, dim=1100)]
heldout_ranges = {"k": (1, 300), "bins": (1, 17), "dim": (1, 1100)}  # drawn per run (harness/task.py): the span the held-out cases cover
