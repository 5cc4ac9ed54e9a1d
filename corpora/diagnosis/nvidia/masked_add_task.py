"""Vector add on lengths that are not multiples of 16: every access is masked and scalar."""
import torch

from vector_add import add as entry  # noqa: F401


def inputs(n):
    return (torch.randn(n), torch.randn(n))


def reference(x, y):
    return x + y


def bytes(n):
    return 3 * 4 * n


cases = [dict(n=(1 << 22) + 3), dict(n=(1 << 24) + 3), dict(n=(1 << 26) + 3), dict(n=(1 << 27) + 3),
         dict(n=100000003)]
