"""Several rows per program (issue 27, family 1; pattern rows-per-program): a row-per-program kernel's
short 1-D tile becomes a [ROWS, BLOCK] tile of consecutive rows. Each variant is judged on the
interpreter against the kernel as written, on rows shorter and longer than the written block and on
row counts that leave the last program's rows partly past the grid; what the rewrite cannot carry
over is declined."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import candidate_rejection

from diagnose.engine import diagnose
from diagnose.render import to_markdown
from diagnose.request import KernelInput, request_from
from diagnose.rewriters import rewrite

PATTERN = "rows-per-program"
ROOT = Path(__file__).resolve().parent.parent

# Our corpus's 2x2 average pooling: one output row per program, its block a literal the grid repeats
# (so fit-tile-to-extent declines it), 28 of 256 lanes live on 56x56 planes.
POOL = (ROOT / "corpora" / "operators" / "avg_pool2d" / "avg_pool2d.py").read_text()
POOL_REFERENCE = "lambda x: torch.nn.functional.avg_pool2d(x, 2)"

# A row reduction on a lambda grid: a max, a sum without an axis, a per-row scalar stored, a weight
# vector that does not depend on the row.
SOFTMAX = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def softmax_kernel(x_ptr, w_ptr, out_ptr, lse_ptr, stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        top = tl.max(x, axis=0)
        e = tl.exp(x - top)
        total = tl.sum(e)
        tl.store(out_ptr + row * stride + cols, e / total * w, mask=mask)
        tl.store(lse_ptr + row, top + tl.log(total))


    def softmax(x, w):
        rows, cols = x.shape
        out = torch.empty_like(x)
        lse = torch.empty(rows, dtype=torch.float32, device=x.device)
        BLOCK = triton.next_power_of_2(cols)
        grid = lambda meta: (rows,)
        softmax_kernel[grid](x, w, out, lse, x.stride(0), cols, BLOCK=BLOCK)
        return out, lse
    ''')
SOFTMAX_REFERENCE = ("lambda x, w: (torch.softmax(x.float(), 1) * w, torch.logsumexp(x.float(), 1))")

# Our corpus's index_add: an index loaded per row, atomics into the rows it names (duplicates included).
SCATTER = (ROOT / "corpora" / "operators" / "index_add" / "index_add.py").read_text()
SCATTER_REFERENCE = "lambda src, idx, bins: torch.zeros(bins, src.shape[1]).index_add_(0, idx, src)"

# A loop over column chunks with a tile accumulator: the block steps the loop, so it is not fitted.
ROW_SUM = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))


    def row_sum(x):
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=32)
        return out
    ''')


def test_short_rows_take_fitted_lanes_and_several_rows_per_program(tmp_path):
    variants = rewrite(PATTERN, POOL, {})
    assert [v.params["tile"] for v in variants] == ["1x the written tile", "2x the written tile", "4x the written tile"]
    first = variants[0].source
    assert "kb_row_block = min(256, triton.next_power_of_2(max(1, w_out)))" in first
    assert "kb_rows_per_program = max(1, min(1 * 256, max(256, 8192)) // kb_row_block)" in first
    assert "avg_pool2d_kernel[(triton.cdiv(kb_rows, kb_rows_per_program), triton.cdiv(w_out, 256))]" in first
    assert "BLOCK=kb_row_block, _kb_n_rows=kb_rows, _KB_ROWS=kb_rows_per_program)" in first
    assert "mask=mask & _kb_row_ok" in first and "tl.arange(0, BLOCK)[None, :]" in first
    # rows of 3 outputs, of 300 (wider than the block: two programs a row), and 7 x 5 rows, which no
    # rows-per-program count divides
    for shape in ("2, 3, 10, 6", "1, 1, 4, 600", "1, 7, 10, 8"):
        for variant in variants:
            assert candidate_rejection(tmp_path, POOL, variant.source, "avg_pool2d", f"avg_pool2d(torch.randn({shape}))",
                                       POOL_REFERENCE) == "", (shape, variant.params)


def test_a_row_reduction_reduces_each_row_of_the_tile_and_keeps_a_weight_vector_one_row(tmp_path):
    variants = rewrite(PATTERN, SOFTMAX, {})
    # masked lanes may reach a reduction, so the block stays as written and the rows come in 2, 4, 8
    assert [v.params.get("rows_per_program") for v in variants] == [2, 4, 8]
    source = variants[1].source
    assert "top = tl.max(x, axis=1, keep_dims=True)" in source and "total = tl.sum(e, axis=1, keep_dims=True)" in source
    assert "w = tl.load(w_ptr + cols, mask=mask, other=0.0)" in source  # the weights do not depend on the row
    assert "tl.store(lse_ptr + row, top + tl.log(total), mask=_kb_row_ok)" in source
    assert "softmax_kernel[(triton.cdiv(kb_rows, kb_rows_per_program),)]" in source  # the lambda grid read
    assert "kb_rows_per_program = max(1, min(4, 8192 // BLOCK))" in source
    for shape in ("5, 20", "3, 64", "9, 3"):
        call = f"softmax(torch.randn({shape}), torch.rand({shape.split(', ')[1]}))"
        for variant in variants:
            assert candidate_rejection(tmp_path, SOFTMAX, variant.source, "softmax", call, SOFTMAX_REFERENCE) == ""


def test_rows_scattered_by_a_loaded_index_stay_exact_with_duplicates(tmp_path):
    variants = rewrite(PATTERN, SCATTER, {})
    assert variants and "dst = tl.load(idx_ptr + row, mask=_kb_row_ok)" in variants[0].source
    call = "index_add(torch.randn(13, 10), torch.tensor([0, 1, 1, 4, 2, 2, 2, 0, 3, 4, 4, 1, 0]), 5)"
    for variant in variants:
        assert candidate_rejection(tmp_path, SCATTER, variant.source, "index_add", call, SCATTER_REFERENCE) == ""


def test_a_block_that_steps_a_loop_keeps_its_width_and_the_rows_come_in_twos_fours_and_eights(tmp_path):
    variants = rewrite(PATTERN, ROW_SUM, {})
    assert [v.params["rows_per_program"] for v in variants] == [2, 4, 8]
    assert "kb_rows_per_program = max(1, min(8, 8192 // 32))" in variants[2].source  # a 32-lane block: 8 rows fit
    assert "acc = tl.zeros([_KB_ROWS, BLOCK], dtype=tl.float32)" in variants[0].source
    assert "tl.store(out_ptr + row, tl.sum(acc, axis=1, keep_dims=True), mask=_kb_row_ok)" in variants[0].source
    for shape in ("11, 70", "2, 5"):
        for variant in variants:
            assert candidate_rejection(tmp_path, ROW_SUM, variant.source, "row_sum", f"row_sum(torch.randn({shape}))",
                                       "lambda x: x.sum(1)") == ""


@pytest.mark.parametrize("source, replacements", [
    # a scalar a loop makes a tile of the lanes (not a column of the rows): no number starts that
    (ROW_SUM, [("acc = tl.zeros([BLOCK], dtype=tl.float32)", "acc = 0.0"), ("tl.sum(acc, axis=0)", "tl.sum(acc)")]),
    # a scalar carried by a loop whose first value is not a number
    (ROW_SUM, [("acc = tl.zeros([BLOCK], dtype=tl.float32)", "acc = n_cols * 0.0"),
               ("acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)",
                "acc += tl.sum(tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0))"),
               ("tl.sum(acc, axis=0)", "acc")]),
    # a branch on the row (it would test a tensor), and an early return
    (POOL, [("    mask = ow < W_out\n", "    mask = ow < W_out\n    if row % 2 == 0:\n        mask = mask & (ow > 0)\n")]),
    (POOL, [("    plane = row // H_out\n",
             "    for _ in range(1):\n        if row >= H_out * 1000:\n            return\n    plane = row // H_out\n")]),
    # a loop whose bound depends on the row
    (ROW_SUM, [("range(0, n_cols, BLOCK)", "range(0, n_cols - row, BLOCK)")]),
    # already a 2-D tile, or a grid-stride loop
    (POOL, [("ow = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)", "ow = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]")]),
    (POOL, [("plane = row // H_out", "plane = row // H_out + tl.num_programs(0) * 0")]),
    # a row-dependent value stored through a pointer that does not depend on the row
    (SOFTMAX, [("tl.store(lse_ptr + row, top + tl.log(total))", "tl.store(lse_ptr + cols, top + tl.log(total) + cols * 0.0, mask=mask)")]),
    # an atomic once per program: it would count programs, not rows
    (SCATTER, [("    tl.atomic_add(out_ptr + dst * stride_out + cols, vec, mask=mask)\n",
                "    tl.atomic_add(out_ptr + dst * stride_out + cols, vec, mask=mask)\n    tl.atomic_add(idx_ptr, 0)\n")]),
    # a hint on a row-dependent value
    (POOL, [("plane = row // H_out", "plane = tl.multiple_of(row // H_out, 4)")]),
])
def test_what_the_tile_cannot_carry_over_is_declined(source, replacements):
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    assert rewrite(PATTERN, source, {}) == []


def test_a_block_the_kernel_reads_elsewhere_is_not_fitted(tmp_path):
    # The mean divides by the block as written: fitting the lanes would change it, so the rows take it as is.
    source = SOFTMAX.replace("total = tl.sum(e)", "total = tl.sum(e) * (BLOCK / BLOCK)")
    variants = rewrite(PATTERN, source, {})
    assert [v.params.get("rows_per_program") for v in variants] == [2, 4, 8]
    assert "kb_row_block" not in variants[0].source
    call = "softmax(torch.randn(7, 20), torch.rand(20))"
    assert candidate_rejection(tmp_path, source, variants[2].source, "softmax", call, SOFTMAX_REFERENCE) == ""


def test_the_masked_lanes_finding_names_the_rewrite(tmp_path):
    path = tmp_path / "avg_pool2d.py"
    path.write_text(POOL)
    answer = diagnose(request_from(KernelInput(kernel=str(path), call="avg_pool2d(torch.randn(4, 8, 56, 56))")), None,
                      level_max="L1")
    assert "parallelism.masked-lanes" in [f.kind for f in answer.findings]  # 28 of 256 lanes live
    assert any(r.pattern_id == PATTERN and r.for_finding == "parallelism.masked-lanes" for r in answer.recommendations)
    assert "rows-per-program" in to_markdown(answer)


# What a review found wrong in the first version, each now declined or exact (probes written for it).
PAD = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def pad_kernel(x_ptr, out_ptr, W, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        lanes = tl.arange(0, BLOCK)
        src = lanes - 1
        x = tl.load(x_ptr + row * W + src, mask=(src >= 0) & (src < W), other=0.0)
        tl.store(out_ptr + row * (W + 1) + lanes, x, mask=lanes <= W)


    def pad(x):
        out = torch.zeros(x.shape[0], x.shape[1] + 1, dtype=x.dtype, device=x.device)
        pad_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=64)
        return out
    ''')


def test_lanes_that_must_cover_more_than_the_masked_extent_are_not_fitted(tmp_path):
    # The store covers W + 1 columns through `lanes <= W`: a block fitted to W would drop the last one.
    variants = rewrite(PATTERN, PAD, {})
    assert variants and all("kb_row_block" not in v.source for v in variants)
    for variant in variants:
        assert candidate_rejection(tmp_path, PAD, variant.source, "pad", "pad(torch.randn(3, 4))",
                                   "lambda x: torch.nn.functional.pad(x, (1, 0))") == ""


NORM = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def norm_kernel(x_ptr, w_ptr, out_ptr, wsum_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        top = tl.max(x, axis=0, keep_dims=True)
        scale = tl.load(w_ptr + 0 * row, mask=None)
        tl.store(out_ptr + row * n_cols + cols, (x - top) * w * scale, mask=mask)
        tl.store(wsum_ptr, tl.sum(w, axis=0))


    def norm(x, w):
        rows, cols = x.shape
        out = torch.empty_like(x)
        wsum = torch.empty(1, dtype=x.dtype, device=x.device)
        norm_kernel[(rows,)](x, w, out, wsum, cols, BLOCK=triton.next_power_of_2(cols))
        return out, wsum
    ''')


def test_a_reduction_of_a_row_free_value_stays_a_scalar_and_given_options_are_kept(tmp_path):
    # A weight vector's sum stored through a scalar pointer, a max that already keeps its dims, and an
    # explicit mask=None on a row's load.
    variants = rewrite(PATTERN, NORM, {})
    assert variants
    text = variants[0].source
    assert "tl.max(x, axis=1, keep_dims=True)" in text and text.count("keep_dims") == 1
    assert "tl.store(wsum_ptr, tl.sum(w, axis=None))" in text
    assert "scale = tl.load(w_ptr + 0 * row, mask=_kb_row_ok)" in text
    reference = "lambda x, w: ((x - x.max(1, keepdim=True).values) * w * w[0], w.sum().reshape(1))"
    for variant in variants:
        assert candidate_rejection(tmp_path, NORM, variant.source, "norm", "norm(torch.randn(5, 20), torch.rand(20))",
                                   reference) == ""


@pytest.mark.parametrize("old, new", [
    # a tile filled with a row's value
    ("    cols = tl.arange(0, BLOCK)\n", "    cols = tl.arange(0, BLOCK) + tl.full([BLOCK], row, tl.int32) * 0\n"),
    # a function the rewrite cannot read (an import), handed a tile
    ("    e = tl.exp(x - top)\n", "    e = helpers.exp_of(x - top)\n"),
    # a reduction's options by position
    ("    top = tl.max(x, axis=0)\n", "    top = tl.max(x, 0, False)\n"),
])
def test_what_the_rewrite_cannot_read_is_declined(old, new):
    source = SOFTMAX.replace("import torch\n", "import torch\nimport helpers\n")
    assert old in source
    assert rewrite(PATTERN, source.replace(old, new), {}) == []


def test_an_axis_written_in_hex_is_read_not_raised():
    for axis in ("0x0", "axis=0x0"):
        assert len(rewrite(PATTERN, POOL.replace("row = tl.program_id(0)", f"row = tl.program_id({axis})"), {})) == 3


def test_empty_rows_and_a_grid_bound_before_a_reshape(tmp_path):
    # `grid` holds the row count of the moment it was bound; the launch comes after a reshape.
    source = ROW_SUM.replace("    row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=32)\n",
                             "    grid = (x.shape[0],)\n    n = x.shape[1]\n    x = x.reshape(-1)\n"
                             "    row_sum_kernel[grid](x, out, n, BLOCK=32)\n")
    assert "x.reshape(-1)" in source
    # (another function binding `grid` to a lambda does not change how this launch's tuple is read)
    source += "\n\ndef other(n):\n    grid = lambda meta: (n,)\n    return grid\n"
    variants = rewrite(PATTERN, source, {})
    assert variants and "kb_rows = grid[0]" in variants[0].source
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "row_sum", "row_sum(torch.randn(9, 16))",
                                   "lambda x: x.sum(1)") == ""
    # rows of no columns: the fitted block stays at least 1 (next_power_of_2(0) is 0)
    fitted = rewrite(PATTERN, SCATTER, {})[0]
    assert "triton.next_power_of_2(max(1, dim))" in fitted.source
    assert candidate_rejection(tmp_path, SCATTER, fitted.source, "index_add", "index_add(torch.randn(3, 0), torch.tensor([0, 1, 1]), 2)",
                               SCATTER_REFERENCE) == ""


# A first draft's early exit for the programs past the last row (the grid rounded up).
GUARDED = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def row_max_kernel(x_ptr, out_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        if n_cols == 0:
            return
        if row >= n_rows:
            return
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
        tl.store(out_ptr + row, tl.max(x, axis=0))


    def row_max(x):
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(x.shape[0], 4) * 4,)
        row_max_kernel[grid](x, out, x.shape[0], x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
    ''')


def test_an_early_exit_of_a_row_becomes_a_mask_on_what_follows_it(tmp_path):
    variants = rewrite(PATTERN, GUARDED, {})
    assert len(variants) == 3
    text = variants[0].source
    assert "    if n_cols == 0:\n        return\n" in text  # the whole program's exit stays a branch
    assert "_kb_row_ok = _kb_row_ok & ((row >= n_rows) == 0)" in text
    # 7 rows on a grid of 8 programs: the eighth row's exit is all that keeps it from writing past the output
    for shape in ("7, 20", "5, 3"):
        for variant in variants:
            assert candidate_rejection(tmp_path, GUARDED, variant.source, "row_max", f"row_max(torch.randn({shape}))",
                                       "lambda x: x.max(1).values") == "", (shape, variant.params)


def test_a_store_of_the_whole_program_after_a_rows_exit_is_declined():
    # it ran for the rows the exit let through; with several rows a program it would run for all of them
    source = GUARDED.replace("    tl.store(out_ptr + row, tl.max(x, axis=0))\n",
                             "    tl.store(out_ptr + row, tl.max(x, axis=0))\n    tl.store(out_ptr, 0.0)\n")
    assert "tl.store(out_ptr, 0.0)" in source and rewrite(PATTERN, source, {}) == []


def test_a_scalar_accumulator_starts_as_a_column_of_the_rows(tmp_path):
    # The first draft's `total = 0.0; total += tl.sum(...)` and a running max from float("-inf").
    source = ROW_SUM.replace("    acc = tl.zeros([BLOCK], dtype=tl.float32)\n",
                             "    acc = 0.0\n    top = -float(\"inf\")\n").replace(
        "        acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)\n",
        "        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)\n"
        "        acc += tl.sum(x)\n        top = tl.maximum(top, tl.max(tl.where(cols < n_cols, x, -float(\"inf\"))))\n").replace(
        "tl.store(out_ptr + row, tl.sum(acc, axis=0))", "tl.store(out_ptr + row, acc + top)")
    assert "acc = 0.0" in source and "acc + top" in source
    variants = rewrite(PATTERN, source, {})
    assert [v.params["rows_per_program"] for v in variants] == [2, 4, 8]
    text = variants[0].source
    assert "acc = tl.full([_KB_ROWS, 1], 0.0, tl.float32)" in text and 'top = tl.full([_KB_ROWS, 1], -float("inf"), tl.float32)' in text
    for shape in ("11, 70", "2, 5"):
        for variant in variants:
            assert candidate_rejection(tmp_path, source, variant.source, "row_sum", f"row_sum(torch.randn({shape}))",
                                       "lambda x: x.sum(1) + x.max(1).values") == ""


def test_a_grid_already_short_of_the_sms_gets_no_fewer_programs():
    launched = {"avg_pool2d_kernel": {"num_warps": 4, "num_stages": 3, "programs": 200, "sms": 132}}
    assert rewrite(PATTERN, POOL, {"launched": launched}) == []  # 100 programs at 2 rows: below 132
    launched["avg_pool2d_kernel"]["programs"] = 264
    assert len(rewrite(PATTERN, POOL, {"launched": launched})) == 3
    launched["avg_pool2d_kernel"] |= {"programs": 8, "sms": 0}  # not diagnosed for a GPU: no SM count
    assert len(rewrite(PATTERN, POOL, {"launched": launched})) == 3


def test_the_loop_hands_the_rewrites_the_launchs_programs_and_sms(tmp_path):
    from dataclasses import asdict

    from diagnose.loop_options import OptimizeOptions
    from diagnose.optimize import diagnose_kernel
    from diagnose.rounds import RoundsStore
    from harness.task import TaskSpec, task_from_call

    kernel = ROOT / "tests" / "fixtures" / "wild" / "column_scan.py"
    spec = TaskSpec(kernel=str(kernel), call="scan(torch.randn(4096, 1024))")
    store = RoundsStore(tmp_path / "run", create=True)
    try:
        store.create_run("run", "column_scan", spec, asdict(OptimizeOptions()))
        _, launched = diagnose_kernel(store, task_from_call(kernel, spec.call), kernel, "scan", OptimizeOptions(), None)
    finally:
        store.close()
    assert launched["_scan"] == {"num_warps": 4, "num_stages": 3, "programs": 8, "sms": 132}
