"""Wide rounds (`--breadth`): several hypotheses judged side by side on one parent, the winners stacked.

Correctness through the real sandboxed harness on the interpreter, time from a deterministic cost of
the source (test_optimize.TimedJudge), rounds in a real SQLite store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_optimize import SPEC, TimedJudge

from diagnose.composition import patterns_of, stacked_variants, tagged, winners
from diagnose.loop_options import OptimizeOptions
from diagnose.optimize import optimize
from diagnose.planning import breadth_first
from diagnose.rewriters import Variant
from diagnose.rounds import Hypothesis, Round, RoundsStore, RunStatus
from diagnose.run_summary import report
from diagnose.synthesis import synthesize
from harness.measurement import CaseResult, KernelRun, RunReport, Timing
from kb.home import KBHome


def independent_cost(source: str) -> float:
    """Two rewrites that pay independently: the pipelined loop 30% off, the launch-true divisibility hints
    10% off; nothing else moves (the launch knobs included)."""
    return 100.0 * (0.7 if "tl.range(" in source else 1.0) * (0.9 if "_kb_multiple(" in source else 1.0)


def _options(**kw) -> OptimizeOptions:
    return OptimizeOptions(backend="interpreter", seeds=1, **kw)


def _wide_round(tmp_path: Path) -> RoundsStore:
    """One round of breadth 2 on the fixture, its two winners stacked (independent_cost's device)."""
    judge = TimedJudge(cost=independent_cost)
    try:
        return optimize(SPEC, _options(rounds=1, breadth=2), tmp_path / "run", judge=judge)
    finally:
        judge.close()


def test_a_wide_round_judges_two_hypotheses_and_stacks_their_winners(tmp_path):
    store = _wide_round(tmp_path)
    (r,) = store.rounds()
    # The round planned the pipelining rewrite and, passing over the launch knobs (num-stages answers the same
    # finding, the launch search comes next), the next structural rewrite that applies: the divisibility hints.
    assert r.hypothesis.pattern == "tl-range-pipelining" and [h.pattern for h in r.others] == ["divisibility-hints"]
    chosen = r.timings["chosen"]
    assert patterns_of(chosen) == ["tl-range-pipelining", "divisibility-hints"], chosen
    # The stack holds both rewrites, so the round pays both: 1 / (0.7 * 0.9), where either alone pays 1/0.7 or 1/0.9.
    assert r.outcome == "accepted" and r.speedup == pytest.approx(1 / (0.7 * 0.9), rel=1e-6)
    singles = [v["geomean"] for v in r.timings["variants"] if "stack" not in v["variant"] and v["geomean"]]
    assert max(singles) == pytest.approx(1 / 0.7, rel=1e-6)
    best = (store.dir / "best.py").read_text()
    assert "tl.range(" in best and "_kb_multiple(" in best
    assert "Stacked on it in the same round: divisibility-hints (no finding)" in best
    assert r.timings["others"] == [{"pattern": "divisibility-hints", "finding": "", "outcome": "composed"}]
    assert [(h.pattern, outcome) for h, outcome in r.hypotheses_tried()] == [
        ("tl-range-pipelining", "accepted"), ("divisibility-hints", "accepted")]
    assert report(store).history[0].others == ["divisibility-hints (composed)"]  # as `kb rounds show` lists it
    # The files of the round agree with its listing: one params line per variant file, the stack's last.
    listing = (store.dir / "round-001.variants").read_text().splitlines()
    assert len(listing) == len(list(store.dir.glob("round-001.v*.py")))
    assert patterns_of(listing[-1]) == ["tl-range-pipelining", "divisibility-hints"]
    store.close()


def test_a_round_of_one_hypothesis_is_unchanged_by_the_option(tmp_path):
    judge = TimedJudge(cost=independent_cost)
    try:
        store = optimize(SPEC, _options(rounds=1), tmp_path / "run", judge=judge)
    finally:
        judge.close()
    (r,) = store.rounds()
    assert r.others == [] and "others" not in r.timings and "pattern" not in r.timings["chosen"]
    assert r.speedup == pytest.approx(1 / 0.7, rel=1e-6)  # the pipelining alone
    store.close()


class StopAtTheStack(TimedJudge):
    """A kill (Ctrl-C) while the round's stack is being judged: its variants are judged, the stack is not."""

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        if candidate and _holds_both(Path(candidate).read_text()):
            raise KeyboardInterrupt
        return super().__call__(spec, baseline, candidate, entry)


def _holds_both(source: str) -> bool:
    return "tl.range(" in source and "_kb_multiple(" in source


def test_a_wide_round_killed_while_judging_its_stack_resumes_and_judges_it_once(tmp_path):
    judge = StopAtTheStack(cost=independent_cost)
    try:
        with pytest.raises(KeyboardInterrupt):
            optimize(SPEC, _options(rounds=1, breadth=2), tmp_path / "run", judge=judge)
    finally:
        judge.close()
    assert RoundsStore.status_of(tmp_path / "run") == RunStatus.INTERRUPTED
    stacks = [f for f in (tmp_path / "run").glob("round-001.v*.py") if _holds_both(f.read_text())]
    assert len(stacks) == 1  # written before it was judged
    judge = TimedJudge(cost=independent_cost)
    try:
        store = optimize(SPEC, _options(rounds=1, breadth=2), tmp_path / "run", judge=judge, resume=True)
    finally:
        judge.close()
    (r,) = store.rounds()
    assert r.outcome == "accepted" and r.speedup == pytest.approx(1 / (0.7 * 0.9), rel=1e-6)
    assert sum(1 for v in r.timings["variants"] if "stack" in v["variant"]) == 1  # not stacked twice
    store.close()


def _report(speedup: float, noise: float = 0.0) -> RunReport:
    def run(role: str, us: float) -> KernelRun:
        return KernelRun(role=role, source=role, cases=[
            CaseResult(case={"n": n}, label=f"n={n}", timing=Timing(us, us, us, 100, repeat_spread=noise))
            for n in (1, 2)])
    return RunReport(task="t", backend="cuda", device="d", runs=[run("baseline", 100.0), run("candidate", 100.0 / speedup)])


def _judged(tmp_path: Path, rows: list[tuple[str, dict, float]]) -> list:
    out = []
    for i, (pattern, params, speedup) in enumerate(rows):
        path = tmp_path / f"round-001.v{i}.py"
        path.write_text(f"# {pattern} {params}\n")
        report = _report(speedup)
        out.append((path, tagged(pattern, params), report, (speedup if speedup > 1 else None, 0.02, "")))
    (tmp_path / "round-001.variants").write_text("\n".join(line for _, line, *_ in out) + "\n")
    return out


def test_winners_are_each_patterns_best_variant_that_beat_the_parent(tmp_path):
    judged = _judged(tmp_path, [("a", {"x": 1}, 1.30), ("a", {"x": 2}, 1.50), ("b", {"y": 1}, 1.10),
                                ("c", {"z": 1}, 1.005), ("d", {"w": 1}, 0.90)])
    found = winners(judged, _options())
    # c is within the 2% noise, d slower: neither is a winner.
    assert [(w.pattern, w.params, round(w.geomean, 2)) for w in found] == [("a", {"x": 2}, 1.5), ("b", {"y": 1}, 1.1)]


def test_a_stack_skips_a_rewrite_that_no_longer_applies_and_takes_the_winners_own_params(tmp_path):
    judged = _judged(tmp_path, [("a", {"x": 1}, 1.50), ("b", {"y": 1}, 1.10), ("b", {"y": 2}, 1.20),
                                ("c", {"z": 1}, 1.05)])

    def rewrite_with(pattern: str, source: str) -> list[Variant]:
        if pattern == "b":  # its variants on the stacked kernel: the winner's params second
            return [Variant({"y": 1}, source + "# b1\n"), Variant({"y": 2}, source + "# b2\n")]
        return []  # c does not apply to the stacked kernel

    stacks = stacked_variants(tmp_path, 1, judged, _options(), rewrite_with)
    assert len(stacks) == 1
    path, line = stacks[0]
    assert path.name == "round-001.v4.py" and path.read_text().endswith("# b2\n")
    assert patterns_of(line) == ["a", "b"]
    assert (tmp_path / "round-001.variants").read_text().splitlines()[-1] == line
    # A round that has its stacks already (a resumed one) gets none again.
    assert stacked_variants(tmp_path, 1, judged, _options(), rewrite_with) == []


def test_a_small_shape_path_over_a_wide_rounds_variant_holds_that_variants_pattern():
    over = tagged("tile-search", {"BLOCK": 128})
    line = repr({"dispatch": "round-001.v3.py above 4096 input bytes", "small": ["n=1"], "predicted": 1.2, "over": over})
    assert patterns_of(line) == ["tile-search"]
    assert patterns_of(repr({"num_warps": 2})) == []  # a round of one hypothesis: its own
    # The small inputs run another of the round's variants: both rewrites are held, the large inputs' first.
    under = tagged("fit-tile-to-extent", {"BLOCK": 64})
    both = repr({"dispatch": "round-001.v3.py above 4096 input bytes, round-001.v1.py at or below", "small": ["n=1"],
                 "predicted": 1.3, "over": over, "under": under})
    assert patterns_of(both) == ["tile-search", "fit-tile-to-extent"]
    same = repr({"dispatch": "...", "small": ["n=1"], "predicted": 1.3, "over": over,
                 "under": tagged("tile-search", {"BLOCK": 32})})
    assert patterns_of(same) == ["tile-search"]


def _hyp(finding: str, pattern: str) -> Hypothesis:
    return Hypothesis(finding, finding, pattern, "pattern", "L1")


def test_the_patterns_a_wide_round_lost_are_not_tried_again_on_its_parent():
    a, b, c = _hyp("f", "a"), _hyp("f", "b"), _hyp("g", "c")
    rejected = Round(1, 0, "done", a, "k", "L1", rewriter="pattern", outcome="rejected", others=[b],
                     timings={"others": [{"pattern": "b", "finding": "f", "outcome": "lost"}]})
    # Round 1 was rejected on kernel 0: the next round on kernel 0 tries neither a nor b.
    assert [h.pattern for h in breadth_first([a, b, c], [rejected], {0})] == ["c"]
    accepted = Round(1, 0, "done", a, "k", "L1", rewriter="pattern", outcome="accepted", others=[b, c],
                     timings={"others": [{"pattern": "b", "finding": "f", "outcome": "composed"},
                                         {"pattern": "c", "finding": "g", "outcome": "lost"}]})
    # On round 1's kernel: a and b (stacked in it) wait behind the others; c, lost on the parent, is tried once more.
    assert [h.pattern for h in breadth_first([a, b, c], [accepted], {0, 1})] == ["c", "a", "b"]


def test_synthesis_counts_every_pattern_a_wide_round_judged(tmp_path):
    kb_home = KBHome(tmp_path / "home").ensure()
    judge = TimedJudge(cost=independent_cost)
    try:
        store = optimize(SPEC, _options(rounds=1, breadth=2), tmp_path / "run", judge=judge)
        store.close()
    finally:
        judge.close()
    summary = synthesize(kb_home, [tmp_path / "run"])
    assert summary["rounds"] == 1
    assert summary["stats"]["tl-range-pipelining"] == {"tries": 1, "wins": 1}
    assert summary["stats"]["divisibility-hints"] == {"tries": 1, "wins": 1}
    stats = json.loads((Path(kb_home.patterns_dir) / "stats.json").read_text())
    (applied,) = stats["patterns"]["divisibility-hints"]["applied"]
    assert applied["finding"] == "" and math.isclose(stats["patterns"]["divisibility-hints"]["speedups"][0],
                                                     1 / (0.7 * 0.9), rel_tol=1e-3)


def test_a_variant_file_a_kill_left_unlisted_is_made_again_not_judged_without_its_params(tmp_path):
    store = RoundsStore(tmp_path / "run", create=True)
    for i in range(4):
        (store.dir / f"round-002.v{i}.py").write_text(f"# variant {i}\n")
    # v2 and v3 were written by a step (a stack, a small-shape path) killed before it listed them.
    (store.dir / "round-002.variants").write_text(tagged("a", {"x": 1}) + "\n" + tagged("b", {"y": 1}) + "\n")
    files, lines = store.variants(2)
    assert [f.name for f in files] == ["round-002.v0.py", "round-002.v1.py"] and patterns_of(lines[1]) == ["b"]
    assert not (store.dir / "round-002.v2.py").exists() and not (store.dir / "round-002.v3.py").exists()
    # Ordered by index, not by name: v10 after v9.
    for i in range(2, 11):
        (store.dir / f"round-002.v{i}.py").write_text(f"# variant {i}\n")
    (store.dir / "round-002.variants").write_text("".join(f"{{'i': {i}}}\n" for i in range(11)))
    files, lines = store.variants(2)
    assert [f.name for f in files][-2:] == ["round-002.v9.py", "round-002.v10.py"] and len(lines) == 11
    store.close()


def test_a_rejected_wide_round_is_recorded_as_the_hypothesis_whose_variant_it_judged(tmp_path):
    # The pipelining pays nothing here and the hints 0.5%, within the noise: the round's best variant is the
    # hints', and the rejected round's kernel, diff and figures are theirs, so is its hypothesis.
    judge = TimedJudge(cost=lambda source: 100.0 * (0.995 if "_kb_multiple(" in source else 1.0))
    try:
        store = optimize(SPEC, _options(rounds=1, breadth=2), tmp_path / "run", judge=judge)
    finally:
        judge.close()
    (r,) = store.rounds()
    assert r.outcome == "rejected" and "within noise" in r.reason
    assert r.hypothesis.pattern == "divisibility-hints" and patterns_of(r.timings["chosen"]) == ["divisibility-hints"]
    assert [h.pattern for h in r.others] == ["tl-range-pipelining"]
    assert r.timings["others"] == [{"pattern": "tl-range-pipelining", "finding": "pipelining.none", "outcome": "lost"}]
    assert "_kb_multiple(" in (store.dir / "round-001.py").read_text()
    store.close()


def test_a_pattern_outpaced_in_a_wide_round_is_tried_later_and_counts_neither_way(tmp_path):
    a, b = _hyp("f", "relaxed-atomics"), _hyp("g", "masked-tail-split")
    r = Round(1, 0, "done", a, "k", "L1", rewriter="pattern", outcome="accepted", speedup=1.2, others=[b],
              timings={"others": [{"pattern": "masked-tail-split", "finding": "g", "outcome": "outpaced"}]})
    assert [(h.pattern, o) for h, o in r.hypotheses_tried()] == [("relaxed-atomics", "accepted"),
                                                                  ("masked-tail-split", "outpaced")]
    # beaten on kernel 0: not again there; on round 1's kernel, once more after the untried
    assert [h.pattern for h in breadth_first([a, b], [r], {0})] == ["relaxed-atomics"]
    assert [h.pattern for h in breadth_first([a, b], [r], {0, 1})] == ["masked-tail-split", "relaxed-atomics"]
    home = KBHome(tmp_path / "home").ensure()
    store = RoundsStore(home.runs_dir / "w", create=True)
    store.create_run("w", "t", SPEC, {})
    store.plan(r)
    store.done(1, "accepted", "", r.timings, 1.2)
    store.close()
    stats = synthesize(home, [home.runs_dir / "w"])["stats"]
    assert stats == {"relaxed-atomics": {"tries": 1, "wins": 1}}  # the outpaced pattern neither won nor failed


def test_a_stacks_next_rewrite_reads_the_launch_of_the_kernel_it_rewrites(tmp_path):
    """The winner a stack builds on may launch another kernel (a split's copy), other options or another grid:
    the next rewriter's context holds that kernel's intercepted launch, not the parent's."""
    from diagnose.optimize import _stacked_context
    from harness.task import load_job_task

    store = _wide_round(tmp_path)
    (r,) = store.rounds()
    assert set(r.hypothesis.launched) == {"rowsum_kernel"} and r.hypothesis.launched["rowsum_kernel"]["num_warps"] == 1
    winner = (store.dir / "round-000.py").read_text().replace("rowsum_kernel", "rowsum_kb_split").replace(
        "num_warps=1", "num_warps=4")
    context = _stacked_context(store, SPEC, load_job_task(SPEC), r.hypothesis, winner, "row_sum", _options())
    (name, seen), = context["launched"].items()
    assert name == "rowsum_kb_split" and seen["num_warps"] == 4, context["launched"]
    assert seen["programs"] in (4, 8)  # a case's rows, one program each
    assert context["features"] == "loop" and not list(store.dir.glob(".stacked-*"))  # read, then removed
    store.close()
