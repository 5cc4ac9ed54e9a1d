"""Folding the wrapper's PyTorch work into the kernel (issue 27, host side; pattern fold-wrapper-work):
a scaling by a number the wrapper takes moves onto the tile the kernel loads, a clone the kernel only
reads is dropped, a clone it writes over becomes an empty allocation. Each variant is judged on the
interpreter against the reference, and L1 no longer sees the PyTorch pass it removed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from diagnose.engine import diagnose
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite
from harness.capture import intercept_call
from harness.run import RunOptions, run_task
from harness.task import TaskSpec

PATTERN = "fold-wrapper-work"
FIXTURES = Path(__file__).parent / "fixtures"

KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + y, mask=mask)

'''

# The shape of TritonBench-T's first draft of torch.add: the scaling, then broadcast, a dtype check, a
# cast and a contiguous copy on the way to the launch, the launch written one argument per line.
DRAFT = KERNEL + textwrap.dedent('''\

    def add(input, other, *, alpha=1):
        scaled = other * alpha
        a, b = torch.broadcast_tensors(input, scaled)
        dtype = torch.result_type(a, b)
        out = torch.empty_like(a, dtype=dtype)
        b = b.to(dtype)
        b_contiguous = b.contiguous()
        n = out.numel()
        add_kernel[(triton.cdiv(n, 256),)](
            a.contiguous(), b_contiguous, out,
            n,
            BLOCK=256,
        )
        return out
    ''')


def _judge(tmp_path: Path, original: str, candidate: str, call: str, reference: str, entry: str) -> str:
    """The candidate's rejection ("" when it passes); the original must pass. The task allows the
    wrappers' own torch work, as the TritonBench importer allows a draft's (`allow_torch`)."""
    (tmp_path / "original.py").write_text(original)
    (tmp_path / "candidate.py").write_text(candidate)
    (tmp_path / "task.py").write_text(textwrap.dedent(f"""\
        import torch
        from original import {entry} as entry
        allow_torch = ["mul", "div", "clone", "broadcast_tensors", "result_type"]
        reference = {reference}
        def inputs(n):
            return {call}
        cases = [dict(n=1000)]
        """))
    report = run_task(TaskSpec(path=str(tmp_path / "task.py")), RunOptions(backend="interpreter", time=False, seeds=2),
                      candidate=str(tmp_path / "candidate.py"), candidate_entry=entry)
    assert report.run("baseline").correct, report.to_dict()
    run = report.run("candidate")
    return "" if run.correct else json.dumps(report.to_dict()["runs"][-1])


def _torch_work(path: Path, call: str) -> tuple[tuple[str, int, int], ...]:
    """The PyTorch ops (op, calls, bytes) the call makes data with beside its launch, as L1 records them."""
    (facts,) = intercept_call(path, call).facts()
    return facts.wrapper_work


def test_a_scaling_in_the_wrapper_moves_onto_the_tile_the_kernel_loads(tmp_path):
    (variant,) = rewrite(PATTERN, DRAFT, {})
    assert variant.params == {"folded": "other * scale", "into": "add_kernel.y_ptr", "loads": 1}
    new = variant.source
    assert "scaled = other.to(torch.result_type(other, alpha))" in new  # the product's dtype, no pass when equal
    assert "y = (tl.load(y_ptr + offs, mask=mask, other=0) * y_ptr_scale)" in new
    assert "BLOCK: tl.constexpr, y_ptr_scale):" in new
    assert "        BLOCK=256,\n        y_ptr_scale=alpha,\n    )" in new  # laid out as the launch was
    # alpha (keyword-only, default 1) reaches the kernel as 1, which Triton specializes as a constant;
    # a float scale is the next test's.
    assert _judge(tmp_path, DRAFT, new, "(torch.randn(n), torch.randn(n))", "lambda input, other: input + other", "add") == ""
    # L1 saw the wrapper's mul before; after the fold the call runs no PyTorch op that makes data.
    call = "add(torch.randn(1000), torch.randn(1000), alpha=2.5)"
    assert _torch_work(tmp_path / "original.py", call) == (("mul", 1, 8000),)
    assert _torch_work(tmp_path / "candidate.py", call) == ()


def test_a_kernel_other_launches_call_is_copied_and_only_the_folded_launch_calls_the_copy(tmp_path):
    path = FIXTURES / "wrapper_work" / "scaled_add.py"  # add() scales, add_clean() launches the same kernel
    (variant,) = rewrite(PATTERN, path.read_text(), {})
    new = variant.source
    assert "def add_kernel_folded(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, y_ptr_scale):" in new
    assert "add_kernel_folded[(triton.cdiv(x.numel(), 1024),)](x, scaled.contiguous(), out, x.numel(), BLOCK=1024, " \
        "y_ptr_scale=alpha)" in new
    assert "    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)" in new  # add_clean's
    assert _judge(tmp_path, path.read_text(), new, "(torch.randn(n), torch.randn(n), 2.0)",
                  "lambda x, y, alpha=1.0: x + alpha * y", "add") == ""
    assert _judge(tmp_path, path.read_text(), new, "(torch.randn(n), torch.randn(n))", "lambda x, y: x + y", "add_clean") == ""
    n = 1 << 20
    call = f"add(torch.randn({n}), torch.randn({n}), 2.0)"
    found = diagnose(request_from(KernelInput(kernel=str(path), call=call)), None, level_max="L1").findings
    assert any(f.kind == "host.torch-work" for f in found)
    (tmp_path / "folded.py").write_text(new)
    found = diagnose(request_from(KernelInput(kernel=str(tmp_path / "folded.py"), call=call)), None, level_max="L1").findings
    assert not any(f.kind == "host.torch-work" for f in found)


CLONES = '''\
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVERY: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (offs % EVERY == 0)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def relu(x, out=None, every=1):
    if out is None:
        out = x.clone()
    relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256, EVERY=every)
    return out


def relu_of_copy(x):
    source = x.clone()
    out = x.new_empty(x.shape)
    relu_kernel[(triton.cdiv(x.numel(), 256),)](source, out, x.numel(), BLOCK=256, EVERY=1)
    return out
'''


def test_clones_the_kernel_only_reads_or_writes_over_are_dropped(tmp_path):
    variants = {v.params["as"]: v for v in rewrite(PATTERN, CLONES, {}) if "as" in v.params}
    written_over = variants["empty_like (written over)"].source
    assert "        out = torch.empty_like(x)\n" in written_over and written_over.startswith("import torch\n")
    read_only = variants["the input (read only)"].source
    assert "    source = x\n" in read_only
    reference = "lambda x, *a, **k: torch.relu(x)"
    assert _judge(tmp_path, CLONES, written_over, "(torch.randn(n),)", reference, "relu") == ""
    assert _judge(tmp_path, CLONES, read_only, "(torch.randn(n),)", reference, "relu_of_copy") == ""
    # A kernel that writes every other element needs the clone's values in the rest: the rewrite
    # still applies (it cannot see the mask's values), and the judge's poisoned allocation rejects it.
    halves = "lambda x, out=None, every=1: torch.where(torch.arange(x.numel()) % 2 == 0, torch.relu(x), x)"
    rejection = json.loads(_judge(tmp_path, CLONES, written_over, "(torch.randn(n), None, 2)", halves, "relu"))
    (check,) = rejection["cases"][0]["checks"]
    assert check["unwritten"] == 500 and check["mismatched"] == 500


@pytest.mark.parametrize("before, after", [
    ("    return out\n", "    return out, scaled\n"),  # the scaled tensor leaves the wrapper
    ("    scaled = other * alpha\n", "    scaled = other * other\n"),  # a tensor, not a number
    ("    scaled = other * alpha\n", "    if alpha != 1:\n        other = other * alpha\n    scaled = other\n"),
    ("mask=mask, other=0)", "mask=mask, other=float('-inf'))"),  # masked lanes the scale would change
    ("    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + y, mask=mask)\n",
     "    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + y, mask=mask)\n    tl.store(y_ptr + offs, y, mask=mask)\n"),
])
def test_work_the_kernel_cannot_take_over_is_left_alone(before, after):
    source = DRAFT.replace(before, after)
    assert source != DRAFT
    assert rewrite(PATTERN, source, {}) == []


INT_DIVIDED = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(t_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(t_ptr + offs, mask=mask), mask=mask)


def scaled(x, divisor: int = 4):
    t = x / divisor
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    n = t.numel()
    copy_kernel[(triton.cdiv(n, 1024),)](t, out, n, BLOCK=1024)
    return out
'''


def test_an_integer_tensor_divided_by_an_int_is_folded_as_the_float_true_division_gives(tmp_path):
    # torch.result_type(int tensor, int) is the integer type; x / 4 is float (a helper's audit probe)
    (variant,) = rewrite(PATTERN, INT_DIVIDED, {})
    assert "torch.get_default_dtype()" in variant.source
    for inputs in ("(torch.randint(-9, 9, (n,), dtype=torch.int32),)", "(torch.randn(n),)"):
        assert _judge(tmp_path, INT_DIVIDED, variant.source, inputs, "lambda x: x / 4", "scaled") == ""
