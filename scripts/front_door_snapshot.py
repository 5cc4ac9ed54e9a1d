"""What the front door answers, written down so a refactor can be shown to change none of it.

Runs `kb why` / `kb diagnose` with --json on the examples and the operators named, and `kb eval diagnosis
--json` on the gold set, against one KB home, and writes each answer to OUT/<name>.json with the
wall-clock fields (seconds, per-level times) removed and the checkout's path written as <tree>; two snapshots are then compared byte for byte:

    python scripts/front_door_snapshot.py --home H --out /tmp/before   # on the old tree
    python scripts/front_door_snapshot.py --home H --out /tmp/after    # on the new tree
    diff -r /tmp/before /tmp/after

Run it from the root of the tree being snapshotted; it calls `python -m <module>` there (--cli names
the module, since the CLI's home may be what moved)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Wall-clock readings: they differ between any two runs, so they are not behaviour.
_CLOCK_KEYS = {"seconds", "median_seconds", "timings"}

COMMANDS: dict[str, list[str]] = {
    "why-scale": ["why", "why isn't this load vectorized?", "--kernel", "corpora/examples/scale.py",
                  "--call", "scale(torch.randn(1000003), 2.0)", "--json"],
    "why-matmul": ["why", "why doesn't this matmul use tensor cores?", "--kernel", "corpora/examples/matmul_fp32.py",
                   "--call", "matmul(torch.randn(256, 256), torch.randn(256, 256))", "--json"],
    "why-tail-task": ["why", "why isn't this vectorized?", "--task", "corpora/examples/scale_task.py", "--json"],
    "diagnose-scale-task": ["diagnose", "corpora/examples/scale_task.py", "--json"],
    "diagnose-softmax": ["diagnose", "corpora/operators/softmax/task.py", "--json"],
    "diagnose-tail-kernel": ["diagnose", "--kernel", "corpora/examples/scale_tail_split.py", "--call",
                             "scale(torch.randn(1000003), 2.0)", "--json"],
    "diagnose-softmax-l3": ["diagnose", "corpora/operators/softmax/task.py", "--level-max", "L3",
                            "--strategy", "always-deep", "--json"],
    "eval-diagnosis": ["eval", "diagnosis", "--json"],
}


def normalized(value: Any, tree: str) -> Any:
    """`value` without wall-clock readings, and with the checkout's own path (a catalog file cited as
    evidence) written as <tree>: two checkouts of the same code answer alike."""
    if isinstance(value, dict):
        return {k: normalized(v, tree) for k, v in value.items() if k not in _CLOCK_KEYS}
    if isinstance(value, list):
        return [normalized(v, tree) for v in value]
    return value.replace(tree, "<tree>") if isinstance(value, str) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, help="The KB home every command reads.")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cli", default="cli", help="The CLI module (default cli; kb.cli before 2026-12-01).")
    parser.add_argument("--only", default=None, help="Comma-separated snapshot names.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("OPENAI_BASE_URL", None)  # no narrative: it is an LLM's words, not the engine's
    wanted = set(args.only.split(",")) if args.only else set(COMMANDS)
    failed = 0
    for name, argv in COMMANDS.items():
        if name not in wanted:
            continue
        done = subprocess.run([sys.executable, "-m", args.cli, "--home", args.home, *argv], env=env,
                              capture_output=True, text=True)
        try:
            answer = normalized(json.loads(done.stdout), os.getcwd())
        except json.JSONDecodeError:
            answer = {"exit": done.returncode, "stderr": done.stderr.strip().splitlines()[-1:]}
            failed += 1
        (args.out / f"{name}.json").write_text(json.dumps(answer, indent=1, sort_keys=True) + "\n")
        print(f"{name}: exit {done.returncode}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
