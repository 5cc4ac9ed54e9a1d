import torch
import triton
import triton.language as tl


@triton.jit
def permute_3d_kernel(x_ptr, out_ptr, M, N, stride_xb, stride_xm, stride_ob, stride_on,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(2)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + b * stride_xb + rm[:, None] * stride_xm + rn[None, :], mask=mask)
    tl.store(out_ptr + b * stride_ob + rn[None, :] * stride_on + rm[:, None], x, mask=mask)


def permute_3d(x):
    batch, m, n = x.shape
    out = torch.empty((batch, n, m), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, 32), triton.cdiv(n, 32), batch)
    permute_3d_kernel[grid](x, out, m, n, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                            BLOCK_M=32, BLOCK_N=32)
    return out
