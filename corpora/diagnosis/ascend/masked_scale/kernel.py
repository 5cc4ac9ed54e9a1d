"""Scale a ragged vector: a masked load without `other`, whose masked lanes are never read."""
import torch, triton, triton.language as tl

@triton.jit
def masked_scale_kernel(x_ptr, out_ptr, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x * s, mask=offs < n)
