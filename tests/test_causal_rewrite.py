"""Causal loop bounds (issue 27, attention): a causal key loop ends at its rows' diagonal and, in the
split variant, runs the blocks wholly below it without the causal select; both give the reference's
values under the real judge (interpreter); where a skipped block could change the result, or the term is
not causal, the rewrite declines; L1 reports the loops it bounds."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner
from marker_judge import MarkerJudge, only_round
from test_peel_rewrite import CAUSAL, CAUSAL_REFERENCE

from cli import main
from diagnose.features import kernel_features
from diagnose.records import EvidenceLog
from diagnose.rewriters import rewrite
from diagnose.triage import triage
from harness.run import RunOptions, run_task
from harness.task import TaskSpec
from kb.patterns import load_catalog

PATTERN = "causal-loop-bounds"

# the same kernel with a named causal mask, a row start bound to a name, and base-2 exponentials
NAMED = (CAUSAL.replace("    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n",
                        "    start_m = tl.program_id(0) * BLOCK_M\n    rm = start_m + tl.arange(0, BLOCK_M)\n")
         .replace("        s = tl.where((rm[:, None] >= rn[None, :]) & (rn[None, :] < seq), s, -float(\"inf\"))\n",
                  "        visible = rn[None, :] <= rm[:, None]\n"
                  "        s = tl.where(visible & (rn[None, :] < seq), s * 1.4426950408889634, float(\"-inf\"))\n")
         .replace("p = tl.exp(s - m_new[:, None])", "p = tl.exp2(s - m_new[:, None])")
         .replace("alpha = tl.exp(m_i - m_new)", "alpha = tl.exp2(m_i - m_new)"))


def _check(tmp_path, source: str, original: str, seq: int) -> None:
    (tmp_path / "causal.py").write_text(original)
    candidate = tmp_path / "causal_bounded.py"
    candidate.write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "causal.py"), reference=CAUSAL_REFERENCE,
                    call=f"causal(torch.randn({seq}, 16), torch.randn({seq}, 16), torch.randn({seq}, 16))")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(candidate),
                      candidate_entry="causal")
    assert report.run("candidate").correct, report.to_dict()


def test_the_key_loop_ends_at_the_diagonal_and_the_blocks_below_it_drop_the_causal_select(tmp_path):
    bounded, split = rewrite(PATTERN, CAUSAL, {})
    assert not bounded.params["below_diagonal_unmasked"] and split.params["below_diagonal_unmasked"]
    end = "tl.minimum(seq, (tl.program_id(0) * BLOCK_M) + BLOCK_M)"
    assert f"for start_n in range(0, {end}, BLOCK_N):" in bounded.source
    diagonal = "tl.minimum((tl.program_id(0) * BLOCK_M) // BLOCK_N * BLOCK_N, seq // BLOCK_N * BLOCK_N)"
    below, on = split.source.split(f"for start_n in range({diagonal}, {end}, BLOCK_N):")
    assert f"for start_n in range(0, {diagonal}, BLOCK_N):" in below
    assert 's = tl.where((rn[None, :] < seq), s, -float("inf"))' in below  # the boundary term stays
    assert "(rm[:, None] >= rn[None, :]) & (rn[None, :] < seq)" in on  # the diagonal blocks as written
    for seq in (40, 32, 7):  # partial blocks, none, a single one
        for variant in (bounded, split):
            _check(tmp_path, variant.source, CAUSAL, seq)


def test_a_named_mask_a_named_row_start_and_exp2_are_read_the_same_way(tmp_path):
    bounded, split = rewrite(PATTERN, NAMED, {})
    assert "range(0, tl.minimum(seq, start_m + BLOCK_M), BLOCK_N)" in bounded.source
    below = split.source.split("for start_n in range(start_m // BLOCK_N * BLOCK_N")[0]
    assert "s = tl.where((rn[None, :] < seq), s * 1.4426950408889634" in below
    _check(tmp_path, split.source, NAMED, 40)


@pytest.mark.parametrize("change, why", [
    (("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.maximum(m_i, tl.max(s, axis=1))\n        l_i += tl.sum(s, 1) * 0"),
     "the masked scores summed: a skipped block would be missing from it"),
    (('s, -float("inf"))', "s, 0.0)"), "masked to 0, not -inf: exp(0) would count"),
    (("rm[:, None] >= rn[None, :]", "rm[:, None] <= rn[None, :]"), "keys after the rows: not causal"),
    (("rm[:, None] >= rn[None, :]", "rn[:, None] >= rn[None, :]"), "no row block on the other side"),
    (("mask=in_seq[:, None], other=0.0)\n        s =", "mask=in_seq[:, None] & (rm[None, :] >= rn[:, None]), other=0.0)\n        s ="),
     "the causal term in a load's mask too"),
    (("for start_n in range(0, seq, BLOCK_N):", "for start_n in range(0, seq, 2 * BLOCK_N):"), "a step wider than the block"),
])
def test_it_declines_where_skipping_a_block_could_change_the_result(change, why):
    old, new = change
    source = CAUSAL.replace(old, new)
    assert source != CAUSAL
    assert rewrite(PATTERN, source, {}) == [], why


def test_l1_reports_the_causal_loop_and_the_catalog_answers_with_the_rewrite(tmp_path):
    kernel = tmp_path / "causal.py"
    kernel.write_text(CAUSAL)
    line = CAUSAL.splitlines().index("    for start_n in range(0, seq, BLOCK_N):") + 1
    (finding,) = [f for f in triage(kernel_features(kernel), EvidenceLog()) if f.kind == "attention.causal-full-loop"]
    assert finding.kernel_lines == [line] and finding.confidence == 0.9
    assert [p.id for p in load_catalog() if finding.kind in p.symptoms] == [PATTERN]
    # at a launch: 4 programs of 16 rows over 64 keys in blocks of 16 visit 16 blocks; 1 + 2 + 3 + 4 = 10
    # reach no further than their diagonal, so stopping there can gain 1.6x at most
    result = CliRunner().invoke(main, ["diagnose", "--json", "--level-max", "L1", "--kernel", str(kernel), "--call",
                                       "causal(torch.randn(64, 16), torch.randn(64, 16), torch.randn(64, 16))"])
    assert result.exit_code == 0, result.output
    (found,) = [f for f in json.loads(result.output)["findings"] if f["kind"] == "attention.causal-full-loop"]
    assert found["gain"] == 1.6
    kernel.write_text(CAUSAL.replace('s, -float("inf"))', "s, 0.0)"))
    assert not any(f.kind == "attention.causal-full-loop" for f in triage(kernel_features(kernel), EvidenceLog()))


def test_the_loop_answers_a_causal_loop_over_every_key_block_with_its_bound(tmp_path):
    """From the L1 finding to an accepted round that records the pattern's unblock, through the real judge."""
    (tmp_path / "causal.py").write_text(CAUSAL)
    (tmp_path / "task.py").write_text(textwrap.dedent(f'''\
        import torch

        from causal import causal as entry  # noqa: F401


        def inputs(seq):
            return tuple(torch.randn(seq, 16) for _ in range(3))


        reference = {CAUSAL_REFERENCE}
        cases = [dict(seq=64), dict(seq=40)]
        '''))
    judge = MarkerJudge(tmp_path / "causal.py", "tl.minimum(seq,", fast_us=55.0)  # stopping at the diagonal pays
    first = only_round(judge, tmp_path / "task.py", tmp_path / "run")
    assert (first.hypothesis.finding, first.hypothesis.pattern) == ("attention.causal-full-loop", PATTERN)
    assert first.outcome == "accepted", first.reason
    assert first.hypothesis.unblock.startswith("each program's key loop runs from its rows' first visible key to their last")


