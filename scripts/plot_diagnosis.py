"""Plot `kb eval diagnosis --json` reports of several strategies: seconds per case, and where each stopped.

    kb eval diagnosis --strategy progressive --json > progressive.json
    kb eval diagnosis --strategy always-deep --json > always-deep.json
    python scripts/plot_diagnosis.py docs/diagnosis.png progressive.json always-deep.json   # needs '.[plots]'
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LEVELS = ("L1", "L2", "L3", "L4")


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(Path(p).read_text()) for p in sys.argv[2:]]
    ids = [o["id"] for o in reports[0]["per_case"]]
    fig, (ax_time, ax_level) = plt.subplots(1, 2, figsize=(14, 7), gridspec_kw={"width_ratios": [3, 1]})
    height = 0.8 / len(reports)
    for i, report in enumerate(reports):
        seconds = {o["id"]: o["seconds"] for o in report["per_case"]}
        ys = [k + i * height for k in range(len(ids))]
        label = f"{report['strategy']} (median {report['median_seconds']:.2f} s, top-1 {report['top1']:.0%})"
        ax_time.barh(ys, [seconds.get(c, 0) for c in ids], height=height, label=label)
        stops = [o["stopped_at"] for o in report["per_case"]]
        ax_level.bar([x + i * height for x in range(len(LEVELS))], [stops.count(lv) for lv in LEVELS],
                     width=height, label=report["strategy"])
    ax_time.set_yticks([k + 0.4 - height / 2 for k in range(len(ids))], ids, fontsize=8)
    ax_time.invert_yaxis()
    ax_time.axvline(5.0, color="grey", linestyle="--", linewidth=1)
    ax_time.text(5.05, len(ids) - 1, "goal: median 5 s", fontsize=8, color="grey")
    ax_time.set_xlabel("seconds per case (compile included)")
    ax_time.legend(loc="lower right", fontsize=8)
    ax_level.set_xticks([x + 0.4 - height / 2 for x in range(len(LEVELS))], LEVELS)
    ax_level.set_ylabel("cases")
    ax_level.set_title("deepest level reached")
    ax_level.legend(fontsize=8)
    fig.suptitle(f"kb eval diagnosis: {len(ids)} gold cases")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
