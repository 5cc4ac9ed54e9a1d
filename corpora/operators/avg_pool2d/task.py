"""2-D average pooling of (N, C, H, W), 2x2 window, stride 2 (pooling), one program per output row."""
import torch

from avg_pool2d import avg_pool2d as entry  # noqa: F401

family = "pooling"


def inputs(n, c, h, w, dtype=torch.float32):
    return (torch.randn(n, c, h, w, dtype=dtype),)


def reference(x):
    return torch.nn.functional.avg_pool2d(x, 2)


def bytes(n, c, h, w, dtype=torch.float32):
    return (n * c * h * w + n * c * (h // 2) * (w // 2)) * torch.empty((), dtype=dtype).element_size()


cases = [dict(n=32, c=64, h=128, w=128), dict(n=16, c=128, h=256, w=256), dict(n=64, c=256, h=56, w=56),
         dict(n=8, c=32, h=1024, w=1024), dict(n=16, c=96, h=225, w=225),
         dict(n=32, c=128, h=128, w=128, dtype=torch.float16)]
heldout = [dict(n=1, c=1, h=2, w=2), dict(n=1, c=3, h=5, w=7), dict(n=2, c=3, h=33, w=17, dtype=torch.float16)]
heldout_ranges = {"n": (1, 2), "c": (1, 3), "h": (2, 33), "w": (2, 17)}  # drawn per run (harness/task.py): the span the held-out cases cover
