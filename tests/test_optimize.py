"""The optimize loop on the CPU interpreter: correctness through the real sandboxed harness, time from
a deterministic judge (the interpreter's time means nothing), rounds in a real SQLite store."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from http.server import HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cli import main
from diagnose.optimize import HarnessJudge, OptimizeOptions, optimize
from diagnose.rewriters import rewrite
from diagnose.rounds import Hypothesis, RoundsStore, RunStatus
from diagnose.run_summary import report
from harness.errors import UserFacingError
from harness.measurement import CaseResult, KernelRun, RunReport, Timing
from harness.task import TaskSpec

TASK = FIXTURES / "optimize" / "task.py"
KERNEL = FIXTURES / "optimize" / "rowsum.py"
SPEC = TaskSpec(path=str(TASK))


def cost_us(source: str, pipelining_pays: bool = True) -> float:
    """A deterministic 'device': a pipelined loop is 30% faster, num_warps=2 is the sweet spot, and
    whatever the (test) model marks as its own rewrite is twice as fast."""
    t = 50.0 if "# rewritten by the model" in source else 100.0
    if pipelining_pays and "num_stages=" in source:
        t *= 0.7
    w = re.search(r"num_warps=(\d+)", source)
    return t * (1 + 0.1 * abs(math.log2(int(w.group(1)) if w else 4) - 1))


class TimedJudge(HarnessJudge):
    """Checks with the real harness (interpreter, sandboxed worker), then times by `cost_us`."""

    def __init__(self, pipelining_pays: bool = True, die_on_call: int | None = None, kernel: Path = KERNEL,
                 cost: Callable[[str], float] | None = None) -> None:
        super().__init__(OptimizeOptions(backend="interpreter", seeds=1), time=False)
        self.calls = 0
        self.pipelining_pays = pipelining_pays
        self.cost = cost or (lambda source: cost_us(source, self.pipelining_pays))
        self.die_on_call = die_on_call
        self.kernel = kernel  # the task's own kernel file, whose text a baseline of None is timed by

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        self.calls += 1
        if self.die_on_call is not None and self.calls == self.die_on_call:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost machine, mid-round
        report = super().__call__(spec, baseline, candidate, entry)
        sources = {"baseline": Path(baseline or self.kernel).read_text(),
                   "candidate": Path(candidate).read_text() if candidate else ""}
        for run in report.runs:
            if run.correct:
                for case in run.cases:
                    if not case.heldout:
                        t = self.cost(sources[run.role])
                        case.timing = Timing(t, t, t, 100, repeat_spread=0.0)
        return report

    def judge_all(self, spec, baseline, candidates, entry) -> list[RunReport]:
        return [self(spec, baseline, c, entry) for c in candidates]

    def final(self, spec, best, entry, initial=None) -> RunReport:
        """Best against initial, and PyTorch eager at a fixed 80 µs per case."""
        report = self(spec, None, best, entry)
        base = report.run("baseline")
        report.runs.append(KernelRun(role="eager", source="reference", cases=[
            CaseResult(case=c.case, label=c.label, timing=Timing(80.0, 80.0, 80.0, 100, repeat_spread=0.0))
            for c in base.cases if not c.heldout]))
        return report


def _run(tmp_path: Path, rounds: int, **kw) -> RoundsStore:
    judge = kw.pop("judge", None) or TimedJudge()
    try:
        return optimize(SPEC, OptimizeOptions(rounds=rounds, backend="interpreter", seeds=1, **kw),
                        tmp_path / "run", judge=judge)
    finally:
        judge.close()


def test_rounds_accept_then_reject_with_reasons(tmp_path):
    store = _run(tmp_path, rounds=3)
    rounds = store.rounds()
    assert [(r.idx, r.outcome) for r in rounds] == [(1, "accepted"), (2, "accepted"), (3, "rejected")]
    first, second, third = rounds
    # Round 1: a streaming loop that never asks for pipelining. The launch runs it 2 steps per program
    # (N=256, BLOCK=128), too few for L1 to claim it from the source; the IR shows it (L3).
    assert first.hypothesis.finding == "pipelining.none" and first.level == "L3"
    assert first.hypothesis.pattern == "tl-range-pipelining" and "tl.range(" in first.diff
    assert first.speedup == pytest.approx(1 / 0.7, rel=1e-6)
    # Round 2 is the launch search on round 1's kernel; it finds num_warps=2.
    assert second.parent == 1 and second.hypothesis.pattern == "autotune-configs"
    assert second.timings["chosen"] == "{'num_warps': 2}"
    # Round 3 searches around num_warps=2 and finds nothing above noise.
    assert third.parent == 2 and "within noise" in third.reason
    summary = report(store)
    assert summary.best_round == 2 and summary.speedup_vs_initial == pytest.approx(1.1 / 0.7, abs=1e-3)
    assert summary.speedup_vs_initial_measured and set(summary.per_case_vs_initial) == {"m=4,n=256", "m=8,n=128"}
    best = (store.dir / "best.py").read_text()
    assert best.startswith('"""kernel-kb optimize: best kernel of run') and "Round 2 (parent round 1)" in best
    assert "num_stages=3" in best and "num_warps=2" in best
    # What justified each round: its finding and the condition the pattern's rewrite makes true.
    assert first.hypothesis.unblock.startswith("the loop is an innermost scf.for with tt.num_stages > 1")
    assert "The rewrite makes true: the launch configuration is chosen by measurement" in best
    store.close()


def test_a_rewriter_that_raises_on_the_kernel_skips_its_pattern_not_the_run(tmp_path, monkeypatch):
    from diagnose.rewriters import REWRITERS

    def broken(source: str, context: dict) -> list:
        raise AssertionError("a shape this rewriter never met")

    monkeypatch.setitem(REWRITERS, "tl-range-pipelining", broken)  # round 1's pattern in the run above
    said: list[str] = []
    judge = TimedJudge()
    try:
        store = optimize(SPEC, OptimizeOptions(rounds=1, backend="interpreter", seeds=1), tmp_path / "run",
                         judge=judge, log=said.append)
    finally:
        judge.close()
    (first,) = store.rounds()
    assert first.hypothesis.pattern != "tl-range-pipelining" and first.outcome == "accepted"
    assert any("tl-range-pipelining's rewriter failed on this kernel, skipped (AssertionError: a shape" in line
               for line in said)
    assert store.run().status == RunStatus.FINISHED
    store.close()


def test_a_layer_files_entry_gets_rounds_on_the_kernels_file_it_launches(tmp_path):
    """attorch's layout: the run starts from the kernels file, each round rewrites it, and the layer's
    entry (left as it is) launches the rewrite when the judge checks it."""
    layered = FIXTURES / "optimize" / "layered"
    spec = TaskSpec(kernel=str(layered / "rowsum_layer.py"), call="RowSum.apply(torch.randn(4, 256))",
                    reference="lambda x: x.sum(-1)")
    judge = TimedJudge(kernel=layered / "rowsum_kernels.py")
    try:
        store = optimize(spec, OptimizeOptions(rounds=2, backend="interpreter", seeds=1), tmp_path / "run", judge=judge)
    finally:
        judge.close()
    assert (store.dir / "round-000.py").read_text() == (layered / "rowsum_kernels.py").read_text()
    # Round 1 sums the chunks into a vector (correct, no faster on this judge); round 2 pipelines the loop.
    first, second = store.rounds()
    assert (first.hypothesis.pattern, first.outcome) == ("accumulate-then-reduce", "rejected")
    assert "within noise" in first.reason  # checked correct through the layer, then timed
    assert (second.hypothesis.pattern, second.outcome) == ("tl-range-pipelining", "accepted"), second.reason
    assert "tl.range(" in (store.dir / "best.py").read_text()
    store.close()


def test_a_rejected_hypothesis_is_not_retried(tmp_path):
    store = _run(tmp_path, rounds=2, judge=TimedJudge(pipelining_pays=False))
    rounds = store.rounds()
    assert rounds[0].outcome == "rejected" and rounds[0].hypothesis.pattern == "tl-range-pipelining"
    assert rounds[1].hypothesis.pattern != "tl-range-pipelining"  # not blindly tried again
    assert rounds[1].outcome == "accepted" and rounds[1].parent == 0
    store.close()


