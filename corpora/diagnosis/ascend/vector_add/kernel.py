"""Vector add, structured and masked with care_padding=False: one DMA per operand, no padding fill (healthy)."""
import torch, triton, triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, care_padding=False)
    y = tl.load(y_ptr + offs, mask=mask, care_padding=False)
    tl.store(out_ptr + offs, x + y, mask=mask)
