"""Sums that add in 16-bit floats: the L3 finding from the TTIR, the fp32-accumulation rewrite, and a run
that starts from the repaired kernel when the task's own fails its checks (--repair-baseline)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import candidate_rejection

from diagnose.analyzers import precision
from diagnose.records import EvidenceLog
from diagnose.rewriters import rewrite
from harness.capture import capture_call
from harness.errors import UserFacingError

# A row variance as E[x^2] - E[x]^2, its sums in the loaded tile's own dtype; an index sum beside it on
# one line, and a max (which rounds nothing).
KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def row_var_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    mean = tl.sum(x) / n
    var = x.sum(axis=0) * 0.0 + tl.sum(x * x, axis=0) / n - mean * mean
    top = tl.max(x)
    tl.store(out_ptr + row, var + top * 0.0)


@triton.jit
def mixed_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr, tl.sum(x) + tl.sum(offs))


def row_var(x):
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    row_var_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def mixed(x):
    out = torch.empty(1, dtype=torch.float32, device=x.device)
    mixed_kernel[(1,)](x, out, BLOCK=x.numel())
    return out
'''

# fp16, since the interpreter computes it as numpy does (its bf16 is emulated); rows shifted by 3 so that
# E[x^2] - E[x]^2 cancels most of the digits an fp16 sum keeps.
TASK = '''\
import torch

from rowvar import row_var as entry  # noqa: F401


def inputs(rows, n):
    g = torch.Generator().manual_seed(rows * n)
    return ((torch.randn(rows, n, generator=g) + 3).to(torch.float16),)


def reference(x):
    return x.float().var(dim=1, unbiased=False)


tolerances = {"atol": 2e-3, "rtol": 2e-3}
cases = [dict(rows=4, n=4096)]
'''


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision")
    (folder / "rowvar.py").write_text(KERNEL)
    return folder / "rowvar.py"


def _finding(path: Path, call: str):
    (art,) = capture_call(path, call)
    log = EvidenceLog()
    return precision.analyze(art, log), log


def test_sums_of_a_bf16_tile_are_found_in_the_ttir_with_their_lines(compiled):
    (found,), log = _finding(compiled, "row_var(torch.randn(4, 1000, dtype=torch.bfloat16))")
    assert found.kind == "precision.low-precision-accumulation" and found.level == "L3" and found.defect
    assert found.kernel_lines == [11, 12]  # tl.sum(x); x.sum(axis=0) and tl.sum(x * x) on one line; not the max
    assert "bf16" in found.title and "1024 terms" in found.title
    assert "arith.addf ... : bf16" in log.items[0].claim and "rowvar.py:1" in log.items[0].claim


def test_sums_already_in_fp32_or_over_few_terms_are_not_findings(compiled):
    assert _finding(compiled, "row_var(torch.randn(4, 1000))")[0] == []
    assert _finding(compiled, "row_var(torch.randn(4, 8, dtype=torch.float16))")[0] == []


def test_a_line_that_also_sums_integers_is_left_out_of_the_repair(compiled):
    (found,), _ = _finding(compiled, "mixed(torch.randn(1024, dtype=torch.float16))")
    assert "fp16" in found.title and found.kernel_lines == []  # reported, but no line the rewrite may widen
    assert rewrite("fp32-accumulation", KERNEL, {"lines": found.kernel_lines}) == []


def test_the_rewrite_widens_only_the_sums_on_the_lines_it_is_given():
    assert rewrite("fp32-accumulation", KERNEL, {}) == []  # the source alone cannot tell bf16 from int
    (variant,) = rewrite("fp32-accumulation", KERNEL, {"lines": [11, 12, 13]})
    assert variant.params == {"widened": 3, "lines": [11, 12]}
    assert "mean = tl.sum(_kb_float32_if_16_bit(x)) / n" in variant.source
    assert "_kb_float32_if_16_bit(x).sum(axis=0)" in variant.source
    assert "tl.sum(_kb_float32_if_16_bit(x * x), axis=0)" in variant.source
    assert variant.source.count("def _kb_float32_if_16_bit(x):") == 1
    assert "top = tl.max(x)" in variant.source and "tl.sum(x) + tl.sum(offs)" in variant.source
    assert rewrite("fp32-accumulation", variant.source, {"lines": [11, 12]}) == []  # already widened


def _write_task(tmp_path: Path) -> Path:
    (tmp_path / "rowvar.py").write_text(KERNEL)
    (tmp_path / "task.py").write_text(TASK)
    return tmp_path / "task.py"


def _run(task: Path, run_dir: Path, **options):
    from marker_judge import MarkerJudge

    from diagnose.optimize import OptimizeOptions, optimize
    from harness.task import TaskSpec

    judge = MarkerJudge(task.parent / "rowvar.py", "never-present", fast_us=50.0)
    try:
        return optimize(TaskSpec(path=str(task)), OptimizeOptions(rounds=1, backend="interpreter", seeds=1, **options),
                        run_dir, judge=judge)
    finally:
        judge.close()


def test_a_failing_kernel_stops_the_run_and_the_error_names_its_repair(tmp_path):
    task = _write_task(tmp_path)
    with pytest.raises(UserFacingError) as err:
        _run(task, tmp_path / "run")
    assert "fails its checks" in err.value.problem
    assert "L3 precision.low-precision-accumulation" in err.value.problem and "fp32-accumulation" in err.value.problem
    assert "--repair-baseline" in err.value.fix
    with sqlite3.connect(tmp_path / "run" / "rounds.sqlite") as db:
        assert db.execute("select status from run").fetchone()[0] == "failed"


def test_with_repair_baseline_the_run_starts_from_the_checked_repair(tmp_path):
    task = _write_task(tmp_path)
    store = _run(task, tmp_path / "run", repair_baseline=True)
    try:
        info = store.run()
        repaired = info.options["repaired"]
        assert (repaired["finding"], repaired["pattern"], repaired["lines"]) == (
            "precision.low-precision-accumulation", "fp32-accumulation", [11, 12])
        assert "outputs differ from the reference" in repaired["why_failed"]
        round0 = (tmp_path / "run" / "round-000.py").read_text()
        assert "tl.sum(_kb_float32_if_16_bit(x))" in round0
        assert (tmp_path / "run" / "round-000.original.py").read_text() == KERNEL
        baseline = info.baseline["runs"][0]
        assert baseline["role"] == "baseline" and baseline["correct"]
        assert baseline["source"] == str(tmp_path / "run" / "round-000.py")
        assert info.status.value == "finished"
        # no round was a repair: the planner never offers fp32-accumulation as a speed round
        assert all(r.hypothesis.pattern != "fp32-accumulation" for r in store.rounds())
    finally:
        store.close()



def test_a_widened_sum_of_ints_stays_an_int_sum(tmp_path):
    # the lines come from an fp16 launch's IR; the same kernel called on int32 must not sum through fp32
    # (a second audit: an int32 cumsum of values near 1e5 was off by 66)
    source = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def cumsum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + offs, tl.cumsum(x, 0), mask=offs < n)


def cumsum(x):
    out = torch.empty_like(x)
    cumsum_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out
'''
    (variant,) = rewrite("fp32-accumulation", source, {"lines": [10]})
    assert "tl.cumsum(_kb_float32_if_16_bit(x), 0)" in variant.source
    call = "cumsum(torch.randint(90000, 110000, (300,), dtype=torch.int32))"
    assert candidate_rejection(tmp_path, source, variant.source, "cumsum", call, "lambda x: x.cumsum(0).int()") == ""
