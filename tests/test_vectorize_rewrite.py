"""Vectorizing a scalar accumulation loop (issue 27, memory access; pattern vectorize-scalar-loop, found
by L1's `memory.scalar-loop`): its variants compute the same sums under the real judge (interpreter) on
windows shorter, equal to and longer than a chunk; where a loop does more than load and sum, it declines."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES

from diagnose.engine import diagnose
from diagnose.render import to_markdown
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite
from harness.run import RunOptions, run_task
from harness.task import TaskSpec

PATTERN = "vectorize-scalar-loop"
WINDOW = FIXTURES / "scalar_loops" / "window_mean.py"
REFERENCE = "lambda x, oh, ow: torch.nn.functional.adaptive_avg_pool2d(x[None], (oh, ow))[0]"


def _rejection(tmp_path, source: str, call: str) -> str:
    (tmp_path / "window_mean.py").write_text(WINDOW.read_text())
    (tmp_path / "candidate.py").write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "window_mean.py"), call=call, reference=REFERENCE)
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(tmp_path / "candidate.py"),
                      candidate_entry="window_mean")
    assert report.run("baseline").correct, report.to_dict()
    return "" if report.run("candidate").correct else json.dumps(report.to_dict()["runs"][-1])


def test_the_innermost_scalar_loop_loads_a_chunk_of_lanes_and_sums_them(tmp_path):
    variants = rewrite(PATTERN, WINDOW.read_text(), {})
    assert [v.params for v in variants] == [{"chunk": c, "loops": 1} for c in (16, 64, 256)] + \
        [{"tile": t, "loops": 1} for t in ("16x16", "32x32", "8x128")]
    source = variants[0].source
    assert "        _kb_w_end = min((w_out + 1) * w_size, in_w)\n" in source  # the bound, once
    assert "        for _kb_w0 in range(w_out * w_size, _kb_w_end, 16):\n            w = _kb_w0 + tl.arange(0, 16)\n" in source
    assert "total += tl.sum(tl.where(_kb_w_live, tl.load(x_ptr + idx, mask=_kb_w_live, other=0), 0)" \
        ".to(total.dtype))" in source  # summed in the accumulator's type, as its scalar adds were
    assert "count += tl.sum(tl.where(_kb_w_live, 1, 0).to(count.dtype))" in source
    assert "    for h in range(h_out * h_size, (h_out + 1) * h_size):\n" in source  # the outer loop stays
    # windows of 3, 16 and 37 columns: shorter than a chunk, exactly one, and a partial last chunk
    for shape, out in (("12, 12", "4, 4"), ("32, 64", "2, 4"), ("37, 74", "1, 2")):
        assert _rejection(tmp_path, source, f"window_mean(torch.randn({shape}), {out})") == ""
    assert _rejection(tmp_path, variants[2].source, "window_mean(torch.randn(37, 74), 1, 2)") == ""
    # fp16 values near 3500: 64 of them overflow fp16 (65504) where the fp32 running sum does not
    big = "window_mean((torch.rand(64, 64) * 1000 + 3000).half(), 1, 1)"
    assert _rejection(tmp_path, variants[1].source, big) == ""


def test_a_row_loop_around_the_scalar_loop_becomes_a_loop_over_tiles_of_the_window(tmp_path):
    tiled = {v.params["tile"]: v.source for v in rewrite(PATTERN, WINDOW.read_text(), {}) if "tile" in v.params}
    source = tiled["16x16"]
    assert "    _kb_h_end = (h_out + 1) * h_size\n    _kb_w_end = min((w_out + 1) * w_size, in_w)\n" in source
    assert "        h = (_kb_h0 + tl.arange(0, 16))[:, None]\n        _kb_h_live = h < _kb_h_end\n" in source
    assert "            _kb_hw_live = _kb_h_live & (w < _kb_w_end)\n" in source
    assert "count += tl.sum(tl.where(_kb_hw_live, 1, 0).to(count.dtype))" in source
    # windows of 3x3 and 37x37: smaller than a tile, and partial last tiles on both axes
    for shape, out in (("12, 12", "4, 4"), ("74, 74", "2, 2")):
        assert _rejection(tmp_path, source, f"window_mean(torch.randn({shape}), {out})") == ""
    assert _rejection(tmp_path, tiled["8x128"], "window_mean(torch.randn(74, 37), 2, 1)") == ""
    # a row value computed in the outer loop travels with the rows
    with_row = WINDOW.read_text().replace("            idx = h * stride_h + w * stride_w\n", "            idx = row + w * stride_w\n") \
        .replace("        for w in range(", "        row = h * stride_h\n        for w in range(")
    source = next(v.source for v in rewrite(PATTERN, with_row, {}) if v.params.get("tile") == "16x16")
    assert "        _kb_h_live = h < _kb_h_end\n        row = h * stride_h\n" in source
    assert _rejection(tmp_path, source, "window_mean(torch.randn(74, 74), 2, 2)") == ""


@pytest.mark.parametrize("before, after", [
    # the scalar loop's bound follows the row: a triangle, not a tile
    ("for w in range(w_out * w_size, min((w_out + 1) * w_size, in_w)):", "for w in range(w_out * w_size, h):"),
    # the row value is read after the loops
    ("    tl.store(out_ptr + pid, total / count)\n", "    tl.store(out_ptr + pid, total / count + h)\n"),
    # a load per row outside the scalar loop, or an atomic
    ("        for w in range(", "        r = tl.load(x_ptr + h)\n        for w in range("),
    ("        for w in range(", "        r = tl.atomic_max(out_ptr, h)\n        for w in range("),
])
def test_nests_that_are_not_a_window_get_no_tile(before, after):
    source = WINDOW.read_text()
    assert before in source
    assert not any("tile" in v.params for v in rewrite(PATTERN, source.replace(before, after), {}))


def test_l1_names_the_scalar_loop_above_its_missing_pipelining():
    answer = diagnose(request_from(KernelInput(kernel=str(WINDOW), call="window_mean(torch.randn(64, 64), 4, 4)")),
                      None, strategy="always-deep", level_max="L3")
    assert answer.findings[0].kind == "memory.scalar-loop"
    assert answer.findings[0].kernel_lines == [18]
    assert "vectorize-scalar-loop" in to_markdown(answer)  # and L3 kept it: no IR stage shows a loop's trip


@pytest.mark.parametrize("before, after", [
    ("            count += 1\n", "            count += 1\n            tl.store(out_ptr + pid, total)\n"),  # a store
    ("            total += tl.load(x_ptr + idx)\n", "            total += tl.load(x_ptr + idx, mask=idx >= 0)\n"),
    ("            total += tl.load(x_ptr + idx)\n", "            total += tl.load(x_ptr + idx) * total\n"),  # not a sum
    ("    tl.store(out_ptr + pid, total / count)\n", "    tl.store(out_ptr + pid, total / count + idx)\n"),  # read after
    ("for w in range(w_out * w_size, min((w_out + 1) * w_size, in_w)):",
     "for w in range(w_out * w_size, min((w_out + 1) * w_size, in_w), 2):"),  # a step of 2
])
def test_loops_that_do_more_than_load_and_sum_are_left_alone(before, after):
    source = WINDOW.read_text()
    assert before in source
    assert rewrite(PATTERN, source.replace(before, after), {}) == []
