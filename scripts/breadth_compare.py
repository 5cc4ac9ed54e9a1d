"""Compare `kb optimize` runs of the same tasks at different --breadth: final speedup, best round, rounds
run, seconds of round work. Reads the run summaries (`kb optimize --json` / `kb rounds show --json`) named
<name>-b<breadth>.json in a folder, writes a markdown table to stdout and, with --plot, a figure.

    python scripts/breadth_compare.py docs/device/2026-12-05-h100-wide-rounds --plot breadth.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = defaultdict(dict)
    for file in sorted(folder.glob("*-b*.json")):
        match = re.fullmatch(r"(.+)-b(\d+)", file.stem)
        if match:
            runs[match.group(1)][int(match.group(2))] = json.loads(file.read_text())
    return runs


def table(runs: dict[str, dict[int, dict]]) -> str:
    widths = sorted({b for by in runs.values() for b in by})
    head = "| task | " + " | ".join(f"breadth {b}: speedup (best round of rounds run)" for b in widths) + " |"
    lines = [head, "|---|" + "---|" * len(widths)]
    logs: dict[int, list[float]] = defaultdict(list)
    best_rounds: dict[int, list[int]] = defaultdict(list)
    for name, by in sorted(runs.items()):
        cells = []
        for b in widths:
            run = by.get(b)
            if run is None:
                cells.append("-")
                continue
            logs[b].append(math.log(run["speedup_vs_initial"]))
            best_rounds[b].append(run["best_round"])
            cells.append(f"{run['speedup_vs_initial']:.3f}x ({run['best_round']} of {run['rounds']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **geomean / mean best round** | " + " | ".join(
        f"**{math.exp(sum(logs[b]) / len(logs[b])):.3f}x / {sum(best_rounds[b]) / len(best_rounds[b]):.2f}**"
        if logs[b] else "-" for b in widths) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(runs)
    widths = sorted({b for by in runs.values() for b in by})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    step = 0.8 / len(widths)
    for i, b in enumerate(widths):
        xs = [k + i * step for k in range(len(names))]
        left.bar(xs, [runs[n].get(b, {}).get("speedup_vs_initial", 0) for n in names], step, label=f"breadth {b}")
        right.bar(xs, [runs[n].get(b, {}).get("best_round", 0) for n in names], step, label=f"breadth {b}")
    for ax, title in ((left, "speedup over the initial kernel (measured at the end)"), (right, "best round")):
        ax.set_xticks([k + step * (len(widths) - 1) / 2 for k in range(len(names))], names)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    runs = load(args.folder)
    print(table(runs))
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
