"""Rewrites stay right beyond the judge's cases: the probes of a third adversarial review (2026-12-05), each a
small kernel on which a rewriter made a variant that computed other values than the kernel as written, at
some sizes or data, or did not run. Each rewriter now declines the kernel (or drops only the variant that was
wrong); the controls beside them show it still applies where it should, and the interpreter's judge passes
what is left."""

from __future__ import annotations

from conftest import candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.dispatch import size_dispatch

HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"

TAIL = HEADER + '''@triton.jit
def k(X, Y, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + offs, mask=mask, other=0.0)
    tl.store(Y + offs, x, mask=mask)


def f(x):
    y = torch.zeros_like(x)
    n = x.numel()
    k[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    return y
'''


def test_tail_split_declines_a_mask_or_offsets_changed_after_the_test_that_stands_for_them(tmp_path):
    assert rewrite("masked-tail-split", TAIL, {})  # the control
    narrowed = TAIL.replace("    tl.store(Y + offs, x, mask=mask)\n",
                            "    mask = mask & (x > 0)\n    tl.store(Y + offs, x, mask=mask)\n")
    rescaled = TAIL.replace("    mask = offs < N\n", "    offs = offs * 2\n    mask = offs < N\n")
    assert narrowed != TAIL and rescaled != TAIL
    assert rewrite("masked-tail-split", narrowed, {}) == []  # the fast branch dropped the narrowed mask too
    assert rewrite("masked-tail-split", rescaled, {}) == []  # `pid * BLOCK + BLOCK <= N` no longer bounds 2 * offs


PEEL = HEADER + '''@triton.jit
def k(X, Y, K, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.range(0, tl.cdiv(K, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < K, other=0.0)
    tl.store(Y + tl.arange(0, BLOCK), acc)


def f(x):
    y = torch.empty(16, dtype=torch.float32)
    k[(1,)](x, y, x.numel(), BLOCK=16)
    return y
'''


def test_peel_declines_a_step_given_by_keyword():
    assert rewrite("peel-loop-boundary", PEEL, {})
    every_other = PEEL.replace("tl.range(0, tl.cdiv(K, BLOCK))", "tl.range(0, tl.cdiv(K, BLOCK), step=2)")
    assert every_other != PEEL and rewrite("peel-loop-boundary", every_other, {}) == []


def test_peel_keeps_a_condition_joined_with_an_integer_tile(tmp_path):
    flagged = HEADER + '''@triton.jit
def k(X, F, Y, K, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < K, other=0.0)
        flags = tl.load(F + offs, mask=offs < K, other=0)
        acc += tl.where((offs < K) & (flags != 0), x, 0.0) + tl.where((offs < K) & flags, x, 0.0)
    tl.store(Y + tl.arange(0, BLOCK), acc)


def f(x, flags):
    y = torch.empty(16, dtype=torch.float32)
    k[(1,)](x, flags, y, x.numel(), BLOCK=16)
    return y
'''
    (variant,) = rewrite("peel-loop-boundary", flagged, {})
    # the boolean condition loses its bound in full blocks; `True & flags` is not `flags` (2 is true, 2 & True 0)
    assert "tl.where((flags != 0), x, 0.0)" in variant.source or "tl.where(flags != 0, x, 0.0)" in variant.source
    assert "tl.where((offs < K) & flags, x, 0.0)" in variant.source
    # per lane, the sum over blocks of x where f != 0, plus x where f's bit 0 is set (the int1 & int32 promotes)
    reference = ("lambda x, f: torch.nn.functional.pad(x * ((f != 0).float() + ((f & 1) != 0).float()), "
                 "(0, (-x.numel()) % 16)).reshape(-1, 16).sum(0)")
    call = "f(torch.randn(50), torch.randint(0, 4, (50,), dtype=torch.int32))"
    assert candidate_rejection(tmp_path, flagged, variant.source, "f", call, reference) == ""


ROW = HEADER + '''@triton.jit
def k(X, Y, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    tl.store(Y + row * stride + cols, x * 3.0, mask=mask)


def f(x):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    k[(n_rows,)](x, y, x.stride(0), n_cols, BLOCK=triton.next_power_of_2(n_cols))
    return y
'''


def test_row_split_declines_chunks_that_read_what_another_chunk_stores():
    assert rewrite("split-row-tile", ROW, {})
    first = ROW.replace("    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)\n",
                        "    first = tl.load(X + row * stride)\n"
                        "    x = tl.load(X + row * stride + cols, mask=mask, other=0.0) - first\n") \
        .replace("tl.store(Y + row", "tl.store(X + row")
    shifted = ROW.replace("k[(n_rows,)](x, y,", "k[(n_rows,)](x, x[:, 1:],")
    assert first != ROW and shifted != ROW
    assert rewrite("split-row-tile", first, {}) == []  # in place: a later chunk reads x[row, 0] rewritten
    assert rewrite("split-row-tile", shifted, {}) == []  # out is x one column on: a chunk's stores are the next's loads
    in_place = ROW.replace("tl.store(Y + row", "tl.store(X + row")  # `x = f(x)` at the same address: still split
    assert rewrite("split-row-tile", in_place, {})


