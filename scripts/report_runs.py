"""Summarize `kb run --json` reports of benchmark operators (e.g. the output of scripts/device_harness.sh):
a markdown table of medians, spreads and roofline fractions, and a plot.

    python scripts/report_runs.py docs/device/2026-11-29-h200 --plot docs/harness-h200.png

Files named <task>.<round>.json are the same task run in separate processes; the spread between
rounds is reported beside the spread within one process (two timings of the same kernel).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> dict[str, dict[int, dict]]:
    reports: dict[str, dict[int, dict]] = defaultdict(dict)
    for file in sorted(folder.glob("*.json")):
        stem, _, round_ = file.stem.rpartition(".")
        if stem and round_.isdigit():
            reports[stem][int(round_)] = json.loads(file.read_text())
    return reports


def rows(reports: dict[str, dict[int, dict]]) -> list[dict]:
    out = []
    for task, rounds in reports.items():
        per_round = {r: {c["label"]: c for c in rep["runs"][0]["cases"] if c.get("timing")} for r, rep in rounds.items()}
        first = per_round[min(per_round)]
        for label, case in first.items():
            medians = [per_round[r][label]["timing"]["median_us"] for r in sorted(per_round) if label in per_round[r]]
            within = max(per_round[r][label]["timing"]["repeat_spread"] for r in per_round if label in per_round[r])
            across = (max(medians) - min(medians)) / min(medians) if len(medians) > 1 else None
            roof = case.get("roofline") or {}
            out.append({"task": task, "case": label, "medians": medians, "within": within, "across": across,
                        "fraction": roof.get("fraction"), "bound": roof.get("bound"), "gbps": roof.get("achieved_gbps"),
                        "tflops": roof.get("achieved_tflops")})
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| task | case | median µs (per process) | spread in process | spread across processes | roofline |",
             "|---|---|---|---|---|---|"]
    for r in table:
        rate = (f"{r['gbps']:.0f} GB/s" if r["bound"] == "memory" else f"{r['tflops']:.0f} TFLOP/s") if r["bound"] else ""
        medians = " / ".join(f"{m:.1f}" for m in r["medians"])
        across = "" if r["across"] is None else f"{100 * r['across']:.1f}%"
        roof = "" if r["fraction"] is None else f"{100 * r['fraction']:.0f}% {r['bound']} ({rate})"
        lines.append(f"| {r['task']} | {r['case']} | {medians} | {100 * r['within']:.1f}% | {across} | {roof} |")
    per_task = defaultdict(list)
    for r in table:
        per_task[r["task"]].append(r)
    lines.append("")
    lines.append("| task | cases | median spread in process | cases within 3% (in / across processes) |")
    lines.append("|---|---|---|---|")
    for task, rs in per_task.items():
        ok_in = sum(r["within"] <= 0.03 for r in rs)
        ok_across = sum(r["across"] is not None and r["across"] <= 0.03 for r in rs)
        lines.append(f"| {task} | {len(rs)} | {100 * statistics.median(r['within'] for r in rs):.2f}% | "
                     f"{ok_in}/{len(rs)} / {ok_across}/{len(rs)} |")
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in table))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, task in enumerate(tasks):
        rs = [r for r in table if r["task"] == task]
        xs = [r["medians"][0] for r in rs]
        ax1.scatter(xs, [100 * (r["fraction"] or 0) for r in rs], label=task, color=f"C{i}")
        ax2.scatter(xs, [100 * max(r["within"], r["across"] or 0) for r in rs], label=task, color=f"C{i}")
    ax1.set(xscale="log", xlabel="median time per call (µs)", ylabel="% of measured roofline",
            title="Initial kernels against the H200's measured ceilings")
    ax2.axhline(3, color="grey", linestyle="--", linewidth=1)
    ax2.set(xscale="log", yscale="log", xlabel="median time per call (µs)", ylabel="worst spread (%)",
            title="Repeatability: two timings per process, two processes")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    table = rows(load(args.folder))
    print(markdown(table))
    if args.plot:
        plot(table, args.plot)


if __name__ == "__main__":
    main()
