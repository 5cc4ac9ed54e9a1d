"""The demo's cheating answer for corpora/operators/gemv: the kernel is still defined, but the wrapper
lets cuBLAS compute the result (a torch fallback). The judge must reject it, with that reason."""
import triton
import triton.language as tl


@triton.jit
def gemv_kernel(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(y_ptr + rm, tl.zeros((BLOCK_M,), dtype=tl.float32).to(y_ptr.dtype.element_ty), mask=rm < M)


def gemv(a, x):
    return (a.float() @ x.float()).to(a.dtype)