def test_row_split_keeps_a_defaulted_parameter_passed_by_position(tmp_path):
    scaled = ROW.replace("n_cols, BLOCK: tl.constexpr)", "n_cols, scale=1.0, BLOCK: tl.constexpr = 1024)") \
        .replace("x * 3.0", "x * scale").replace("x.stride(0), n_cols, BLOCK=", "x.stride(0), n_cols, 3.0, BLOCK=")
    assert "scale=1.0" in scaled and "n_cols, 3.0, BLOCK=" in scaled
    variants = rewrite("split-row-tile", scaled, {})
    assert variants and all("_KB_COLS: tl.constexpr = None" in v.source for v in variants)
    assert candidate_rejection(tmp_path, scaled, variants[0].source, "f", "f(torch.randn(3, 2000))",
                               "lambda x: x * 3.0") == ""


def test_exp2_fold_declines_a_sentinel_that_overflows_fp16_where_the_scores_may_be_fp16():
    softmax = HEADER + '''@triton.jit
def k(X, Y, n, n_valid, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * n + cols, mask=cols < n, other=0.0)
    s = x * 0.5
    s = tl.where(cols < n_valid, s, -65504.0)
    m = tl.max(s, axis=0)
    e = tl.exp(s - m)
    tl.store(Y + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


def f(x, n_valid):
    y = torch.empty_like(x)
    k[(x.shape[0],)](x, y, x.shape[1], n_valid, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''
    folds = lambda source: [v for v in rewrite("exp2-fast-math", source, {})  # noqa: E731
                            if v.params.get("log2e") == "folded into the scale"]
    assert folds(softmax) == []  # -65504 * log2(e) is -inf in fp16: a fully masked row's -inf - -inf is NaN
    wide = softmax.replace("s = x * 0.5", "s = x.to(tl.float32) * 0.5")
    assert folds(wide)  # fp32 scores hold the scaled sentinel
    assert folds(softmax.replace("-65504.0", "-1000.0"))  # a sentinel whose scaled value fp16 holds


def test_coalescing_declines_a_python_builtin_on_the_program_index():
    column_sums = HEADER + '''@triton.jit
def k(X, Y, M, N, stride, BLOCK: tl.constexpr):
    col = tl.program_id(0)
    c2 = min(col, N - 1)
    rows = tl.arange(0, BLOCK)
    x = tl.load(X + rows * stride + c2, mask=rows < M, other=0.0)
    tl.store(Y + col, tl.sum(x, axis=0))


def f(x):
    m, n = x.shape
    y = torch.zeros(n, dtype=torch.float32)
    k[(n,)](x, y, m, n, x.stride(0), BLOCK=64)
    return y
'''
    # compiled, min() of a tile is tl.minimum; the interpreter, which judges, runs Python's min on it
    assert rewrite("contiguous-innermost-axis", column_sums, {}) == []
    assert rewrite("contiguous-innermost-axis", column_sums.replace("min(col, N - 1)", "tl.minimum(col, N - 1)"), {})


def test_rows_per_program_fits_no_block_to_an_extent_the_kernel_reassigns():
    scale = HEADER + '''@triton.jit