# A sliding window of WINDOW keys on top of the causal mask, the window written as `rows - keys < WINDOW`;
# the online softmax takes 0 as its reference while a row has seen only -inf (a row's first blocks are
# wholly outside its window), as a windowed kernel that visits them must.
WINDOWED = (CAUSAL.replace("def causal_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale,",
                           "def causal_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale, WINDOW,")
            .replace("(rm[:, None] >= rn[None, :]) & (rn[None, :] < seq)",
                     "(rm[:, None] >= rn[None, :]) & (rm[:, None] - rn[None, :] < WINDOW) & (rn[None, :] < seq)")
            .replace("        p = tl.exp(s - m_new[:, None])\n        alpha = tl.exp(m_i - m_new)\n",
                     "        m_ref = tl.where(m_new == -float(\"inf\"), 0.0, m_new)\n"
                     "        p = tl.exp(s - m_ref[:, None])\n        alpha = tl.exp(m_i - m_ref)\n")
            .replace("(q, k, v, o, q.shape[0], q.shape[1] ** -0.5,", "(q, k, v, o, q.shape[0], q.shape[1] ** -0.5, 20,"))
WINDOWED_REFERENCE = ("lambda q, k, v: torch.softmax((q @ k.T * q.shape[1] ** -0.5).masked_fill("
                      "(torch.arange(q.shape[0])[:, None] < torch.arange(q.shape[0])[None, :]) | "
                      "(torch.arange(q.shape[0])[:, None] - torch.arange(q.shape[0])[None, :] >= 20), float('-inf')), -1) @ v")


