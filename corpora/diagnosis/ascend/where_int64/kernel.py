"""ReLU-with-bound over int64 column indices: the `cols < N` select compares int64 vectors."""
import torch, triton, triton.language as tl

@triton.jit
def bounded_relu_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK).to(tl.int64)
    x = tl.load(x_ptr + cols)
    y = tl.where(cols < N, tl.maximum(x, 0.0), 0.0)
    tl.store(out_ptr + cols, y)
