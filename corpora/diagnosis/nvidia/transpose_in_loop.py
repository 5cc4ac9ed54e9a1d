"""Accumulate x^T * x tile by tile (pipelining switched off): tl.trans inside the loop converts layouts every step."""
import torch, triton, triton.language as tl

@triton.jit
def acc_t_kernel(x_ptr, out_ptr, T, B: tl.constexpr):
    r = tl.arange(0, B)
    acc = tl.zeros((B, B), dtype=tl.float32)
    for t in tl.range(0, T, num_stages=1):  # no pipelining: a 64x64 fp32 tile per stage is the budget
        x = tl.load(x_ptr + t * B * B + r[:, None] * B + r[None, :])
        acc += tl.trans(x) * x
    tl.store(out_ptr + r[:, None] * B + r[None, :], acc)

def acc_t(x):
    T, B, _ = x.shape
    out = torch.empty((B, B), dtype=x.dtype, device=x.device)
    acc_t_kernel[(1,)](x, out, T, B=B)
    return out
