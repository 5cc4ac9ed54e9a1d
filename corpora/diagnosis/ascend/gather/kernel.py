"""Gather rows' values by an index tensor: offsets come from loaded indices, so the access is unstructured."""
import torch, triton, triton.language as tl

@triton.jit
def gather_kernel(x_ptr, idx_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    idx = tl.load(idx_ptr + offs)
    vals = tl.load(x_ptr + idx)
    tl.store(out_ptr + offs, vals)
