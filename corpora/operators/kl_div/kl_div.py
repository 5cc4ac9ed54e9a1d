import torch
import triton
import triton.language as tl


@triton.jit
def kl_div_kernel(log_q_ptr, p_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        log_q = tl.load(log_q_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        # p log p is 0 where p is 0 (also the masked tail)
        acc += tl.where(p > 0, p * (tl.log(p) - log_q), 0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def kl_div(log_q, p):
    m, n = log_q.shape
    out = torch.empty(m, dtype=torch.float32, device=log_q.device)
    kl_div_kernel[(m,)](log_q, p, out, n, log_q.stride(0), BLOCK=1024)
    return out