def scale_kernel(X, Out, stride, half, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    half = half * 2
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    x = tl.load(X + row * stride + cols, mask=mask)
    tl.store(Out + row * stride + cols, x * 2.0, mask=mask)


def scale(x):
    rows, n = x.shape
    out = torch.empty_like(x)
    scale_kernel[(rows,)](x, out, x.stride(0), n // 2, BLOCK=triton.next_power_of_2(n))
    return out
'''
    fitted = lambda source: [v for v in rewrite("rows-per-program", source, {}) if "lanes" in v.params]  # noqa: E731
    assert rewrite("rows-per-program", scale, {}) and fitted(scale) == []  # sized from n // 2, the kernel's half is n
    plain = scale.replace("    half = half * 2\n", "")
    assert plain != scale and fitted(plain)


def test_chunked_row_loop_declines_a_pointer_parameter_moved_to_the_tile_and_aliased_views():
    norm = HEADER + '''@triton.jit
def row_norm_kernel(X, Out, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = row * n + tl.arange(0, BLOCK)
    mask = offs < row * n + n
    x = tl.load(X + offs, mask=mask, other=0.0)
    s = tl.sum(x * x, axis=0)
    tl.store(Out + row, tl.sqrt(s))


def row_norm(x):
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.float32)
    row_norm_kernel[(rows,)](x, out, n, BLOCK=triton.next_power_of_2(n))
    return out
'''
    assert rewrite("chunked-row-loop", norm, {})
    moved = norm.replace("    mask = offs < row * n + n\n    x = tl.load(X + offs,",
                         "    X += offs\n    mask = offs < row * n + n\n    x = tl.load(X,")
    assert moved != norm and rewrite("chunked-row-loop", moved, {}) == []
    center = HEADER + '''@triton.jit
def center_kernel(X, Out, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n
    tl.store(Out + row * stride + cols, x - mean, mask=mask)


def center(buf):
    rows, m = buf.shape
    out = torch.empty_like(buf)
    center_kernel[(rows,)](buf, out, buf.stride(0), m, BLOCK=triton.next_power_of_2(m))
    return out
'''
    assert rewrite("chunked-row-loop", center, {})
    shifted = center.replace("center_kernel[(rows,)](buf, out,", "center_kernel[(rows,)](buf, buf[:, 1:],")
    assert shifted != center and rewrite("chunked-row-loop", shifted, {}) == []


FILL = HEADER + '''@triton.jit
def k(X, Out, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N, other=0.0)
    tl.store(Out + offs, x * 2.0, mask=offs < N)


def f(x):
    n = x.numel()
    out = torch.empty_like(x)
    BLOCK = 1024
    k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out
'''


def test_grid_fill_declines_lanes_combined_by_softmax_or_in_a_helper():
    halved = lambda source: [v for v in rewrite("split-work-over-programs", source, {"finding": "x"})  # noqa: E731
                             if "fill" in v.params]
    assert halved(FILL)
    softmax = FILL.replace("x * 2.0", "tl.softmax(x)")
    helper = FILL.replace("@triton.jit\ndef k(", "@triton.jit\ndef _absmax(x):\n    return tl.max(tl.abs(x), axis=0)\n\n\n"
                          "@triton.jit\ndef k(").replace("x * 2.0", "x / _absmax(x)")
    assert softmax != FILL and helper != FILL
    assert halved(softmax) == [] and halved(helper) == []  # per-block softmax / normalisation: a block is a group


FIT = HEADER + '''@triton.jit
def copy_kernel(X, Out, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + row * N + offs, mask=offs < N, other=0.0)
    tl.store(Out + row * N + offs, x, mask=offs < N)


def copy(x):
    rows, n = x.shape
    out = torch.empty_like(x)
    copy_kernel[(rows,)](x, out, n, BLOCK=64)
    return out
'''


def test_fit_keeps_blocks_whose_extent_is_not_the_only_bound_or_that_are_also_strides():
    assert rewrite("fit-tile-to-extent", FIT, {})
    pad = FIT.replace("def copy_kernel(X, Out, N,", "def copy_kernel(X, Out, N, K,").replace(
        "X + row * N + offs, mask=offs < N", "X + row * K + offs, mask=offs < K").replace(
        "copy_kernel[(rows,)](x, out, n,", "copy_kernel[(rows,)](x, out, n, n,")
    stride = FIT.replace("tl.store(Out + row * N + offs, x, mask=offs < N)", "tl.store(Out + row * BLOCK + offs, x)")
    assert pad != FIT and stride != FIT
    assert rewrite("fit-tile-to-extent", pad, {}) == []  # fitted to K, the stores up to N would be lost
    assert rewrite("fit-tile-to-extent", stride, {}) == []  # BLOCK is the output's row stride too
    grid = HEADER + '''@triton.jit
def k(X, Out, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(Out + offs, tl.load(X + offs, mask=offs < N) + 1.0, mask=offs < N)


def f(x):
    n = x.numel()
    out = torch.empty_like(x)
    BLOCK = 1024
    k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out
'''
    assert rewrite("fit-tile-to-extent", grid, {})
    literal = grid.replace("k[(triton.cdiv(n, BLOCK),)]", "k[(triton.cdiv(n, 1024),)]")
    assert literal != grid and rewrite("fit-tile-to-extent", literal, {}) == []  # the grid would not follow


def test_a_small_shape_path_renames_its_globals_in_global_statements_too(tmp_path):
    small = HEADER.rstrip("\n") + "\n\n_buf = None\n\n\n" + '''@triton.jit
def double_kernel(X, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Out + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


def double(x):
    global _buf
    if _buf is None or _buf.shape != x.shape:
        _buf = torch.empty_like(x)
    n = x.numel()
    double_kernel[(triton.cdiv(n, 128),)](x, _buf, n, BLOCK=128)
    return _buf.clone()
'''
    large = small.replace("BLOCK=128", "BLOCK=64").replace("cdiv(n, 128)", "cdiv(n, 64)")
    merged = size_dispatch(small, large, "double", 1000)
    assert merged is not None and "global _buf_kb_small" in merged
    assert candidate_rejection(tmp_path, small, merged, "double", "double(torch.randn(10))", "lambda x: x * 2") == ""
