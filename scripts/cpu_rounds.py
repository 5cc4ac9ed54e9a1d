"""A CPU proxy for what judging costs a round of `kb optimize`: the diagnosis and the variants' checks
(the interpreter is never timed). Runs `optimize()` on tests/fixtures/optimize/task.py with a judge
that checks and does not time, importing the code of the tree ROOT, so two trees can be compared:

    python scripts/cpu_rounds.py build/old     # a `git archive` of an earlier commit
    python scripts/cpu_rounds.py .

Prints the run's wall time and each round's (its rounds.sqlite record: planned to done).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

TASK = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "optimize" / "task.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the tree whose harness and loop to run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    from diagnose.optimize import HarnessJudge, OptimizeOptions, optimize

    try:
        from harness.task import TaskSpec

        spec: object = TaskSpec(path=str(TASK))
    except ImportError:  # a tree from before 2026-12-01 names its task with a dict
        spec = {"path": str(TASK)}

    options = OptimizeOptions(rounds=args.rounds, backend="interpreter", seeds=2, references=())
    judge = HarnessJudge(options, time=False)
    run = Path(tempfile.mkdtemp()) / "run"
    started = time.time()
    try:
        optimize(spec, options, run, judge=judge)
    finally:
        judge.close()
    total = time.time() - started
    with sqlite3.connect(run / "rounds.sqlite") as db:
        rounds = [(idx, round(done - planned, 2), outcome) for idx, planned, done, outcome in
                  db.execute("SELECT idx, started, finished, outcome FROM rounds ORDER BY idx")]
    print(f"{args.root}: whole run {total:.1f} s; rounds (index, seconds, outcome): {rounds}")


if __name__ == "__main__":
    main()
