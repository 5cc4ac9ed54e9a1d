"""Embedding lookup: gather one table row per token (gather/index), exact."""
import torch

from embedding import embedding as entry  # noqa: F401

family = "gather/index"


def inputs(tokens, vocab, dim, dtype=torch.float32):
    return (torch.randint(0, vocab, (tokens,)), torch.randn(vocab, dim, dtype=dtype))


def reference(idx, table):
    return table[idx]


def bytes(tokens, vocab, dim, dtype=torch.float32):
    return 2 * tokens * dim * torch.empty((), dtype=dtype).element_size() + 8 * tokens


cases = [dict(tokens=16384, vocab=32000, dim=512), dict(tokens=32768, vocab=32000, dim=1024),
         dict(tokens=8192, vocab=128000, dim=4096), dict(tokens=65536, vocab=50000, dim=256),
         dict(tokens=16384, vocab=32000, dim=2048, dtype=torch.float16)]
heldout = [dict(tokens=1, vocab=3, dim=5), dict(tokens=77, vocab=1000, dim=300)]
heldout_ranges = {"tokens": (1, 77), "vocab": (3, 1000), "dim": (5, 300)}  # drawn per run (harness/task.py): the span the held-out cases cover
