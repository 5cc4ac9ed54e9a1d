"""What the judge's process split costs, measured (docs/benchmarks.md, "The judge's process split").

Three parts, each printed as a table and written to OUT/judge-cost.json:

- workers: how long the zygote takes to start, a fresh worker to be forked and ready, and (for
  comparison) a worker started as a plain subprocess that imports torch and triton itself;
- hand-over: input sets handed from the reference worker to a kernel worker, and outputs handed back,
  at 1 MiB, 64 MiB and 1 GiB (CUDA IPC on a GPU, files on the CPU);
- candidates: `kb run TASK --candidate FILE` for each task, with the time of every request to every
  worker summed by kind (start and load, staging inputs, the checks' calls, comparisons, timing).

    python scripts/judge_cost.py --backend cuda --out runs/judge-cost corpora/operators/softmax/task.py ...
    python scripts/judge_cost.py --rounds OLD_RUNS NEW_RUNS     # per-round wall times of two sets of optimize runs

`--rounds` compares `kb optimize` runs made before and after the split (one run directory per
operator under each): each round's wall time (its rounds.sqlite record), and each run's total.
"""

from __future__ import annotations

import argparse
import collections
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def workers(backend: str, repeats: int = 10) -> dict[str, Any]:
    from harness.sandbox import Worker
    from harness.zygote import Zygote

    started = time.monotonic()
    Zygote({"TRITON_INTERPRET": "1"} if backend == "interpreter" else {}).close()
    zygote_s = time.monotonic() - started
    forked: list[float] = []
    plain: list[float] = []
    for _ in range(repeats):
        for into, wrap in ((forked, None), (plain, lambda cmd: cmd)):  # a wrapped worker is never forked
            worker = Worker(backend, wrap=wrap)
            t = time.monotonic()
            worker.submit({"op": "ping"}, 120)
            into.append(time.monotonic() - t)
            worker.close()
    return {"zygote_start_s": zygote_s, "forked_worker_ms": 1000 * statistics.median(forked),
            "plain_worker_ms": 1000 * statistics.median(plain)}


def hand_over(backend: str) -> list[dict[str, Any]]:
    """Reference -> kernel worker (stage) and kernel worker -> reference (outputs compared), per size:
    1 MiB, 64 MiB and 1 GiB on a GPU; 4 KiB to 1 MiB on the interpreter, which is slow to run them."""
    import tempfile

    from harness.judge import Judge, KernelSpec
    from harness.task import TaskSpec

    rows = []
    task = Path(tempfile.mkdtemp()) / "copy_task.py"
    sizes = (18, 24, 28) if backend == "cuda" else (10, 14, 18)
    task.write_text(_COPY_TASK.replace("CASES", repr([{"n": 1 << k} for k in sizes])))
    (task.parent / "copy_kernel.py").write_text(_COPY_KERNEL)
    with Judge(TaskSpec(path=str(task)), backend, timeout_s=300) as judge:
        info = judge.begin(seed=1)
        for case, label in enumerate(info.labels[:info.timed]):
            hosted = judge._host(KernelSpec("candidate", file=str(task.parent / "copy_kernel.py")))
            key, made = judge._set(case, 0)
            t = time.monotonic()
            judge._stage(hosted.worker, [key])
            stage_s = time.monotonic() - t
            t = time.monotonic()
            answer = judge._ask(hosted.worker, {"op": "check", "name": hosted.name, "a": key, "b": key, "pin": None,
                                                "exempt": []})
            check_s = time.monotonic() - t
            t = time.monotonic()
            judge._ref("compare", keys=[key] * len(answer["calls"]), case=case, dir=str(hosted.worker.directory),
                       calls=[{"outputs": c["outputs"], "inputs_after": c["inputs_after"]} for c in answer["calls"]])
            compare_s = time.monotonic() - t
            gib = made["bytes"] / 2 ** 30
            rows.append({"case": label, "bytes": made["bytes"], "stage_ms": 1000 * stage_s,
                         "stage_gbps": gib / stage_s if stage_s else None, "check_ms": 1000 * check_s,
                         "compare_ms": 1000 * compare_s,
                         "compare_gbps": 6 * gib / compare_s if compare_s else None})  # 3 calls x (out + input)
        judge.end()
    return rows


