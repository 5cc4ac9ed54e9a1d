"""Benchmarks of issue 3: indexing compiler releases, incremental re-indexing, search latency, retrieval quality.

Each step runs the real `kb` command in a subprocess and records wall time; results are appended
as JSON lines to --out so a long run can be resumed step by step.

    python scripts/bench_kb.py --src /work/data/src --work /work/data/bench --out docs/bench-kb.jsonl \
        full-triton-ascend full-ascendnpu-ir incremental search eval

Steps:
    full-triton-ascend   kb index compiler --source SRC/triton-ascend (fresh home)
    full-ascendnpu-ir    kb index compiler --source SRC/AscendNPU-IR (same home, its own release)
    incremental          Ascend/triton-ascend v3.2.0rc4 then v3.2.0 in one home, vs v3.2.0 in a fresh home
    search               p50/p95 of warm in-process `kb search` queries, and a cold `kb search` command
    eval                 kb eval retrieval --json over corpora/queries

`kb` runs as `python -m cli` from this checkout (not an installed `kb` script, which may point at
another checkout). --home names the KB home under --work that the full, search and eval steps use
(default `home`); --prefix names the two homes of the incremental step (`incremental`, `cold`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# This checkout's code, whatever `kb` script is installed in the environment.
KB = [sys.executable, "-m", "cli"]
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _run(args: list[str], home: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([*KB, "--home", str(home), *args], capture_output=True, text=True, env=_ENV)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def _record(out: Path, step: str, **fields: object) -> None:
    row = {"step": step, "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()} "
           f"{os.cpu_count()} cpu", **fields}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


def full(src: Path, home: Path, out: Path, tree: str, release: str, fresh: bool) -> None:
    if fresh:
        shutil.rmtree(home, ignore_errors=True)
    seconds, stdout = _run(["index", "compiler", "--source", str(src / tree), "--release", release], home)
    _record(out, f"full-{tree}", seconds=round(seconds, 1), report=stdout.strip().splitlines()[:2])


def incremental(src: Path, work: Path, out: Path, prefix: str = "") -> None:
    """rc4 then v3.2.0 in one home (the second run is the incremental one), vs v3.2.0 alone."""
    a, b = src / "ascend-triton-v3.2.0rc4", src / "ascend-triton-v3.2.0"
    home = work / f"{prefix}incremental"
    shutil.rmtree(home, ignore_errors=True)
    first, _ = _run(["index", "compiler", "--source", str(a), "--release", "triton-ascend-v3.2.0rc4"], home)
    second, report = _run(["index", "compiler", "--source", str(b), "--release", "triton-ascend-v3.2.0"], home)
    cold = work / f"{prefix}cold"
    shutil.rmtree(cold, ignore_errors=True)
    full_b, _ = _run(["index", "compiler", "--source", str(b), "--release", "triton-ascend-v3.2.0"], cold)
    _record(out, "incremental", rc4_full_s=round(first, 1), v320_incremental_s=round(second, 1),
            v320_full_s=round(full_b, 1), ratio=round(second / full_b, 3), report=report.strip().splitlines()[:2])


def search(home_dir: Path, out: Path) -> None:
    sys.path.insert(0, str(REPO))
    from kb.home import KBHome
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    home = KBHome(home_dir)
    queries = ["where is the vector width of a global load decided", "tritongpu-remove-layout-conversions",
               "how does the Ascend backend pick the number of cores", "getMaskAlignment",
               "which pass converts triton to linalg", "where are sync flags between pipes inserted",
               "createTritonToLinalgPass", "lit tests for hivm load", "what blocks wgmma for a dot",
               "multi buffer option"]
    searcher = Searcher(home, "compiler", "triton-ascend-3.5.0")
    store = SymbolStore(home.symbols_db)
    searcher.answer("warm up", k=5, store=store)
    times = []
    for _ in range(3):
        for q in queries:
            start = time.perf_counter()
            searcher.answer(q, k=5, store=store)
            times.append((time.perf_counter() - start) * 1000)
    # A question never asked before: its embedding is not cached, so the model is loaded and run.
    cold, _ = _run(["search", f"which pass plans the local memory of a kernel (asked at {time.time():.0f})",
                    "--release", "triton-ascend-3.5.0"], home_dir)
    _record(out, "search", warm_p50_ms=round(statistics.median(times), 1),
            warm_p95_ms=round(sorted(times)[int(0.95 * len(times)) - 1], 1), cold_command_s=round(cold, 2),
            queries=len(times))


def evaluate(home: Path, out: Path) -> None:
    seconds, stdout = _run(["eval", "retrieval", "--json"], home)
    report = json.loads(stdout)
    (home.parent / f"eval-retrieval-{home.name}.json").write_text(json.dumps(report, indent=1))
    summary = {label: {mode: per_kind["all"] for mode, per_kind in per_mode.items()}
               for label, per_mode in [*report["sets"].items(), ("overall", report["overall"])]}
    _record(out, "eval", seconds=round(seconds, 1), summary=summary, splits=report["splits"],
            by_kind={mode: {k: v for k, v in per_kind.items() if k != "all"}
                     for mode, per_kind in report["overall"].items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, required=True, help="directory holding the source checkouts")
    parser.add_argument("--work", type=Path, required=True, help="scratch directory for KB homes")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench-kb.jsonl")
    parser.add_argument("--home", default="home", help="name of the KB home under --work (full, search, eval)")
    parser.add_argument("--prefix", default="", help="prefix of the incremental step's two homes")
    parser.add_argument("steps", nargs="+")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    home = args.work / args.home
    for step in args.steps:
        if step == "full-triton-ascend":
            full(args.src, home, args.out, "triton-ascend", "triton-ascend-3.5.0", fresh=True)
        elif step == "full-ascendnpu-ir":
            full(args.src, home, args.out, "AscendNPU-IR", "ascendnpu-ir-52f96a1", fresh=False)
        elif step == "incremental":
            incremental(args.src, args.work, args.out, args.prefix)
        elif step == "search":
            search(home, args.out)
        elif step == "eval":
            evaluate(home, args.out)
        else:
            raise SystemExit(f"unknown step {step!r}")


if __name__ == "__main__":
    main()
