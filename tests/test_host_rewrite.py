"""Wrapper overhead (issue 27, host side): syncs, printing and logging leave the wrapper, and outputs a
kernel writes are no longer zero-filled first; the judge's poisoned allocations catch an output the kernel
does not write in full, so the zero fill is dropped only where it was never needed."""

from __future__ import annotations

import json
import textwrap

from diagnose.rewriters import rewrite
from harness.run import RunOptions, run_task
from harness.task import TaskSpec
from kb.patterns import load_catalog

PATTERN = "trim-wrapper-overhead"

CHATTY = textwrap.dedent('''\
    import logging

    import torch
    import triton
    import triton.language as tl

    logger = logging.getLogger(__name__)


    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


    def double(x):
        out = torch.zeros_like(x)
        logger.debug("doubling %d elements", x.numel())
        if x.numel() > 10**9:
            print("large input")
        double_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        torch.cuda.synchronize()
        return out
    ''')


# the interpreter's torch has no CUDA to synchronize: the judge's baseline is the wrapper without the sync
QUIET_SYNC = CHATTY.replace("    torch.cuda.synchronize()\n", "")


def _check(tmp_path, source: str, original: str, reference: str = "lambda x: x * 2") -> str:
    """The candidate's rejection ("" when it passes); the original must pass."""
    (tmp_path / "double.py").write_text(original)
    candidate = tmp_path / "double_trim.py"
    candidate.write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "double.py"), call="double(torch.randn(1000))", reference=reference)
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(candidate),
                      candidate_entry="double")
    assert report.run("baseline").correct, report.to_dict()
    run = report.run("candidate")
    return "" if run.correct else json.dumps(report.to_dict()["runs"][-1])


def test_the_wrapper_loses_its_sync_logging_and_zero_fill_and_stays_correct(tmp_path):
    trimmed, emptied = rewrite(PATTERN, CHATTY, {})
    assert trimmed.params == {"removed": "syncs-and-logging", "statements": 3}
    assert "synchronize" not in trimmed.source and "logger.debug" not in trimmed.source
    assert "    if x.numel() > 10**9:\n        pass\n" in trimmed.source  # a block left empty keeps a pass
    assert emptied.params == {"removed": "empty-outputs", "allocations": 1}
    assert "out = torch.empty_like(x)" in emptied.source
    (emptied_here,) = [v for v in rewrite(PATTERN, QUIET_SYNC, {}) if v.params["removed"] == "empty-outputs"]
    assert _check(tmp_path, trimmed.source, QUIET_SYNC) == "" and _check(tmp_path, emptied_here.source, QUIET_SYNC) == ""


def test_a_zero_fill_the_kernel_relies_on_is_kept_by_the_judge_or_the_rule(tmp_path):
    # a kernel that writes every other element: without the zero fill the rest is never written
    halves = QUIET_SYNC.replace("tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)",
                            "tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, "
                            "mask=(offs < n) & (offs % 2 == 0))")
    (emptied,) = [v for v in rewrite(PATTERN, halves, {}) if v.params["removed"] == "empty-outputs"]
    rejection = _check(tmp_path, emptied.source, halves,
                       "lambda x: torch.where(torch.arange(x.numel()) % 2 == 0, x * 2, torch.zeros_like(x))")
    assert json.loads(rejection)["cases"][0]["checks"][0]["unwritten"] == 500  # the odd half, poisoned
    # a kernel that accumulates with atomics: no empty-outputs variant at all
    atomic = CHATTY.replace("tl.store(out_ptr + offs,", "tl.atomic_add(out_ptr + offs,")
    assert [v.params["removed"] for v in rewrite(PATTERN, atomic, {})] == ["syncs-and-logging"]


def test_a_host_bound_finding_reaches_the_rewrite():
    # host-bound: the device idles while the wrapper runs. Launch-bound (the kernel itself takes a few
    # microseconds) is persistent-kernel's: a trimmed wrapper does not shorten a tiny kernel.
    assert [p.id for p in load_catalog() if "profile.host-bound" in p.symptoms] == [PATTERN]
