"""A task's own kernel that fails its checks, repaired where the diagnosis names why.

The optimize loop accepts only rewrites that keep a kernel's values, so it cannot start from a kernel
whose values are wrong. Some wrong values have a cause the compiler shows: a sum the TTIR adds in bf16
(`precision.low-precision-accumulation`). For those, the catalog has a rewrite that changes the values
on purpose, toward the reference (`fp32-accumulation`). Such repairs are never a speed round. With
`--repair-baseline`, the loop applies one to the failing kernel, checks it, and starts the run from it.
The run records the repair, and its speedups are over the repaired kernel. Without the option, the
error that stops the run names the finding and the option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diagnose.records import Answer
from diagnose.rewriters import rewrite

__all__ = ["REPAIRS", "Repair", "find_repair"]

# finding kind -> the pattern whose rewrite repairs it. These patterns change a kernel's values, so
# the planner never offers them as a round (diagnose.planning).
REPAIRS: dict[str, str] = {"precision.low-precision-accumulation": "fp32-accumulation"}


@dataclass
class Repair:
    """What a failing kernel's repair rests on: the finding, its pattern, and the lines it changes."""

    finding: str
    title: str
    pattern: str
    lines: list[int]
    level: str
    source: str  # the repaired module

    def record(self, original: str, why_failed: str) -> dict[str, Any]:
        """What the run keeps of it (its options' `repaired`): all but the source, which is round-000.py."""
        data = {k: v for k, v in asdict(self).items() if k != "source"}
        return {**data, "original": original, "why_failed": why_failed}

    def describe(self) -> str:
        return f"{self.level} {self.finding} ({self.title}) -> {self.pattern}"


def find_repair(answer: Answer, source: str) -> Repair | None:
    """The first finding of `answer` that a repair pattern answers and whose rewrite applies to `source`."""
    for f in answer.findings:
        pattern = REPAIRS.get(f.kind)
        if pattern is None:
            continue
        try:
            variants = rewrite(pattern, source, {"lines": list(f.kernel_lines)})
        except Exception:  # noqa: BLE001 - a repair whose rewriter fails on this kernel is no repair
            continue
        if variants:
            return Repair(f.kind, f.title, pattern, list(f.kernel_lines), f.level, variants[0].source)
    return None


def repair_from(diagnose_kernel: Callable[[Path], Answer], initial: Path) -> Repair | None:
    """The repair of the kernel file `initial`, from its diagnosis (compiled, not timed)."""
    return find_repair(diagnose_kernel(initial), initial.read_text())
