"""One attention head block: per key block, scores on Cube, exp on Vector, then P @ V on Cube again."""
import torch, triton, triton.language as tl

@triton.jit
def attention_block_kernel(q_ptr, k_ptr, v_ptr, out_ptr, n_keys, BLOCK: tl.constexpr, D: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :])
    acc = tl.zeros((BLOCK, D), dtype=tl.float32)
    for start in range(0, n_keys, BLOCK):
        k = tl.load(k_ptr + (start + rows)[None, :] * D + dims[:, None])
        p = tl.exp(tl.dot(q, k))
        v = tl.load(v_ptr + (start + rows)[:, None] * D + dims[None, :])
        acc += tl.dot(p.to(tl.float16), v)
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], acc.to(tl.float16))
