"""A dot kernel whose one block sizes its M rows, N columns and K step (first drafts of addmm write
`BLOCK_SIZE` for all three) is untied into one block per role, read from the kernel's structure, so the
tile search gives it Hopper tiles; a kernel that relies on the tile being square is left as written."""

from __future__ import annotations

import textwrap

import pytest
from conftest import candidate_rejection

from diagnose.rewriters import dot_tile_autotune, dot_tile_configs
from diagnose.rewriters.untie import untie_shared_block

# The shape of TritonBench-T's first addmm draft: one BLOCK_SIZE, a wrapper local, an epilogue that reads a
# third tensor through a local address.
SQUARE = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def addmm_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, K, N, s_am, s_ak, s_bk, s_bn, beta: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
        pid0 = tl.program_id(0)
        pid1 = tl.program_id(1)
        row_start = pid0 * BLOCK_SIZE
        rows = row_start + tl.arange(0, BLOCK_SIZE)
        cols = pid1 * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        acc = tl.zeros((BLOCK_SIZE, BLOCK_SIZE), dtype=tl.float32)
        for k in range(0, K, BLOCK_SIZE):
            ks = k + tl.arange(0, BLOCK_SIZE)
            a = tl.load(a_ptr + rows[:, None] * s_am + ks[None, :] * s_ak, mask=(rows[:, None] < M) & (ks[None, :] < K),
                        other=0.0)
            b = tl.load(b_ptr + ks[:, None] * s_bk + cols[None, :] * s_bn, mask=(ks[:, None] < K) & (cols[None, :] < N),
                        other=0.0)
            acc += tl.dot(a, b)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        c_ptrs = c_ptr + rows[:, None] * N + cols[None, :]
        acc += beta * tl.load(c_ptrs, mask=mask, other=0.0)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=mask)


    def addmm(c, a, b, beta=1.0):
        M, K = a.shape
        N = b.shape[1]
        out = torch.empty((M, N), dtype=torch.float32, device=a.device)
        BLOCK_SIZE = 32
        grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE))
        addmm_kernel[grid](a, b, c, out, M, K, N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), beta,
                           BLOCK_SIZE=BLOCK_SIZE)
        return out
    ''')
CALL = "addmm(torch.randn(70, 90), torch.randn(70, 50), torch.randn(50, 90))"
REFERENCE = "lambda c, a, b: c + a @ b"

# The tutorial's spelling: a counted K loop, the K offsets bound alone, advancing addresses, the block at
# the launch as a literal and a `meta` grid, the program axes swapped (axis 0 steps the columns).
COUNTED = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, B: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        offs_m = pid_m * B + tl.arange(0, B)
        offs_n = pid_n * B + tl.arange(0, B)
        offs_k = tl.arange(0, B)
        a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
        b_ptrs = b_ptr + offs_k[:, None] * N + offs_n[None, :]
        acc = tl.zeros((B, B), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, B)):
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * B), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * B) & (offs_n[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
            a_ptrs += B
            b_ptrs += B * N
        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


    def mm(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=torch.float32, device=a.device)
        grid = lambda meta: (triton.cdiv(N, meta["B"]), triton.cdiv(M, meta["B"]))
        mm_kernel[grid](a, b, c, M, N, K, B=32)
        return c
    ''')


def test_a_shared_block_is_untied_by_role_and_the_tile_search_then_applies(tmp_path):
    assert dot_tile_configs(SQUARE.replace("BLOCK_SIZE", "BLOCK"), {}) != []  # reaches it under any name
    untied = untie_shared_block(SQUARE)
    assert untied is not None and untied.block == "BLOCK_SIZE"
    assert untied.names == {"M": "BLOCK_M", "N": "BLOCK_N", "K": "BLOCK_K"}
    text = untied.source
    for line in ("row_start = pid0 * BLOCK_M", "rows = row_start + tl.arange(0, BLOCK_M)",
                 "cols = pid1 * BLOCK_N + tl.arange(0, BLOCK_N)", "acc = tl.zeros((BLOCK_M, BLOCK_N)",
                 "for k in range(0, K, BLOCK_K):", "ks = k + tl.arange(0, BLOCK_K)",
                 "BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr",
                 "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
                 "BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K"):
        assert line in text, line
    assert "    BLOCK_SIZE = 32\n    BLOCK_M = 32\n    BLOCK_N = 32\n    BLOCK_K = 32\n" in text
    assert candidate_rejection(tmp_path, SQUARE, text, "addmm", CALL, REFERENCE, seeds=1) == ""
    variants = dot_tile_configs(SQUARE, {})
    assert len(variants) == 6 and all(v.params["untied"] == "BLOCK_SIZE" for v in variants)
    narrow = next(v for v in variants if (v.params["BLOCK_M"], v.params["BLOCK_N"]) == (64, 128))
    assert "BLOCK_M = 64\n    BLOCK_N = 128\n    BLOCK_K = 32\n" in narrow.source
    assert candidate_rejection(tmp_path, SQUARE, narrow.source, "addmm", CALL, REFERENCE, seeds=1) == ""
    # Its epilogue reads `c` through a local address (c_ptrs): still a parameter, so a tuner may rerun it.
    (tuned,) = dot_tile_autotune(SQUARE, {})
    assert tuned.params["untied"] == "BLOCK_SIZE" and "@triton.autotune(" in tuned.source
    assert 'grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))' in tuned.source
    assert candidate_rejection(tmp_path, SQUARE, tuned.source, "addmm", CALL, REFERENCE, seeds=1) == ""


