"""A task file for `kb why --task` (format: harness/task.py): the launch wrapper, inputs per case, cases."""
import torch

from scale import scale as entry  # noqa: F401  (the kernel file beside this one)


def inputs(n):
    return (torch.randn(n), 2.0)


cases = [dict(n=1000003), dict(n=1 << 20)]
