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


# The same review's second pass, the bug classes above tried against the other rewriters.
ROWSUM = HEADER + '''@triton.jit
def rowsum_kernel(x_ptr, b_ptr, out_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0)
        acc += x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def rowsum(x, b):
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32)
    rowsum_kernel[(M,)](x, b, out, N, x.stride(0), BLOCK=32)
    return out
'''


def test_split_declines_a_started_accumulator_a_keyword_step_an_aliased_output_and_a_loop_of_launches():
    split = lambda source: [v for v in rewrite("split-work-over-programs", source, {"finding": "x"})  # noqa: E731
                            if v.params.get("split")]
    assert split(ROWSUM)
    started = ROWSUM.replace("    for start in", "    acc += tl.load(b_ptr + tl.arange(0, BLOCK))\n    for start in")
    keyword = ROWSUM.replace("range(0, N, BLOCK)", "tl.range(0, N, step=BLOCK)")
    aliased = ROWSUM.replace("    out = torch.empty(M, dtype=torch.float32)\n    rowsum_kernel[(M,)](x, b, out,",
                             "    out = x[:, 0]\n    rowsum_kernel[(M,)](x, b, out,")
    looped = ROWSUM.replace("    rowsum_kernel[(M,)](x, b, out, N, x.stride(0), BLOCK=32)\n",
                            "    for half in (x[: M // 2], x[M // 2:]):\n"
                            "        rowsum_kernel[(M,)](half, b, out, N, x.stride(0), BLOCK=32)\n")
    for source in (started, keyword, aliased, looped):
        assert source != ROWSUM and split(source) == []


def test_accumulate_widens_no_block_whose_load_mask_is_reassigned():
    exp_sum = HEADER + '''@triton.jit
def k(X, Out, K, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = 0.0
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < K
        x = tl.load(X + row * K + offs, mask=mask, other=0.0)
        acc += tl.sum(tl.exp(x))
    tl.store(Out + row, acc)


def f(x):
    out = torch.empty(x.shape[0], dtype=torch.float32)
    k[(x.shape[0],)](x, out, x.shape[1], BLOCK=128)
    return out
'''
    widened = lambda source: [v for v in rewrite("accumulate-then-reduce", source, {}) if "BLOCK" in v.params]  # noqa: E731
    assert widened(exp_sum)
    reassigned = exp_sum.replace("        acc += tl.sum(tl.exp(x))\n",
                                 "        mask = offs >= 0\n        acc += tl.sum(tl.exp(x))\n")
    assert reassigned != exp_sum and rewrite("accumulate-then-reduce", reassigned, {}) and widened(reassigned) == []


def test_fold_keeps_a_copy_the_kernel_writes_over_or_the_wrapper_changes():
    diff = HEADER + '''@triton.jit
def diff_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    prev = tl.load(b_ptr + offs - 1, mask=mask & (offs >= 1), other=0.0)
    tl.store(out_ptr + offs, a - prev, mask=mask)


def diff(x, alpha: float = 2.0):
    n = x.numel()
    out = torch.empty_like(x)
    scaled = x * alpha
    diff_kernel[(triton.cdiv(n, 64),)](x, scaled, out, n, BLOCK=64)
    return out
'''
    assert rewrite("fold-wrapper-work", diff, {})
    in_place = diff.replace("](x, scaled, out, n,", "](x, scaled, x, n,")  # x[i] -= alpha * x[i - 1]
    cloned = in_place.replace("scaled = x * alpha", "scaled = x.clone()")
    changed = diff.replace("    scaled = x * alpha\n", "    scaled = x * alpha\n    x.add_(1.0)\n")
    for source in (in_place, cloned, changed):
        assert source != diff and rewrite("fold-wrapper-work", source, {}) == []


def test_scan_declines_a_launch_whose_output_is_its_input_one_step_on_and_a_keyword_step():
    hgrn = HEADER + '''@triton.jit
def hgrn_kernel(x_ptr, g_ptr, o_ptr, T, D, BD: tl.constexpr):
    cols = tl.program_id(0) * BD + tl.arange(0, BD)
    mask = cols < D
    p_x = x_ptr + cols
    p_g = g_ptr + cols
    p_o = o_ptr + cols
    h = tl.zeros([BD], dtype=tl.float32)
    for _ in range(0, T):
        x = tl.load(p_x, mask=mask, other=0.0)
        g = tl.load(p_g, mask=mask, other=0.0)
        h = tl.exp(g) * h + x
        tl.store(p_o, h, mask=mask)
        p_x += D
        p_g += D
        p_o += D


def hgrn(x, g):
    T, D = x.shape
    o = torch.empty_like(x)
    hgrn_kernel[(triton.cdiv(D, 16),)](x, g, o, T, D, BD=16)
    return o
'''
    assert rewrite("chunked-linear-scan", hgrn, {})
    shifted = hgrn.replace("hgrn_kernel[(triton.cdiv(D, 16),)](x, g, o,", "hgrn_kernel[(triton.cdiv(D, 16),)](x, g, x[1:],")
    keyword = hgrn.replace("range(0, T)", "tl.range(0, T, step=2)")
    for source in (shifted, keyword):
        assert source != hgrn and rewrite("chunked-linear-scan", source, {}) == []


