"""Block sizes change only where the kernel lets them (diagnose/rewriters/resizing.py): a block grows where
its accesses are masked along it, shrinks where it steps a loop or a program axis. The two kernels here
are a helper audit's probes: each was right at the judge's sizes and wrong at others once resized."""

from __future__ import annotations

import re

import libcst as cst
from conftest import candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.base import jit_functions
from diagnose.rewriters.resizing import Resizing, block_resizing

UNMASKED_K = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K: no K mask
        a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0)
        b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(a, b):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
    return c
'''

WHOLE_ROW = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


def softmax(x):
    y = torch.empty_like(x)
    softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=1024)
    return y
'''


def _kernel(source: str, name: str) -> cst.FunctionDef:
    return jit_functions(cst.parse_module(source))[name]


def test_what_each_block_allows():
    mm = _kernel(UNMASKED_K, "matmul_kernel")
    assert block_resizing(mm, "BLOCK_M") == Resizing(grow=True, shrink=True, axis=True)  # masked by M, a program axis
    assert block_resizing(mm, "BLOCK_K") == Resizing(grow=False, shrink=True)  # unmasked along K, a loop step
    row = _kernel(WHOLE_ROW, "softmax_kernel")
    assert block_resizing(row, "BLOCK") == Resizing(grow=True, shrink=False)  # masked, but the row's whole width


def test_the_launch_search_and_the_tile_table_leave_an_unmasked_loop_block_no_larger(tmp_path):
    for pattern in ("block-size-num-warps", "wgmma-friendly-tiles"):
        variants = rewrite(pattern, UNMASKED_K, {})
        assert variants and all(v.params.get("BLOCK_K", 32) <= 32 for v in variants), pattern
    halved = next(v for v in rewrite("block-size-num-warps", UNMASKED_K, {}) if v.params.get("BLOCK_K") == 16)
    call, reference = "matmul(torch.randn(40, 96), torch.randn(96, 24))", "lambda a, b: a @ b"
    assert candidate_rejection(tmp_path, UNMASKED_K, halved.source, "matmul", call, reference) == ""


def test_the_launch_search_does_not_shrink_a_block_that_spans_the_row(tmp_path):
    variants = rewrite("block-size-num-warps", WHOLE_ROW, {})
    assert [v.params["BLOCK"] for v in variants if "BLOCK" in v.params] == [2048]
    wider = next(v for v in variants if "BLOCK" in v.params)
    assert candidate_rejection(tmp_path, WHOLE_ROW, wider.source, "softmax", "softmax(torch.randn(6, 1000))",
                               "lambda x: torch.softmax(x, 1)") == ""


def test_widened_autotune_configs_keep_an_unmasked_loop_block():
    tuned = UNMASKED_K.replace("@triton.jit\n", "@triton.autotune(configs=[triton.Config({'BLOCK_M': 32, 'BLOCK_N': 32, "
                               "'BLOCK_K': 32}, num_warps=4, num_stages=3)], key=['M', 'N', 'K'])\n@triton.jit\n", 1) \
        .replace("    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))\n",
                 "    grid = lambda meta: (triton.cdiv(M, meta['BLOCK_M']), triton.cdiv(N, meta['BLOCK_N']))\n") \
        .replace(", BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)", ")")
    variants = {v.params["configs_added"]: v.source for v in rewrite("block-size-num-warps", tuned, {})}
    assert {"blocks", "hopper-tiles"} <= set(variants)  # M and N grow; the Hopper tiles with K at 32 stay
    for source in variants.values():
        assert {int(k) for k in re.findall(r"BLOCK_K['\"]: (\d+)", source)} == {32}


def test_a_mask_that_reads_the_lanes_without_capping_them_does_not_let_the_block_grow():
    # tried as an adversary: `offs_k >= 0` reads BLOCK_K's lanes and bounds nothing past K
    uncapped = UNMASKED_K.replace("a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0)",
                                  "a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] >= 0), other=0.0)")
    capped = uncapped.replace("(offs_k[None, :] >= 0)", "(K > offs_k[None, :] + k)").replace(
        "b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0)",
        "b = tl.load(b_ptrs, mask=(offs_n[None, :] < N) & (offs_k[:, None] + k < K), other=0.0)")
    assert uncapped != UNMASKED_K and capped != uncapped
    mm = _kernel(uncapped, "matmul_kernel")
    assert not block_resizing(mm, "BLOCK_K").grow
    assert block_resizing(_kernel(capped, "matmul_kernel"), "BLOCK_K").grow


