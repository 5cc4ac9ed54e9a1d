"""What the L3 analyzers share: source-file names and op evidence. IR syntax is read through harness.ir."""

from __future__ import annotations

from diagnose.records import EvidenceLog
from harness import ir

__all__ = ["at", "log_op", "short"]


def short(path: str) -> str:
    return path.rsplit("/", 1)[-1] if path else "kernel"


def at(src: str, line: int) -> str:
    """`file:line`, or just the file when the IR carried no location for the op."""
    return f"{src}:{line}" if line else src


def log_op(log: EvidenceLog, stage: str, op: ir.OpLine, claim: str) -> str:
    return log.add("L3", stage, claim, f"{stage}:{op.ir_line}", op.text[:400])
