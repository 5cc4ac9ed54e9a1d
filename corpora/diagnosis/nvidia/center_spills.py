"""Row normalisation with a 16384-element row held by one warp: 512 live fp32 values per thread spill."""
import torch, triton, triton.language as tl

@triton.jit
def center_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = row * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    mean = tl.sum(x, axis=0) / BLOCK
    var = tl.sum((x - mean) * (x - mean), axis=0) / BLOCK
    tl.store(out_ptr + offs, (x - mean) / tl.sqrt(var + 1e-5))

def center(x, BLOCK=16384, num_warps=1):
    out = torch.empty_like(x)
    center_kernel[(x.shape[0],)](x, out, BLOCK=BLOCK, num_warps=num_warps)
    return out
