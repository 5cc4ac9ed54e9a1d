import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale, stride_bh, stride_s,
                     HEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD)
    base = bh * stride_bh
    q = tl.load(q_ptr + base + rm[:, None] * stride_s + rd[None, :], mask=rm[:, None] < seq, other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)
    for start_n in range(0, seq, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(rn[None, :] < seq, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rm[:, None] * stride_s + rd[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rm[:, None] < seq)


def attention(q, k, v):
    batch, heads, seq, head = q.shape
    o = torch.empty_like(q)
    grid = (triton.cdiv(seq, 64), batch * heads)
    attention_kernel[grid](q, k, v, o, seq, head ** -0.5, q.stride(1), q.stride(2),
                           HEAD=head, BLOCK_M=64, BLOCK_N=64)
    return o
