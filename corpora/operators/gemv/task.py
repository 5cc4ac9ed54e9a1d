"""Matrix-vector product y = A @ x, A (m, k), x (k,): fp32 accumulation, output in A's dtype."""
import torch

from gemv import gemv as entry  # noqa: F401

family = "matmul"


def inputs(m, k, dtype=torch.float16):
    return (torch.randn(m, k, dtype=dtype), torch.randn(k, dtype=dtype))


def reference(a, x):
    return a @ x


def flops(m, k, dtype=torch.float16):
    return 2 * m * k


def bytes(m, k, dtype=torch.float16):
    return (m * k + k + m) * torch.empty((), dtype=dtype).element_size()


# Dot products of up to 16384 terms of magnitude 1 (outputs ~ sqrt(k) ~ 100): summation order
# moves fp32 results by ~1e-4 absolute; fp16 outputs are rounded at 1e-3 relative.
tolerances = {"float32": {"atol": 1e-3, "rtol": 1e-4}, "float16": {"atol": 1e-2, "rtol": 1e-2}}
cases = [dict(m=8192, k=8192), dict(m=16384, k=8192), dict(m=32768, k=4096), dict(m=4096, k=16384),
         dict(m=10000, k=5000), dict(m=8192, k=8192, dtype=torch.float32), dict(m=4096, k=14336, dtype=torch.float32)]
heldout = [dict(m=1, k=1), dict(m=5, k=33), dict(m=129, k=1000, dtype=torch.float32)]
heldout_ranges = {"m": (1, 129), "k": (1, 1000)}  # drawn per run (harness/task.py): the span the held-out cases cover
