"""fp16 row sums over rows of 8001 elements: every row starts at a 2-byte offset, so no access is aligned."""
import torch, triton, triton.language as tl

@triton.jit
def rowsum_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in tl.range(0, N, BLOCK, num_stages=3):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))

def row_sum(x):
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    rowsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)
    return out