def test_a_pattern_a_finding_already_got_on_this_lineage_waits_behind_the_untried_ones():
    from diagnose.planning import breadth_first
    from diagnose.rounds import Round

    def hyp(finding: str, pattern: str, untargeted: bool = False) -> Hypothesis:
        return Hypothesis(finding, finding or pattern, pattern, "pattern", "L1", untargeted=untargeted)

    tiles, fold = hyp("dot.tile-underused", "autotune-configs"), hyp("math.exp-unfolded-scale", "exp2-fast-math")
    peel, search = hyp("loop.boundary-mask", "peel-loop-boundary"), hyp("", "autotune-configs")
    spare = hyp("", "tl-range-pipelining", untargeted=True)
    planned = [tiles, fold, peel, search, spare]

    def accepted(idx: int, parent: int, h: Hypothesis) -> Round:
        return Round(idx, parent, "done", h, f"k{idx}", rewriter="pattern", outcome="accepted")

    # the tile search won round 1: the same finding asking for it again goes behind the untried findings
    # and the launch search, still ahead of what no finding asked for
    assert breadth_first(planned, [accepted(1, 0, tiles)], {0, 1}) == [fold, peel, search, tiles, spare]
    # on another branch (round 2 rewrote the task's own kernel) the win does not count
    assert breadth_first(planned, [accepted(1, 0, tiles)], {0, 2}) == planned
    # nor does the launch search's own climbing; a pair rejected on an ancestor comes back once, after the
    # untried targeted ones (round 2 changed the kernel since)
    rejected = Round(1, 0, "done", tiles, "k1", rewriter="pattern", outcome="rejected")
    assert breadth_first(planned, [rejected, accepted(2, 0, search)], {0, 2}) == [fold, peel, search, tiles, spare]


def test_a_pair_rejected_before_an_accepted_round_is_tried_once_more_on_the_new_kernel():
    from diagnose.planning import breadth_first
    from diagnose.rounds import Round

    def hyp(finding: str, pattern: str) -> Hypothesis:
        return Hypothesis(finding, finding, pattern, "pattern", "L1")

    tiles, fold, peel = (hyp("dot.tile-underused", "autotune-configs"), hyp("math.exp-unfolded-scale", "exp2-fast-math"),
                         hyp("loop.boundary-mask", "peel-loop-boundary"))

    def done(idx: int, parent: int, h: Hypothesis, outcome: str) -> Round:
        return Round(idx, parent, "done", h, f"k{idx}", rewriter="pattern", outcome=outcome)

    # attention's bench run: tiles rejected on the task's kernel, exp2 accepted in round 2
    history = [done(1, 0, tiles, "rejected"), done(2, 0, fold, "accepted")]
    assert breadth_first([tiles, fold, peel], history[:1], {0}) == [fold, peel]  # not on the kernel it lost on
    assert breadth_first([tiles, fold, peel], history, {0, 2}) == [peel, tiles, fold]
    # rejected on the new kernel too: out for good, here and on its descendants
    history += [done(3, 2, tiles, "rejected"), done(4, 2, peel, "accepted")]
    assert breadth_first([tiles, fold, peel], history, {0, 2}) == [peel, fold]
    assert breadth_first([tiles, fold, peel], history, {0, 2, 4}) == [fold, peel]
    # a failed round counts as a rejection
    assert breadth_first([tiles, peel], [done(1, 0, tiles, "failed")], {0}) == [peel]
    # a rewrite no finding asked for comes back behind the untargeted ones that were never tried
    spare, other = (Hypothesis("", "s", "tl-range-pipelining", "pattern", "L1", untargeted=True),
                    Hypothesis("", "o", "int32-offsets", "pattern", "L1", untargeted=True))
    history = [done(1, 0, spare, "rejected"), done(2, 0, fold, "accepted")]
    assert breadth_first([spare, other, peel], history, {0, 2}) == [peel, other, spare]


def test_once_the_findings_are_spent_the_loop_tries_the_rewrites_that_apply_untargeted(tmp_path):
    # rowsum: pipelining (a finding), then the launch search twice; then nothing is left to ask for.
    off = _run(tmp_path / "off", rounds=4, untargeted=False)
    assert len(off.rounds()) == 3 and off.run().note == "no untried hypothesis left after 3 rounds"
    off.close()
    on = _run(tmp_path / "on", rounds=4)
    rounds = on.rounds()
    assert [r.hypothesis.pattern for r in rounds[:3]] == ["tl-range-pipelining", "autotune-configs", "autotune-configs"]
    fourth = rounds[3]
    # No finding asked for it, and the round says so; its rewriter applied to the best kernel (round 2).
    assert fourth.hypothesis.finding == "" and fourth.hypothesis.untargeted
    assert fourth.hypothesis.title.startswith("untargeted: ")
    assert not any(r.hypothesis.untargeted for r in rounds[:3])
    # a record written before the field: its title says it
    assert Hypothesis.from_json({k: v for k, v in asdict(fourth.hypothesis).items() if k != "untargeted"}).untargeted
    assert fourth.parent == 2 and fourth.hypothesis.pattern not in ("tl-range-pipelining", "autotune-configs")
    assert fourth.state == "done" and fourth.outcome in ("accepted", "rejected")
    on.close()


class ConfirmingJudge(TimedJudge):
    """Times a round's pick against its parent a second time with the parent `parent_factor` as slow as
    in the round's own timing (0.7: the round's gain was a slow reading of the parent)."""

    def __init__(self, parent_factor: float) -> None:
        super().__init__()
        self.parent_factor = parent_factor
        self.confirmed: list[str] = []

    def confirm(self, spec, baseline, candidate, entry) -> RunReport:
        self.confirmed.append(Path(candidate).name)
        report = self(spec, baseline, candidate, entry)
        for case in report.run("baseline").cases:
            if case.timing is not None:
                case.timing = Timing(*(case.timing.median_us * self.parent_factor,) * 3, 100, repeat_spread=0.0)
        return report


