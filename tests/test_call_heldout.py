"""Held-out shapes for a task made from one call (`kb run/optimize --kernel F --call EXPR`): the call's sizes
(`harness.call_sizes`), the cases drawn from them, and the judge holding candidates only to the drawn cases
the task's own kernel passes."""

from __future__ import annotations

import ast
import random

import pytest
from conftest import candidate_rejection

from harness.call_sizes import call_sizes, resized, size_ranges
from harness.run import RunOptions, run_task
from harness.task import Call, TaskSpec, task_from_call


def _sizes(call: str) -> dict[str, int]:
    return call_sizes(ast.parse(call, mode="eval").body)  # type: ignore[arg-type]


def test_the_sizes_are_the_literals_that_shape_the_calls_tensors():
    assert _sizes("f(torch.randn(8192, 4096), torch.zeros((4096,), dtype=torch.float16))") == \
        {"size8192": 8192, "size4096": 4096}
    # randint's bounds are values and full's fill a value; small literals (a batch of 2, dim=1) stay
    assert _sizes("f(torch.randint(0, 5000, (20000,)), torch.full((2, 64), 7), dim=1)") == \
        {"size20000": 20000, "size64": 64}
    assert _sizes("f(torch.randint(0, 5000, size=(300,)), torch.arange(1024), torch.randperm(77))") == \
        {"size300": 300, "size1024": 1024, "size77": 77}
    assert _sizes("f(x, 4096, BLOCK=128)") == {}  # no tensor made here: nothing says what is a size


def test_a_size_moves_every_literal_of_its_value_but_not_launch_knobs():
    call = ast.parse("index_add(torch.randn(5000, 64), torch.randint(0, 5000, (900,)), 5000, BLOCK=5000, "
                     "n=5000, num_warps=4)", mode="eval").body
    assert isinstance(call, ast.Call)
    assert ast.unparse(resized(call, {5000: 37})) == \
        "index_add(torch.randn(37, 64), torch.randint(0, 37, (900,)), 37, BLOCK=5000, n=37, num_warps=4)"
    assert size_ranges({"size4096": 4096, "size5": 5}) == {"size4096": (256, 2048), "size5": (2, 2)}


def test_each_drawn_case_changes_one_size_and_the_inputs_follow(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text("def f(x, y, n):\n    return x\n")
    task = task_from_call(kernel, "f(torch.randn(300, 64), torch.randn(64), n=300)")
    assert task.cases == [{}] and task.inferred_ranges
    drawn = task.generated_cases(random.Random(7), 4)
    assert all(len(case) == 1 for case in drawn) and {k for c in drawn for k in c} == {"size300", "size64"}
    made = task.inputs(size300=45)
    assert isinstance(made, Call)
    assert made.args[0].shape == (45, 64) and made.args[1].shape == (64,) and made.kwargs == {"n": 45}
    assert task.inputs().args[0].shape == (300, 64)


ROW_SUM = '''
import torch, triton, triton.language as tl

@triton.jit
def row_sum_kernel(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    tl.store(out_ptr + row, tl.sum(tl.load(x_ptr + row * N + cols), 0))

def row_sum(x):
    m, n = x.shape
    out = torch.empty(ROWS, device=x.device, dtype=x.dtype)
    row_sum_kernel[(min(m, ROWS),)](x, out, N=n)
    return out
'''
CALL, REFERENCE = "row_sum(torch.randn(300, 64))", "lambda x: x.sum(1)"


def test_a_size_the_kernel_as_written_fails_is_held_against_no_one(tmp_path):
    # tl.arange needs a power of two: every drawn column count fails the task's own kernel, which is then
    # correct (a note says which case and why) and no candidate is held to it
    (tmp_path / "rs.py").write_text(ROW_SUM.replace("ROWS", "m"))
    spec = TaskSpec(kernel=str(tmp_path / "rs.py"), call=CALL, reference=REFERENCE)
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1, seed=3),
                      candidate=str(tmp_path / "rs.py"))
    assert report.run("baseline").correct and report.run("candidate").correct
    held = [c.label for c in report.run("candidate").cases if c.generated]
    # the scaled-input case takes the call's sizes of 256 or more cut to an eighth (64 stays as written)
    assert held[-1] == "size300=37,input scale=16.0"
    assert held[:-1] and all(label.startswith("size300=") for label in held[:-1])
    assert any("size64=" in n and "held against no kernel" in n and "power of 2" in n for n in report.notes)


def test_a_candidate_right_at_the_calls_rows_only_is_rejected(tmp_path):
    why = candidate_rejection(tmp_path, ROW_SUM.replace("ROWS", "m"), ROW_SUM.replace("ROWS", "300"), "row_sum",
                              CALL, REFERENCE, seeds=1)
    assert '"label": "size300=' in why and "shape" in why, why[:800]