def test_empty_outputs_keep_the_zeros_of_an_output_the_kernel_reads():
    accumulate = HEADER + '''@triton.jit
def accum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, acc + tl.load(x_ptr + offs, mask=mask), mask=mask)


def sum_rows(x):
    R, n = x.shape
    out = torch.zeros(n, dtype=torch.float32)
    for r in range(R):
        accum_kernel[(triton.cdiv(n, 64),)](x[r], out, n, BLOCK=64)
    return out
'''
    emptied = lambda source: [v for v in rewrite("trim-wrapper-overhead", source, {})  # noqa: E731
                              if "empty-outputs" in v.params["removed"]]
    assert emptied(accumulate) == []
    written = accumulate.replace("acc = tl.load(out_ptr + offs, mask=mask)", "acc = 0.0").replace(
        "    for r in range(R):\n        accum_kernel", "    for r in range(1):\n        accum_kernel")
    assert emptied(written)


def test_pipelining_and_relaxed_atomics_decline_launches_that_alias_their_pointers():
    shift = HEADER + '''@triton.jit
def shift_kernel(src, dst, T, D, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for t in range(1, T):
        x = tl.load(src + (t - 1) * D + cols, mask=cols < D, other=0.0)
        tl.store(dst + (t - 1) * D + cols, x * 0.5 + 1.0, mask=cols < D)


def shift(h):
    T, D = h.shape
    out = torch.empty_like(h)
    shift_kernel[(1,)](h, out, T, D, BLOCK=triton.next_power_of_2(D))
    return out
'''
    assert rewrite("tl-range-pipelining", shift, {})
    recurrence = shift.replace("shift_kernel[(1,)](h, out,", "shift_kernel[(1,)](h, h[1:],")
    assert recurrence != shift and rewrite("tl-range-pipelining", recurrence, {}) == []
    scatter = HEADER + '''@triton.jit
def k(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n)
    tl.atomic_add(dst + offs % 7, x, mask=offs < n)


def f(x):
    out = torch.zeros(7)
    k[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out
'''
    assert rewrite("relaxed-atomics", scatter, {})
    same = scatter.replace("](x, out, x.numel()", "](x, x, x.numel()")
    assert same != scatter and rewrite("relaxed-atomics", same, {}) == []


def test_a_single_config_kernel_that_reruns_differently_is_not_given_more_configs():
    add_in_place = HEADER + '''@triton.autotune(configs=[triton.Config({'BLOCK': 64}, num_warps=4)], key=['n'])
@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def f(x, y):
    n = x.numel()
    k[lambda meta: (triton.cdiv(n, meta['BLOCK']),)](x, y, n)
    return x
'''
    # the tuner would run `x += y` once per config on the same x
    assert rewrite("autotune-configs", add_in_place, {}) == []
    restored = add_in_place.replace("key=['n'])", "key=['n'], restore_value=['x_ptr'])")
    out_of_place = add_in_place.replace("tl.store(x_ptr + offs,", "tl.store(y_ptr + offs,").replace(
        "tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)", "tl.load(x_ptr + offs, mask=mask) * 2")
    assert rewrite("autotune-configs", restored, {}) and rewrite("autotune-configs", out_of_place, {})


def test_the_tile_search_declines_a_lambda_grid_that_does_not_read_the_blocks():
    matmul = HEADER + '''@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :], mask=(offs_k[:, None] < K) & (offs_n[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(M, meta['BLOCK_M']), triton.cdiv(N, meta['BLOCK_N']))
    matmul_kernel[grid](a, b, c, M, N, K, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
    return c
'''
    assert rewrite("wgmma-friendly-tiles", matmul, {})
    fixed = matmul.replace("(triton.cdiv(M, meta['BLOCK_M']), triton.cdiv(N, meta['BLOCK_N']))",
                           "((M + 127) // 128, (N + 255) // 256)")
    assert fixed != matmul and rewrite("wgmma-friendly-tiles", fixed, {}) == []  # smaller tiles: outputs never written


