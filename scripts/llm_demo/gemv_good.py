"""The rewrite the demo's scripted endpoint replays as "the model's" answer for corpora/operators/gemv:
written by us (not by a model) from what the loop measured on the H200 (docs/device/2026-12-02-h200-l4):
the K loop software-pipelined four stages deep, and eight warps per 64-row block."""
import torch
import triton
import triton.language as tl


@triton.jit
def gemv_kernel(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=4):
        cols = k + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + cols[None, :],
                    mask=(rm[:, None] < M) & (cols[None, :] < K), other=0.0).to(tl.float32)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(y_ptr + rm, acc.to(y_ptr.dtype.element_ty), mask=rm < M)


def gemv(a, x):
    m, k = a.shape
    y = torch.empty(m, dtype=a.dtype, device=a.device)
    gemv_kernel[(triton.cdiv(m, 64),)](a, x, y, m, k, a.stride(0), BLOCK_M=64, BLOCK_K=64, num_warps=8)
    return y
