"""Small readers shared by the L3 analyzers: loop bodies in MLIR text, source-file names, op evidence."""

from __future__ import annotations

import re

from diagnose.records import EvidenceLog
from harness import ir

__all__ = ["at", "in_loops", "log_op", "short", "ssa_defs", "tensor_elements"]

_LOOP_OPEN = re.compile(r"=?\s*scf\.(for|while)\b")


def short(path: str) -> str:
    return path.rsplit("/", 1)[-1] if path else "kernel"


_SSA_DEF = re.compile(r"\s*(%[\w.$-]+)(?::\d+)?\s*=\s*(.*)")


def ssa_defs(text: str) -> dict[str, str]:
    """SSA value -> the rest of its defining line (`%5 = arith.muli %3, %4 : i32` -> "arith.muli ...")."""
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _SSA_DEF.match(line))}


def at(src: str, line: int) -> str:
    """`file:line`, or just the file when the IR carried no location for the op."""
    return f"{src}:{line}" if line else src


def in_loops(text: str) -> set[int]:
    """1-based line numbers of an MLIR module that lie inside an scf.for / scf.while body.

    Brace depth is tracked from each loop's opening line; MLIR prints one op per line, so region
    braces are the only braces that open and close across lines.
    """
    inside: set[int] = set()
    stack: list[int] = []  # brace depth at which each open loop started
    depth = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        code = line.split(" loc(")[0]
        if stack:
            inside.add(lineno)
        if _LOOP_OPEN.search(code) and code.rstrip().endswith("{"):
            stack.append(depth)
        depth += code.count("{") - code.count("}")
        while stack and depth <= stack[-1]:
            stack.pop()
    return inside


def tensor_elements(type_text: str) -> int:
    m = re.search(r"tensor<(\d+(?:x\d+)*)x", type_text)
    if not m:
        return 0
    n = 1
    for d in m.group(1).split("x"):
        n *= int(d)
    return n


def log_op(log: EvidenceLog, stage: str, op: ir.OpLine, claim: str) -> str:
    return log.add("L3", stage, claim, f"{stage}:{op.ir_line}", op.text[:400])
