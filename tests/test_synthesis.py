"""Synthesis: finished rounds become pattern statistics and learned patterns, counted once."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from cli import main
from diagnose.rounds import Hypothesis, Round, RoundsStore
from diagnose.synthesis import synthesize
from harness.task import TaskSpec
from kb.home import KBHome
from kb.patterns import catalog_for


def _run(home: KBHome, name: str, rounds: list[Round], task: str = "softmax") -> None:
    store = RoundsStore(home.runs_dir / name, create=True)
    store.create_run(name, task, TaskSpec(path="t.py"), {})
    for r in rounds:
        store.plan(r)
        store.rewritten(r.idx, f"round-{r.idx:03d}.py", r.diff or "")
        store.done(r.idx, r.outcome or "rejected", r.reason or "", None, r.speedup)
    store.close()


def _round(idx: int, pattern: str, outcome: str, speedup: float = 1.0, rewriter: str = "pattern",
           finding: str = "reduction.cross-warp", diff: str = "") -> Round:
    hyp = Hypothesis(finding, "", pattern, rewriter, "L3", ["E2"])
    return Round(idx, 0, "done", hyp, f"k{idx}", "L3", ["E2"], rewriter, diff=diff, outcome=outcome,
                 reason="" if outcome == "accepted" else "within noise", speedup=speedup)


def test_rounds_update_statistics_once_and_rank_l1(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    _run(home, "a", [_round(1, "warp-local-reduction", "accepted", 1.3), _round(2, "autotune-configs", "rejected")])
    first = synthesize(home, [home.runs_dir / "a"])
    assert first["rounds"] == 2 and first["updated"] == ["autotune-configs", "warp-local-reduction"]
    again = synthesize(home, [home.runs_dir / "a"])
    assert again["rounds"] == 0  # every round counts once
    stats = {p.id: p.stats for p in catalog_for(home)}
    assert stats["warp-local-reduction"]["wins"] == 1 and stats["warp-local-reduction"]["speedups"] == [1.3]
    assert stats["autotune-configs"]["failed"][0]["why"] == "within noise"
    assert stats["autotune-configs"]["tries"] == 1 and stats["autotune-configs"].get("wins", 0) == 0


def test_accepted_llm_round_becomes_a_learned_pattern_and_bad_records_are_demoted(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    diff = "--- a/kernel.py\n+++ b/kernel.py\n-    x = tl.exp(x)\n+    x = tl.exp2(x * 1.44)\n"
    _run(home, "b", [_round(1, "llm-rewrite", "accepted", 1.2, rewriter="llm", diff=diff),
                     _round(2, "llm-rewrite", "rejected", rewriter="llm")])
    summary = synthesize(home, [home.runs_dir / "b"])
    assert summary["learned"] == ["learned-reduction-cross-warp-l3"]
    path = home.patterns_dir / "learned" / "learned-reduction-cross-warp-l3.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["provenance"] == {"kind": "learned", "runs": ["b"], "rounds": [1], "operators": ["softmax"],
                                 "evidence": ["E2"], "rewriter": "llm"}
    assert "tl.exp2" in doc["rewrite"]["after"] and doc["symptoms"] == ["reduction.cross-warp"]
    learned = {p.id: p for p in catalog_for(home)}["learned-reduction-cross-warp-l3"]
    assert learned.stats["tries"] == 2 and learned.stats["wins"] == 1  # the rejected retry counts against it
    # Two more failures: 1 win in 4 tries is below a third -> demoted to high risk, never deleted.
    _run(home, "c", [_round(1, "llm-rewrite", "rejected", rewriter="llm"), _round(2, "llm-rewrite", "failed",
                                                                                  rewriter="llm")])
    assert synthesize(home, [home.runs_dir / "c"])["demoted"] == ["learned-reduction-cross-warp-l3"]
    demoted = {p.id: p for p in catalog_for(home)}["learned-reduction-cross-warp-l3"]
    assert demoted.risk == "high" and demoted.stats["status"] == "demoted" and path.is_file()


def test_cli_synthesize_and_patterns(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    _run(home, "a", [_round(1, "warp-local-reduction", "accepted", 1.3)])
    out = CliRunner().invoke(main, ["--home", str(home.root), "synthesize", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["stats"] == {"warp-local-reduction": {"tries": 1, "wins": 1}}
    listed = CliRunner().invoke(main, ["--home", str(home.root), "patterns", "list", "--json"])
    row = next(r for r in json.loads(listed.stdout) if r["id"] == "warp-local-reduction")
    assert (row["wins"], row["tries"], row["provenance"]) == (1, 1, "curated")
    shown = CliRunner().invoke(main, ["--home", str(home.root), "patterns", "show", "warp-local-reduction"])
    assert "applied: run a round 1 (softmax, reduction.cross-warp)" in shown.output
    missing = CliRunner().invoke(main, ["--home", str(home.root), "patterns", "show", "nope"])
    assert missing.exit_code == 2 and "no pattern 'nope'" in missing.output
    empty = CliRunner().invoke(main, ["--home", str(tmp_path / "fresh"), "synthesize"])
    assert empty.exit_code == 2 and "no optimize runs" in empty.output


def test_statistics_reorder_the_optimize_loop(tmp_path):
    """A record learned on other operators changes what the loop tries first: the pipelining pattern
    that kept failing for `pipelining.none` goes behind the launch search that kept winning."""
    from test_optimize import SPEC, TimedJudge

    from diagnose.optimize import OptimizeOptions, optimize

    def first_round(home: KBHome | None, name: str) -> dict:
        judge = TimedJudge()
        try:
            store = optimize(SPEC, OptimizeOptions(rounds=1, backend="interpreter", seeds=1), tmp_path / name,
                             home=home, judge=judge)
        finally:
            judge.close()
        hypothesis = store.rounds()[0].hypothesis
        store.close()
        return hypothesis

    assert first_round(None, "fresh").pattern == "tl-range-pipelining"
    home = KBHome(tmp_path / "home").ensure()
    _run(home, "earlier", [_round(i, "tl-range-pipelining", "rejected", finding="pipelining.none") for i in (1, 2, 3)]
         + [_round(i, "autotune-configs", "accepted", 1.2, finding="") for i in (4, 5)], task="row_sum")
    synthesize(home, [home.runs_dir / "earlier"])
    learned = first_round(home, "learned")
    assert learned.pattern == "autotune-configs" and learned.record == 0.75  # (2 + 1) / (2 + 2)


def test_an_old_key_of_the_same_id_does_not_hide_a_new_run(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    (home.patterns_dir).mkdir(parents=True, exist_ok=True)
    (home.patterns_dir / "stats.json").write_text(json.dumps({"patterns": {}, "counted": ["softmax:1"]}))
    store = RoundsStore(home.runs_dir / "softmax", create=True)
    store.create_run("softmax", "softmax", TaskSpec(path="t.py", family="softmax"), {})  # a run from after the change
    r = _round(1, "warp-local-reduction", "accepted", 1.2)
    store.plan(r)
    store.done(1, "accepted", "", None, 1.2)
    store.close()
    assert synthesize(home, [home.runs_dir / "softmax"])["rounds"] == 1
