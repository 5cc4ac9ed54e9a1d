import torch
import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(a, b):
    out = torch.empty_like(a)
    n = a.numel()
    silu_mul_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
    return out
