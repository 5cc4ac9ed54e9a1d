"""Non-causal scaled dot-product attention, fp16, one program per 64 query rows (online softmax)."""
import torch

from attention import attention as entry  # noqa: F401

family = "attention"


def inputs(batch, heads, seq, head=64):
    shape = (batch, heads, seq, head)
    return tuple(torch.randn(shape, dtype=torch.float16) for _ in range(3))


def reference(q, k, v):
    q, k, v = (t.to(torch.float32) for t in (q, k, v))
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v


# The speed stand-in: the reference above computes in a wider type for accuracy.
def eager(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def flops(batch, heads, seq, head=64):
    return 4 * batch * heads * seq * seq * head


def bytes(batch, heads, seq, head=64):
    return 4 * batch * heads * seq * head * 2


cases = [dict(batch=4, heads=16, seq=512), dict(batch=4, heads=16, seq=1024), dict(batch=2, heads=16, seq=2048),
         dict(batch=1, heads=16, seq=4096), dict(batch=8, heads=8, seq=1024, head=128)]
heldout = [dict(batch=1, heads=1, seq=1), dict(batch=2, heads=3, seq=77)]
heldout_ranges = {"batch": (1, 2), "heads": (1, 3), "seq": (1, 77)}  # drawn per run (harness/task.py): the span the held-out cases cover
