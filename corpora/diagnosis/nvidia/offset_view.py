"""Scale a view that starts one element into its buffer: the base pointer is not 16-byte aligned."""
import torch, triton, triton.language as tl

@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * s, mask=mask)

def scale_tail(buf, s):
    x = buf[1:]  # e.g. dropping a header element
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, s, BLOCK=1024)
    return out