def _check_windowed(tmp_path, original: str, source: str, seq: int, window: int = 20) -> None:
    (tmp_path / "windowed.py").write_text(original)
    (tmp_path / "windowed_bounded.py").write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "windowed.py"), reference=WINDOWED_REFERENCE.replace(">= 20)", f">= {window})"),
                    call=f"causal(torch.randn({seq}, 16), torch.randn({seq}, 16), torch.randn({seq}, 16))")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2),
                      candidate=str(tmp_path / "windowed_bounded.py"), candidate_entry="causal")
    assert report.run("baseline").correct and report.run("candidate").correct, report.to_dict()


def test_a_sliding_window_starts_the_key_loop_at_the_windows_first_block(tmp_path):
    assert "m_ref = tl.where" in WINDOWED and "WINDOW) & (rn" in WINDOWED  # the replacements took
    bounded, split = rewrite(PATTERN, WINDOWED, {})
    assert bounded.params["window_start"] and split.params["below_diagonal_unmasked"]
    start = "tl.maximum((tl.program_id(0) * BLOCK_M) - (WINDOW) + 1, 0) // BLOCK_N * BLOCK_N"
    end = "tl.minimum(seq, (tl.program_id(0) * BLOCK_M) + BLOCK_M)"
    assert f"for start_n in range({start}, {end}, BLOCK_N):" in bounded.source
    assert "(rm[:, None] - rn[None, :] < WINDOW)" in bounded.source  # the boundary blocks keep every term
    # split: the window's edge as written, the blocks every row sees whole without either term, the diagonal
    assert split.source.count("for start_n in range(") == 3
    assert 's = tl.where((rn[None, :] < seq), s, -float("inf"))' in split.source
    for seq in (70, 20, 9):  # rows past the window, a window as long as the sequence, one block
        for variant in (bounded, split):
            _check_windowed(tmp_path, WINDOWED, variant.source, seq)
    # a window of 50 over blocks of 16 leaves whole blocks inside every row's window: the unmasked loop runs
    wide = WINDOWED.replace("q.shape[1] ** -0.5, 20,", "q.shape[1] ** -0.5, 50,")
    assert wide != WINDOWED
    for variant in rewrite(PATTERN, wide, {}):
        _check_windowed(tmp_path, wide, variant.source, 130, window=50)


@pytest.mark.parametrize("window", [
    "rn[None, :] > rm[:, None] - WINDOW",          # the same window, rearranged
    "rm[:, None] < rn[None, :] + WINDOW",
    "rn[None, :] >= rm[:, None] - WINDOW + 1",
])
def test_a_window_written_another_way_reads_the_same(tmp_path, window):
    source = WINDOWED.replace("(rm[:, None] - rn[None, :] < WINDOW)", f"({window})")
    variants = rewrite(PATTERN, source, {})
    assert len(variants) == 2 and all("range(tl.maximum(" in v.source for v in variants)
    for variant in variants:
        _check_windowed(tmp_path, source, variant.source, 70)


