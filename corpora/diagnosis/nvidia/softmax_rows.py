"""Softmax over 4096-wide rows, 8 warps, 16 elements per thread (healthy)."""
import torch, triton, triton.language as tl

@triton.jit
def softmax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0))

def softmax(x):
    out = torch.empty_like(x)
    softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=x.shape[1], num_warps=8)
    return out
