"""Bias add over a flattened (rows, cols) tensor: column index from a runtime `%`, row from `//`."""
import torch, triton, triton.language as tl

@triton.jit
def bias_kernel(x_ptr, b_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = offs // cols
    col = offs % cols
    x = tl.load(x_ptr + row * cols + col, mask=mask)
    b = tl.load(b_ptr + col, mask=mask)
    tl.store(out_ptr + offs, x + b, mask=mask)

def bias_add(x, b):
    out = torch.empty_like(x)
    n = x.numel()
    bias_kernel[(triton.cdiv(n, 1024),)](x, b, out, n, x.shape[1], BLOCK=1024)
    return out
