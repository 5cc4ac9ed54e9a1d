"""Batched fp16 matmul with a 3-D tl.dot over the batch: rank-3 dots cannot use wgmma."""
import torch, triton, triton.language as tl

@triton.jit
def bmm_kernel(a_ptr, b_ptr, c_ptr, K, B: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rb = tl.arange(0, B)
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((B, BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rb[:, None, None] * BM * K + rm[None, :, None] * K + (k + rk)[None, None, :])
        b = tl.load(b_ptr + rb[:, None, None] * K * BN + (k + rk)[None, :, None] * BN + rn[None, None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rb[:, None, None] * BM * BN + rm[None, :, None] * BN + rn[None, None, :], acc)

def bmm(a, b):
    B, M, K = a.shape
    N = b.shape[2]
    c = torch.empty((B, M, N), dtype=torch.float32, device=a.device)
    bmm_kernel[(1,)](a, b, c, K, B=B, BM=M, BN=N, BK=32)
    return c
