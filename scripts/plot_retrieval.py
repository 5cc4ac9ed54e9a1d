"""Plot a `kb eval retrieval --json` report: recall@5 and MRR per source set and query kind, per mode.

    kb eval retrieval --json > eval.json
    python scripts/plot_retrieval.py eval.json docs/retrieval.png      # needs `pip install -e '.[plots]'`
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(sys.argv[1]).read_text())
    groups: list[tuple[str, dict]] = []
    for label, per_mode in [*report["sets"].items(), ("all", report["overall"])]:
        for kind in ("nl", "symbol", "all"):
            groups.append((f"{label}\n{kind}", {mode: per_mode[mode].get(kind) or {} for mode in per_mode}))
    modes = list(groups[0][1])
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.2 * len(groups)), 7), sharex=True)
    width = 0.8 / len(modes)
    for ax, metric in zip(axes, ("recall@5", "mrr")):
        for i, mode in enumerate(modes):
            xs = [g + (i - (len(modes) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [per[mode].get(metric, 0.0) for _, per in groups], width, label=mode)
        ax.axhline({"recall@5": 0.9, "mrr": 0.75}[metric], color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel(metric)
        ax.set_ylim(0, 1)
    axes[0].legend(ncols=len(modes), loc="lower right")
    axes[1].set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=7, rotation=25, ha="right")
    n = report["overall"][modes[0]]["all"]["n"]
    fig.suptitle(f"kb eval retrieval: {n} gold questions (dashed: goal)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
