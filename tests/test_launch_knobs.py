"""Launch knobs where first drafts write them (issue 27): a block size bound to a name the wrapper
assigns once (`BLOCK_SIZE = 1024`, then `BLOCK_SIZE=BLOCK_SIZE` or by position), or passed by position,
is a knob the launch search and the dot-tile search change where it is written, so the grid that
reads the same name follows. A name whose value depends on a branch or a loop is not a knob."""

from __future__ import annotations

import textwrap

import libcst as cst
from conftest import candidate_rejection

from diagnose.rewriters import dot_tile_autotune, dot_tile_configs, rewrite
from diagnose.rewriters.launch import Knob, current_knobs, jit_names

SCALE = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


    def scale(x, alpha):
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK_SIZE = 256
        grid = (triton.cdiv(n, BLOCK_SIZE),)
        scale_kernel[grid](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)
        return out
    ''')


def _knobs(source: str) -> dict[str, Knob]:
    module = cst.parse_module(source)
    return current_knobs(module, jit_names(module))


def test_a_block_bound_to_a_local_name_changes_where_it_is_assigned_and_the_grid_follows(tmp_path):
    assert _knobs(SCALE)["BLOCK_SIZE"] == Knob(256, local="BLOCK_SIZE", scope="scale")
    variants = {tuple(v.params.items()): v.source for v in rewrite("block-size-num-warps", SCALE, {})}
    halved = variants[(("BLOCK_SIZE", 128),)]
    assert "    BLOCK_SIZE = 128\n" in halved and "BLOCK_SIZE=BLOCK_SIZE)" in halved
    # The grid reads the name: at 128 a grid left at 256 would cover half of x.
    assert candidate_rejection(tmp_path, SCALE, halved, "scale", "scale(torch.randn(1000), 3.0)", "lambda x, a: x * a",
                               seeds=1) == ""


def test_a_block_passed_by_position_is_a_knob_and_a_size_passed_by_position_is_not():
    source = SCALE.replace("BLOCK_SIZE: tl.constexpr)", "N: tl.constexpr, BLOCK_SIZE: tl.constexpr)")
    source = source.replace("    BLOCK_SIZE = 256\n    grid = (triton.cdiv(n, BLOCK_SIZE),)\n",
                            "    grid = (triton.cdiv(n, 256),)\n")
    source = source.replace("scale_kernel[grid](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)",
                            "scale_kernel[grid](x, out, n, alpha, 4096, 256)")
    assert _knobs(source) == {"BLOCK_SIZE": Knob(256)}  # N is a problem size: never searched
    doubled = next(v.source for v in rewrite("block-size-num-warps", source, {}) if v.params == {"BLOCK_SIZE": 512})
    assert "scale_kernel[grid](x, out, n, alpha, 4096, 512)" in doubled
    assert "grid = (triton.cdiv(n, 512),)" in doubled  # the literal divisor moves with it, as for a keyword


def test_a_name_a_branch_or_a_loop_may_change_is_not_a_knob():
    branch = SCALE.replace("    BLOCK_SIZE = 256\n", "    BLOCK_SIZE = 256\n    if n < 4096:\n        BLOCK_SIZE = 64\n")
    assert "BLOCK_SIZE" not in _knobs(branch)
    looped = SCALE.replace("    BLOCK_SIZE = 256\n    grid = (triton.cdiv(n, BLOCK_SIZE),)\n"
                           "    scale_kernel[grid](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)\n",
                           "    BLOCK_SIZE = 256\n    for _ in range(2):\n"
                           "        scale_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)\n"
                           "        BLOCK_SIZE = 512\n")
    assert "BLOCK_SIZE" not in _knobs(looped)
    parameter = SCALE.replace("def scale(x, alpha):", "def scale(x, alpha, BLOCK_SIZE):").replace("    BLOCK_SIZE = 256\n", "")
    assert "BLOCK_SIZE" not in _knobs(parameter)
    # Warps from a heuristic size nothing else: the search sets them at the launch, the heuristic stays.
    heuristic = branch.replace("BLOCK_SIZE=BLOCK_SIZE)", "BLOCK_SIZE=BLOCK_SIZE, num_warps=nw)").replace(
        "    out = torch.empty_like(x)\n", "    out = torch.empty_like(x)\n    nw = 4 if x.numel() < 4096 else 8\n")
    variants = {tuple(v.params.items()): v.source for v in rewrite("block-size-num-warps", heuristic, {})}
    assert "BLOCK_SIZE=BLOCK_SIZE, num_warps=2)" in variants[(("num_warps", 2),)]
    assert not any(k[0][0] == "BLOCK_SIZE" for k in variants)  # the branch's block is no knob
    # The same literal reached in each branch that launches (the drafts' 2-D and batched paths): a knob,
    # and both assignments move together.
    both = SCALE.replace("    BLOCK_SIZE = 256\n    grid = (triton.cdiv(n, BLOCK_SIZE),)\n"
                         "    scale_kernel[grid](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)\n",
                         "    if n < 4096:\n        BLOCK_SIZE = 256\n"
                         "        scale_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)\n"
                         "        return out\n    BLOCK_SIZE = 256\n"
                         "    scale_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, alpha, BLOCK_SIZE=BLOCK_SIZE)\n")
    doubled = next(v.source for v in rewrite("block-size-num-warps", both, {}) if v.params == {"BLOCK_SIZE": 512})
    assert doubled.count("BLOCK_SIZE = 512\n") == 2


# The shape of TritonBench-T's first draft of torch.matmul: the tile blocks are locals passed by
# position, the grid divides by the same names, and a second kernel (the 1-D dot product) is launched
# on a grid of its own from the same wrapper.
MATMUL = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def dot_kernel(x_ptr, y_ptr, out_ptr, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < N) * tl.load(y_ptr + offs, mask=offs < N)))


    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    def matmul(a, b):
        if a.dim() == 1:
            out = torch.empty((), dtype=torch.float32, device=a.device)
            grid = (1,)
            dot_kernel[grid](a, b, out, a.numel(), 1024)
            return out
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=torch.float32, device=a.device)
        BLOCK_M = 256
        BLOCK_N = 256
        BLOCK_K = 16
        grid = ((M + BLOCK_M - 1) // BLOCK_M, (N + BLOCK_N - 1) // BLOCK_N)
        matmul_kernel[grid](a, b, c, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        return c
    ''')


