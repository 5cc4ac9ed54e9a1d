"""Wrapper overhead (issue 27, host side): syncs, printing and logging leave the wrapper, a scalar uploaded
per call is made on the device, and outputs a kernel writes are no longer zero-filled first; the judge's
poisoned allocations catch an output the kernel does not write in full, so the zero fill is dropped only
where it was never needed. L1 reports the wrapper's waits as the rewrite sees them."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import FIXTURES

from diagnose.engine import diagnose
from diagnose.render import to_markdown
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite
from diagnose.rewriters.host import HostWait, host_waits
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
    trimmed, emptied, both = rewrite(PATTERN, CHATTY, {})
    assert trimmed.params == {"removed": "host-waits", "statements": 3, "uploads": 0}
    assert "synchronize" not in trimmed.source and "logger.debug" not in trimmed.source
    assert "    if x.numel() > 10**9:\n        pass\n" in trimmed.source  # a block left empty keeps a pass
    assert emptied.params == {"removed": "empty-outputs", "allocations": 1}
    assert "out = torch.empty_like(x)" in emptied.source
    assert both.params["removed"] == "host-waits+empty-outputs" and "synchronize" not in both.source \
        and "out = torch.empty_like(x)" in both.source
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
    assert [v.params["removed"] for v in rewrite(PATTERN, atomic, {})] == ["host-waits"]


IGNORED_ROWS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def ce_fwd_kernel(X, Y, Loss, stride, n_cols, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    y = tl.load(Y + row)
    if y == ignore_index:
        return
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), 0))
    tl.store(Loss + row, lse - tl.load(X + row * stride + y).to(tl.float32))


def cross_entropy(x, y, ignore_index=-100):
    n_rows, n_cols = x.shape
    loss = torch.zeros(n_rows, dtype=torch.float32, device=x.device)
    ce_fwd_kernel[(n_rows,)](x, y, loss, x.stride(0), n_cols, ignore_index, BLOCK=triton.next_power_of_2(n_cols))
    return loss.sum() / (y != ignore_index).sum()
'''


_EXIT = "    if y == ignore_index:\n        return\n"
_STORE = "    tl.store(Loss + row, lse - tl.load(X + row * stride + y).to(tl.float32))\n"


@pytest.mark.parametrize("source", [
    IGNORED_ROWS,  # Liger's early exit on ignore_index: random test targets never take it
    IGNORED_ROWS.replace(_EXIT, "").replace(_STORE, "    if y != ignore_index:\n    " + _STORE),  # a store under an if
    IGNORED_ROWS.replace(_EXIT, "").replace(_STORE, _STORE.replace("))\n", "), mask=y >= 0)\n")),  # a mask from data
    # a helper's store masked by its parameter, which the kernel loaded (tried as an adversary)
    IGNORED_ROWS.replace(_EXIT, "").replace(_STORE, _STORE.replace("    tl.store(Loss + row, ", "    _put(Loss + row, ")
                                                   .replace("))\n", "), y >= 0)\n")).replace(
        "@triton.jit\ndef ce_fwd_kernel", "@triton.jit\ndef _put(p, v, ok):\n    tl.store(p, v, mask=ok)\n\n\n"
        "@triton.jit\ndef ce_fwd_kernel"),
], ids=["early-return", "store-under-if", "mask-from-loaded-value", "mask-through-a-helper"])
def test_a_kernel_that_may_skip_what_it_writes_keeps_its_zero_fill(source):
    # a helper's audit: with the zeros gone, the skipped rows were whatever memory held (NaN, poisoned)
    assert source == IGNORED_ROWS or _EXIT not in source
    assert "empty-outputs" not in {v.params["removed"] for v in rewrite(PATTERN, source, {})}
    assert "empty-outputs" in {v.params["removed"] for v in rewrite(PATTERN, IGNORED_ROWS.replace(_EXIT, ""), {})}


def test_a_helper_that_ends_with_its_return_is_no_early_exit():
    helper = IGNORED_ROWS.replace(_EXIT, "").replace(
        "@triton.jit\ndef ce_fwd_kernel", "@triton.jit\ndef _row():\n    return tl.program_id(0)\n\n\n@triton.jit\n"
        "def ce_fwd_kernel").replace("    row = tl.program_id(0)\n", "    row = _row()\n")
    assert "def _row():" in helper and "row = _row()" in helper
    assert "empty-outputs" in {v.params["removed"] for v in rewrite(PATTERN, helper, {})}


def test_a_host_bound_finding_reaches_the_rewrite():
    # host-bound: the device idles while the wrapper runs. Launch-bound (the kernel itself takes a few
    # microseconds) is persistent-kernel's: a trimmed wrapper does not shorten a tiny kernel.
    assert [p.id for p in load_catalog() if "profile.host-bound" in p.symptoms] == [PATTERN]


AXPY = FIXTURES / "host_waits" / "axpy.py"


def test_the_wrappers_waits_are_found_outside_the_kernels_with_which_can_go():
    assert host_waits(AXPY.read_text()) == [
        HostWait(18, "torch.tensor(..., device=)", True),  # alpha, one value with its dtype: a fill makes it
        HostWait(22, "torch.cuda.synchronize()", True),
        HostWait(27, ".item()", False),  # the caller reads the norm: the host needs the value
    ]
    uploads = textwrap.dedent('''\
        import torch
        def f(x, alpha, scales):
            a = torch.tensor(2.0, device=x.device)  # a literal: torch.full infers float32 as torch.tensor does
            b = torch.tensor(alpha, device=x.device)  # no dtype: a NumPy float64 would change dtype under full
            c = torch.tensor([1.0, 2.0], dtype=x.dtype, device=x.device)  # several values
            d = torch.tensor(scales, dtype=x.dtype)  # on the host: no upload, no wait
            return a, b, c, d
        ''')
    assert [(w.line, w.removable) for w in host_waits(uploads)] == [(3, True), (4, False), (5, False)]
    (variant,) = rewrite(PATTERN, uploads, {})
    assert variant.params == {"removed": "host-waits", "statements": 0, "uploads": 1}
    assert "a = torch.full((), 2.0, device=x.device)" in variant.source
    assert "b = torch.tensor(alpha, device=x.device)" in variant.source and "torch.tensor([1.0, 2.0]" in variant.source
    assert host_waits("def broken(:\n") == []


def test_a_scalar_made_on_the_device_computes_what_the_upload_did(tmp_path):
    (waitless, _, _) = rewrite(PATTERN, AXPY.read_text(), {})
    assert waitless.params == {"removed": "host-waits", "statements": 1, "uploads": 1}
    assert "alpha_t = torch.full((), alpha, dtype=x.dtype, device=x.device)" in waitless.source
    assert "torch.cuda.synchronize" not in waitless.source
    (tmp_path / "axpy.py").write_text(AXPY.read_text())
    candidate = tmp_path / "axpy_waitless.py"
    candidate.write_text(waitless.source)
    spec = TaskSpec(kernel=str(tmp_path / "axpy.py"), call="axpy(torch.randn(3000), torch.randn(3000), 0.37)",
                    reference="lambda x, y, alpha: y + alpha * x")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(candidate),
                      candidate_entry="axpy")
    assert report.run("baseline").correct and report.run("candidate").correct, report.to_dict()


def test_l1_reports_the_waits_and_sends_the_removable_ones_to_the_trim(tmp_path):
    answer = diagnose(request_from(KernelInput(kernel=str(AXPY), call="axpy(torch.randn(4096), torch.randn(4096), 0.5)")),
                      None, level_max="L1")
    sync = next(f for f in answer.findings if f.kind == "host.sync")
    assert "3 time(s) per call" in sync.title and sync.kernel_lines == [18, 22, 27] and sync.confidence == 0.85
    assert "2 of these 3 can go" in sync.explanation
    assert PATTERN in to_markdown(answer)
    # A wrapper whose only wait reads a value back: reported for a rewrite that keeps the value on the device,
    # not sent to the trim, which cannot remove it.
    read_back = tmp_path / "read_back.py"
    read_back.write_text(AXPY.read_text().replace("    if x.is_cuda:\n        torch.cuda.synchronize()\n", "")
                         .replace("torch.tensor(alpha, dtype=x.dtype, device=x.device)",
                                  "torch.full((), float(torch.as_tensor(alpha).item()), dtype=x.dtype, device=x.device)"))
    answer = diagnose(request_from(KernelInput(kernel=str(read_back), call="axpy(torch.randn(4096), torch.randn(4096), 0.5)")),
                      None, level_max="L1")
    kinds = [f.kind for f in answer.findings]
    assert "host.read-back" in kinds and "host.sync" not in kinds
    assert next(f for f in answer.findings if f.kind == "host.read-back").confidence == 0.5
