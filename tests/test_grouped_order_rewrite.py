"""grouped-program-order: a dot kernel's program ids renumbered into the matmul tutorial's grouped launch order,
a bijection of the grid, so every tile is computed once and the values do not change."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from diagnose.rewriters import rewrite

PATTERN = "grouped-program-order"

MATMUL = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
        """C = A @ B, one output tile per program."""
        rm = tl.program_id(axis=0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    def matmul(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        matmul_kernel[grid](a, b, c, M, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        return c
    ''')

# Each program marks the cell of its (pid 0, pid 1) once: after the renumbering every cell must be marked
# exactly once, for grids whose axis-1 extent is not a multiple of the group.
MARKS = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mark_kernel(out_ptr, n1, unused_ptr):
        i = tl.program_id(0)
        j = tl.program_id(1)
        r = tl.arange(0, 16)
        t = tl.dot(tl.load(unused_ptr + r[:, None] * 16 + r[None, :]), tl.load(unused_ptr + r[:, None] * 16 + r[None, :]))
        tl.atomic_add(out_ptr + i * n1 + j, 1 + 0 * tl.sum(tl.sum(t, axis=1), axis=0).to(tl.int32))


    def marks(n0, n1):
        out = torch.zeros(n0 * n1, dtype=torch.int32)
        mark_kernel[(n0, n1)](out, n1, torch.zeros(256))
        return out
    ''')


def test_the_renumbering_covers_every_tile_once(tmp_path):
    from conftest import candidate_rejection

    variants = rewrite(PATTERN, MARKS, {})
    assert [v.params["group"] for v in variants] == [8, 4, 16]
    reference = "lambda n0, n1: torch.ones(n0 * n1, dtype=torch.int32)"
    for variant in variants:
        for n0, n1 in ((5, 7), (3, 17), (9, 1), (1, 20)):
            assert candidate_rejection(tmp_path, MARKS, variant.source, "marks", f"marks({n0}, {n1})", reference,
                                       seeds=1) == "", (variant.params, n0, n1)


def test_a_matmul_is_renumbered_and_computes_the_same_product(tmp_path):
    from conftest import candidate_rejection

    variants = rewrite(PATTERN, MATMUL, {})
    text = variants[0].source
    assert variants[0].params == {"group": 8, "kernels": ["matmul_kernel"]}
    assert '"""C = A @ B, one output tile per program."""\n    _kb_i, _kb_j = tl.program_id(0), tl.program_id(1)' in text
    assert "rm = _kb_pid0 * BLOCK_M" in text and "rn = _kb_pid1 * BLOCK_N" in text
    for variant in variants:  # 7 x 5 tiles: the last group narrower than 4, 8 and 16
        assert candidate_rejection(tmp_path, MATMUL, variant.source, "matmul",
                                   "matmul(torch.randn(100, 40), torch.randn(40, 72))", "torch.matmul", seeds=1) == ""


def test_the_renumbered_kernel_compiles_for_sm90(tmp_path: Path):
    from harness.capture import capture_call

    module = tmp_path / "grouped.py"
    module.write_text(rewrite(PATTERN, MATMUL, {})[0].source)
    arts = capture_call(module, "matmul(torch.randn(128, 64), torch.randn(64, 96))", cache_dir=tmp_path / "cache")
    assert [a.kernel for a in arts] == ["matmul_kernel"] and "tt.get_num_programs" in arts[0].stages["ttir"]


@pytest.mark.parametrize("change", [
    ("acc += tl.dot(a, b)", "acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)"),  # no dot
    ("rn = tl.program_id(1) * BLOCK_N", "rn = 0 * BLOCK_N"),  # one axis only
    ("rn = tl.program_id(1) * BLOCK_N", "rn = tl.program_id(K % 2) * BLOCK_N"),  # an axis not known
    ("rn = tl.program_id(1) * BLOCK_N", "rn = tl.program_id(1) % tl.num_programs(1) * BLOCK_N"),  # renumbered already
])
def test_it_declines_kernels_it_cannot_renumber_whole(change):
    old, new = change
    assert old in MATMUL
    assert rewrite(PATTERN, MATMUL.replace(old, new), {}) == []


def test_a_helper_reading_program_ids_is_not_renumbered_alone_nor_through_another():
    # The dot and the program ids in a helper the launched kernel calls: renumbering the helper alone would
    # store its tiles at the caller's unrenumbered coordinates.
    in_helper = MATMUL.replace('''@triton.jit
def matmul_kernel(''', '''@triton.jit
def tile(a_ptr, b_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    return tl.dot(tl.load(a_ptr + rm[:, None] * K + rk[None, :]), tl.load(b_ptr + rk[:, None] * N + rn[None, :]))


@triton.jit
def matmul_kernel(''').replace("        acc += tl.dot(a, b)\n", "        acc += tl.dot(a, b) + 0 * tile(a_ptr, b_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)\n")
    assert "tile(a_ptr" in in_helper
    assert rewrite(PATTERN, in_helper, {}) == []
    # Two levels down.
    nested = MATMUL.replace('''@triton.jit
def matmul_kernel(''', '''@triton.jit
def column_index():
    return tl.program_id(1)


@triton.jit
def columns(BLOCK_N: tl.constexpr):
    return column_index() * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def matmul_kernel(''').replace("rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
                               "rn = columns(BLOCK_N) + 0 * tl.program_id(1)")
    assert "columns(BLOCK_N)" in nested
    assert rewrite(PATTERN, nested, {}) == []


def test_it_declines_a_module_that_does_not_bind_tl():
    spelled = MATMUL.replace("import triton.language as tl\n", "").replace("tl.", "triton.language.")
    assert "tl.dot" not in spelled.replace("language.dot", "") and rewrite(PATTERN, spelled, {}) == []


def test_it_declines_a_kernel_whose_helper_reads_program_ids():
    helper = MATMUL.replace('''@triton.jit
def matmul_kernel(''', '''@triton.jit
def column(BLOCK_N: tl.constexpr):
    return tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def matmul_kernel(''').replace("rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
                               "rn = column(BLOCK_N) + 0 * tl.program_id(1)")
    assert "column(BLOCK_N)" in helper
    assert rewrite(PATTERN, helper, {}) == []