def test_the_scaled_case_widens_float_inputs_only(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text("def f(x, i, pair, eps=1e-5):\n    return x\n")
    task = task_from_call(kernel, "f(torch.ones(8), torch.arange(8), (torch.ones(8), torch.arange(8)), eps=0.5)")
    args, kwargs = task.arguments(task.scaled_case())
    assert args[0].tolist() == [16.0] * 8 and args[1].tolist() == list(range(8))
    assert args[2][0].tolist() == [16.0] * 8 and args[2][1].tolist() == list(range(8)) and kwargs == {"eps": 0.5}


def test_a_kernel_wrong_on_wide_inputs_is_not_held_to_them(tmp_path):
    # the task's own kernel clamps: the scaled case is outside what it does, so its identical rewrite passes
    import runpy

    from conftest import FIXTURES

    cheat = runpy.run_path(str(FIXTURES / "judge_audit" / "p10_randn_range_only.py"))
    (tmp_path / "own.py").write_text(cheat["CANDIDATE"])
    spec = TaskSpec(kernel=str(tmp_path / "own.py"), call=cheat["CALL"], reference=cheat["REFERENCE"])
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(tmp_path / "own.py"))
    assert report.run("baseline").correct and report.run("candidate").correct
    assert any(n.startswith("held-out case size1000=125,input scale=16.0 is held against no kernel")
               for n in report.notes)


def test_the_scaled_case_is_the_largest_held_out_one():
    from harness.task import Task

    task = Task(name="t", entry=print, inputs=lambda n, m=1: (), cases=[dict(n=4096)],
                heldout=[dict(n=1), dict(n=77, m=3), dict(n=200)])
    assert task.scaled_case() == {"n": 77, "m": 3, "input scale": 16.0}


# Rows summed after rounding to fp16: an error of about 2**-11 of each element, absolute in the row's sum,
# so it grows sixteen-fold with the scaled inputs while the task's atol (set for randn) would not.
ROW_SUM_FP16 = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + row, tl.sum(x.to(tl.float16).to(tl.float32), axis=0))


def row_sum(x):
    out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
    _row_sum[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
'''


def _own_kernel_run(tmp_path, source: str, reference: str):
    """The task's own kernel (`source`) checked against `reference` at atol 2e-2, rtol 1e-3: the run's report
    and the own kernel's record, which must pass."""
    (tmp_path / "own.py").write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "own.py"), call="row_sum(torch.randn(300, 64))",
                    reference=reference, tolerances={"atol": 2e-2, "rtol": 1e-3})
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1))
    own = report.run("baseline")
    assert own is not None and own.correct, own
    return report, own


def test_the_scaled_case_asks_the_same_digits_of_larger_outputs(tmp_path):
    report, own = _own_kernel_run(tmp_path, ROW_SUM_FP16, "lambda x: x.sum(1)")
    assert not any("held against no kernel" in n for n in report.notes), report.notes
    scaled = next(c for c in own.cases if "input scale" in c.case)
    # a sum is linear: its outputs grow as its inputs do, and so does the atol they are held to
    assert scaled.checks[0].atol == pytest.approx(16 * 2e-2) and scaled.checks[0].mismatched == 0
    assert all(c.checks[0].atol == pytest.approx(2e-2) for c in own.cases if "input scale" not in c.case)


def test_magnitude_growth_follows_the_outputs_within_its_limit():
    import torch

    from harness.reference import magnitude_growth

    x = torch.randn(64, 64, dtype=torch.float64)
    assert magnitude_growth(x, 16 * x, limit=256) == pytest.approx(16)
    assert magnitude_growth(x @ x, (16 * x) @ (16 * x), limit=256) == pytest.approx(256)
    assert magnitude_growth(x.exp(), (16 * x).exp(), limit=256) == 256  # exp's growth is cut at the limit
    softmax = torch.softmax(x, dim=1), torch.softmax(16 * x, dim=1)
    assert magnitude_growth(*softmax, limit=256) < 16  # normalised outputs barely grow
    assert magnitude_growth(x, x / 16, limit=256) == 1.0  # atol never shrinks
    assert magnitude_growth(torch.zeros(4), torch.ones(4), limit=256) == 1.0
    assert magnitude_growth(torch.arange(4), 16 * torch.arange(4), limit=256) == 1.0  # integers are exact


# Two outputs that grow differently with their inputs: a row's sum (linear) and its softmax (normalised).
SUM_AND_SOFTMAX = ROW_SUM_FP16.replace(
    "def _row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):",
    "def _row_sum(x_ptr, out_ptr, p_ptr, n, BLOCK: tl.constexpr):").replace(
    "    tl.store(out_ptr + row, tl.sum(x.to(tl.float16).to(tl.float32), axis=0))\n",
    "    tl.store(out_ptr + row, tl.sum(x.to(tl.float16).to(tl.float32), axis=0))\n"
    "    e = tl.exp(tl.where(offs < n, x, -float('inf')) - tl.max(tl.where(offs < n, x, -float('inf')), axis=0))\n"
    "    tl.store(p_ptr + row * n + offs, e / tl.sum(e, axis=0), mask=offs < n)\n").replace(
    "    _row_sum[(x.shape[0],)](x, out, x.shape[1],",
    "    p = torch.empty_like(x)\n    _row_sum[(x.shape[0],)](x, out, p, x.shape[1],").replace(
    "    return out\n", "    return out, p\n")


def test_each_output_of_the_scaled_case_grows_its_own_atol(tmp_path):
    assert SUM_AND_SOFTMAX.count("return out, p") == 1
    _, own = _own_kernel_run(tmp_path, SUM_AND_SOFTMAX, "lambda x: (x.sum(1), torch.softmax(x, 1))")
    scaled = next(c for c in own.cases if "input scale" in c.case)
    sums, softmax = scaled.checks
    assert sums.atol == pytest.approx(16 * 2e-2)
    # the softmax's outputs stay in [0, 1] and grow far less than its inputs: its atol stays near the task's
    assert 2e-2 <= softmax.atol < 16 * 2e-2 / 2
