"""The affine reader of 2-D tile loads (diagnose/rewriters/affine.py) on the ways kernels spell a matmul's
operand loads: Triton's tutorial (pointers advanced in the loop, rows wrapped by `% M`), a first draft's
(masks through names, ranges made in the loop, unit strides left out), attorch's (a pointer parameter moved
in place); what it declines; and the TMA and persistent rewrites it opens, under the real judge and compiled
for sm90."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from conftest import candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.affine import TileAxis, TileLoad, tile_loads

# Triton's tutorial matmul, cut down (no GROUP_M order): pointers advanced, rows and columns wrapped.
TUTORIAL = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


    def mm(a, b):
        M, K = a.shape
        K, N = b.shape
        c = torch.empty((M, N), device=a.device, dtype=torch.float16)
        grid = (triton.cdiv(M, 128), triton.cdiv(N, 64))
        mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                        BLOCK_M=128, BLOCK_N=64, BLOCK_K=32)
        return c
''')

# A first draft's form (TritonBench-T answers): masks through names, the K range made in the loop, strides
# implied by the sizes.
DRAFT = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mm_kernel(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm_mask = rm < M
        rn_mask = rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_range = k + tl.arange(0, BLOCK_K)
            k_mask = k_range < K
            a = tl.load(A + (rm[:, None] * K + k_range[None, :]), mask=(rm_mask[:, None] & k_mask[None, :]), other=0.0)
            b = tl.load(B + (k_range[:, None] * N + rn[None, :]), mask=(k_mask[:, None] & rn_mask[None, :]), other=0.0)
            acc += tl.dot(a, b)
        tl.store(C + (rm[:, None] * N + rn[None, :]), acc.to(tl.float16), mask=(rm_mask[:, None] & rn_mask[None, :]))


    def mm(a, b):
        m, k = a.shape
        k, n = b.shape
        c = torch.empty((m, n), device=a.device, dtype=torch.float16)
        BLOCK_M = 128
        BLOCK_N = 64
        BLOCK_K = 32
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        # the launch's own comment stays above the dispatch
        mm_kernel[grid](a, b, c, m, n, k, BLOCK_M, BLOCK_N, BLOCK_K)
        return c
''')

# attorch's linear layer form: pointer parameters moved in place by the row offsets, strides on the left.
MOVED = textwrap.dedent('''
    import triton
    import triton.language as tl


    @triton.jit
    def linear_kernel(x_pointer, w_pointer, out_pointer, rows, cols_in, cols_out, x_row_stride, x_col_stride,
                      w_in_stride, w_out_stride, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        r_mask = r < rows
        o_mask = o < cols_out
        x_pointer += x_row_stride * r[:, None]
        w_pointer += w_out_stride * o[None, :]
        acc = tl.zeros((BLOCK_R, BLOCK_O), dtype=tl.float32)
        for block in range(0, tl.cdiv(cols_in, BLOCK_I)):
            i = block * BLOCK_I + tl.arange(0, BLOCK_I)
            i_mask = i < cols_in
            x = tl.load(x_pointer + x_col_stride * i[None, :], mask=r_mask[:, None] & i_mask[None, :])
            w = tl.load(w_pointer + w_in_stride * i[:, None], mask=o_mask[None, :] & i_mask[:, None])
            acc += tl.dot(x, w)
        tl.store(out_pointer + r[:, None] * cols_out + o[None, :], acc, mask=r_mask[:, None] & o_mask[None, :])
''')


def _reads(source: str) -> list[TileLoad]:
    fn = next(f for f in cst.parse_module(source).body if isinstance(f, cst.FunctionDef) and f.decorators)
    return list(tile_loads(fn).values())


def test_pointers_advanced_in_the_loop_and_rows_wrapped_into_range():
    a, b = _reads(TUTORIAL)
    assert a == TileLoad("a_ptr", (TileAxis("pid_m * BLOCK_M", "BLOCK_M", "stride_am", "M"),
                                   TileAxis("k * BLOCK_K", "BLOCK_K", "stride_ak", "K")))
    assert b == TileLoad("b_ptr", (TileAxis("k * BLOCK_K", "BLOCK_K", "stride_bk", "K"),
                                   TileAxis("pid_n * BLOCK_N", "BLOCK_N", "stride_bn", "N")))


def test_a_pointer_advanced_before_its_load_starts_one_step_on():
    moved = TUTORIAL.replace("        a_ptrs += BLOCK_K * stride_ak\n", "").replace(
        "        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)\n",
        "        a_ptrs += BLOCK_K * stride_ak\n"
        "        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - (k + 1) * BLOCK_K, other=0.0)\n")
    assert moved.index("a_ptrs += BLOCK_K") < moved.index("a = tl.load(a_ptrs") < moved.index("tl.dot(a, b, acc)")
    a = next(r for r in _reads(moved) if r.base == "a_ptr")
    assert a.axes[1].start == "(k + 1) * BLOCK_K" and a.axes[1].bound == "K"
    # Loaded on both sides of its step, a pointer has two starts in one iteration: not read.
    both = TUTORIAL.replace("        a_ptrs += BLOCK_K * stride_ak\n",
                            "        a_ptrs += BLOCK_K * stride_ak\n        acc += tl.load(a_ptrs).to(tl.float32)\n")
    assert [r.base for r in _reads(both)] == ["b_ptr"]


def test_masks_through_names_ranges_made_in_the_loop_and_unit_strides_left_out():
    a, b = _reads(DRAFT)
    assert a == TileLoad("A", (TileAxis("pid_m * BLOCK_M", "BLOCK_M", "K", "M"), TileAxis("k", "BLOCK_K", "1", "K")))
    assert b == TileLoad("B", (TileAxis("k", "BLOCK_K", "N", "K"), TileAxis("pid_n * BLOCK_N", "BLOCK_N", "1", "N")))


def test_a_pointer_parameter_moved_in_place_is_read_from_its_launch_value():
    x, w = _reads(MOVED)
    assert x == TileLoad("x_pointer", (TileAxis("tl.program_id(0) * BLOCK_R", "BLOCK_R", "x_row_stride", "rows"),
                                       TileAxis("block * BLOCK_I", "BLOCK_I", "x_col_stride", "cols_in")))
    assert w.base == "w_pointer" and [a.bound for a in w.axes] == ["cols_in", "cols_out"]


@pytest.mark.parametrize("change", [
    # The K mask does not follow the advanced pointer: the read cannot say what it bounds.
    ("mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)", "mask=offs_k[None, :] < K, other=0.0)"),
    # Rows gathered through an index loaded from memory.
    ("offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M", "offs_am = tl.load(c_ptr + tl.arange(0, BLOCK_M))"),
    # A start that changes between where it is made and the load.
    ("    offs_k = tl.arange(0, BLOCK_K)\n", "    offs_k = tl.arange(0, BLOCK_K)\n    pid_m = pid_m + 1\n"),
    # A load that asks for something a descriptor does not do.
    ("mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)", "mask=offs_k[None, :] < K - k * BLOCK_K, other=1.0)"),
    # A second limit on the K axis (a split's own end): the descriptor's shape would carry only one.
    ("mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)",
     "mask=(offs_k[None, :] < K - k * BLOCK_K) & (offs_k[None, :] < K_END), other=0.0)"),
    # The advanced pointer read through another expression: its start moves, the expression's does not.
    ("        a = tl.load(a_ptrs, mask=", "        a = tl.load(a_ptrs + 0 * stride_ak, mask="),
    # The base moved by a scalar offset (a batch): a descriptor at the kernel's top would read batch 0.
    ("    a_ptrs = a_ptr + (", "    a_ptr += tl.program_id(2) * stride_am * M\n    a_ptrs = a_ptr + ("),
])
def test_what_the_reader_cannot_place_is_declined(change):
    old, new = change
    assert old in TUTORIAL
    reads = _reads(TUTORIAL.replace(old, new))
    assert [r.base for r in reads] == ["b_ptr"]  # the other operand's load, untouched, still reads


@pytest.mark.parametrize("change", [
    # A reduction across output rows: a wrapped row read as zero instead would change it.
    ("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b, acc) + tl.sum(a, axis=1)[:, None]", []),
    ("    tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))",
     "    tl.atomic_max(c_ptr + offs_cn, tl.max(acc, axis=0), mask=offs_cn < N)", []),
    # A store not masked by the rows' bound: the wrapped rows would be written; the columns still are masked.
    ("mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))", "mask=offs_cn[None, :] < N)", ["b_ptr"]),
])
def test_rows_wrapped_into_range_are_read_only_where_no_output_row_sees_them(change):
    old, new, read = change
    assert old in TUTORIAL
    assert [r.base for r in _reads(TUTORIAL.replace(old, new))] == read


def test_a_load_in_a_branch_that_remakes_its_range_is_not_read_with_the_old_one():
    branch = DRAFT.replace(
        "        a = tl.load(A + (rm[:, None] * K + k_range[None, :])",
        "        if REVERSE:\n            k_range = K - BLOCK_K - k + tl.arange(0, BLOCK_K)\n"
        "            a = tl.load(A + (rm[:, None] * K + k_range[None, :])")
    assert "if REVERSE:" in branch
    assert all(r.base != "A" for r in _reads(branch))


def test_a_pointer_advanced_in_an_outer_loop_moves_with_that_loop():
    nested = TUTORIAL.replace("        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)\n",
                              "        for j in range(0, 2):\n"
                              "            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)\n")
    assert "for j in range(0, 2)" in nested
    a = next(r for r in _reads(nested) if r.base == "a_ptr")
    assert a.axes[1].start == "k * BLOCK_K"


@pytest.mark.parametrize("call", [
    "mm(torch.randn(256, 64).half(), torch.randn(64, 128).half())",  # whole 128x64 tiles, 4 of them
    "mm(torch.randn(200, 40).half(), torch.randn(40, 136).half())",  # ragged: TMA pads, the store masks
    "mm(torch.randn(33, 33).half(), torch.randn(33, 17).half())",    # 66-byte rows: the kernel as written
])
@pytest.mark.parametrize("source", [TUTORIAL, DRAFT], ids=["tutorial", "draft"])
def test_the_descriptor_forms_of_both_spellings_pass_the_judge(tmp_path, source, call):
    variants = rewrite("tensor-descriptors-tma", source, {}) + \
        [v for v in rewrite("persistent-kernel", source, {}) if "persistent" in v.params]
    assert [v.params.get("warp_specialize") for v in variants] == [None, False, True]  # TMA, then persistent
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "mm", call, "torch.matmul", seeds=1) == "", \
            variant.params


def test_the_draft_form_compiles_for_sm90_to_tma_copies_with_its_launch_comment_kept(tmp_path):
    from harness.capture import capture_call

    (variant,) = rewrite("tensor-descriptors-tma", DRAFT, {})
    assert "    # the launch's own comment stays above the dispatch\n    if (" in variant.source
    assert "A_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])" \
        in variant.source
    (tmp_path / "tma.py").write_text(variant.source)
    [art] = capture_call(tmp_path / "tma.py", "mm(torch.randn(256, 256).half(), torch.randn(256, 256).half())",
                         target="cuda:90")
    assert art.kernel == "mm_kernel_tma" and "ttng.async_tma_copy_global_to_local" in art.stages["ttgir"]


def test_the_dispatch_keeps_each_launch_as_it_was_written_one_level_in():
    (variant,) = rewrite("tensor-descriptors-tma", TUTORIAL, {})
    start = TUTORIAL.index("    mm_kernel[grid](")
    launch = TUTORIAL[start:TUTORIAL.index("\n", TUTORIAL.index("BLOCK_M=128", start))]
    assert "\n" in launch  # a call over two lines: its second line moves with the first
    shifted = "\n".join("    " + line for line in launch.splitlines())
    assert "    else:\n" + shifted in variant.source
    assert shifted.replace("mm_kernel[grid]", "mm_kernel_tma[grid]") in variant.source
