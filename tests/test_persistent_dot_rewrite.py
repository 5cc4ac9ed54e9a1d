"""The persistent tensor-descriptor form of a tiled matmul (issue 27, family 2): one program per SM walks the
output tiles of the 2-D grid, with TMA loads, with and without warp specialization; correct under the real
judge (interpreter) on aligned, ragged and TMA-ineligible shapes, compiled for sm90; declined where the
kernel's tiles cannot be counted from its own masks."""

from __future__ import annotations

import textwrap

import pytest
from conftest import FIXTURES, candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.persistent_dot import MIN_FIXED_TILE

MATMUL = FIXTURES.parent.parent / "corpora" / "operators" / "matmul" / "matmul.py"
# The corpus matmul launched on a 128x64 tile: large enough for one program per SM (`MIN_FIXED_TILE`).
WIDE = MATMUL.read_text().replace("grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))",
                                  "grid = (triton.cdiv(m, 128), triton.cdiv(n, 64))") \
    .replace("BLOCK_M=64, BLOCK_N=64, BLOCK_K=32", "BLOCK_M=128, BLOCK_N=64, BLOCK_K=32")


def _persistent(source: str) -> list:
    return [v for v in rewrite("persistent-kernel", source, {}) if "persistent" in v.params]


def test_a_tiled_matmul_gets_both_forms_with_its_launch_on_the_sm_count():
    variants = _persistent(WIDE)
    assert [v.params["warp_specialize"] for v in variants] == [False, True]
    source = variants[1].source
    assert "_kb_tiles_m = tl.cdiv(M, BLOCK_M)" in source and "_kb_tiles_n = tl.cdiv(N, BLOCK_N)" in source
    assert "tl.num_programs(0), flatten=True, warp_specialize=True):" in source
    assert "matmul_kernel_tma[(_kb_sm_count,)](" in source and "matmul_kernel[grid](" in source  # TMA's rules, else as written
    # The descriptors are made once per program, before the tile loop.
    assert source.index("a_desc = tl.make_tensor_descriptor") < source.index("for _kb_tile in")


@pytest.mark.parametrize("call", [
    "matmul(torch.randn(128, 64).half(), torch.randn(64, 128).half())",   # whole tiles: 4 of them on 4 programs
    "matmul(torch.randn(200, 96).half(), torch.randn(96, 136).half())",   # ragged last tiles (TMA pads, the store masks)
    "matmul(torch.randn(65, 65).half(), torch.randn(65, 33).half())",     # 130-byte rows: the kernel as written
])
def test_the_persistent_forms_pass_the_judge(tmp_path, call):
    for variant in _persistent(WIDE):
        assert candidate_rejection(tmp_path, WIDE, variant.source, "matmul", call, "torch.matmul",
                                   seeds=1) == "", variant.params


def test_the_warp_specialized_form_compiles_for_sm90_as_one_flattened_tile_loop(tmp_path):
    from harness.capture import capture_call

    (tmp_path / "persistent.py").write_text(_persistent(WIDE)[1].source)
    [art] = capture_call(tmp_path / "persistent.py", "matmul(torch.randn(512, 512).half(), torch.randn(512, 512).half())",
                         target="cuda:90")
    assert art.kernel == "matmul_kernel_tma"
    assert "ttng.async_tma_copy_global_to_local" in art.stages["ttgir"]
    assert "ttng.warp_group_dot" in art.stages["ttgir"]


def test_a_launch_fixed_tile_too_small_for_one_program_per_sm_is_left_to_the_tile_search():
    # 64x64: on the H200 a draft's 64x64x32 tile ran 2.4-3.5x slower persistent than on its own grid.
    assert MIN_FIXED_TILE == 64 * 128 and _persistent(MATMUL.read_text()) == []
    # The same tile written as wrapper locals passed by position (TritonBench-T's drafts) is read as well.
    positional = WIDE.replace("BLOCK_M=128, BLOCK_N=64, BLOCK_K=32", "BLOCK_M, BLOCK_N, BLOCK_K").replace(
        "    grid = (", "    BLOCK_M = 64\n    BLOCK_N = 64\n    BLOCK_K = 32\n    grid = (")
    assert "BLOCK_M = 64" in positional and _persistent(positional) == []
    assert len(_persistent(positional.replace("BLOCK_N = 64", "BLOCK_N = 128"))) == 2


def test_tiles_that_cannot_be_counted_from_the_masks_are_left_alone():
    source = WIDE
    # Rows bounded by a value the kernel recomputes: the tile count read before the loop would be stale.
    moved = source.replace("    rm = pid_m * BLOCK_M", "    M = M - 0\n    rm = pid_m * BLOCK_M")
    assert _persistent(moved) == []
    # A third program axis (a batch): not a 2-D tile grid.
    batched = source.replace("    rk = tl.arange(0, BLOCK_K)", "    rk = tl.arange(0, BLOCK_K) + tl.program_id(2) * 0")
    assert _persistent(batched) == []
    # Rows without a bound: nothing to count them by.
    unmasked = textwrap.dedent(source).replace("mask=(rm[:, None] < M) & (rn[None, :] < N)", "mask=rn[None, :] < N") \
        .replace("mask=(rm[:, None] < M) & ((k + rk)[None, :] < K)", "mask=(k + rk)[None, :] < K")
    assert _persistent(unmasked) == []


def test_an_autotuned_matmul_lets_its_tuner_pick_the_tile_and_the_warp_specialization(tmp_path):
    # The loop's round 1 on this matmul (H200): the tile search's size-keyed @triton.autotune.
    (tuned,) = [v for v in rewrite("autotune-configs", MATMUL.read_text(), {}) if "autotune" in v.params]
    (variant,) = _persistent(tuned.source)
    assert variant.params["warp_specialize"] == "tuned" and variant.params["configs_added"] == 8
    kernel = variant.source[variant.source.index("def matmul_kernel_tma"):]
    assert "_KB_WARP_SPECIALIZE: tl.constexpr = False" in kernel and "warp_specialize=_KB_WARP_SPECIALIZE" in kernel
    configs = variant.source[variant.source.rindex("@triton.autotune", 0, variant.source.index("def matmul_kernel_tma")):]
    assert '"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "_KB_WARP_SPECIALIZE": True}, num_warps=8, num_stages=3' in configs
    call = "matmul(torch.randn(200, 96).half(), torch.randn(96, 136).half())"
    assert candidate_rejection(tmp_path, MATMUL.read_text(), variant.source, "matmul", call, "torch.matmul", seeds=1) == ""
