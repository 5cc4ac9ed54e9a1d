"""Row sums of a wide matrix, one program per row, looping over column blocks: nothing prefetches the next block."""
import torch, triton, triton.language as tl

@triton.jit
def rowsum_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))

def row_sum(x):
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    rowsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)
    return out