_COPY_TASK = '''"""out = x, fp32: a task for measuring hand-overs."""
import torch

from copy_kernel import copy as entry  # noqa: F401


def inputs(n):
    return (torch.randn(n),)


def reference(x):
    return x.clone()


cases = CASES
'''
_COPY_KERNEL = '''import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def copy(x):
    out = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)
    return out
'''


def candidates(backend: str, tasks: list[str], time_kernels: bool) -> list[dict[str, Any]]:
    """`kb run TASK --candidate FILE` (the task's own kernel file as the candidate: same work, all of
    the split's costs), with each request's time summed by kind."""
    import harness.session as session_module
    from harness.judge import Judge
    from harness.run import RunOptions, run_task
    from harness.task import TaskSpec, load_task

    rows = []
    for task_path in tasks:
        stats: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        original = session_module.Session._ask

        def timed(self: Any, worker: Any, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
            t = time.monotonic()
            try:
                return original(self, worker, request, timeout)
            finally:
                entry = stats[request.get("op", "?")]
                entry[0] += 1
                entry[1] += time.monotonic() - t

        session_module.Session._ask = timed  # type: ignore[method-assign]
        try:
            task = load_task(task_path)
            started = time.monotonic()
            with Judge(TaskSpec(path=task_path), backend, timeout_s=600, spares=1) as judge:
                report = run_task(TaskSpec(path=task_path), RunOptions(backend=backend, seeds=2, time=time_kernels),
                                  candidate=task.source_file, judge=judge)
            wall = time.monotonic() - started
        finally:
            session_module.Session._ask = original  # type: ignore[method-assign]
        rows.append({"task": task.name, "wall_s": wall, "correct": [r.correct for r in report.runs],
                     "requests": {op: {"n": n, "s": s} for op, (n, s) in sorted(stats.items())}})
    return rows


def medians(old: Path, new: Path) -> list[dict[str, Any]]:
    """`kb run` reports of the same task before and after (run-OP.json): each case's median and spread."""
    rows = []
    for path in sorted(new.glob("run-*.json")):
        row: dict[str, Any] = {"task": path.stem.removeprefix("run-")}
        for label, root in (("old", old), ("new", new)):
            try:
                report = json.loads((root / path.name).read_text())
            except (OSError, ValueError):
                continue
            base = next(r for r in report["runs"] if r["role"] == "baseline")
            row[label] = {c["label"]: [round(c["timing"]["median_us"], 2), round(c["timing"]["repeat_spread"] or 0, 3),
                                       c["timing"]["timing_passes"]] for c in base["cases"] if c.get("timing")}
        rows.append(row)
    return rows


def rounds(old: Path, new: Path) -> list[dict[str, Any]]:
    """Per operator: each round's wall time and the run's, before (old) and after (new)."""
    rows = []
    for run in sorted(p for p in new.iterdir() if (p / "rounds.sqlite").is_file()):
        row: dict[str, Any] = {"operator": run.name}
        for label, root in (("old", old), ("new", new)):
            db = root / run.name / "rounds.sqlite"
            if not db.is_file():
                continue
            con = sqlite3.connect(db)
            row[f"{label}_rounds_s"] = [f - s for s, f in con.execute(
                "SELECT started, finished FROM rounds WHERE finished IS NOT NULL ORDER BY idx")]
            wall = root / run.name / "wall_s.txt"
            row[f"{label}_wall_s"] = float(wall.read_text()) if wall.is_file() else None
            con.close()
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="*")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("runs/judge-cost"))
    parser.add_argument("--no-time", action="store_true", help="checks only in the candidates part")
    parser.add_argument("--rounds", nargs=2, type=Path, metavar=("OLD", "NEW"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rounds:
        result: dict[str, Any] = {"rounds": rounds(*args.rounds), "medians": medians(*args.rounds)}
    else:
        result = {"backend": args.backend, "workers": workers(args.backend), "hand_over": hand_over(args.backend),
                  "candidates": candidates(args.backend, args.tasks, not args.no_time)}
    (args.out / "judge-cost.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
