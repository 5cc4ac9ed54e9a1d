"""Does the diagnosis ask first for the rewrite that paid? Over a bench's finished runs (measured on a GPU),
each run's initial kernel is diagnosed again here, offline, with the baseline the run measured, and the
loop's first hypotheses now (those whose rewrite applies to the kernel) are set beside the patterns of the
rounds that were accepted on the device.

The comparison is one-sided: a pattern that was never tried cannot show it would have paid. It says
whether the ranking puts the known winners first, so a round budget is not spent before them.

    python scripts/first_hypotheses.py BENCH_DIR [--strategy progressive] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunCheck:
    operator: str
    paid: list[str]  # the accepted rounds' patterns, in round order
    tried: list[str]  # every round's pattern, in round order
    first: list[tuple[str, str, str]]  # (finding, pattern, level) of the first two applicable hypotheses now
    note: str = ""

    @property
    def first_paid(self) -> bool | None:
        """Whether the first hypothesis now is the first round that paid (None: nothing paid)."""
        return (bool(self.first) and self.first[0][1] == self.paid[0]) if self.paid else None


def check_run(run_dir: Path) -> RunCheck:
    from diagnose.engine import diagnose
    from diagnose.loop_options import OptimizeOptions
    from diagnose.planning import hypotheses
    from diagnose.request import KernelInput, request_from
    from diagnose.rewriters import rewrite
    from harness.entries import entry_name
    from harness.measurement import RunReport
    from harness.task import load_task

    with sqlite3.connect(run_dir / "rounds.sqlite") as db:
        spec, baseline = db.execute("select spec, baseline from run").fetchone()
        rounds = db.execute("select hypothesis, outcome from rounds order by idx").fetchall()
    tried = [json.loads(h)["pattern"] for h, _ in rounds]
    paid = [json.loads(h)["pattern"] for h, outcome in rounds if outcome == "accepted"]
    check = RunCheck(run_dir.name, paid, tried, [])
    if not baseline:
        check.note = "no baseline measured"
        return check
    task = json.loads(spec)["path"]
    initial = run_dir / "round-000.py"
    request = request_from(KernelInput(task=task, rewrite=str(initial), entry=entry_name(load_task(task).entry)),
                           None, tempfile.mkdtemp(prefix="kb-first-"), RunReport.from_dict(json.loads(baseline)))
    answer = diagnose(request, None, None, "progressive")
    source = initial.read_text()
    applicable = [h for h in hypotheses(answer, OptimizeOptions(backend="cuda"))
                  if h.rewriter != "pattern" or rewrite(h.pattern, source, {})]
    check.first = [(h.finding or "(search)", h.pattern, h.level) for h in applicable[:2]]
    return check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--strategy", default="progressive")
    args = parser.parse_args()
    runs = sorted(p.parent for p in (args.bench_dir / "runs" / args.strategy).glob("*/rounds.sqlite"))
    if not runs:
        print(f"first_hypotheses: no runs under {args.bench_dir / 'runs' / args.strategy}; "
              "pass a bench directory (`kb bench --bench-dir`)", file=sys.stderr)
        return 2
    from rich.progress import track

    checks = [check_run(run) for run in track(runs, description="diagnosing", transient=True)]
    print("| operator | accepted rounds' patterns | first hypotheses now (finding, pattern, level) | first one paid |")
    print("|---|---|---|---|")
    for c in checks:
        first = "; ".join(f"{f} -> {p} ({lv})" for f, p, lv in c.first) or c.note or "-"
        verdict = {True: "yes", False: "no", None: "-"}[c.first_paid]
        print(f"| {c.operator} | {', '.join(c.paid) or '-'} | {first} | {verdict} |")
    improved = [c for c in checks if c.paid]
    hits = sum(1 for c in improved if c.first_paid)
    print(f"\nOf {len(improved)} runs with an accepted round, the first hypothesis now is the first round that paid "
          f"in {hits}; {len(checks)} runs read.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
