"""How noisy were a bench's timings, and how much of that noise is sampling? The evidence for the
do_bench windows (`kb bench --warmup-ms/--rep-ms`).

Every kernel-case timing of the harness is two do_bench windows, interleaved with the other kernels
of its job; its `repeat_spread` is |median2 - median1| / median1. The sampling error of one window's
median follows from the spread of its repetitions (p20..p80, about 1.68 sigma for a normal) and their
number: s.e. ~ 1.2533 sigma / sqrt(reps). If the observed repeat spread is far above what sampling
alone gives, the noise is drift between windows and a longer window buys nothing; if sampling alone
is far below the acceptance floor (2%), a window a third as long (s.e. x sqrt(3)) is still safe.

    python scripts/timing_noise.py build/bench-h200 [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Expected |a - b| of two independent normal estimates with standard error s: s * sqrt(2) * sqrt(2/pi).
_MEAN_ABS_DIFF = math.sqrt(2) * math.sqrt(2 / math.pi)


def timings(bench_dir: Path) -> Iterator[dict[str, Any]]:
    """Every timed kernel-case of every round's report in the bench's runs."""
    for db in sorted((bench_dir / "runs").glob("*/*/rounds.sqlite")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("select timings from rounds where timings is not null").fetchall()
        finally:
            con.close()
        for (raw,) in rows:
            for run in (json.loads(raw).get("report") or {}).get("runs", []):
                for case in run.get("cases", []):
                    if case.get("timing") and case["timing"].get("repeat_spread") is not None:
                        yield case["timing"]


def summarize(bench_dir: Path, shorter_by: float = 3.0) -> dict[str, Any]:
    spreads, sampling, reps = [], [], []
    for t in timings(bench_dir):
        per_window = max(t["reps"] / 2, 1)
        sigma = (t["p80_us"] - t["p20_us"]) / t["median_us"] / 1.683
        se = 1.2533 * sigma / math.sqrt(per_window)
        spreads.append(t["repeat_spread"])
        sampling.append(se * _MEAN_ABS_DIFF)
        reps.append(per_window)
    if not spreads:
        raise SystemExit(f"{bench_dir}: no timed rounds (is it a bench directory with runs/?)")

    def q(values: list[float], p: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(p * len(values)))], 5)

    return {
        "bench": str(bench_dir), "timings": len(spreads),
        "repeat_spread": {"median": q(spreads, 0.5), "p90": q(spreads, 0.9), "max": round(max(spreads), 5)},
        "sampling_only": {"median": q(sampling, 0.5), "p90": q(sampling, 0.9)},
        f"sampling_only_window_{shorter_by:g}x_shorter": {
            "median": round(q(sampling, 0.5) * math.sqrt(shorter_by), 5),
            "p90": round(q(sampling, 0.9) * math.sqrt(shorter_by), 5)},
        "median_reps_per_window": statistics.median(reps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--shorter-by", type=float, default=3.0, help="Window shortening to project (default 3).")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = summarize(args.bench_dir, args.shorter_by)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        for key, value in data.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
