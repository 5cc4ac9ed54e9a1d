"""Copy a transposed view tile by tile, indexing the stride-1 axis first: the innermost index is strided."""
import torch, triton, triton.language as tl

@triton.jit
def copy_kernel(x_ptr, out_ptr, M, N, sxm, sxn, som, son, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    x = tl.load(x_ptr + rm[:, None] * sxm + rn[None, :] * sxn)
    tl.store(out_ptr + rm[:, None] * som + rn[None, :] * son, x)

def copy_t(a):
    x = a.t()  # (N, M) view of a row-major (M, N) tensor: stride (1, M)
    out = torch.empty(x.shape, dtype=x.dtype, device=a.device)
    M, N = x.shape
    copy_kernel[(M // 64, N // 64)](x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), BM=64, BN=64)
    return out