def test_a_round_is_accepted_only_if_its_pick_is_faster_when_timed_again(tmp_path):
    judge = ConfirmingJudge(parent_factor=0.7)  # the pipelined loop's 1.43x does not hold up
    store = _run(tmp_path / "gone", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.confirmed == ["round-001.v0.py"]  # the pick of the round's variants
    assert first.outcome == "rejected" and "1.429x among the variants, 1.000x timed again alone: not confirmed" in first.reason
    assert first.timings["confirmation"]["geomean"] == pytest.approx(1.0) and store.run().best_round in (None, 0)
    assert not (store.dir / "best.py").exists()
    store.close()

    kept = _run(tmp_path / "kept", rounds=1, judge=ConfirmingJudge(parent_factor=0.9))
    (first,) = kept.rounds()
    # The recorded speedup is the second, unselected figure, not the best of the variants.
    assert first.outcome == "accepted" and first.speedup == pytest.approx(0.9 / 0.7)
    assert first.reason.endswith("1.429x among the variants")
    assert report(kept).best_round == 1
    kept.close()


class NoisyConfirmationJudge(TimedJudge):
    """Pipelining pays 1.43x on every case; timed again alone, case m=8,n=128 reads the candidate
    `slow[i]` times slower in the i-th confirmation (noise between jobs, or a real regression)."""

    def __init__(self, slow: list[float]) -> None:
        super().__init__()
        self.slow = slow
        self.confirmations = 0

    def confirm(self, spec, baseline, candidate, entry) -> RunReport:
        report = self(spec, baseline, candidate, entry)
        factor = self.slow[self.confirmations]
        self.confirmations += 1
        for case in report.run("candidate").cases:
            if case.timing is not None and case.label == "m=8,n=128":
                case.timing = Timing(*(case.timing.median_us * factor,) * 3, 100, repeat_spread=0.0)
        return report


def test_a_case_one_confirmation_reads_slower_is_timed_again_and_the_timings_pooled(tmp_path):
    # 1.429x in the round; timed again, case m=8,n=128 reads 1.429 / 1.5 = 0.952x: vetoed before. The
    # readings disagree, so a third timing (the case at 1.429x again) is pooled with it: accepted.
    judge = NoisyConfirmationJudge(slow=[1.5, 1.0])
    store = _run(tmp_path / "noise", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.confirmations == 2
    assert first.outcome == "accepted" and "pooled over two timings alone" in first.reason
    pooled_case = first.timings["per_case"]["m=8,n=128"]
    assert pooled_case == pytest.approx(100 / ((70 * 1.5 + 70) / 2), rel=1e-6)  # the mean of both medians
    # The gap between the two timings (70 against 105 us) widens the bar the pooled report is judged by.
    assert first.timings["confirmation"]["noise"] == pytest.approx(35 / 105)
    store.close()

    # A real regression reads slow in both timings alone and still vetoes.
    judge = NoisyConfirmationJudge(slow=[1.5, 1.5])
    store = _run(tmp_path / "real", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.confirmations == 2
    assert first.outcome == "rejected" and "case m=8,n=128 is 0.952x of the parent" in first.reason
    store.close()

    # A confirmation that agrees with the round costs no third timing.
    judge = NoisyConfirmationJudge(slow=[1.0])
    store = _run(tmp_path / "agree", rounds=1, judge=judge)
    assert judge.confirmations == 1 and store.rounds()[0].outcome == "accepted"
    store.close()


class NearMissJudge(TimedJudge):
    """The round's variants are timed with case m=8,n=128 of every pipelined variant `first` times slower
    (0.97x of the parent against the 2% bar: within twice it); each timing alone after that reads it
    `again` times slower."""

    def __init__(self, first: float, again: float, rejected_alone: str | None = None) -> None:
        super().__init__()
        self.first, self.again, self.alone, self.rejected_alone = first, again, 0, rejected_alone

    def _slowed(self, report: RunReport, factor: float) -> RunReport:
        for case in report.run("candidate").cases:
            if case.timing is not None and case.label == "m=8,n=128":
                case.timing = Timing(*(case.timing.median_us * factor,) * 3, 100, repeat_spread=0.0)
        return report

    def judge_all(self, spec, baseline, candidates, entry) -> list[RunReport]:
        return [self._slowed(self(spec, baseline, c, entry), self.first) for c in candidates]

    def confirm(self, spec, baseline, candidate, entry) -> RunReport:
        self.alone += 1
        report = self._slowed(self(spec, baseline, candidate, entry), self.again)
        report.run("candidate").rejected = self.rejected_alone
        return report


def test_a_variant_vetoed_by_a_case_within_twice_the_noise_is_timed_again_before_it_is_rejected(tmp_path):
    # Among the variants the pipelined loop reads 1.429x on case m=4,n=256 and 0.970x on m=8,n=128 (geomean
    # 1.18x): vetoed by a case slower than the 2% bar but within twice it. Timed again alone it reads 1.429x
    # on both: pooled with the first reading, the case clears the bar, and the round's confirmation follows.
    judge = NearMissJudge(first=1.429 / 0.97, again=1.0)
    store = _run(tmp_path / "noise", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.alone == 2  # the second look, then the round's confirmation
    assert first.outcome == "accepted" and first.speedup == pytest.approx(1 / 0.7, rel=1e-6)
    assert any("within twice the noise" in note for note in first.timings["report"]["notes"])
    store.close()

    # A regression that reads the same alone still vetoes: no confirmation follows.
    judge = NearMissJudge(first=1.429 / 0.97, again=1.429 / 0.97)
    store = _run(tmp_path / "real", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.alone == 1 and first.outcome == "rejected" and "is 0.970x of the parent" in first.reason
    store.close()

    # A kernel the second look finds wrong (rejected while timed again) stays rejected, whatever its times.
    judge = NearMissJudge(first=1.429 / 0.97, again=1.0, rejected_alone="while timed: outputs differ")
    store = _run(tmp_path / "wrong", rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.alone == 1 and first.outcome == "rejected"
    store.close()

    # A case slower by more than twice the noise is a regression as read: no second look.
    judge = NearMissJudge(first=1.429 / 0.95, again=1.0)
    store = _run(tmp_path / "far", rounds=1, judge=judge)
    assert judge.alone == 0 and store.rounds()[0].outcome == "rejected"
    store.close()


class OneCaseSlowerJudge(TimedJudge):
    """Pipelining pays (1.43x) on every case but m=8,n=128, where it costs 1.5x more."""

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        report = super().__call__(spec, baseline, candidate, entry)
        sources = {"baseline": Path(baseline or self.kernel).read_text(), "candidate": Path(candidate).read_text() if candidate else ""}
        for run in report.runs:
            for case in run.cases:
                if case.timing and case.label == "m=8,n=128" and "num_stages=" in sources[run.role]:
                    case.timing = Timing(*(case.timing.median_us * 1.5,) * 3, 100, repeat_spread=0.0)
        return report


def test_a_variant_faster_on_the_geomean_but_slower_on_a_case_is_not_accepted(tmp_path):
    store = _run(tmp_path, rounds=1, judge=OneCaseSlowerJudge())
    (first,) = store.rounds()
    # geomean 1.17x over the parent, which alone was accepted before; case m=8,n=128 is 0.952x
    assert first.hypothesis.pattern == "tl-range-pipelining" and first.outcome == "rejected"
    assert "geomean 1.166x, but case m=8,n=128 is 0.952x of the parent: slower by more than the noise 2.0%" \
        in first.reason
    store.close()


class HostBoundCaseJudge(TimedJudge):
    """Case m=8,n=128 is host-bound: 100 µs whatever the kernel, its two timings 40% apart; pipelining
    pays 1.43x on the other case, timed steadily."""

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        report = super().__call__(spec, baseline, candidate, entry)
        for run in report.runs:
            for case in run.cases:
                if case.timing and case.label == "m=8,n=128":
                    case.timing = Timing(100.0, 100.0, 100.0, 100, repeat_spread=0.4)
        return report


def test_a_clear_win_on_one_case_is_not_held_under_a_noisy_host_bound_case(tmp_path):
    """Geomean 1.195x against the noisy case's 40% bar: rejected as 'within noise' before; the steady
    case's 1.43x clears twice its own 2%, and no case is slower beyond the bar."""
    store = _run(tmp_path, rounds=1, judge=HostBoundCaseJudge())
    (first,) = store.rounds()
    assert first.hypothesis.pattern == "tl-range-pipelining" and first.outcome == "accepted"
    assert "case m=4,n=256 1.429x of the parent, above twice its own noise 2.0% (geomean 1.195x, within the noise " \
           "40.0%" in first.reason
    store.close()


class FailingConfirmationJudge(TimedJudge):
    def __init__(self) -> None:
        super().__init__()
        self.tries = 0

    def confirm(self, spec, baseline, candidate, entry) -> RunReport:
        self.tries += 1
        return RunReport(task="t", backend="cuda", device="H200", failure="candidate: the worker timed out")


def test_a_confirmation_that_cannot_be_timed_fails_the_round_instead_of_rejecting_the_kernel(tmp_path):
    judge = FailingConfirmationJudge()
    store = _run(tmp_path, rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.tries == 2  # once more in a fresh worker before giving up
    assert first.outcome == "failed" and "timing it again failed: candidate: the worker timed out" in first.reason
    assert store.run().best_round in (None, 0)
    store.close()


class LostDeviceJudge(TimedJudge):
    """The task's own kernel cannot be measured: its worker crashed (a lost device, a driver error)."""

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        report = super().__call__(spec, baseline, candidate, entry)
        report.failure = "the worker crashed"
        return report


def test_a_step_that_cannot_be_taken_leaves_the_run_interrupted_with_why_and_resumable(tmp_path):
    """Not "running" with no process behind it (the wild runs that stopped on the H200 read so): the run
    says it was interrupted and why, and resumes."""
    with pytest.raises(UserFacingError, match="measuring the task's own kernel failed"):
        _run(tmp_path, rounds=1, judge=LostDeviceJudge())
    store = RoundsStore(tmp_path / "run")
    info = store.run()
    assert info.status == RunStatus.INTERRUPTED and "the worker crashed" in (info.note or ""), (info.status, info.note)
    store.close()
    judge = TimedJudge()
    try:
        resumed = optimize(SPEC, OptimizeOptions(rounds=1, backend="interpreter", seeds=1), tmp_path / "run",
                           judge=judge, resume=True)
    finally:
        judge.close()
    assert resumed.run().status == RunStatus.FINISHED and len(resumed.rounds()) == 1
    resumed.close()


class ShortOfMemoryJudge(TimedJudge):
    """A device that holds `fits` variants' workers at once: more raise the judge's out-of-memory error,
    as the reference worker reports torch's."""

    def __init__(self, fits: int) -> None:
        super().__init__()
        self.fits, self.batches = fits, []

    def judge_all(self, spec, baseline, candidates, entry) -> list[RunReport]:
        self.batches.append(len(candidates))
        if len(candidates) > self.fits:
            raise UserFacingError("the judge's reference worker failed (make): OutOfMemoryError: CUDA out of memory. "
                                  "Tried to allocate 4.00 GiB", "check the task's inputs and reference")
        return super().judge_all(spec, baseline, candidates, entry)


def test_variants_that_do_not_fit_the_device_together_are_judged_one_at_a_time(tmp_path):
    judge = ShortOfMemoryJudge(fits=1)
    store = _run(tmp_path, rounds=1, judge=judge)
    (first,) = store.rounds()
    assert judge.batches[0] > 1 and set(judge.batches[1:]) == {1}  # all at once, then one by one
    assert first.outcome == "accepted", first.reason  # pipelining's 1.43x, found one variant at a time
    store.close()


def test_a_round_that_cannot_fit_the_device_fails_and_the_run_goes_on(tmp_path):
    store = _run(tmp_path, rounds=2, judge=ShortOfMemoryJudge(fits=0))
    rounds = store.rounds()
    assert rounds[0].outcome == "failed" and "ran out of memory validating the variants, one at a time too" \
        in rounds[0].reason
    assert rounds[1].hypothesis.pattern != rounds[0].hypothesis.pattern  # the next hypothesis, not the same wall
    assert store.run().status == RunStatus.FINISHED
    store.close()


def _killed_run(run_dir: str) -> None:
    judge = TimedJudge(die_on_call=4)  # baseline, round 1 (3 variants): dies validating round 1's last variant
    optimize(TaskSpec(path=str(TASK)), OptimizeOptions(rounds=2, backend="interpreter", seeds=1), Path(run_dir),
             judge=judge)


def test_a_killed_run_resumes_without_loss(tmp_path):
    run_dir = tmp_path / "run"
    child = multiprocessing.get_context("spawn").Process(target=_killed_run, args=(str(run_dir),))
    child.start()
    child.join(300)
    assert child.exitcode == -signal.SIGKILL
    store = RoundsStore(run_dir)
    before = store.rounds()
    assert store.run().baseline is not None and [(r.idx, r.state) for r in before] == [(1, "rewritten")]
    store.close()
    judge = TimedJudge()
    store = optimize(SPEC, OptimizeOptions(rounds=2, backend="interpreter", seeds=1), run_dir, judge=judge, resume=True)
    judge.close()
    after = store.rounds()
    assert [(r.idx, r.state, r.outcome) for r in after] == [(1, "done", "accepted"), (2, "done", "accepted")]
    assert after[0].key == before[0].key and after[0].started == before[0].started  # the same round, finished
    # Its work is what the resumed invocation spent on it: not the killed one's, nor the time between.
    assert 0 < after[0].worked < after[0].finished - after[0].started
    assert 0 < after[1].worked <= after[1].finished - after[1].started + 0.01 and after[1].seconds == after[1].worked
    assert replace(after[1], worked=None).seconds == after[1].finished - after[1].started  # a record from before
    assert judge.calls == 3 + 6 + 1  # round 1 again, round 2's search, the final best-vs-initial: no baseline re-run
    assert store.run().status == RunStatus.FINISHED
    with pytest.raises(UserFacingError, match="already holds a run"):
        optimize(SPEC, OptimizeOptions(rounds=1), run_dir, judge=judge)
    store.close()


def test_rewriters_leave_readable_code():
    source = KERNEL.read_text()
    (piped,) = [v for v in rewrite("tl-range-pipelining", source, {}) if v.params["num_stages"] == 3]
    assert "    for start in tl.range(0, N, BLOCK, num_stages=3):\n" in piped.source
    assert piped.source.replace("tl.range(0, N, BLOCK, num_stages=3)", "range(0, N, BLOCK)") == source
    warps = {v.params.get("num_warps") for v in rewrite("autotune-configs", source, {})}
    assert {2, 8} <= warps
    assert rewrite("dot-input-precision-tf32", source, {}) == []  # no dot: does not apply
    # row * N + cols: no pid * BLOCK start to vouch for (N itself gets the launch-true form, tests/test_hints_rewrite.py)
    assert [v for v in rewrite("divisibility-hints", source, {}) if "hints" in v.params] == []
    gelu = (FIXTURES.parent.parent / "corpora" / "operators" / "gelu" / "gelu.py").read_text()
    (hinted,) = [v for v in rewrite("divisibility-hints", gelu, {}) if "hints" in v.params]
    assert ("offs = tl.max_contiguous(tl.multiple_of(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), BLOCK), BLOCK)"
            in hinted.source)


def test_cli_rounds_list_and_show(tmp_path):
    home = tmp_path / "home"
    run_dir = home / "runs" / "rowsum-test"
    judge = TimedJudge()
    optimize(SPEC, OptimizeOptions(rounds=1, backend="interpreter", seeds=1), run_dir, judge=judge).close()
    judge.close()
    listed = CliRunner().invoke(main, ["--home", str(home), "rounds", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [r["run"] for r in json.loads(listed.stdout)] == ["rowsum-test"]
    shown = CliRunner().invoke(main, ["--home", str(home), "rounds", "show", "rowsum-test"])
    assert shown.exit_code == 0 and "pipelining.none" in shown.output and "accepted" in shown.output
    missing = CliRunner().invoke(main, ["--home", str(home), "rounds", "show", "nope"])
    assert missing.exit_code == 2 and "no optimize run 'nope'" in missing.output
    bad = CliRunner().invoke(main, ["--home", str(home), "optimize"])
    assert bad.exit_code == 2 and "give a TASK file" in bad.output


# ------------------------------------------------------------------------------------------ LLM
def test_llm_rewrites_through_a_local_chat_server(tmp_path, monkeypatch):
    from test_engine import _ChatHandler

    good = KERNEL.read_text() + "# rewritten by the model\n"
    replies = ["I cannot help with that.", f"Here is the kernel.\n```python\n{good}```\n"]

    class Handler(_ChatHandler):
        def reply_text(self, body: dict) -> str:
            return replies[min(len(Handler.requests), len(replies)) - 1]

    Handler.requests = []
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KB_LLM_BASE_URL", f"http://127.0.0.1:{server.server_port}/v1")
    monkeypatch.setenv("KB_LLM_RETRIES", "0")
    try:
        # Pipelining does not pay on this 'device'; the finding's other pattern (num-stages, a launch
        # search) finds num_warps=2; the finding outlives it, and the model is asked before num-stages
        # would search again (planning.breadth_first), after the catalog's rewrites (the default order).
        store = _run(tmp_path, rounds=4, llm="openai", judge=TimedJudge(pipelining_pays=False))
    finally:
        server.shutdown()
    rounds = store.rounds()
    assert [(r.rewriter, r.outcome) for r in rounds] == [
        ("pattern", "rejected"), ("pattern", "accepted"), ("llm", "accepted"), ("pattern", "accepted")]
    assert rounds[1].hypothesis.pattern == "num-stages"  # tl-range was rejected on the ancestor: skipped
    asked = rounds[2]
    assert asked.hypothesis.finding == "pipelining.none"
    # The first reply had no code: it got a repair turn and the second passed.
    assert [a["outcome"] for a in asked.timings["llm"]["attempts"]][:2] == ["unusable", "passed"]
    assert "# rewritten by the model" in asked.diff and asked.speedup == pytest.approx(100 / 55)
    prompt = Handler.requests[0]["messages"][-1]["content"]
    assert "rowsum_kernel" in prompt and "[E" in prompt  # the kernel and the cited evidence
    # The run's history: the rounds before, with their outcome and the judge's reason.
    assert "round 1 (on round 0's kernel): pipelining.none -> tl-range-pipelining (pattern): rejected" in prompt
    assert "round 2 (on round 0's kernel)" in prompt and "num_warps" in prompt
    assert "no torch fallback" in Handler.requests[0]["messages"][0]["content"]
    store.close()


def test_masked_tail_split_is_correct_and_vectorizes_full_blocks(tmp_path):
    from harness.capture import capture_call
    from harness.ir import ptx_memory_accesses
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "diagnosis" / "nvidia" / "vector_add.py"
    (variant,) = rewrite("masked-tail-split", original.read_text(), {})
    assert "if (tl.program_id(0) * BLOCK) + BLOCK <= n:" in variant.source
    split = tmp_path / "vector_add_split.py"
    split.write_text(variant.source)
    spec = TaskSpec(**{"kernel": str(original), "call": "add(torch.randn(3001), torch.randn(3001))", "reference": "torch.add"})
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(split),
                      candidate_entry="add")
    assert report.run("candidate").correct, report.to_dict()
    ptx = capture_call(split, "add(torch.randn(1000003), torch.randn(1000003))")[0].stages["ptx"]
    assert any(a.kind == "load" and a.bits == 128 for a in ptx_memory_accesses(ptx))


def test_persistent_launch_is_correct(tmp_path):
    from harness.capture import capture_call
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "operators" / "gelu" / "gelu.py"
    variants = rewrite("persistent-kernel", original.read_text(), {})
    assert [v.params["programs_per_sm"] for v in variants] == [1, 2, 4]
    assert "for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):" in variants[1].source
    # A 2-D grid: not this loop over a 1-D grid; a tiled matmul gets the persistent TMA form instead
    # (tests/test_persistent_dot_rewrite.py).
    assert all("programs_per_sm" not in v.params for v in rewrite(
        "persistent-kernel", (FIXTURES.parent.parent / "corpora" / "operators" / "matmul" / "matmul.py").read_text(), {}))
    persistent = tmp_path / "gelu_persistent.py"
    persistent.write_text(variants[1].source)
    spec = TaskSpec(**{"kernel": str(original), "call": "gelu(torch.randn(5000))",
            "reference": "torch.nn.functional.gelu"})
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(persistent),
                      candidate_entry="gelu")
    assert report.run("candidate").correct, report.to_dict()
    ttgir = capture_call(persistent, "gelu(torch.randn(1 << 20))")[0].stages["ttgir"]
    assert "scf.for" in ttgir


ROW_GEGLU = '''import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(a, b, c, stride, n_cols: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    program_id = tl.program_id(0)  # Liger adds .to(tl.int64), which the interpreter's int loop index lacks
    a += program_id * stride  # Liger's way to a row: the pointer parameters move
    b += program_id * stride
    c += program_id * stride
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(a + cols, mask=mask, other=0.0)
    tl.store(c + cols, x * tl.sigmoid(x) * tl.load(b + cols, mask=mask, other=0.0), mask=mask)


def row_op(a, b):
    c = torch.empty_like(a)
    rows, cols = a.shape
    _row_kernel[(rows,)](a, b, c, a.stride(0), n_cols=cols, BLOCK_SIZE=triton.next_power_of_2(cols))
    return c
'''


def test_a_persistent_loop_starts_each_tile_from_the_parameters_as_launched(tmp_path):
    """A kernel that moves its pointer parameters to its row (`a += pid * stride`): in a persistent loop
    each tile must start from the launched pointers again, not from the last tile's (on the H200, Liger's
    GEGLU made persistent read out of bounds: an illegal memory access in every variant)."""
    from harness.run import RunOptions, run_task

    (variant, *_) = rewrite("persistent-kernel", ROW_GEGLU, {})
    source = variant.source
    assert "_kb_a_at_launch = a" in source and "        a = _kb_a_at_launch" in source
    # without a GPU the wrapper counts 4 SMs: 4 to 16 programs walk the 40 rows, each through several tiles
    assert "if torch.cuda.is_available() else 4)" in source
    (tmp_path / "row.py").write_text(ROW_GEGLU)
    (tmp_path / "row_persistent.py").write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "row.py"), call="row_op(torch.randn(40, 100), torch.randn(40, 100))",
                    reference="lambda a, b: torch.nn.functional.silu(a) * b")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1),
                      candidate=str(tmp_path / "row_persistent.py"), candidate_entry="row_op")
    assert report.run("candidate").correct, report.to_dict()
    # a constexpr parameter the body reassigns cannot be carried by the loop: the rewrite declines
    moved_constexpr = ROW_GEGLU.replace("    cols = tl.arange(0, BLOCK_SIZE)\n",
                                        "    n_cols = n_cols - 0\n    cols = tl.arange(0, BLOCK_SIZE)\n")
    assert rewrite("persistent-kernel", moved_constexpr, {}) == []


def test_a_kernel_that_reads_the_grid_where_the_loop_cannot_rename_it_is_not_made_persistent():
    # A grid-stride loop over tl.num_programs(0) would step by the persistent grid and count tiles twice;
    # a helper's own tl.program_id(0) would stay the program's, not the tile's (a helper's audit probes).
    gelu = (FIXTURES.parent.parent / "corpora" / "operators" / "gelu" / "gelu.py").read_text()
    assert rewrite("persistent-kernel", gelu, {})
    strided = gelu.replace("tl.program_id(0)", "tl.program_id(0) + 0 * tl.num_programs(0)", 1)
    assert strided != gelu and rewrite("persistent-kernel", strided, {}) == []
    helper = ROW_GEGLU.replace("    program_id = tl.program_id(0)  #", "    program_id = _row()  #").replace(
        "@triton.jit\ndef _row_kernel", "@triton.jit\ndef _row():\n    return tl.program_id(0)\n\n\n@triton.jit\ndef _row_kernel")
    assert "def _row():" in helper and rewrite("persistent-kernel", helper, {}) == []
    # a kernel that may spin on another program's flag: with several tiles a program it could wait on itself
    for wait in ("tl.atomic_cas(c + 0, 0, 0)", "tl.load(c, volatile=True)"):
        spinning = ROW_GEGLU.replace("    cols = tl.arange(0, BLOCK_SIZE)\n", f"    _w = {wait}\n    cols = tl.arange(0, BLOCK_SIZE)\n")
        assert wait in spinning and rewrite("persistent-kernel", spinning, {}) == [], wait
    assert rewrite("persistent-kernel", ROW_GEGLU, {})


def test_persistent_launch_reads_a_lambda_grid_and_converts_each_launch_once(tmp_path):
    """The first drafts' grid, `grid = lambda meta: (triton.cdiv(n, meta['BLOCK']),)`, inside a wrapper
    nested in another function: the launch is converted once, its tile count taken from its own BLOCK."""
    from harness.run import RunOptions, run_task

    gelu = (FIXTURES.parent.parent / "corpora" / "operators" / "gelu" / "gelu.py").read_text()
    nested = gelu.replace(
        "def gelu(x):\n    out = torch.empty_like(x)\n    n = x.numel()\n"
        "    gelu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)\n    return out\n",
        "def make_gelu():\n    def run(x):\n        out = torch.empty_like(x)\n        n = x.numel()\n"
        "        grid = lambda meta: (triton.cdiv(n, meta['BLOCK']),)\n"
        "        gelu_kernel[grid](x, out, n, BLOCK=512)\n        return out\n    return run\n\n\n"
        "def gelu(x):\n    return make_gelu()(x)\n")
    assert nested != gelu
    variants = rewrite("persistent-kernel", nested, {})
    assert [v.params["programs_per_sm"] for v in variants] == [1, 2, 4]
    source = variants[0].source
    assert source.count("n_tiles = triton.cdiv(n, 512)") == 1 and source.count("n_tiles=n_tiles") == 1
    (tmp_path / "gelu.py").write_text(nested)
    (tmp_path / "gelu_persistent.py").write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "gelu.py"), call="gelu(torch.randn(5000))", reference="torch.nn.functional.gelu")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2),
                      candidate=str(tmp_path / "gelu_persistent.py"), candidate_entry="gelu")
    assert report.run("candidate").correct, report.to_dict()


