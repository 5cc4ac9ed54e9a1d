"""Copy a 64x64 tile of a row-major matrix whose row stride is a runtime argument."""
import torch, triton, triton.language as tl

@triton.jit
def tile_copy_kernel(x_ptr, out_ptr, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :])
    tl.store(out_ptr + rows[:, None] * BLOCK_N + cols[None, :], x)
