"""A judge for loop tests on a machine without a GPU: the real harness checks every variant (on the
interpreter), and the timing is set by whether a kernel's source carries a rewrite's marker."""

from __future__ import annotations

from pathlib import Path

from diagnose.optimize import HarnessJudge, OptimizeOptions, optimize
from diagnose.rounds import Round
from harness.measurement import RunReport, Timing
from harness.task import TaskSpec


class MarkerJudge(HarnessJudge):
    """Times a correct kernel whose source contains `marker` at `fast_us`, any other at `slow_us`."""

    def __init__(self, initial: Path, marker: str, fast_us: float, slow_us: float = 100.0) -> None:
        super().__init__(OptimizeOptions(backend="interpreter", seeds=1), time=False)
        self.initial, self.marker, self.fast_us, self.slow_us = initial, marker, fast_us, slow_us

    def __call__(self, spec: TaskSpec, baseline: str | None, candidate: str | None, entry: str) -> RunReport:
        report = super().__call__(spec, baseline, candidate, entry)
        sources = {"baseline": Path(baseline or self.initial).read_text(),
                   "candidate": Path(candidate).read_text() if candidate else ""}
        for run in report.runs:
            for case in run.cases if run.correct else []:
                if not case.heldout:
                    t = self.fast_us if self.marker in sources[run.role] else self.slow_us
                    case.timing = Timing(t, t, t, 100, repeat_spread=0.0)
        return report

    def judge_all(self, spec: TaskSpec, baseline: str, candidates: list[str], entry: str) -> list[RunReport]:
        return [self(spec, baseline, c, entry) for c in candidates]


def only_round(judge: HarnessJudge, task: Path, run_dir: Path) -> Round:
    """The round of a one-round optimize run of `task` on the interpreter, judged by `judge`; the judge
    and the run's store are closed after it."""
    try:
        store = optimize(TaskSpec(path=str(task)), OptimizeOptions(rounds=1, backend="interpreter", seeds=1),
                         run_dir, judge=judge)
    finally:
        judge.close()
    try:
        (first,) = store.rounds()
        return first
    finally:
        store.close()