def test_tensor_descriptor_rewrite_dispatches_on_tma_rules(tmp_path):
    from harness.capture import capture_call
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "operators" / "matmul" / "matmul.py"
    (variant,) = rewrite("tensor-descriptors-tma", original.read_text(), {})
    assert variant.params == {"tma": ["a_ptr", "b_ptr"]}
    assert "a_desc.load([pid_m * BLOCK_M, k])" in variant.source and "else:\n        matmul_kernel[grid]" in variant.source
    tma = tmp_path / "matmul_tma.py"
    tma.write_text(variant.source)
    # Aligned operands take the descriptor kernel; k = 65 (130-byte rows) breaks TMA's rule and
    # takes the original: both must match the reference.
    for call in ("matmul(torch.randn(128, 64).half(), torch.randn(64, 128).half())",
                 "matmul(torch.randn(65, 65).half(), torch.randn(65, 33).half())"):
        spec = TaskSpec(**{"kernel": str(original), "call": call, "reference": "torch.matmul"})
        report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(tma),
                          candidate_entry="matmul")
        assert report.run("candidate").correct, (call, report.to_dict())
    arts = capture_call(tma, "matmul(torch.randn(512, 512).half(), torch.randn(512, 512).half())")
    assert any("ttng.async_tma_copy_global_to_local" in a.stages["ttgir"] for a in arts)


