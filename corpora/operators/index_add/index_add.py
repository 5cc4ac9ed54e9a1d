import torch
import triton
import triton.language as tl


@triton.jit
def index_add_kernel(src_ptr, idx_ptr, out_ptr, dim, stride_src, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < dim
    dst = tl.load(idx_ptr + row)
    vec = tl.load(src_ptr + row * stride_src + cols, mask=mask)
    tl.atomic_add(out_ptr + dst * stride_out + cols, vec, mask=mask)


def index_add(src, idx, bins):
    k, dim = src.shape
    out = torch.zeros((bins, dim), dtype=src.dtype, device=src.device)
    index_add_kernel[(k, triton.cdiv(dim, 1024))](src, idx, out, dim, src.stride(0), out.stride(0), BLOCK=1024)
    return out
