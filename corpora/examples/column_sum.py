import torch
import triton
import triton.language as tl


@triton.jit
def column_sum_kernel(x_ptr, out_ptr, M, stride_m, BLOCK: tl.constexpr):
    col = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, M, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + rows * stride_m + col, mask=rows < M, other=0.0)
    tl.store(out_ptr + col, tl.sum(acc, axis=0))


def column_sum(x):
    m, n = x.shape
    out = torch.empty(n, dtype=torch.float32, device=x.device)
    column_sum_kernel[(n,)](x, out, m, x.stride(0), BLOCK=64)
    return out