def test_the_final_measurement_reports_speedups_over_pytorch():
    from diagnose.end_of_run import final_record

    def run_of(role, us):
        return KernelRun(role=role, source=f"{role}.py", cases=[
            CaseResult(case={"n": i}, label=f"n={i}", timing=Timing(t, t, t, 10, 0.0)) for i, t in enumerate(us)])
    report = RunReport(task="t", backend="cuda", device="H200", runs=[
        run_of("baseline", [100.0, 100.0]), run_of("candidate", [50.0, 25.0]), run_of("eager", [100.0, 50.0])])
    record = final_record(2, report, OptimizeOptions())
    assert record["geomean"] == pytest.approx(8 ** 0.5) and record["per_case"] == {"n=0": 2.0, "n=1": 4.0}
    assert record["vs_eager"]["initial"]["geomean"] == pytest.approx(0.5 ** 0.5)  # the initial kernel lost to eager
    assert record["vs_eager"]["best"]["per_case"] == {"n=0": 2.0, "n=1": 2.0}
    unchanged = final_record(0, RunReport(task="t", backend="cuda", device="H200", runs=[
        run_of("baseline", [100.0, 100.0]), run_of("eager", [100.0, 50.0])]), OptimizeOptions())
    assert unchanged["geomean"] == 1.0 and unchanged["vs_eager"]["best"] == unchanged["vs_eager"]["initial"]


