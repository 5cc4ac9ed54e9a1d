"""eviction-hints: a streamed operand marked evict_first, one every program re-reads evict_last
(diagnose/rewriters/eviction.py), judged on the interpreter and compiled for sm90."""

from __future__ import annotations

import re

import pytest
from conftest import candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.eviction import eviction_sites

PATTERN = "eviction-hints"

SCALE_ROWS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row * stride
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + base + cols, x * w, mask=mask)


def scale_rows(x, w):
    out = torch.empty_like(x)
    scale_rows_kernel[(x.shape[0],)](x, w, out, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
'''

GEMV = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def gemv_kernel(a_ptr, x_ptr, y_ptr, m, k, stride_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :], mask=(rows[:, None] < m) & (cols[None, :] < k),
                    other=0.0)
        v = tl.load(x_ptr + cols, mask=cols < k, other=0.0)
        acc += a * v[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1), mask=rows < m)


def gemv(a, x):
    m, k = a.shape
    y = torch.empty(m, dtype=torch.float32, device=a.device)
    gemv_kernel[(triton.cdiv(m, 32),)](a, x, y, m, k, a.stride(0), BLOCK_M=32, BLOCK_K=64)
    return y
'''


def test_the_row_is_streamed_and_the_weight_kept(tmp_path):
    (sites,) = eviction_sites(SCALE_ROWS)
    assert (sites.kernel, sites.streamed, sites.shared) == ("scale_rows_kernel", (12,), (13,))
    variants = rewrite(PATTERN, SCALE_ROWS, {})
    assert [v.params for v in variants] == [{"evict_first": 1, "evict_last": 1}, {"evict_first": 1}, {"evict_last": 1}]
    both = variants[0].source
    assert 'x = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first")' in both
    assert 'w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")' in both
    assert "evict_last" not in variants[1].source and "evict_first" not in variants[2].source
    for variant in variants:  # a hint changes no value
        assert candidate_rejection(tmp_path, SCALE_ROWS, variant.source, "scale_rows",
                                   "scale_rows(torch.randn(6, 100), torch.randn(100))", "lambda x, w: x * w") == ""


def test_a_gemv_streams_its_matrix_through_the_loop_past_its_vector(tmp_path):
    (sites,) = eviction_sites(GEMV)
    assert (sites.streamed, sites.shared) == ((12,), (14,))
    (both, *_) = rewrite(PATTERN, GEMV, {})
    assert candidate_rejection(tmp_path, GEMV, both.source, "gemv", "gemv(torch.randn(70, 200), torch.randn(200))",
                               "lambda a, x: a @ x") == ""


def test_the_hints_reach_the_sm90_loads_as_l2_cache_policies(tmp_path):
    from harness.capture import capture_call

    path = tmp_path / "scale_rows.py"
    path.write_text(rewrite(PATTERN, SCALE_ROWS, {})[0].source)
    ptx = capture_call(path, "scale_rows(torch.randn(64, 1024), torch.randn(1024))", target="cuda:90")[0].stages["ptx"]
    assert {"createpolicy.fractional.L2::evict_first.b64", "createpolicy.fractional.L2::evict_last.b64"} <= set(
        re.findall(r"createpolicy[\w.:]+", ptx))
    loads = set(re.findall(r"ld\.global[\w.:]*", ptx))
    assert any("L1::evict_first.L2::cache_hint" in x for x in loads) and any("L1::evict_last.L2::cache_hint" in x
                                                                              for x in loads)


@pytest.mark.parametrize("source, why", [
    # every operand streamed, none shared: nothing to keep
    (SCALE_ROWS.replace("w_ptr + cols", "w_ptr + base + cols"), "no shared operand"),
    # the row read again (a two-pass kernel): evict_first would drop what the second read needs
    (SCALE_ROWS.replace("    tl.store(out_ptr + base + cols, x * w, mask=mask)",
                        "    y = tl.load(x_ptr + base + cols, mask=mask, other=0.0)\n"
                        "    tl.store(out_ptr + base + cols, x * w + y, mask=mask)"), "the row loaded twice"),
    # a policy already chosen is the author's
    (SCALE_ROWS.replace("mask=mask, other=0.0)\n    w", 'mask=mask, other=0.0, cache_modifier=".cg")\n    w'),
     "the stream names its cache modifier"),
    # a dot's operands are shared along the other output axis
    (SCALE_ROWS.replace("x * w, mask=mask)", "x * w, mask=mask)\n    tl.dot(x[None, :], w[:, None])"), "a tl.dot"),
])
def test_what_is_not_a_stream_past_a_shared_operand_is_declined(source, why):
    assert source != SCALE_ROWS, why
    assert rewrite(PATTERN, source, {}) == [], why


def test_a_load_over_one_of_two_program_axes_is_neither():
    two_axes = SCALE_ROWS.replace("    base = row * stride\n", "    base = row * stride + tl.program_id(1) * BLOCK\n")
    two_axes = two_axes.replace("w_ptr + cols", "w_ptr + tl.program_id(1) * BLOCK + cols")
    # x over both axes is a stream; w over axis 1 only is re-read by the programs of axis 0, not by all: no
    # shared operand, so nothing to hint.
    assert eviction_sites(two_axes) == [] and rewrite(PATTERN, two_axes, {}) == []


@pytest.mark.parametrize("old, new, why", [
    # unpacked program ids: x over axis 0 only, re-read by every program of axis 1 (paired element by element)
    ("    row = tl.program_id(0)\n", "    row, col = tl.program_id(0), tl.program_id(1)\n    base2 = col * 0\n",
     "x runs over one of two axes"),
    # a flat grid split by // and %: the column block is shared by every row's program
    ("    row = tl.program_id(0)\n", "    row = tl.program_id(0) // 4\n", "a program index divided"),
    # a gather: the row's index is loaded, so programs may share rows (an embedding's repeated token)
    ("    base = row * stride\n", "    base = tl.load(w_ptr + row).to(tl.int32) * stride\n", "an address loaded"),
    # the row read again by every iteration of a loop that does not move it
    ("    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)\n",
     "    x = tl.zeros([BLOCK], dtype=tl.float32)\n    for r in range(3):\n"
     "        x += tl.load(x_ptr + base + cols, mask=mask, other=0.0)\n", "a loop-invariant read"),
    # arguments spread with *: what each is cannot be read
    ("tl.load(x_ptr + base + cols, mask=mask, other=0.0)", "tl.load(*(x_ptr + base + cols, mask))", "starred"),
])
def test_a_load_other_programs_may_read_is_not_taken_for_a_stream(old, new, why):
    source = SCALE_ROWS.replace(old, new)
    assert source != SCALE_ROWS, why
    assert eviction_sites(source) == [] and rewrite(PATTERN, source, {}) == [], why


def test_the_loop_plans_it_for_a_memory_bound_kernel_and_it_applies_there():
    from diagnose.loop_options import OptimizeOptions
    from diagnose.planning import hypotheses
    from diagnose.records import Answer, Finding
    from kb.patterns import catalog_for

    bound = Finding("profile.memory-bound", "memory", "memory-bound at 0.6 of the copy rate", "", ["E1"], level="L2",
                    confidence=0.8)
    answer = Answer("why slow", "scale_rows", "cuda", "", [bound], [], [], [], ["L1", "L2"], stopped_at="L2")
    planned = [h.pattern for h in hypotheses(answer, OptimizeOptions(), catalog_for(None))
               if h.finding == "profile.memory-bound"]
    assert "eviction-hints" in planned
    assert rewrite("eviction-hints", SCALE_ROWS, {"finding": "profile.memory-bound"})


def _memory_bound_plan(catalog: list) -> list[str]:
    from diagnose.loop_options import OptimizeOptions
    from diagnose.planning import hypotheses
    from diagnose.records import Answer, Finding, Recommendation

    bound = Finding("profile.memory-bound", "memory", "memory-bound at 0.6 of the copy rate", "", ["E1"], level="L2",
                    confidence=0.8)
    # Diagnosis recommends its two best patterns for the finding, the one with fewer symptoms first.
    recommended = [Recommendation(pid, pid, "", "", "", "low", bound.kind, ["E1"], "symptom")
                   for pid in (PATTERN, "block-size-num-warps")]
    answer = Answer("why slow", "scale_rows", "cuda", "", [bound], recommended, [], [], ["L1", "L2"], stopped_at="L2")
    return [h.pattern for h in hypotheses(answer, OptimizeOptions(), catalog)]


def test_its_measured_record_ranks_it_behind_the_launch_knobs_until_a_home_learns_otherwise(tmp_path):
    """Timed on the H100 it gained nothing (the catalog carries that record); it outranked
    block-size-num-warps by having fewer symptoms alone. A home whose runs saw it win puts it first again."""
    import json

    from kb.home import KBHome
    from kb.patterns import catalog_for

    plan = _memory_bound_plan(catalog_for(None))
    assert plan.index("block-size-num-warps") < plan.index(PATTERN)
    home = KBHome(tmp_path / "home").ensure()
    home.patterns_dir.mkdir(parents=True, exist_ok=True)
    won = [{"run": f"r{i}", "round": 1, "task": "gemv", "family": "memory", "finding": "profile.memory-bound",
            "level": "L2"} for i in range(4)]
    (home.patterns_dir / "stats.json").write_text(json.dumps(
        {"patterns": {PATTERN: {"tries": 4, "wins": 4, "speedups": [1.1] * 4, "applied": won, "failed": []}}}))
    plan = _memory_bound_plan(catalog_for(home))
    assert plan.index(PATTERN) < plan.index("block-size-num-warps")