def test_the_tutorials_spelling_with_swapped_axes_and_a_literal_block_is_untied(tmp_path):
    untied = untie_shared_block(COUNTED)
    assert untied is not None
    text = untied.source
    for line in ("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
                 "offs_k = tl.arange(0, BLOCK_K)", "for k in range(0, tl.cdiv(K, BLOCK_K)):",
                 "K - k * BLOCK_K", "a_ptrs += BLOCK_K\n", "b_ptrs += BLOCK_K * N",
                 'grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, meta["BLOCK_M"]))',
                 "BLOCK_M=32, BLOCK_N=32, BLOCK_K=32"):
        assert line in text, line
    call, reference = "mm(torch.randn(70, 50), torch.randn(50, 90))", "lambda a, b: a @ b"
    assert candidate_rejection(tmp_path, COUNTED, text, "mm", call, reference, seeds=1) == ""
    wide = next(v for v in dot_tile_configs(COUNTED, {}) if v.params["BLOCK_N"] == 128 and v.params["BLOCK_M"] == 64)
    assert candidate_rejection(tmp_path, COUNTED, wide.source, "mm", call, reference, seeds=1) == ""


@pytest.mark.parametrize("old, new, why", [
    ("    cols = pid1 * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n",
     "    cols = pid1 * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n    same = tl.arange(0, BLOCK_SIZE)\n",
     "a vector of the block no access reads"),
    # one offset vector read as the rows of the first operand and as its K: the tile must be square
    ("rows[:, None] * s_am + ks[None, :] * s_ak", "rows[:, None] * s_am + rows[None, :] * s_ak", "rows as K too"),
    # the block read in a way no rule gives a role to
    ("        acc += tl.dot(a, b)\n", "        acc += tl.dot(a, b) * (BLOCK_SIZE / 32)\n", "an unread use"),
    # the grid counts a third axis by the block
    ("grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE))",
     "grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE), triton.cdiv(K, BLOCK_SIZE))", "a third axis"),
    # a block the wrapper computes: no literal to untie into
    ("BLOCK_SIZE = 32\n", "BLOCK_SIZE = min(32, triton.next_power_of_2(M))\n", "computed"),
    # the wrapper reads the block beyond the launch and its grid: that read would keep the old size
    ("    return out\n", "    tiles = torch.empty(triton.cdiv(M, BLOCK_SIZE))\n    return out\n", "read elsewhere"),
])
def test_a_kernel_that_relies_on_a_square_tile_or_is_not_read_whole_stays_tied(old, new, why):
    source = SQUARE.replace(old, new)
    assert source != SQUARE, why
    assert untie_shared_block(source) is None, why
    assert dot_tile_configs(source, {}) == [], why


def test_tile_blocks_bound_to_one_wrapper_local_get_a_local_each_before_the_tile_search(tmp_path):
    """`BLOCK_M=BS, BLOCK_N=BS, BLOCK_K=BS`: a tile set where they are written would set the one local three times
    (its last knob winning), so the variant would not be the tile its params name. Each block gets its own local
    first, and each grid axis reads its own block's."""
    untied = untie_shared_block(SQUARE)
    assert untied is not None
    shared = untied.source.replace("BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K",
                                   "BLOCK_M=BLOCK_SIZE, BLOCK_N=BLOCK_SIZE, BLOCK_K=BLOCK_SIZE").replace(
        "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
        "grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE))").replace(
        "    BLOCK_M = 32\n    BLOCK_N = 32\n    BLOCK_K = 32\n", "")
    assert "BLOCK_N=BLOCK_SIZE" in shared and "BLOCK_N = 32" not in shared
    variants = dot_tile_configs(shared, {})
    assert len(variants) == 6 and all(v.params["untied"] == "BLOCK_SIZE" for v in variants)
    narrow = next(v for v in variants if (v.params["BLOCK_M"], v.params["BLOCK_N"]) == (64, 128))
    assert "BLOCK_M = 64\n    BLOCK_N = 128\n    BLOCK_K = 32\n" in narrow.source
    assert "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))" in narrow.source
    assert candidate_rejection(tmp_path, shared, narrow.source, "addmm", CALL, REFERENCE, seeds=1) == ""
    # A grid axis that reads the shared local for no block of the tile: left as written, no tiles.
    third = shared.replace("grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE))",
                           "grid = (triton.cdiv(M, BLOCK_SIZE), triton.cdiv(N, BLOCK_SIZE), triton.cdiv(K, BLOCK_SIZE))")
    assert third != shared and dot_tile_configs(third, {}) == []
    # Nor where the wrapper reads the shared local beyond the launch and its grid.
    sized = shared.replace("    return out\n", "    tiles = torch.empty(triton.cdiv(M, BLOCK_SIZE))\n    return out\n")
    assert sized != shared and dot_tile_configs(sized, {}) == []


def test_a_block_passed_by_position_is_passed_once_per_role_in_the_new_parameters_order(tmp_path):
    source = SQUARE.replace("beta,\n                       BLOCK_SIZE=BLOCK_SIZE)", "beta,\n                       BLOCK_SIZE)")
    assert source != SQUARE
    untied = untie_shared_block(source)
    assert untied is not None
    assert "beta,\n                       BLOCK_M, BLOCK_N, BLOCK_K)" in untied.source
    assert candidate_rejection(tmp_path, source, untied.source, "addmm", CALL, REFERENCE, seeds=1) == ""