# The fourth pass: edge inputs (empty grids, narrow dtypes) and names the rewrites add.
DOUBLE = HEADER + '''@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tile = tl.load(x_ptr + offs, mask=mask)
    offs2 = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs2, tile * 2, mask=offs2 < n)


def f(x):
    y = torch.empty_like(x)
    n = x.numel()
    k[(triton.cdiv(n, 16),)](x, y, n, BLOCK=16)
    return y
'''


def test_the_persistent_loop_takes_names_the_module_does_not_use(tmp_path):
    # the kernel's own `tile` and a module-level `sm_count` the wrapper reads stay theirs
    source = DOUBLE.replace("def f(x):\n", "sm_count = 3\n\n\ndef f(x):\n    assert sm_count == 3\n")
    variants = rewrite("persistent-kernel", source, {})
    assert variants and all("for tile_ in tl.range(" in v.source and "sm_count_ = " in v.source for v in variants)
    assert candidate_rejection(tmp_path, source, variants[1].source, "f", "f(torch.randn(1000))", "lambda x: x * 2") == ""
    spelled = DOUBLE.replace("tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask",
                             "triton.language.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask")
    assert spelled != DOUBLE and rewrite("persistent-kernel", spelled, {}) == []  # the loop would not rename it


def test_split_launches_survive_an_empty_grid_and_keep_the_wrappers_sm_count(tmp_path):
    source = ROWSUM.replace("def rowsum(x, b):\n", "sm_count = 3\n\n\ndef rowsum(x, b):\n    assert sm_count == 3\n")
    variants = [v for v in rewrite("split-work-over-programs", source, {"finding": "x"}) if v.params.get("split")]
    assert variants and all("max(1, n_blocks)" in v.source and "_kb_sm_count = " in v.source for v in variants)
    for call in ("rowsum(torch.randn(0, 300), torch.randn(32))", "rowsum(torch.randn(4, 300), torch.randn(32))"):
        assert candidate_rejection(tmp_path, source, variants[0].source, "rowsum", call,
                                   "lambda x, b: x.sum(1)") == "", call


def test_int32_offsets_cast_the_32_bit_branch_too(tmp_path):
    gather = HEADER + '''@triton.jit
def gather_kernel(idx_ptr, w_ptr, out_ptr, D: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.load(idx_ptr + pid).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    v = tl.load(w_ptr + i * D + cols, mask=mask)
    tl.store(out_ptr + pid * D + cols, v, mask=mask)


def gather(idx, w):
    D = w.shape[1]
    out = torch.empty((idx.shape[0], D), dtype=w.dtype, device=w.device)
    gather_kernel[(idx.shape[0],)](idx, w, out, D, BLOCK=512)
    return out
'''
    (variant,) = rewrite("int32-offsets", gather, {})
    assert "if _KB_INT64 else tl.load(idx_ptr + pid).to(tl.int32))" in variant.source
    # an int16 index times 300 columns wrapped in int16 when the branch kept the index's own type
    call = "gather(torch.tensor([0, 5, 299, 150], dtype=torch.int16), torch.randn(300, 300))"
    assert candidate_rejection(tmp_path, gather, variant.source, "gather", call, "lambda i, w: w[i.long()]") == ""


def test_a_scalar_upload_becomes_a_fill_only_where_the_value_fits_its_dtype():
    upload = HEADER + '''@triton.jit
def k(x_ptr, hi_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.minimum(tl.load(x_ptr + offs, mask=mask), tl.load(hi_ptr)), mask=mask)


def f(x):
    hi = torch.tensor(1e40, dtype=torch.float32, device=x.device)
    y = torch.empty_like(x)
    k[(triton.cdiv(x.numel(), 64),)](x, hi, y, x.numel(), BLOCK=64)
    return y
'''
    filled = lambda source: [v for v in rewrite("trim-wrapper-overhead", source, {})  # noqa: E731
                             if v.params.get("uploads")]
    assert filled(upload) == []  # torch.tensor makes inf of 1e40, torch.full raises
    assert filled(upload.replace("1e40", "1e30"))
    assert filled(upload.replace("torch.tensor(1e40", "torch.tensor(x.numel()").replace("torch.float32", "torch.float16")) == []


def test_row_split_sees_an_alias_made_by_a_wrapper_name():
    flip = ROW.replace("x = tl.load(X + row * stride + cols,", "x = tl.load(X + row * stride + n_cols - 1 - cols,")
    assert rewrite("split-row-tile", flip, {})  # out of place: each chunk reads the input only
    in_place = flip.replace("    y = torch.empty_like(x)\n", "    y = x\n")
    assert in_place != flip and rewrite("split-row-tile", in_place, {}) == []  # `y = x`: the row reversed in place