def test_a_window_alone_starts_the_loop_and_leaves_its_end(tmp_path):
    one_sided = WINDOWED.replace("(rm[:, None] >= rn[None, :]) & ", "")
    bounded, split = rewrite(PATTERN, one_sided, {})
    assert "for start_n in range(tl.maximum(" in bounded.source and ", seq, BLOCK_N):" in bounded.source
    assert split.source.count("for start_n in range(") == 2  # the window's edge, then every key inside it
    (tmp_path / "one.py").write_text(one_sided)
    reference = WINDOWED_REFERENCE.replace("(torch.arange(q.shape[0])[:, None] < torch.arange(q.shape[0])[None, :]) | ", "")
    for variant in (bounded, split):
        (tmp_path / "one_bounded.py").write_text(variant.source)
        spec = TaskSpec(kernel=str(tmp_path / "one.py"), reference=reference,
                        call="causal(torch.randn(70, 16), torch.randn(70, 16), torch.randn(70, 16))")
        report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2),
                          candidate=str(tmp_path / "one_bounded.py"), candidate_entry="causal")
        assert report.run("baseline").correct and report.run("candidate").correct, report.to_dict()


@pytest.mark.parametrize("condition", [
    "(rm[:, None] >= rn[None, :]) | (rn[None, :] < 4)",   # a term under `|` masks no block whole
    "(rn[None, :] < seq) & ~(rm[:, None] >= rn[None, :])",
])
def test_a_causal_term_that_is_not_a_conjunct_of_the_select_is_left_alone(condition):
    source = CAUSAL.replace("(rm[:, None] >= rn[None, :]) & (rn[None, :] < seq)", condition)
    assert condition in source and rewrite(PATTERN, source, {}) == []


def test_a_window_whose_width_changes_in_the_loop_or_is_not_a_window_is_left_alone():
    grows = WINDOWED.replace("        in_seq = rn < seq\n", "        in_seq = rn < seq\n        WINDOW = WINDOW + 1\n")
    assert all(not v.params["window_start"] for v in rewrite(PATTERN, grows, {}))
    both_ways = WINDOWED.replace("(rm[:, None] - rn[None, :] < WINDOW)", "(rm[:, None] + rn[None, :] < WINDOW)")
    assert all(not v.params["window_start"] for v in rewrite(PATTERN, both_ways, {}))


def test_l1_reports_a_windowed_loop_and_the_catalog_answers_it(tmp_path):
    kernel = tmp_path / "windowed.py"
    kernel.write_text(WINDOWED)
    (finding,) = [f for f in triage(kernel_features(kernel), EvidenceLog()) if f.kind == "attention.window-full-loop"]
    assert "before the window and past their diagonal" in finding.title
    assert [p.id for p in load_catalog() if finding.kind in p.symptoms] == [PATTERN]


def test_a_window_alone_on_wide_row_blocks_stops_its_edge_loop_at_the_sequence(tmp_path):
    # no key-range term in the select: the loop's bound alone keeps keys past seq out (a review's probe)
    source = (WINDOWED.replace("(rm[:, None] >= rn[None, :]) & ", "").replace(" & (rn[None, :] < seq)", "")
              .replace("triton.cdiv(q.shape[0], 16)", "triton.cdiv(q.shape[0], 32)").replace("BLOCK_M=16", "BLOCK_M=32"))
    assert "BLOCK_M=32" in source and "< seq), s" not in source
    reference = WINDOWED_REFERENCE.replace("(torch.arange(q.shape[0])[:, None] < torch.arange(q.shape[0])[None, :]) | ", "")
    (tmp_path / "one.py").write_text(source)
    for variant in rewrite(PATTERN, source, {}):
        (tmp_path / "one_bounded.py").write_text(variant.source)
        spec = TaskSpec(kernel=str(tmp_path / "one.py"), reference=reference,
                        call="causal(torch.randn(48, 16), torch.randn(48, 16), torch.randn(48, 16))")
        report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2),
                          candidate=str(tmp_path / "one_bounded.py"), candidate_entry="causal")
        assert report.run("candidate").correct, (variant.params, report.to_dict())


