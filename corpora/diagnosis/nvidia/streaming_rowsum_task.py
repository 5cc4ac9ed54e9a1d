"""Row sums of wide fp32 matrices by a column loop that never asks for pipelining."""
import torch

from streaming_rowsum import row_sum as entry  # noqa: F401


def inputs(m, n):
    return (torch.randn(m, n),)


def reference(x):
    return x.sum(dim=-1)


def bytes(m, n):
    return 4 * m * n + 4 * m


tolerances = {"atol": 1e-2, "rtol": 1e-4}
cases = [dict(m=256, n=65536), dict(m=512, n=65536), dict(m=1024, n=32768), dict(m=2048, n=16384),
         dict(m=4096, n=8192)]
