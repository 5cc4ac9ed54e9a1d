"""Fitting a tile to the extent it covers (issue 27, parallelism; pattern fit-tile-to-extent, found by
L1's `parallelism.masked-lanes`): a block wider than its axis is sized at launch to the axis, and the
lanes it frees can go to the axis the loop walks. Each variant is judged on the interpreter, on
extents below and above the block as written."""

from __future__ import annotations

import textwrap

import pytest
from conftest import FIXTURES, candidate_rejection

from diagnose.engine import diagnose
from diagnose.render import to_markdown
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite

PATTERN = "fit-tile-to-extent"

# The shape of TritonBench-T's first draft of torch.sum: 128 rows per program, 64 columns a step, the
# blocks bound to names the grid reads too; summing a vector is one row.
ROWS = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def row_sum_kernel(X, Sum, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_rows = rows < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for off in range(0, N, BLOCK_N):
            cols = off + tl.arange(0, BLOCK_N)
            acc += tl.load(X + rows[:, None] * N + cols[None, :], mask=mask_rows[:, None] & (cols < N)[None, :], other=0.0)
        tl.store(Sum + rows, tl.sum(acc, axis=1), mask=mask_rows)


    def row_sum(x):
        M, N = x.shape
        out = torch.empty(M, dtype=x.dtype, device=x.device)
        BLOCK_M = 128
        BLOCK_N = 64
        grid = lambda META: (triton.cdiv(M, BLOCK_M),)
        row_sum_kernel[grid](x, out, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        return out
    ''')


def test_a_row_block_wider_than_the_rows_is_sized_to_them_and_its_lanes_go_to_the_loop(tmp_path):
    fitted, grown = rewrite(PATTERN, ROWS, {})
    assert fitted.params == {"fit": "BLOCK_M to M"} and grown.params == {"fit": "BLOCK_M to M", "grow": "BLOCK_N"}
    assert "    BLOCK_M = min(128, triton.next_power_of_2(M))\n    BLOCK_N = 64\n" in fitted.source
    assert "    BLOCK_N = 64 * (128 // min(128, triton.next_power_of_2(M)))\n" in grown.source
    reference = "lambda x: x.sum(1)"
    for variant in (fitted, grown):
        # one row (the vector sum), a few rows, and more rows than the block as written
        for shape in ("1, 3000", "5, 200", "300, 70"):
            assert candidate_rejection(tmp_path, ROWS, variant.source, "row_sum", f"row_sum(torch.randn({shape}))", reference) == ""


def test_one_tile_across_a_short_row_takes_the_rows_width_at_the_launch(tmp_path):
    source = (FIXTURES / "wild" / "narrow_rows.py").read_text()
    (variant,) = rewrite(PATTERN, source, {})
    assert "BLOCK=min(block, triton.next_power_of_2(x.shape[1]))" in variant.source  # the grid never reads it
    for shape in ("64, 4", "10, 200"):
        assert candidate_rejection(tmp_path, source, variant.source, "scale_rows", f"scale_rows(torch.randn({shape}))",
                          "lambda x, block=256: x * 2") == ""
    # L1's finding at such a launch now names the pattern
    answer = diagnose(request_from(KernelInput(kernel=str(FIXTURES / "wild" / "narrow_rows.py"),
                                               call="scale_rows(torch.randn(65536, 4))")), None, level_max="L1")
    assert answer.findings[0].kind == "parallelism.masked-lanes" and "fit-tile-to-extent" in to_markdown(answer)


@pytest.mark.parametrize("replacements, applies", [
    # a number at the launch that the grid reads back as META["BLOCK_M"]: the grid follows
    ([("    BLOCK_M = 128\n", ""), ("BLOCK_M=BLOCK_M", "BLOCK_M=128"),
      ("triton.cdiv(M, BLOCK_M)", "triton.cdiv(M, META['BLOCK_M'])")], True),
    # a number at the launch that the grid does not read: programs would skip rows
    ([("    BLOCK_M = 128\n", ""), ("BLOCK_M=BLOCK_M", "BLOCK_M=128"), ("triton.cdiv(M, BLOCK_M)", "triton.cdiv(M, 128)")],
     False),
    # the block is bound before the extent is known
    ([("    M, N = x.shape\n", ""), ("    BLOCK_N = 64\n", "    BLOCK_N = 64\n    M, N = x.shape\n"),
      ("torch.empty(M,", "torch.empty(x.shape[0],")], False),
])
def test_the_block_changes_only_where_the_grid_follows_it(replacements, applies):
    source = ROWS
    for before, after in replacements:
        assert before in source
        source = source.replace(before, after)
    variants = rewrite(PATTERN, source, {})
    assert bool(variants) == applies
    if applies:
        assert "BLOCK_M=min(128, triton.next_power_of_2(M))" in variants[0].source


def test_a_dot_kernel_keeps_blocks_of_sixteen():
    source = ROWS.replace("tl.sum(acc, axis=1)", "tl.sum(tl.dot(acc, acc.T), axis=1)")
    (fitted, _) = rewrite(PATTERN, source, {})
    assert "BLOCK_M = max(16, min(128, triton.next_power_of_2(M)))" in fitted.source


# What the split rewrite leaves of the torch.sum draft (TritonBench-T, on the H100 2026-12-05): the row start
# bound to a name, the grid counted into `n_blocks`, and a split copy of the kernel launched in both branches
# of a dtype test, whose stores became masked atomics.
SPLIT = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def row_sum_kernel(X, Sum, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        row_start = tl.program_id(0) * BLOCK_M
        rows = row_start + tl.arange(0, BLOCK_M)
        mask_rows = rows < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for off in range(0, N, BLOCK_N):
            cols = off + tl.arange(0, BLOCK_N)
            acc += tl.load(X + rows[:, None] * N + cols[None, :], mask=mask_rows[:, None] & (cols < N)[None, :], other=0.0)
        tl.store(Sum + rows, tl.sum(acc, axis=1), mask=mask_rows)


    @triton.jit
    def row_sum_kernel_split(X, Sum, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        row_start = tl.program_id(0) * BLOCK_M
        rows = row_start + tl.arange(0, BLOCK_M)
        mask_rows = rows < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for off in range(tl.program_id(1) * BLOCK_N, N, BLOCK_N * tl.num_programs(1)):
            cols = off + tl.arange(0, BLOCK_N)
            acc += tl.load(X + rows[:, None] * N + cols[None, :], mask=mask_rows[:, None] & (cols < N)[None, :], other=0.0)
        tl.atomic_add(Sum + rows, tl.sum(acc, axis=1), mask=mask_rows, sem="relaxed")


    def row_sum(x):
        M, N = x.shape
        out = torch.empty(M, dtype=torch.float32, device=x.device)
        BLOCK_M = 128
        BLOCK_N = 64
        n_blocks = triton.cdiv(M, BLOCK_M)
        n_split = max(1, min(8, -(-16 // n_blocks)))
        if n_split > 1:
            if x.dtype == torch.float32:
                out.zero_()
                row_sum_kernel_split[(n_blocks, n_split)](x, out, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
            else:
                out.zero_()
                row_sum_kernel_split[(n_blocks, n_split)](x.float(), out, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        else:
            row_sum_kernel[(n_blocks,)](x, out, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        return out
    ''')


def test_after_a_split_the_idle_rows_are_found_on_the_atomic_and_the_tile_is_fitted(tmp_path):
    """The split's own output must stay open to the fit: its row mask is on an atomic now, its load mask
    moves with the loop, its block starts through a name and its grid is a name (each declined before)."""
    path = tmp_path / "split.py"
    path.write_text(SPLIT)
    answer = diagnose(request_from(KernelInput(kernel=str(path), call="row_sum(torch.randn(1, 5000))")), None,
                      level_max="L1")
    idle = next(f for f in answer.findings if f.kind == "parallelism.masked-lanes")
    assert "99% of the lanes" in idle.title and idle.gain == 16.0
    fitted, grown = rewrite(PATTERN, SPLIT, {})
    assert "    BLOCK_M = min(128, triton.next_power_of_2(M))\n" in fitted.source
    assert "    BLOCK_N = 64 * (128 // min(128, triton.next_power_of_2(M)))\n" in grown.source
    for variant in (fitted, grown):
        for shape in ("1, 3000", "5, 200", "300, 70"):  # split (16 and 4 ways), and one program a row block
            assert candidate_rejection(tmp_path, SPLIT, variant.source, "row_sum", f"row_sum(torch.randn({shape}))",
                                       "lambda x: x.sum(1)") == ""


@pytest.mark.parametrize("before, after", [
    # the block's name also sizes a kernel that takes it as a stride: fitting it would move that kernel's rows
    ("    return out\n", "    pad_kernel[(M,)](out, BLOCK_M, W=BLOCK_M)\n    return out\n"),
    # the split copy's grid does not follow the block
    ("row_sum_kernel_split[(n_blocks, n_split)](x, out", "row_sum_kernel_split[(triton.cdiv(M, 128), n_split)](x, out"),
])
def test_a_block_name_other_launches_read_differently_is_left(before, after):
    pad = ("\n\n@triton.jit\ndef pad_kernel(Out, stride, W: tl.constexpr):\n"
           "    tl.store(Out + tl.program_id(0) * W + tl.arange(0, W), 0.0)\n")
    source = SPLIT.replace("\n\ndef row_sum(x):", pad + "\n\ndef row_sum(x):").replace(before, after)
    assert source.count(after) == 1
    assert [v for v in rewrite(PATTERN, source, {}) if v.params.get("fit") == "BLOCK_M to M"] == []
