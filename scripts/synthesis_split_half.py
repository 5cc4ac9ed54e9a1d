"""Issue 7's measurement: does what synthesis learns on some operators help on others?

The benchmark operators are split in two halves, stratified by family (sorted by family and name,
then dealt alternately, so matmul and bmm, softmax and log_softmax, layer_norm and rms_norm land in
different halves). Then, each phase resumable from the state on disk under --out:

  1. bench `a/`: the optimize loop on half A, reading a fresh home (`home-learned/`);
  2. `kb synthesize` of a/'s rounds into `home-learned/` (once: `a/synthesized.json` marks it);
  3. bench `b/`: half B twice under the same round budget, condition `with` reading `home-learned/`
     and condition `without` reading an empty home (`home-fresh/`), interleaved operator by operator
     so that with two GPUs both conditions of an operator run side by side;
  4. reports of a/ and b/, and `compare.json` / `compare.md`: per operator of half B, the rounds to
     the best kernel and the final speedup, with and without.

Run on the GPU host (repository root):

    python scripts/synthesis_split_half.py --out build/split-half --rounds 3 --workers 2 --stop-after 480

and again with the same --out until it prints "complete"; every call goes on where the last stopped.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnose.bench import (  # noqa: E402
    DEFAULT_SUITE,
    BenchSpec,
    Condition,
    bench_runs,
    create_bench,
    jobs,
    load_bench,
    load_suite,
    run_bench,
    write_report,  # noqa: E402
)


def family_of(task: Path) -> str:
    """The task's `family = "..."` without importing it (no torch needed to plan)."""
    for node in ast.parse(task.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "family" for t in node.targets):
            return str(ast.literal_eval(node.value))
    return ""


def split(suite: Path) -> tuple[list[str], list[str]]:
    ordered = sorted(load_suite(suite).items(), key=lambda kv: (family_of(kv[1]), kv[0]))
    return [name for name, _ in ordered[0::2]], [name for name, _ in ordered[1::2]]


def _bench(directory: Path, spec: BenchSpec, workers: int, deadline: float) -> bool:
    """Create (first time) and run the bench until done or the deadline; True when every job is finished."""
    if not (directory / "bench.json").is_file():
        create_bench(directory, spec)

    def event(what: str, job) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {what} {job.condition.name}/{job.operator}"
              + (f": {job.state} in {job.seconds:.0f} s" if what == "done" else ""), flush=True)

    left = deadline - time.time()
    if left > 0:
        run_bench(directory, workers, left, event)
    return all(j.state in ("finished", "failed") for j in jobs(directory, load_bench(directory)))


def compare(b_dir: Path, out: Path) -> dict:
    data = json.loads((b_dir / "report.json").read_text())
    rows = {(r["condition"], r["operator"]): r for r in data["operators"]}
    ops = list(dict.fromkeys(r["operator"] for r in data["operators"]))
    table = []
    for op in ops:
        w, wo = rows.get(("with", op), {}), rows.get(("without", op), {})
        table.append({"operator": op, "family": w.get("family") or wo.get("family"),
                      "with": {k: w.get(k) for k in ("speedup", "best_round", "best_pattern", "rounds", "seconds_to_best",
                                                     "patterns_tried", "status")},
                      "without": {k: wo.get(k) for k in ("speedup", "best_round", "best_pattern", "rounds",
                                                         "seconds_to_best", "patterns_tried", "status")}})
    suites = data["suite_by_condition"]

    def improved_rounds(cond: str) -> list[int]:
        return [t[cond]["best_round"] for t in table if t[cond].get("best_round")]

    summary = {
        "operators": len(table),
        "geomean": {c: suites[c]["geomean"] for c in ("with", "without")},
        "median": {c: suites[c]["median"] for c in ("with", "without")},
        "improved": {c: suites[c]["improved"] for c in ("with", "without")},
        "mean_rounds_to_best_improved": {c: round(statistics.mean(improved_rounds(c)), 2) if improved_rounds(c) else None
                                         for c in ("with", "without")},
        "first_hypothesis_differs": sum(1 for t in table if (t["with"].get("patterns_tried") or [None])[0]
                                        != (t["without"].get("patterns_tried") or [None])[0]),
    }
    result = {"summary": summary, "operators": table, "device": data.get("device"), "rounds": data["rounds"]}
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    lines = ["| operator | family | with: speedup | with: best round (pattern) | without: speedup | "
             "without: best round (pattern) | first tried with / without |", "|---|---|---|---|---|---|---|"]
    for t in table:
        cells = []
        for c in ("with", "without"):
            s = t[c]
            cells += [f"{s['speedup']:.3f}x" if s.get("speedup") else "-",
                      f"{s.get('best_round') or 0} ({s.get('best_pattern') or 'none accepted'})"]
        first = " / ".join((t[c].get("patterns_tried") or ["-"])[0] for c in ("with", "without"))
        lines.append(f"| {t['operator']} | {t['family']} | " + " | ".join(cells) + f" | {first} |")
    lines += ["", "| | with learned statistics | without |", "|---|---|---|"]
    for key in ("geomean", "median", "improved", "mean_rounds_to_best_improved"):
        lines.append(f"| {key.replace('_', ' ')} | {summary[key]['with']} | {summary[key]['without']} |")
    lines.append(f"| operators whose first hypothesis differs | {summary['first_hypothesis_differs']} of "
                 f"{summary['operators']} | |")
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--stop-after", type=float, default=None, help="seconds; no job or round starts after")
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    deadline = time.time() + (args.stop_after if args.stop_after is not None else 1e9)
    out = args.out.resolve()
    half_a, half_b = split(args.suite)
    learned, fresh = out / "home-learned", out / "home-fresh"
    from kb.home import KBHome

    for home in (learned, fresh):
        KBHome(home).ensure()  # both homes exist and are empty of statistics until step 2
    note = f"half A: {', '.join(half_a)}; half B: {', '.join(half_b)}"
    print(note, flush=True)
    spec_a = BenchSpec(str(args.suite.resolve()), half_a, [Condition("learn", "progressive", str(learned))],
                       args.rounds, None, "none", args.backend, note="Synthesis split-half, phase A. " + note)
    if not _bench(out / "a", spec_a, args.workers, deadline):
        print("phase A not complete: run again with the same --out", flush=True)
        return
    marker = out / "a" / "synthesized.json"
    if not marker.is_file():
        from diagnose.synthesis import synthesize

        home = KBHome(learned)
        summary = synthesize(home, bench_runs(out / "a"))
        marker.write_text(json.dumps(summary, indent=1, default=str))
        print(f"synthesized {summary['rounds']} rounds of half A into {learned}", flush=True)
        write_report(out / "a")
    spec_b = BenchSpec(str(args.suite.resolve()), half_b,
                       [Condition("with", "progressive", str(learned)), Condition("without", "progressive", str(fresh))],
                       args.rounds, None, "none", args.backend, note="Synthesis split-half, phase B. " + note)
    complete = _bench(out / "b", spec_b, args.workers, deadline)
    write_report(out / "b")
    if not complete:
        print("phase B not complete: run again with the same --out", flush=True)
        return
    result = compare(out / "b", out)
    print(json.dumps(result["summary"], indent=1))
    print("complete", flush=True)


if __name__ == "__main__":
    main()
