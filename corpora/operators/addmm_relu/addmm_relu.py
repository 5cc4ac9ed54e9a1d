import torch
import triton
import triton.language as tl


@triton.jit
def addmm_relu_kernel(x_ptr, w_ptr, b_ptr, c_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn,
                      stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(x_ptr + rm[:, None] * stride_xm + (k + rk)[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(w_ptr + (k + rk)[:, None] * stride_wk + rn[None, :] * stride_wn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c, mask=(rm[:, None] < M) & (rn[None, :] < N))


def addmm_relu(x, w, b):
    m, k = x.shape
    _, n = w.shape
    c = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    addmm_relu_kernel[grid](x, w, b, c, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                            c.stride(0), c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    return c
