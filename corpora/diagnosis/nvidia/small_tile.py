"""GELU with a 256-element block on 8 warps: one element per thread, so no vector accesses."""
import torch, triton, triton.language as tl

@triton.jit
def gelu_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y)

def gelu(x):
    out = torch.empty_like(x)
    gelu_kernel[(x.numel() // 256,)](x, out, BLOCK=256, num_warps=8)
    return out