class SlowAtTheEnd(TimedJudge):
    """The end-of-run timing finds the best kernel 3x slower than the initial one on the first case."""

    def final(self, spec, best, entry, initial=None) -> RunReport:
        report = super().final(spec, best, entry)
        first = next(c for c in report.run("candidate").cases if not c.heldout)
        first.timing = Timing(*(first.timing.median_us * 3,) * 3, 100, repeat_spread=0.0)
        return report


def test_a_best_kernel_that_does_not_hold_up_at_the_end_hands_back_the_initial_one(tmp_path):
    store = _run(tmp_path, rounds=1, judge=SlowAtTheEnd())
    (first,) = store.rounds()
    assert first.outcome == "accepted"  # by its own timing
    info = store.run()
    assert info.best_round == 0 and info.best_path.endswith("round-000.py")
    assert info.final["best_round"] == 0 and info.final["geomean"] == 1.0
    assert set(info.final["per_case"].values()) == {1.0}
    assert "round 1's kernel did not hold up in the end-of-run timing" in info.note
    assert "slower by more than the noise" in info.note
    best = (store.dir / "best.py").read_text()
    assert "the initial kernel" in best.splitlines()[0] and best.endswith(KERNEL.read_text())
    summary = report(store)
    assert summary.best_round == 0 and summary.speedup_vs_initial == 1.0
    store.close()


class NoGainAtTheEnd(TimedJudge):
    """The end-of-run timing finds the best kernel as fast as the initial one on every case."""

    def final(self, spec, best, entry, initial=None) -> RunReport:
        report = super().final(spec, best, entry)
        parent = {c.label: c.timing for c in report.run("baseline").cases}
        for case in report.run("candidate").cases:
            if case.timing is not None:
                case.timing = parent[case.label]
        return report


def test_a_best_kernel_with_no_gain_in_the_end_of_run_timing_hands_back_the_initial_one(tmp_path):
    store = _run(tmp_path, rounds=1, judge=NoGainAtTheEnd())
    assert store.rounds()[0].outcome == "accepted"  # by its own timing
    info = store.run()
    assert info.best_round == 0 and info.final["best_round"] == 0 and info.final["geomean"] == 1.0
    assert "no gain on the initial kernel beyond the noise: geomean 1.000x, noise 2.0%" in info.note
    store.close()


class UntimedAtTheEnd(TimedJudge):
    """The end-of-run measurement checks but does not time (the interpreter's untimed judge)."""

    def final(self, spec, best, entry, initial=None) -> RunReport:
        report = super().final(spec, best, entry)
        for run in report.runs:
            for case in run.cases:
                case.timing = None
        return report


def test_an_untimed_end_of_run_keeps_the_best_kernel(tmp_path):
    store = _run(tmp_path, rounds=1, judge=UntimedAtTheEnd())
    info = store.run()
    assert info.best_round == 1 and info.final["best_round"] == 1 and not info.note  # no verdict against it
    store.close()


def test_one_process_per_run_directory_and_an_empty_store_starts_afresh(tmp_path):
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    judge = TimedJudge()
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UserFacingError, match="another kb optimize is working in"):
            optimize(SPEC, OptimizeOptions(rounds=1, backend="interpreter"), run_dir, judge=judge)
    judge.close()
    RoundsStore(run_dir, create=True).close()  # killed before the run record was written
    store = _run(tmp_path, rounds=1)  # the same directory: tmp_path / "run"
    assert store.run().status == RunStatus.FINISHED
    store.close()


def test_nothing_accepted_and_no_stand_ins_leaves_nothing_to_time_at_the_end(tmp_path):
    class CountingJudge(TimedJudge):
        finals = 0

        def final(self, spec, best, entry, initial=None):
            self.finals += 1
            return super().final(spec, best, entry)

    judge = CountingJudge(pipelining_pays=False)
    store = _run(tmp_path, rounds=1, references=(), judge=judge)
    info = store.run()
    assert store.rounds()[0].outcome == "rejected" and not info.best_round
    # The initial kernel is the best one and no stand-in was asked for: no end-of-run job.
    assert judge.finals == 0
    assert info.final["best_round"] == 0 and info.final["geomean"] == 1.0
    assert report(store).speedup_vs_initial_measured and "vs_eager" not in info.final
    store.close()


def test_timing_windows_reach_the_timing_job():
    from harness.judge import Judge, KernelSpec
    from harness.timing import REP_MS, WARMUP_MS

    for options, windows in ((OptimizeOptions(backend="interpreter"), (WARMUP_MS, REP_MS)),
                             (OptimizeOptions(backend="interpreter", warmup_ms=50, rep_ms=100), (50, 100))):
        harness_judge = HarnessJudge(options, time=False)
        assert (harness_judge.options.warmup_ms, harness_judge.options.rep_ms) == windows
        harness_judge.close()
    with Judge(SPEC, "interpreter", timeout_s=120) as judge:  # the windows a timing job ran with, recorded
        judge.begin(seed=3)
        timed = judge.time([KernelSpec("baseline")], cases=[0], warmup_ms=3, rep_ms=7)
        (case,) = timed.cases["baseline"]
        assert (case.timing.warmup_ms, case.timing.rep_ms) == (3, 7)


def test_a_rounds_variants_are_checked_by_several_workers(tmp_path):
    variants = []
    for i in range(3):  # three sources: three workers, checked two at a time
        variants.append(tmp_path / f"v{i}.py")
        variants[-1].write_text(KERNEL.read_text() + f"\n# variant {i}\n")
    judge = HarnessJudge(OptimizeOptions(backend="interpreter", seeds=1, check_workers=2), time=False)
    try:
        reports = judge.judge_all(SPEC, str(KERNEL), [str(v) for v in variants], "row_sum")
        assert [r.run("candidate").correct for r in reports] == [True, True, True]
        session = judge.judge_for(SPEC)
        assert len({h.worker.pid for h in session._hosted.values()}) == 3  # one worker per source
        judge.judge_all(SPEC, str(KERNEL), [str(KERNEL)], "row_sum")  # the next round retires the last one's
        assert len(session._hosted) == 1
        judge.judge_all(SPEC, str(KERNEL), [str(v) for v in variants], "row_sum")
        judge.confirm(SPEC, str(KERNEL), str(variants[0]), "row_sum")  # the pick timed again: the others retire
        assert len(session._hosted) == 2
        judge.judge_all(SPEC, str(KERNEL), [str(v) for v in variants], "row_sum")
        judge.final(SPEC, str(variants[1]), "row_sum")  # the end of the run: the last round's workers retire
        hosted = {h.spec.file for h in session._hosted.values()}
        assert str(variants[1]) in hosted and not hosted & {str(variants[0]), str(variants[2])}
    finally:
        judge.close()