def test_an_unused_window_shaped_binding_does_not_start_the_loop(tmp_path):
    source = WINDOWED.replace("        in_seq = rn < seq\n",
                              "        in_seq = rn < seq\n        near = rm[:, None] - rn[None, :] < 2\n")
    variants = rewrite(PATTERN, source, {})
    assert variants and all("- (2)" not in v.source and "- (WINDOW) + 1" in v.source for v in variants)
    for variant in variants:
        _check_windowed(tmp_path, source, variant.source, 70)


@pytest.mark.parametrize(("change", "declined"), [
    # a window per row (a tile) or a fractional one cannot bound a loop: the causal bound alone stays
    (("        in_seq = rn < seq\n", "        in_seq = rn < seq\n"), None),
    (("(rm[:, None] - rn[None, :] < WINDOW)", "(rm[:, None] - rn[None, :] < WINDOW + (rm[:, None] % 3))"), "window"),
    (("(rm[:, None] - rn[None, :] < WINDOW)", "(rm[:, None] - rn[None, :] < WINDOW * 0.5)"), "window"),
    # the row start read again after it was reassigned; what a skipped block would store, or add up
    (("    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n",
      "    start = tl.program_id(0) * BLOCK_M\n    rm = start + tl.arange(0, BLOCK_M)\n    start = 0\n"), "all"),
    (("        m_i = m_new\n", "        m_i = m_new\n        tl.store(o_ptr + rm, m_new)\n"), "all"),
    (("        m_i = m_new\n", "        m_i = m_new\n        l_extra = l_extra + tl.sum(v, axis=0)\n"), "all"),
])
def test_what_a_window_or_a_skipped_block_cannot_justify_is_left_alone(change, declined):
    source = WINDOWED.replace(*change)
    if "l_extra" in source:
        source = source.replace("    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)\n",
                                "    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)\n    l_extra = tl.zeros((HEAD,), dtype=tl.float32)\n")
    assert source != WINDOWED or declined is None
    variants = rewrite(PATTERN, source, {})
    if declined is None:
        assert variants and all(v.params["window_start"] for v in variants)
    elif declined == "window":
        assert variants and not any(v.params["window_start"] for v in variants)
    else:
        assert variants == []


MORE_QUERIES = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def attn_kernel(Q, K, V, Out, sm_scale, N_Q, N_K, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        v = tl.load(V + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        s = tl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(Out + rows[:, None] * D + offs_d[None, :], acc / l_i[:, None], mask=rows[:, None] < N_Q)


def attention(q, k, v):
    N_Q, D = q.shape
    N_K = k.shape[0]
    o = torch.empty_like(q)
    attn_kernel[(triton.cdiv(N_Q, 16),)](q, k, v, o, D ** -0.5, N_Q, N_K, D=D, BLOCK_M=16, BLOCK_N=16)
    return o
'''
MORE_QUERIES_REFERENCE = ("lambda q, k, v: torch.softmax((q @ k.T * q.shape[1] ** -0.5).masked_fill("
                          "torch.arange(q.shape[0])[:, None] < torch.arange(k.shape[0])[None, :], float('-inf')), 1) @ v")


@pytest.mark.parametrize("n_q, n_k", [(64, 32), (80, 48), (50, 32)])  # its keys unmasked past N_K: whole blocks
def test_with_more_queries_than_keys_the_unmasked_blocks_stop_at_the_last_key(tmp_path, n_q, n_k):
    # top-left causal with N_Q > N_K: the rows' diagonal lies past the last key (a helper's audit: the
    # unmasked loop ran past N_K, 0.181 off at 64 x 32)
    (tmp_path / "attn.py").write_text(MORE_QUERIES)
    for variant in rewrite(PATTERN, MORE_QUERIES, {}):
        (tmp_path / "bounded.py").write_text(variant.source)
        spec = TaskSpec(kernel=str(tmp_path / "attn.py"), reference=MORE_QUERIES_REFERENCE,
                        call=f"attention(torch.randn({n_q}, 16), torch.randn({n_k}, 16), torch.randn({n_k}, 16))")
        report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1),
                          candidate=str(tmp_path / "bounded.py"), candidate_entry="attention")
        assert report.run("baseline").correct and report.run("candidate").correct, report.to_dict()
