"""Every benchmark operator is a well-formed task: entry, reference, at least 5 timed cases, held-out
shapes, and bytes or FLOPs for the roofline (evaluation.md)."""

from __future__ import annotations

import pytest
from conftest import REPO

from harness.task import load_task

OPERATORS = sorted(p.parent.name for p in (REPO / "corpora" / "operators").glob("*/task.py"))


def test_the_suite_covers_the_published_size():
    assert len(OPERATORS) >= 37  # the reference result's 37 operators (evaluation.md)


@pytest.mark.parametrize("name", OPERATORS)
def test_operator_task_is_complete(name):
    task = load_task(REPO / "corpora" / "operators" / name / "task.py")
    assert task.reference is not None and callable(task.entry)
    assert len(task.cases) >= 5 and task.heldout
    assert task.bytes is not None or task.flops is not None
    assert task.family  # reports group by it
    assert task.source_file.endswith(f"{name}.py")  # kernels are named after their operator


@pytest.mark.parametrize("name", OPERATORS)
def test_held_out_cases_are_drawn_per_run_within_the_declared_ranges(name):
    """Each run draws held-out shapes from `heldout_ranges` (harness/task.py): the span the listed
    held-out cases cover, which the operator's own kernel handles (checked on the interpreter when the
    ranges were written: 12 draws each, all 39 kernels right)."""
    import random

    task = load_task(REPO / "corpora" / "operators" / name / "task.py")
    assert task.heldout_ranges
    drawn = task.generated_cases(random.Random(0), 20)
    for case in drawn:
        for key, span in task.heldout_ranges.items():
            assert span[0] <= case[key] <= span[1] if isinstance(span, tuple) else case[key] in span
    assert len({task.case_label(c) for c in drawn}) > 5  # shapes a kernel cannot read in the file
    assert task.generated_cases(random.Random(0), 20) == drawn  # and a seed replays them


WIDENED = [n for n in OPERATORS if load_task(REPO / "corpora" / "operators" / n / "task.py").eager is not None]


def test_operators_whose_reference_widens_the_type_have_a_speed_stand_in():
    import inspect

    for name in OPERATORS:
        task = load_task(REPO / "corpora" / "operators" / name / "task.py")
        widened = any(w in inspect.getsource(task.reference) for w in ("float64", "to(torch.float32)", ".double()"))
        assert not widened or task.eager is not None, f"{name}: eager would be timed in the reference's wider type"


@pytest.mark.parametrize("name", WIDENED)
def test_the_speed_stand_in_computes_the_reference(name):
    """`eager` is timed instead of the reference: it must be the same operation (on the CPU, at a held-out
    shape, within the task's tolerance for the kernel's output dtype)."""
    import torch

    from harness.task import tolerance_for

    task = load_task(REPO / "corpora" / "operators" / name / "task.py")
    torch.manual_seed(0)
    args = task.inputs(**task.heldout[0])
    fast, exact = task.eager(*args), task.reference(*args)
    tol = tolerance_for(task, str(fast.dtype).removeprefix("torch."))
    torch.testing.assert_close(fast.to(exact.dtype), exact, atol=max(tol["atol"], 1e-6), rtol=max(tol["rtol"], 1e-6))
