"""Batched C[i] = A[i] @ B[i], fp16 inputs and output, fp32 accumulation (a matmul variant)."""
import torch

from bmm import bmm as entry  # noqa: F401

family = "matmul"


def inputs(batch, m, n, k):
    return (torch.randn(batch, m, k, dtype=torch.float16), torch.randn(batch, k, n, dtype=torch.float16))


def reference(a, b):
    return torch.bmm(a.to(torch.float32), b.to(torch.float32))


# The speed stand-in: the reference above computes in a wider type for accuracy.
def eager(a, b):
    return torch.bmm(a, b)


def flops(batch, m, n, k):
    return 2 * batch * m * n * k


def bytes(batch, m, n, k):
    return 2 * batch * (m * k + k * n + m * n)


cases = [dict(batch=32, m=256, n=256, k=256), dict(batch=16, m=512, n=512, k=512),
         dict(batch=8, m=1024, n=1024, k=1024), dict(batch=64, m=128, n=128, k=512),
         dict(batch=4, m=2048, n=2048, k=1024)]
heldout = [dict(batch=1, m=1, n=1, k=1), dict(batch=3, m=65, n=33, k=17)]
heldout_ranges = {"batch": (1, 3), "m": (1, 65), "n": (1, 33), "k": (1, 17)}  # drawn per run (harness/task.py): the span the held-out cases cover
