"""MLIR lit tests (`.mlir`) as worked examples of each pass, dialect and op.

A lit test file holds cases separated by `// -----` (`-split-input-file`); its RUN lines name the
tool and passes under test. Each case becomes a chunk (a case larger than the budget is split
between top-level operations, never inside one), the ops it uses become `example` references, and
each pass flag on a RUN line becomes a `run-pass` fact linking the file to the pass it tests.

Regex and brace counting on purpose: tree-sitter-mlir is incomplete and knows no Triton or HIVM
dialects (see ../shared/design/kb-stack.md §2).
"""

from __future__ import annotations

import re
from collections import Counter

from harness.ir import function_name, op_source_lines
from indexer.code import Piece, pack_line_ranges
from indexer.parsed import Fact, ParsedFile, SourceSymbol, Unit, source_lines

__all__ = ["parse_lit_test"]

_SPLIT = re.compile(r"^// -----\s*$")
# // RUN: triton-opt %s -split-input-file -tritongpu-coalesce | FileCheck %s
# // RUN: bishengir-opt --hivm-plan-memory="mem-plan-mode=global" %s | FileCheck %s
_RUN = re.compile(r"^\s*//\s*RUN:\s*(?P<cmd>.*)$")
_FLAG = re.compile(r"(?<![\w-])--?(?P<flag>[a-z][\w.-]*[a-z0-9])(?:=(?P<value>\"[^\"]*\"|'[^']*'|\S+))?")
# -pass-pipeline="builtin.module(tritongpu-coalesce, func.func(cse))"
_PIPELINE_PASS = re.compile(r"[(,]\s*(?P<name>[a-z][\w-]*[a-z0-9])(?=\s*[,){])")
# Flags of the test tools themselves, not passes.
_TOOL_FLAGS = {"split-input-file", "verify-diagnostics", "allow-unregistered-dialect", "check-prefixes",
               "check-prefix", "implicit-check-not", "dump-input", "mlir-print-debuginfo", "mlir-print-ir-after-all",
               "mlir-print-ir-before-all", "mlir-disable-threading", "o", "input-file", "match-full-lines",
               "strict-whitespace", "pass-pipeline", "mlir-print-local-scope", "debug", "debug-only", "enable-var-scope"}


def _run_passes(lines: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for lineno, line in enumerate(lines, start=1):
        m = _RUN.match(line)
        if m is None:
            continue
        cmd = m["cmd"].split("|")[0]
        for fm in _FLAG.finditer(cmd):
            flag = fm["flag"]
            if flag == "pass-pipeline" and fm["value"]:
                out.extend((p["name"], lineno) for p in _PIPELINE_PASS.finditer(fm["value"])
                           if p["name"] not in ("builtin.module", "func.func"))
            elif flag not in _TOOL_FLAGS:
                out.append((flag, lineno))
    return list(dict.fromkeys(out))


def _cases(lines: list[str]) -> list[tuple[int, int]]:
    """0-based inclusive row ranges of the `// -----`-separated cases."""
    bounds, start = [], 0
    for i, line in enumerate(lines):
        if _SPLIT.match(line):
            bounds.append((start, i - 1))
            start = i + 1
    bounds.append((start, len(lines) - 1))
    return [(s, e) for s, e in bounds if any(lines[r].strip() for r in range(s, e + 1))]


def _top_level_pieces(lines: list[str], start: int, end: int) -> list[Piece]:
    """Split rows [start, end] where brace depth returns to its starting level (between top-level ops)."""
    pieces, depth, piece_start = [], 0, start
    for row in range(start, end + 1):
        code = lines[row].split("//", 1)[0] if lines[row].lstrip().startswith("//") else lines[row]
        depth += code.count("{") - code.count("}")
        if depth <= 1 and row > piece_start and (code.rstrip().endswith("}") or not code.strip()):
            pieces.append((piece_start, row, 0))
            piece_start = row + 1
    if piece_start <= end:
        pieces.append((piece_start, end, 0))
    return pieces


def parse_lit_test(source: bytes, max_chars: int = 3000) -> ParsedFile:
    text = source.decode("utf-8", "replace")
    lines = source_lines(text)
    parsed = ParsedFile(lang="mlir")
    runs = _run_passes(lines)
    parsed.facts.extend(Fact("run-pass", flag, "", line) for flag, line in runs)
    tested = ", ".join(flag for flag, _ in runs[:6]) or "no RUN line"
    file_ops: Counter[str] = Counter()
    file_funcs: list[str] = []
    for case_start, case_end in _cases(lines):
        size = sum(len(lines[r]) + 1 for r in range(case_start, case_end + 1))
        pieces = [(case_start, case_end)] if size <= max_chars else pack_line_ranges(
            _top_level_pieces(lines, case_start, case_end), lines, max_chars)
        for start, end in pieces:
            body = "\n".join(lines[start : end + 1])
            if not body.strip():
                continue
            funcs = [name for r in range(start, end + 1) if (name := function_name(lines[r]))]
            op_lines = op_source_lines(body)
            ops = Counter(o.op for o in op_lines)  # the op itself: `kb symbols llvm.call` finds every call
            first_use: dict[str, int] = {}
            for o in op_lines:
                first_use.setdefault(o.op, start + o.ir_line)
            file_ops.update(ops)
            file_funcs.extend(funcs)
            unit_index = len(parsed.units)
            parsed.units.append(Unit(body, start + 1, end + 1, funcs[0] if funcs else "", "lit-test"))
            for name in funcs:
                row = next(r for r in range(start, end + 1) if function_name(lines[r]) == name)
                parsed.symbols.append(SourceSymbol(name, "lit-test-func", row + 1, row + 1, "def", "", unit_index))
            for op in ops:
                # cited at the op's first use in the case, where an engineer wants to land
                parsed.symbols.append(SourceSymbol(op, "op-use", first_use[op], first_use[op], "example", "",
                                                   unit_index))
    # One summary for the whole file, shared by its cases: the embedding cache then computes one
    # vector per file (what a lit test file is about is its passes and ops), while BM25 still
    # ranks the individual cases.
    summary = (f"MLIR lit test of {tested}. Functions: {', '.join(file_funcs[:8]) or '-'}. "
               f"Ops: {', '.join(op for op, _ in file_ops.most_common(16))}.")
    for unit in parsed.units:
        unit.summary = summary
    return parsed

