"""Layer norm over rows of 1000 features, one program per row, masked to the row length."""
import torch, triton, triton.language as tl

@triton.jit
def ln_kernel(x_ptr, w_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / N
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / N
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(out_ptr + row * N + cols, d / tl.sqrt(var + eps) * w, mask=mask)

def layer_norm(x, w, eps=1e-5):
    out = torch.empty_like(x)
    ln_kernel[(x.shape[0],)](x, w, out, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
