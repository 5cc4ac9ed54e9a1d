import torch
import triton
import triton.language as tl


@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.where(x > 0, x, 0.01 * x)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def leaky_relu(x):
    out = torch.empty_like(x)
    n = x.numel()
    leaky_relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