def test_a_draft_matmul_with_local_blocks_gets_whole_tiles_and_its_grid_follows(tmp_path):
    variants = dot_tile_configs(MATMUL, {})
    assert len(variants) == 6
    wide = variants[0]
    assert wide.params == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 4, "num_warps": 8}
    assert "    BLOCK_M = 128\n    BLOCK_N = 256\n    BLOCK_K = 64\n" in wide.source
    # warps and stages go to the tiled kernel's launch only; the dot product's launch is as written
    assert "dot_kernel[grid](a, b, out, a.numel(), 1024)\n" in wide.source
    assert "matmul_kernel[grid](a, b, c, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, num_stages=4, num_warps=8)" in wide.source
    # 64 x 128 tiles: a grid that kept 256 x 256 would compute an eighth of the output's blocks
    narrow = next(v for v in variants if v.params["BLOCK_M"] == 64 and v.params["BLOCK_N"] == 128)
    assert candidate_rejection(tmp_path, MATMUL, narrow.source, "matmul",
                               "matmul(torch.randn(130, 40), torch.randn(40, 300))", "lambda a, b: a @ b", seeds=1) == ""


def test_a_draft_matmul_with_local_blocks_passed_by_position_gets_a_size_keyed_tuner(tmp_path):
    """No one tile suits 256^2 and 4096^2 (scripts/matmul_headroom.py on the H200: each size's best tile
    differs), so the drafts' form, blocks bound to wrapper locals and passed by position, gets the tuner too."""
    tuned = dot_tile_autotune(MATMUL, {})
    assert len(tuned) == 1
    source = tuned[0].source
    assert tuned[0].params["key"] == ["M", "N", "K"]
    assert tuned[0].params["autotune"][0] == {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 16, "num_stages": 3, "num_warps": 4}
    # The tuner owns the blocks: the trailing positions that passed them go, the grid reads the picked config.
    assert "matmul_kernel[grid](a, b, c, M, N, K)" in source
    assert 'grid = lambda meta: ((M + meta["BLOCK_M"] - 1) // meta["BLOCK_M"], (N + meta["BLOCK_N"] - 1) // meta["BLOCK_N"])' \
        in source
    assert "dot_kernel[grid](a, b, out, a.numel(), 1024)" in source  # the other kernel's launch as written
    # Checked under every config it may pick (the judge pins each one), on a size no tile divides.
    assert candidate_rejection(tmp_path, MATMUL, source, "matmul",
                               "matmul(torch.randn(130, 40), torch.randn(40, 300))", "lambda a, b: a @ b", seeds=1) == ""
    # A block read outside the launch and its grid (here a tile count the kernel is passed) would keep the
    # old size for the tuned kernel; a position followed by another would shift it: no tuner for either.
    counted = MATMUL.replace("def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,", "def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, T,")
    counted = counted.replace("matmul_kernel[grid](a, b, c, M, N, K,", "tiles = (M + BLOCK_M - 1) // BLOCK_M\n"
                              "    matmul_kernel[grid](a, b, c, M, N, K, tiles,")
    assert "tiles = (M + BLOCK_M" in counted and dot_tile_configs(counted, {}) and dot_tile_autotune(counted, {}) == []
    shifted = MATMUL.replace("BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, SCALE):").replace(
        "BLOCK_M, BLOCK_N, BLOCK_K)", "BLOCK_M, BLOCK_N, BLOCK_K, 2.0)")
    assert "BLOCK_K, 2.0)" in shifted and dot_tile_configs(shifted, {}) and dot_tile_autotune(shifted, {}) == []
    # A grid that is a lambda reading the local would keep the old block whatever the tuner picks.
    lazy = MATMUL.replace("grid = ((M + BLOCK_M", "grid = lambda meta: ((M + BLOCK_M")
    assert "grid = lambda meta: ((M + BLOCK_M" in lazy and dot_tile_autotune(lazy, {}) == []