# The second audit's probes: two kernels of one module, the first's grid written as a literal division.
TWO_GRIDS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(X, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Out + offs, tl.load(X + offs, mask=mask) * 3.0, mask=mask)


@triton.jit
def shift_kernel(Y, n, CHUNK: tl.constexpr = 64):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n
    tl.store(Y + offs, tl.load(Y + offs, mask=mask) + 1.0, mask=mask)


def scale_shift(x):
    n = x.numel()
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(n, 64),)](x, out, n, BLOCK=64)
    shift_kernel[(triton.cdiv(n, 64),)](out, n)
    return out
'''


def test_a_program_axis_block_shrinks_only_where_the_grid_follows_it(tmp_path):
    blocks = lambda source: sorted(v.params["BLOCK"] for v in rewrite("block-size-num-warps", source, {})  # noqa: E731
                                   if "BLOCK" in v.params)
    assert blocks(TWO_GRIDS) == [32, 128]  # triton.cdiv(n, 64) divides by the knob: the setter moves it
    floor = TWO_GRIDS.replace("scale_kernel[(triton.cdiv(n, 64),)]", "scale_kernel[((n + 63) // 64,)]")
    assert floor != TWO_GRIDS and blocks(floor) == [128]  # a grid that would not follow: no smaller block
    call, reference = "scale_shift(torch.randn(1000))", "lambda x: x * 3 + 1"
    for variant in rewrite("block-size-num-warps", floor, {}):
        assert candidate_rejection(tmp_path, floor, variant.source, "scale_shift", call, reference) == "", variant.params


def test_a_block_change_moves_only_its_own_launchs_grid(tmp_path):
    # shift_kernel's grid divides by 64 for its own CHUNK: before, doubling BLOCK halved it too
    wider = next(v for v in rewrite("block-size-num-warps", TWO_GRIDS, {}) if v.params.get("BLOCK") == 128)
    assert "scale_kernel[(triton.cdiv(n, 128),)]" in wider.source
    assert "shift_kernel[(triton.cdiv(n, 64),)]" in wider.source
    assert candidate_rejection(tmp_path, TWO_GRIDS, wider.source, "scale_shift", "scale_shift(torch.randn(1000))",
                               "lambda x: x * 3 + 1") == ""


def test_a_mask_sized_by_the_block_itself_does_not_let_it_grow():
    # `cols < BLOCK` is true for every lane whatever BLOCK is: grown, the block would read past the row
    by_block = WHOLE_ROW.replace("mask = cols < n_cols", "mask = cols < BLOCK")
    assert by_block != WHOLE_ROW
    assert block_resizing(_kernel(WHOLE_ROW, "softmax_kernel"), "BLOCK").grow
    assert not block_resizing(_kernel(by_block, "softmax_kernel"), "BLOCK").grow


ROW_MAX = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def rowmax_kernel(X, Out, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + row * n + offs, mask=offs < n, other=0.0)
    tl.store(Out + row, tl.max(x, axis=0))


def rowmax(x):
    rows, n = x.shape
    out = torch.empty(rows, dtype=x.dtype)
    rowmax_kernel[(rows,)](x, out, n, BLOCK=64)
    return out
'''


def test_a_block_whose_masked_lanes_would_join_a_max_does_not_grow_or_fit(tmp_path):
    # right for 64-wide rows as written; grown to 128, 64 masked zeros join the max of a negative row
    assert not block_resizing(_kernel(ROW_MAX, "rowmax_kernel"), "BLOCK").grow
    assert not [v for v in rewrite("block-size-num-warps", ROW_MAX, {}) if "BLOCK" in v.params]
    assert rewrite("fit-tile-to-extent", ROW_MAX, {}) == []
    identity = ROW_MAX.replace("other=0.0", "other=-float('inf')")
    selected = ROW_MAX.replace("tl.max(x, axis=0)", "tl.max(tl.where(offs < n, x, -float('inf')), axis=0)")
    for source in (identity, selected):
        assert source != ROW_MAX and block_resizing(_kernel(source, "rowmax_kernel"), "BLOCK").grow
    wider = next(v for v in rewrite("block-size-num-warps", identity, {}) if v.params.get("BLOCK") == 128)
    assert candidate_rejection(tmp_path, identity, wider.source, "rowmax", "rowmax(-torch.rand(3, 64) - 1)",
                               "lambda x: x.max(1).values") == ""
