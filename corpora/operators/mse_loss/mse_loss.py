import torch
import triton
import triton.language as tl


@triton.jit
def mse_kernel(x_ptr, y_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        d = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32) - \
            tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        acc += d * d
    tl.store(out_ptr + row, tl.sum(acc, axis=0) / n_cols)


def mse_loss(x, y):
    m, n = x.shape
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    mse_kernel[(m,)](x, y, out, n, x.stride(0), BLOCK=1024)
    return out
