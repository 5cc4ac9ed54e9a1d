"""Coalesced accesses for lanes that walk a strided axis (issue 27, family 5; pattern
contiguous-innermost-axis): a kernel whose program index is the unit-stride axis while its lanes step a
row apart takes 8, 16 or 32 consecutive program indices as a second tile axis. Each variant is judged on
the interpreter against the kernel as written, on column counts no variant's width divides; the column
sum is compiled for sm90 to show the load it was after."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from conftest import candidate_rejection

from diagnose.engine import diagnose
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite

PATTERN = "contiguous-innermost-axis"
ROOT = Path(__file__).resolve().parent.parent

# A first draft of x.sum(0): one program per column, its lanes down the rows, a loop over row blocks (the
# launch triage's fixture for an uncoalesced load).
COLUMN_SUM = (ROOT / "tests" / "fixtures" / "wild" / "column_gather.py").read_text()

# Softmax over dim 0 with the whole column in one tile, read and written through the strides, the
# address built in named steps.
COLUMN_SOFTMAX = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def column_softmax_kernel(x_ptr, y_ptr, M, stride_row, stride_col, BLOCK: tl.constexpr):
        col = tl.program_id(0)
        rows = tl.arange(0, BLOCK)
        offsets = rows * stride_row + col * stride_col
        mask = rows < M
        x = tl.load(x_ptr + offsets, mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + offsets, e / tl.sum(e, axis=0), mask=mask)


    def column_softmax(x):
        y = torch.empty_like(x)
        column_softmax_kernel[(x.shape[1],)](x, y, x.shape[0], x.stride(0), x.stride(1),
                                             BLOCK=triton.next_power_of_2(x.shape[0]))
        return y
    ''')

# A transpose written output-row first: the load strided, the store contiguous.
TRANSPOSE = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def transpose_kernel(x_ptr, out_ptr, M, N, BLOCK: tl.constexpr):
        j = tl.program_id(0)
        for start in range(0, M, BLOCK):
            i = start + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + i * N + j, mask=i < M)
            tl.store(out_ptr + j * M + i, v, mask=i < M)


    def transpose(x):
        m, n = x.shape
        out = torch.empty(n, m, dtype=x.dtype, device=x.device)
        transpose_kernel[(n,)](x, out, m, n, BLOCK=32)
        return out
    ''')


def test_a_column_per_program_takes_8_16_and_32_columns_across_the_lanes(tmp_path):
    variants = rewrite(PATTERN, COLUMN_SUM, {})
    assert [v.params["rows_per_program"] for v in variants] == [8, 16, 32]
    assert all(v.params["coalesce"] for v in variants)
    text = variants[0].source
    assert "_kb_row = tl.program_id(0) * _KB_ROWS + tl.arange(0, _KB_ROWS)[:, None]" in text
    assert "col = _kb_row" in text and "acc = tl.zeros([_KB_ROWS, BLOCK], dtype=tl.float32)" in text
    assert "tl.store(OUT + col, tl.sum(acc, axis=1, keep_dims=True), mask=_kb_row_ok)" in text
    assert "_col_sum[(triton.cdiv(kb_rows, kb_rows_per_program),)]" in text
    # 37 columns: no width divides them, the last program's columns run past the grid; 130 rows: a partial
    # row block
    for shape in ("130, 37", "1, 5", "64, 8"):
        for variant in variants:
            assert candidate_rejection(tmp_path, COLUMN_SUM, variant.source, "col_sum",
                                       f"col_sum(torch.randn({shape}))", "lambda x: x.sum(0)") == "", shape


def test_columns_reduced_and_written_back_through_named_strides(tmp_path):
    variants = rewrite(PATTERN, COLUMN_SOFTMAX, {})
    assert len(variants) == 3
    assert "tl.max(x, axis=1, keep_dims=True)" in variants[0].source
    for shape in ("20, 13", "3, 40"):
        for variant in variants:
            assert candidate_rejection(tmp_path, COLUMN_SOFTMAX, variant.source, "column_softmax",
                                       f"column_softmax(torch.randn({shape}))", "lambda x: torch.softmax(x, 0)") == ""


def test_a_transpose_reads_its_columns_together(tmp_path):
    variants = rewrite(PATTERN, TRANSPOSE, {})
    assert len(variants) == 3
    for shape in ("70, 19", "5, 33"):
        for variant in variants:
            assert candidate_rejection(tmp_path, TRANSPOSE, variant.source, "transpose",
                                       f"transpose(torch.randn({shape}))", "lambda x: x.t().contiguous()") == ""


def test_the_strided_load_becomes_a_vector_load_for_sm90(tmp_path):
    from harness.capture import capture_call

    def loads(source: str, name: str) -> set[str]:
        path = tmp_path / name / "column_gather.py"
        path.parent.mkdir()
        path.write_text(source)
        ptx = capture_call(path, "col_sum(torch.randn(4096, 4096))", target="cuda:90")[0].stages["ptx"]
        return set(re.findall(r"ld\.global(?:\.\w+)*", ptx))

    # As written each lane loads one 4-byte element of its own sector; with 8 columns a program, each
    # thread loads 4 consecutive columns at once (the coalescer orders the tile along them).
    assert loads(COLUMN_SUM, "written") == {"ld.global.b32"}
    assert loads(rewrite(PATTERN, COLUMN_SUM, {})[0].source, "eight") == {"ld.global.v4.b32"}


@pytest.mark.parametrize("old, new", [
    # lanes at unit stride (an ordinary row kernel): nothing to coalesce
    ("X + r * stride + col", "X + col * stride + r"),
    # lanes scaled by the literal 1
    ("X + r * stride + col", "X + r * 1 + col * stride"),
    # strided lanes, but the program index only inside the lanes' term: more programs a tile would not help
    ("X + r * stride + col", "X + (r + col * rows) * stride"),
    # a branch on the program index: the rows rewrite declines it
    ("        acc += tl.load(", "        if col % 2 == 0:\n            acc += 0.0\n        acc += tl.load("),
])
def test_what_is_not_the_class_or_cannot_be_carried_over_is_declined(old, new):
    assert old in COLUMN_SUM
    assert rewrite(PATTERN, COLUMN_SUM.replace(old, new), {}) == []


def test_a_round_no_finding_asked_for_gets_no_variants():
    # Stride-generic kernels (`cols * stride_col`) are unit-stride at most launches: only the launch's
    # finding says the lanes are strided.
    assert rewrite(PATTERN, COLUMN_SUM, {"finding": ""}) == []
    assert len(rewrite(PATTERN, COLUMN_SUM, {"finding": "memory.uncoalesced"})) == 3


def test_the_uncoalesced_finding_names_the_rewrite_and_the_rewrite_retires_it(tmp_path):
    path = tmp_path / "column_gather.py"
    path.write_text(COLUMN_SUM)
    call = "col_sum(torch.randn(256, 512))"
    answer = diagnose(request_from(KernelInput(kernel=str(path), call=call)), None, level_max="L1")
    assert "memory.uncoalesced" in [f.kind for f in answer.findings]
    assert any(r.pattern_id == PATTERN and r.for_finding == "memory.uncoalesced" for r in answer.recommendations)
    path.write_text(rewrite(PATTERN, COLUMN_SUM, {})[0].source)
    answer = diagnose(request_from(KernelInput(kernel=str(path), call=call)), None, level_max="L1")
    assert "memory.uncoalesced" not in [f.kind for f in answer.findings]


# A first draft that sums into a float argument: the loop would grow it into a column of the tile.
PARAMETER_SUM = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def column_sum_kernel(x_ptr, out_ptr, M, stride_m, total, BLOCK: tl.constexpr):
        col = tl.program_id(0)
        for start in range(0, M, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            total += tl.sum(tl.load(x_ptr + rows * stride_m + col, mask=rows < M, other=0.0), axis=0)
        tl.store(out_ptr + col, total)


    def column_sum(x):
        m, n = x.shape
        out = torch.empty(n, dtype=torch.float32, device=x.device)
        column_sum_kernel[(n,)](x, out, m, x.stride(0), 0.0, BLOCK=32)
        return out
    ''')


def test_a_parameter_a_loop_grows_into_a_tile_is_declined_but_one_moved_before_the_loop_is_not(tmp_path):
    # Triton refuses a loop-carried value whose type changes (the interpreter does not): both row rewrites
    # decline the first; `x_ptr += col` in straight-line code makes the pointer a column once, before any loop.
    assert rewrite(PATTERN, PARAMETER_SUM, {}) == [] and rewrite("rows-per-program", PARAMETER_SUM, {}) == []
    moved = textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def column_sum_kernel(x_ptr, out_ptr, M, stride_m, BLOCK: tl.constexpr):
            col = tl.program_id(0)
            x_ptr += col
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, M, BLOCK):
                rows = start + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + rows * stride_m, mask=rows < M, other=0.0)
            tl.store(out_ptr + col, tl.sum(acc, axis=0))


        def column_sum(x):
            m, n = x.shape
            out = torch.empty(n, dtype=torch.float32, device=x.device)
            column_sum_kernel[(n,)](x, out, m, x.stride(0), BLOCK=32)
            return out
        ''')
    variants = rewrite(PATTERN, moved, {})
    assert len(variants) == 3, moved
    for variant in variants:
        assert candidate_rejection(tmp_path, moved, variant.source, "column_sum", "column_sum(torch.randn(70, 19))",
                                   "lambda x: x.sum(0)") == ""


def test_the_columns_are_capped_by_the_block_and_a_block_the_launch_does_not_fix_is_declined():
    # 8,192 elements a tile at most: a 2048-row block takes 4 columns, one of 8192 none (as written)
    assert [v.params["rows_per_program"] for v in rewrite(PATTERN, COLUMN_SUM.replace("BLOCK=256", "BLOCK=2048"), {})] == [4]
    assert rewrite(PATTERN, COLUMN_SUM.replace("BLOCK=256", "BLOCK=8192"), {}) == []
    # a block a heuristic picks at the launch (next_power_of_2 of the rows: up to 2**20) has no cap to read
    tuned = COLUMN_SUM.replace("@triton.jit\n", '@triton.heuristics({"BLOCK": lambda a: triton.next_power_of_2(a["rows"])})\n'
                               "@triton.jit\n").replace(", BLOCK=256)", ")")
    assert "triton.heuristics" in tuned and rewrite(PATTERN, tuned, {}) == []