def test_dot_kernels_search_whole_tile_shapes_and_the_grid_follows(tmp_path):
    from diagnose.rewriters import dot_tile_configs
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "operators" / "bmm" / "bmm.py"
    variants = rewrite("autotune-configs", original.read_text(), {})
    assert len(variants) == 7  # six tiles, then the same six under @triton.autotune
    wide = variants[0]
    assert wide.params == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 4, "num_warps": 8}
    # Axis 0 steps by BLOCK_M and axis 1 by BLOCK_N in the kernel: each grid divisor follows its own block.
    assert "BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)" in wide.source
    for v in variants[:6]:
        assert f"grid = (triton.cdiv(m, {v.params['BLOCK_M']}), triton.cdiv(n, {v.params['BLOCK_N']}), batch)" in v.source
    narrow = tmp_path / "bmm_tiles.py"
    narrow.write_text(variants[3].source)  # 64 x 128 tiles on 130 x 70: masked rows and columns
    spec = TaskSpec(**{"kernel": str(original), "reference": "lambda a, b: torch.bmm(a.float(), b.float()).half()",
            "call": "bmm(torch.randn(2, 130, 65).half(), torch.randn(2, 65, 70).half())"})
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(narrow),
                      candidate_entry="bmm")
    assert report.run("candidate").correct, report.to_dict()
    # Not a dot kernel: the one-knob search, as before.
    assert all(len(v.params) == 1 for v in rewrite("autotune-configs", KERNEL.read_text(), {}))
    # A grid divisor on an axis the kernel does not tie to a block: no tile search (it could under-cover).
    odd = original.read_text().replace("pid_m = tl.program_id(0)", "pid_m = tl.program_id(0) + 0 * BLOCK_K")
    odd = odd.replace("rm = pid_m * BLOCK_M", "rm = pid_m")
    assert dot_tile_configs(odd, {}) == [] and dot_tile_configs(original.read_text(), {})
    # A grouped 1-D grid, or a literal cdiv outside the grid, would keep the old tile size: no tile search.
    grouped = original.read_text().replace("grid = (triton.cdiv(m, 64), triton.cdiv(n, 64), batch)",
                                           "grid = (triton.cdiv(m, 64) * triton.cdiv(n, 64), 1, batch)")
    assert dot_tile_configs(grouped, {}) == []
    counted = original.read_text().replace("    grid = (", "    tiles = (triton.cdiv(k, 32), 4)\n    grid = (")
    assert dot_tile_configs(counted, {}) == []


def test_autotuned_tiles_are_checked_under_every_config_they_may_pick(tmp_path):
    from diagnose.rewriters import dot_tile_autotune, dot_tile_configs
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "operators" / "matmul" / "matmul.py"
    tuned = rewrite("autotune-configs", original.read_text(), {})[-1]
    assert tuned.params["key"] == ["M", "N", "K"] and len(tuned.params["autotune"]) == 7
    # The kernel's own tile (64 x 64 x 32 at Triton's default warps and stages) comes first: the tuner may keep it.
    assert tuned.params["autotune"][0] == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_stages": 3, "num_warps": 4}
    # Warps passed as an expression: the kernel's own launch is not known, so it is not listed.
    unknown = original.read_text().replace("BLOCK_K=32)", "BLOCK_K=32, num_warps=2 * 2)")
    assert "num_warps=2 * 2" in unknown and len(rewrite("autotune-configs", unknown, {})[-1].params["autotune"]) == 6
    assert "@triton.autotune(configs=[" in tuned.source and "key=['M', 'N', 'K'])" in tuned.source
    # The grid follows the config the tuner picks; the launch no longer names the tile.
    assert 'grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))' in tuned.source
    assert "BLOCK_M=" not in tuned.source.split("def matmul(")[1]
    spec = TaskSpec(**{"kernel": str(original), "reference": "lambda a, b: (a.float() @ b.float()).half()",
            "call": "matmul(torch.randn(130, 65).half(), torch.randn(65, 70).half())"})
    good, bad = tmp_path / "tuned.py", tmp_path / "tuned_fixed_grid.py"
    good.write_text(tuned.source)
    # A grid fixed at 128 rows per program is right for the 128-row configs only.
    bad.write_text(tuned.source.replace('triton.cdiv(m, meta["BLOCK_M"])', "triton.cdiv(m, 128)"))
    options = RunOptions(backend="interpreter", time=False, seeds=1)
    assert run_task(spec, options, candidate=str(good), candidate_entry="matmul").run("candidate").correct
    wrong = run_task(spec, options, candidate=str(bad), candidate_entry="matmul").run("candidate")
    assert not wrong.correct and "config matmul_kernel BLOCK_M=64, BLOCK_N=64" in wrong.rejected
    # Tuning reruns the kernel on the same buffers: not for atomics or a buffer both read and written.
    assert dot_tile_autotune(original.read_text().replace("tl.store(c_ptr", "tl.atomic_add(c_ptr"), {}) == []
    assert dot_tile_autotune(original.read_text().replace("tl.store(c_ptr", "tl.store(a_ptr"), {}) == []
    # Once tuned, the configs own the launch knobs: no launch keyword that would clash with them; the
    # searches widen the config list instead, every config it had kept in front (tests/test_configs_rewrite.py).
    wrapper = tuned.source.split("def matmul(")[1]
    for pattern in ("block-size-num-warps", "autotune-configs"):
        widened = rewrite(pattern, tuned.source, {})
        assert widened and all(v.source.split("def matmul(")[1] == wrapper for v in widened)
        assert all(v.source.split("], key=")[0].startswith(tuned.source.split("], key=")[0].rstrip(",\n"))
                   for v in widened)
    # A grouped 1-D grid keeps a literal tile size the config cannot change: no autotune either.
    grouped = original.read_text().replace("grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))",
                                           "grid = (triton.cdiv(m, 64) * triton.cdiv(n, 64), 1)")
    assert dot_tile_autotune(grouped, {}) == []
    # Tensors stay out of the key whatever their names; a `grid = (..)` of another function stays a tuple;
    # a grid that does not count its tiles with cdiv keeps the old size, so nothing is tuned.
    renamed = original.read_text().replace("a_ptr", "A").replace("b_ptr", "B").replace("c_ptr", "C")
    assert dot_tile_autotune(renamed, {})[0].params["key"] == ["M", "N", "K"]
    elsewhere = dot_tile_autotune(original.read_text() + "\n\ndef other():\n    grid = (4,)\n    return grid\n", {})
    assert "    grid = (4,)" in elsewhere[0].source
    rounded = original.read_text().replace("triton.cdiv(m, 64)", "(m + 63) // 64")
    assert dot_tile_autotune(rounded, {}) == [] and dot_tile_configs(rounded, {}) == []
    # Only the launched kernel is tuned, not a @triton.jit helper it calls.
    helper = original.read_text().replace("@triton.jit\ndef matmul_kernel(",
                                          "@triton.jit\ndef relu(x):\n    return tl.maximum(x, 0)\n\n\n"
                                          "@triton.jit\ndef matmul_kernel(")
    tuned_helper = dot_tile_autotune(helper, {})[0].source
    assert tuned_helper.count("@triton.autotune(") == 1
    assert tuned_helper.index("@triton.autotune(") > tuned_helper.index("def relu(")


_DOUBLE = """
import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 4096})], key=["n"])
@triton.jit
def double_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def double(x):
    o = torch.empty_like(x)
    if len(double_kernel.configs) == 1 and double_kernel.configs[0].kwargs["BLOCK"] > {LIMIT}:
        raise OutOfResources(300000, 232448, "shared memory")  # as the device says of a config too large
    double_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, o, x.numel())
    return o
"""


def test_a_config_the_tuner_would_pass_over_is_passed_over_by_the_check(tmp_path):
    from harness.run import RunOptions, run_task

    options = RunOptions(backend="interpreter", time=False, seeds=1)
    reports = {}
    for limit in (1024, 16):  # the 4096 config does not fit; then neither does the 64 one
        kernel = tmp_path / f"double_{limit}.py"
        kernel.write_text(_DOUBLE.replace("{LIMIT}", str(limit)))
        spec = TaskSpec(**{"kernel": str(kernel), "reference": "lambda x: x * 2", "call": "double(torch.randn(1000))"})
        reports[limit] = run_task(spec, options).run("baseline")
    assert reports[1024].correct and reports[1024].rejected is None
    assert not reports[16].correct and "no config of the autotuned kernel can run" in reports[16].rejected
    assert "OutOfResources" in reports[16].rejected


