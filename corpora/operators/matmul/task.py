"""C = A @ B, fp16 inputs and output, fp32 accumulation."""
import torch

from matmul import matmul as entry  # noqa: F401

family = "matmul"


def inputs(m, n, k):
    return (torch.randn(m, k, dtype=torch.float16), torch.randn(k, n, dtype=torch.float16))


def reference(a, b):
    return a @ b


def flops(m, n, k):
    return 2 * m * n * k


def bytes(m, n, k):
    return 2 * (m * k + k * n + m * n)


# fp16 output of sums of up to 4096 products: relative rounding of the output dominates.
tolerances = {"atol": 2e-2, "rtol": 1e-2}
cases = [dict(m=512, n=512, k=512), dict(m=1024, n=1024, k=1024), dict(m=2048, n=2048, k=2048),
         dict(m=4096, n=4096, k=4096), dict(m=3072, n=1024, k=4096)]
heldout = [dict(m=129, n=257, k=65), dict(m=1, n=64, k=100)]
heldout_ranges = {"m": (1, 129), "n": (64, 257), "k": (65, 100)}  # drawn per run (harness/task.py): the span the held-out cases cover
