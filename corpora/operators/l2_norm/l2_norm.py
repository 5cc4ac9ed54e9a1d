import torch
import triton
import triton.language as tl


@triton.jit
def l2_norm_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(out_ptr + row, tl.sqrt(tl.sum(acc, axis=0)).to(out_ptr.dtype.element_ty))


def l2_norm(x):
    m, n = x.shape
    out = torch.empty(m, dtype=x.dtype, device=x.device)
    l2_norm_kernel[(m,)](x, out, n, x.stride(0), BLOCK=1024)
    return out