def test_pinning_a_tuner_restores_it_and_an_unpinned_call_tunes_afresh():
    import triton
    import triton.language as tl

    from harness.host import pinned as _pinned

    @triton.autotune(configs=[triton.Config({"B": 32}), triton.Config({"B": 64}, num_warps=8)], key=["n"])
    @triton.jit
    def kernel(x_ptr, n, B: tl.constexpr):
        pass

    configs = list(kernel.configs)
    kernel.cache[(1000,)] = configs[0]
    with _pinned([kernel], 1) as label:
        assert kernel.configs == [configs[1]] and not kernel.cache
        assert label == ", config kernel B=64, num_warps=8, num_stages=3"
    assert kernel.configs == configs and kernel.cache == {(1000,): configs[0]}
    # The device's extra call: every config in play, the cache empty so that this call benchmarks.
    with _pinned([kernel], None) as label:
        assert kernel.configs == configs and not kernel.cache and label == ", tuned on this call"
    assert kernel.cache == {(1000,): configs[0]}
    with pytest.raises(RuntimeError), _pinned([kernel], 0):
        raise RuntimeError("a failing check")
    assert kernel.configs == configs  # restored on the way out of a failure too


def test_attention_tiles_are_the_measured_ones_and_stay_correct(tmp_path):
    from harness.run import RunOptions, run_task

    original = FIXTURES.parent.parent / "corpora" / "operators" / "attention" / "attention.py"
    variants = rewrite("autotune-configs", original.read_text(), {})
    # No BLOCK_K (the head dimension is the dot's K): M x N tiles with stages and warps, the four measured
    # best on the H200 (docs/device/2026-12-03-h200-attention), then a tuner over them.
    assert [v.params for v in variants][:4] == [
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3, "num_warps": 4},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 4, "num_warps": 4},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 3, "num_warps": 8}]
    assert len(variants) == 5 and "autotune" in variants[4].params
    assert "grid = (triton.cdiv(seq, 128), batch * heads)" in variants[0].source  # axis 0 steps by BLOCK_M
    wide = tmp_path / "attention_tiles.py"
    wide.write_text(variants[0].source)  # 128-row tiles over 77 rows: masked rows and a grid at 128
    spec = TaskSpec(**{"kernel": str(original), "reference": "lambda q, k, v: torch.nn.functional.scaled_dot_product_attention("
            "q.float(), k.float(), v.float()).half()",
            "call": "attention(" + ", ".join(["torch.randn(1, 2, 77, 16).half()"] * 3) + ")",
            "tolerances": {"atol": 1e-2, "rtol": 1e-2}})
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(wide),
                      candidate_entry="attention")
    assert report.run("candidate").correct, report.to_dict()


def test_a_timing_burn_in_leaves_autotuned_kernels_to_tune_again(tmp_path):
    from harness.host import KernelHost, autotuners
    from harness.loading import load_kernel_module

    original = FIXTURES.parent.parent / "corpora" / "operators" / "matmul" / "matmul.py"
    tuned = tmp_path / "tuned.py"
    tuned.write_text(rewrite("autotune-configs", original.read_text(), {})[-1].source)
    entry = load_kernel_module(tuned).matmul
    (tuner,) = autotuners(entry)
    tuner.cache[(512, 512, 512, "torch.float16")] = tuner.configs[0]  # what the burn-in's first call kept
    host = KernelHost("cpu", tmp_path)
    host.entries = {"candidate": entry, "eager": lambda a, b: a @ b}
    host.forget_tunings()
    assert tuner.cache == {} and len(tuner.configs) == 7


class _WildJudge(HarnessJudge):
    """Checks with the real harness; a launch with more warps than the wild wrapper's own is 'faster'."""

    def __init__(self) -> None:
        super().__init__(OptimizeOptions(backend="interpreter", seeds=1), time=False)

    def __call__(self, spec, baseline, candidate, entry) -> RunReport:
        report = super().__call__(spec, baseline, candidate, entry)
        for run in report.runs:
            source = Path(candidate).read_text() if run.role == "candidate" and candidate else ""
            t = 60.0 if "num_warps=8" in source else 100.0
            for case in run.cases:
                if run.correct and not case.heldout:
                    case.timing = Timing(t, t, t, 100, repeat_spread=0.0)
        return report

    def judge_all(self, spec, baseline, candidates, entry) -> list[RunReport]:
        return [self(spec, baseline, c, entry) for c in candidates]


WILD_ROWSUM = '''"""Row sums behind an autograd Function inside a package, as libraries ship their kernels."""
import torch
import triton
import triton.language as tl

from rowpkg.ops.settings import BLOCK  # the package by its name
from .settings import WARPS  # and relatively


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class RowSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=BLOCK, num_warps=WARPS)
        return out
'''


def store_speedup(run_dir: Path) -> float:
    store = RoundsStore(run_dir)
    try:
        return report(store).speedup_vs_initial
    finally:
        store.close()


def test_a_kernel_from_the_wild_is_diagnosed_and_rewritten_under_its_call(tmp_path):
    """`kb optimize --kernel K --call C` on an autograd Function's `.apply`, the form most library kernels
    take: each round's parent is diagnosed as the kernel under that call (its launch read, its IR
    compiled in a worker that resolves `Function.apply` in the rewrite), not as a task file, which the
    kernel file is not (every wild case on the H200 failed so after its baseline, 2026-12-03)."""
    from diagnose.optimize import diagnose_kernel
    from harness.entries import entry_name
    from harness.task import load_job_task

    ops = tmp_path / "src" / "rowpkg" / "ops"
    ops.mkdir(parents=True)
    for folder in (ops, ops.parent):
        (folder / "__init__.py").write_text("")
    (ops / "settings.py").write_text("BLOCK = 64\nWARPS = 1\n")
    (ops / "row_sum.py").write_text(WILD_ROWSUM)
    spec = TaskSpec(kernel=str(ops / "row_sum.py"), call="RowSum.apply(torch.randn(6, 300))",
                    reference="lambda x: x.sum(-1)")
    judge = _WildJudge()
    try:
        store = optimize(spec, OptimizeOptions(rounds=1, backend="interpreter", seeds=1), tmp_path / "run", judge=judge)
    finally:
        judge.close()
    (first,) = store.rounds()
    assert first.state == "done" and first.outcome in ("accepted", "rejected"), (first.reason, first.outcome)
    assert first.hypothesis.launched == {"_row_sum_kernel": {"num_warps": 1, "num_stages": 3, "programs": 6, "sms": 132}}  # kept for a resume
    # its variants, written in the run's folder, imported as if they sat in the package (on the H200 every
    # rewrite of a Liger kernel failed with "No module named 'liger_kernel'")
    assert "cannot be loaded" not in (first.reason or ""), first.reason
    assert all(v.get("geomean") for v in first.timings["variants"]), first.timings  # each checked and timed
    # the diagnosis of the round's parent reached the IR, compiled under the call, with the launch read
    task = load_job_task(spec)
    answer, launched = diagnose_kernel(store, task, store.dir / "round-000.py", entry_name(task.entry),
                                 OptimizeOptions(backend="interpreter", strategy="always-deep"), None)
    assert launched == {"_row_sum_kernel": {"num_warps": 1, "num_stages": 3, "programs": 6, "sms": 132}}  # WARPS from the package
    assert "the IR confirms it" in " ".join(answer.notes), answer.notes
    from diagnose.request import KernelInput, request_from

    given = KernelInput(kernel=spec.kernel, call=spec.call, rewrite=str(store.dir / "round-000.py"), entry="RowSum.apply")
    (launch,) = request_from(given).launch_facts()  # the launch L1 reads: the call's, through `RowSum.apply`
    assert launch.grid == (6,) or list(launch.grid) == [6], launch
    store.close()
    # the before/after table of scripts/wild_cases.py reads such a run, filed under a case's id
    import contextlib
    import io
    import shutil
    import sys

    sys.path.insert(0, str(FIXTURES.parent.parent / "scripts"))
    import wild_cases

    shutil.copytree(tmp_path / "run", tmp_path / "wild" / "runs" / "fla_hgrn_fused_recurrent")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        wild_cases.table(tmp_path / "wild")
    (row,) = [line for line in printed.getvalue().splitlines() if line.startswith("| fla_hgrn_fused_recurrent |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "finished" and cells[5] == f"{store_speedup(tmp_path / 'run'):.3f}x", cells
    assert "1 finished runs" in printed.getvalue()
