import torch
import triton
import triton.language as tl


@triton.jit
def transpose_kernel(x_ptr, out_ptr, m, n, stride_x, stride_out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    x = tl.load(x_ptr + rm[:, None] * stride_x + rn[None, :], mask=mask)
    tl.store(out_ptr + rn[None, :] * stride_out + rm[:, None], x, mask=mask)


def transpose(x):
    m, n = x.shape
    out = torch.empty((n, m), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, 32), triton.cdiv(n, 32))
    transpose_kernel[grid](x, out, m, n, x.stride(0), out.stride(0), BLOCK_M=32, BLOCK_N=32)
    return out
