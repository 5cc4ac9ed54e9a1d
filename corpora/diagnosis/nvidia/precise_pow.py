"""Elementwise x**2.5 through the precise libdevice pow."""
import torch, triton, triton.language as tl
from triton.language.extra import libdevice

@triton.jit
def pow_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, libdevice.pow(x, 2.5))

def power(x):
    out = torch.empty_like(x)
    pow_kernel[(x.numel() // 1024,)](x, out, BLOCK=1024)
    return out