def test_after_a_small_shape_path_over_the_tuner_the_tile_search_leaves_the_tuned_kernel_to_its_configs(tmp_path):
    """On the H200 the TritonBench-T matmul's round 2 was this module (the draft up to 1.3 MB of inputs, the
    tuner above); round 3's tile variants passed BLOCK_M=... to the tuned kernel as well, and every check
    failed with "got multiple values for argument"."""
    from diagnose.rewriters.dispatch import size_dispatch

    merged = size_dispatch(MATMUL, dot_tile_autotune(MATMUL, {})[0].source, "matmul", 40_000)
    assert merged is not None
    tuned_launch = next(line for line in merged.splitlines() if "matmul_kernel[grid](a, b, c, M, N, K)" in line)
    variants = dot_tile_configs(merged, {})
    assert variants and all(tuned_launch in v.source.splitlines() for v in variants)  # the tuned launch as it was
    assert all("BLOCK_M = 256" not in v.source.split("_kb_small")[-1] for v in variants)
    small_call, large_call = "matmul(torch.randn(30, 40), torch.randn(40, 50))", "matmul(torch.randn(130, 40), torch.randn(40, 300))"
    for call in (small_call, large_call):  # either path, under every config the tuner may pick
        assert candidate_rejection(tmp_path, MATMUL, variants[3].source, "matmul", call, "lambda a, b: a @ b", seeds=1) == ""


def test_a_draft_matmul_whose_grid_counts_tiles_by_a_literal_gets_no_tile_search():
    # A grid that counts the tiles by a literal the blocks do not bind would keep the old size.
    fixed = MATMUL.replace("grid = ((M + BLOCK_M - 1) // BLOCK_M, (N + BLOCK_N - 1) // BLOCK_N)",
                           "grid = ((M + 31) // 32, (N + 31) // 32)")
    assert dot_tile_configs(fixed, {}) == []
    # The same when branches bind the grid: every tuple the wrapper binds to that name is checked.
    branched = fixed.replace("    grid = ((M + 31) // 32, (N + 31) // 32)\n",
                             "    if M > 4096:\n        grid = ((M + 31) // 32, (N + 31) // 32)\n"
                             "    else:\n        grid = ((M + BLOCK_M - 1) // BLOCK_M, (N + BLOCK_N - 1) // BLOCK_N)\n")
    assert branched != fixed and dot_tile_configs(branched, {}) == []


ROW_SETTINGS = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    def calculate_settings(n):  # Liger's and unsloth's: the block and the warps computed from the row
        block = triton.next_power_of_2(n)
        return block, 16 if block >= 8192 else 4


    @triton.jit
    def row_kernel(x_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
        cols = tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_ptr + tl.program_id(0) * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + tl.program_id(0) * n_cols + cols, x * 2.0, mask=cols < n_cols)


    def row_op(x):
        out = torch.empty_like(x)
        BLOCK_SIZE, num_warps = calculate_settings(x.shape[1])
        row_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
        return out
    ''')


def test_a_knob_the_wrapper_computes_is_searched_from_the_launchs_own_value():
    """Liger's GEGLU launched 16 warps (`calculate_settings`) and the search, not knowing it, proposed 2,
    8, 1 and 16 (the value it had) around Triton's default 4. With the launch's options, which the
    diagnosis intercepts, it steps from 16: 8 and 32 first."""
    def warps(context: dict) -> list[int]:
        return [v.params["num_warps"] for v in rewrite("block-size-num-warps", ROW_SETTINGS, context)
                if "num_warps" in v.params]

    assert warps({}) == [2, 8, 1, 16]  # from the default: 16, the launch's own value, is proposed as new
    launched = {"row_kernel": {"num_warps": 16, "num_stages": 3}}
    assert warps({"launched": launched})[:2] == [8, 32] and 16 not in warps({"launched": launched})
    # options of a kernel this module does not define change nothing
    assert warps({"launched": {"other_kernel": {"num_warps": 16, "num_stages": 3}}}) == [2, 8, 1, 16]
    # and the value the source spells still wins over the launch's
    spelled = ROW_SETTINGS.replace("num_warps=num_warps)", "num_warps=2)")
    assert 2 not in [v.params.get("num_warps") for v in rewrite("block-size-num-warps", spelled, {"launched": launched})]
