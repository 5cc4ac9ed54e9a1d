"""A first draft of x.sum(0) whose lanes walk down a column (`kb diagnose` says memory.uncoalesced; the
contiguous-innermost-axis rewrite answers it). Format: harness/task.py."""
import torch

from column_sum import column_sum as entry  # noqa: F401  (the kernel file beside this one)

family = "reduction"


def inputs(m, n):
    return (torch.randn(m, n),)


def reference(x):
    return x.sum(0)


tolerances = {"atol": 1e-3, "rtol": 1e-4}
cases = [dict(m=4096, n=4096), dict(m=16384, n=1024)]
heldout = [dict(m=1, n=1), dict(m=130, n=37)]
