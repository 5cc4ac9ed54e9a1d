"""Measure the spine's figures for docs/benchmarks.md: `kb --help`, KB build, warm `kb why`.

Usage: python scripts/bench_spine.py [--home DIR] [--repeat N]
Runs the real commands as subprocesses (what a user waits for) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KB = str(Path(sys.executable).parent / "kb")
WHY = ["why", "why isn't this load vectorized?", "--kernel", str(REPO / "corpora/examples/scale.py"),
       "--call", "scale(torch.randn(1000003), 2.0)"]


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([KB, *args], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    home = Path(args.home or tempfile.mkdtemp(prefix="kb-bench-"))
    shutil.rmtree(home, ignore_errors=True)
    env = {**os.environ, "KB_HOME": str(home)}
    rows = []
    rows.append(("kb --help", statistics.median(timed(["--help"], env) for _ in range(args.repeat)), "<= 0.5 s"))
    rows.append(("kb index patterns (cold: model load, 18 patterns)", timed(["index", "patterns"], env), "-"))
    rows.append(("kb index compiler --installed (cold embedding cache)", timed(["index", "compiler", "--installed"], env),
                 "<= 120 s"))
    timed(WHY, env)  # first run compiles and fills the compile cache
    warm = [timed(WHY, env) for _ in range(args.repeat)]
    rows.append((f"kb why on corpora/examples/scale.py, warm KB (median of {args.repeat})", statistics.median(warm),
                 "<= 3 s goal, <= 10 s acceptable"))
    print(f"date {date.today()}, {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| step | seconds | goal |\n|---|---|---|")
    for name, seconds, goal in rows:
        print(f"| {name} | {seconds:.2f} | {goal} |")


if __name__ == "__main__":
    main()
