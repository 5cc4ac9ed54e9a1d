"""Registers and spills of our corpus's whole-row kernels before and after the chunked row loop, compiled
for sm90 on this machine (no GPU needed: ptxas runs at compile time), at each task's widest case.

    PYTHONPATH=. python scripts/rowloop_spills.py [OPERATOR ...]

Prints a Markdown table: for each operator the rewrite applies to, the widest case's registers, spill
stores and spill loads (bytes) of the kernel as written and of each variant (columns per chunk).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from diagnose.rewriters import rewrite
from harness.capture import capture_call
from harness.entries import entry_name
from harness.task import load_task

ROOT = Path(__file__).resolve().parent.parent
OPERATORS = ROOT / "corpora" / "operators"


def _ptxas(kernel: Path, call: str) -> str:
    report = capture_call(kernel, call, target="cuda:90")[0].ptxas
    return f"{report.registers} / {report.spill_stores} / {report.spill_loads}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("operators", nargs="*", help="operator names (default: every one the rewrite applies to)")
    args = parser.parse_args()
    names = args.operators or sorted(p.name for p in OPERATORS.iterdir() if (p / "task.py").is_file())
    print("| operator | widest case | as written: registers / spill stores / spill loads (B) | 2048 | 4096 | 8192 |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            kernel = OPERATORS / name / f"{name}.py"
            variants = rewrite("chunked-row-loop", kernel.read_text(), {}) if kernel.is_file() else []
            if not variants:
                continue
            task = load_task(OPERATORS / name / "task.py")
            case = max(task.cases, key=lambda c: c.get("n", 0))
            sys.path.insert(0, str(OPERATORS / name))
            call = f"{entry_name(task.entry)}(*__import__('task').inputs(**{case!r}))"
            cells = [_ptxas(kernel, call)]
            for v in variants:
                path = Path(tmp) / f"{name}_{v.params['chunk']}.py"
                path.write_text(v.source)
                cells.append(_ptxas(path, call))
            sys.path.pop(0)
            sys.modules.pop("task", None)
            print(f"| {name} | {task.case_label(case)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
