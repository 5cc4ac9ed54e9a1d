"""What a compile writes to stderr: MLIR_ENABLE_DUMP's "IR Dump Before/After" sections (split into pass
snapshots) and MLIR_ENABLE_DIAGNOSTICS' remarks, warnings and notes, interleaved in one stream."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.ir.artifacts import Remark

# MLIR_ENABLE_DUMP streams

# Triton (3.x) pass manager, e.g.
# // -----// IR Dump Before TritonGPUCoalesce: tritongpu-coalesce ('builtin.module' operation) //----- //
# // -----// IR Dump Before ConvertTritonGPUToLLVM: convert-triton-gpu-to-llvm{compute-capability=90} ('builtin.module' operation) //----- //
_TRITON_DUMP_HEADER = re.compile(
    r"^// -----// IR Dump (?P<when>Before|After) (?P<cls>[\w:.]+)(?P<failed> Failed)?: (?P<arg>[\w.-]+)"
    r"(?P<opts>\{.*?\})?\s*"
    r"\('(?P<anchor>[\w.]+)' operation(?::\s*@(?P<func>[\w.$]+))?\)\s*//----- //\s*$"
)
# Upstream MLIR / bishengir (--mlir-print-ir-after-all), e.g.
# // -----// IR Dump After CSE (cse) //----- //
# // -----// IR Dump After HIVMPlanMemory (hivm-plan-memory) ('func.func' operation: @add_kernel) //----- //
# // -----// IR Dump After HIVMLoadVectorize Failed (hivm-load-vectorize) //----- //   (--mlir-print-ir-after-failure)
_MLIR_DUMP_HEADER = re.compile(
    r"^// -----// IR Dump (?P<when>Before|After) (?P<cls>[\w:.]+)(?P<failed> Failed)? \((?P<arg>[\w.-]+)\)"
    r"(?:\s*\('(?P<anchor>[\w.]+)' operation(?::\s*@(?P<func>[\w.$]+))?\))?\s*//----- //\s*$"
)
# Either header, whole or in part, as a user pastes it from a log: "IR Dump Before TritonGPUCoalesce"
# names the class alone.
_HEADER_PASS = re.compile(r"IR Dump (?:Before|After) (?P<cls>[\w.]+(?:::[\w.]+)*)(?: Failed)?"
                          r"(?:(?::\s*|\s+\()(?P<arg>[\w.-]+))?")


def dump_header_pass(text: str) -> str | None:
    """The pass named in an "IR Dump Before/After X" header: its argument (`tritongpu-coalesce`)
    where the header has one, else its class (`TritonGPUCoalesce`); None for other text."""
    m = _HEADER_PASS.search(text)
    return (m["arg"] or m["cls"]) if m else None


# Triton's software pipeliner prints its own internal steps inside tritongpu-pipeline's section, e.g.
# // -----// SoftwarePipeliner internal IR Dump After: LowerLoops
_PIPELINER_HEADER = re.compile(r"^// -----// (?P<cls>SoftwarePipeliner) internal\s+(?:IR Dump\s+)?After: (?P<step>\w+)")


@dataclass
class PassSnapshot:
    """IR text as printed before (or after) one pass ran.

    Attributes:
        index: position in the stream, from 0.
        when: "Before" or "After".
        pass_class: C++ class name, e.g. "TritonGPUCoalesce".
        pass_arg: command-line argument, e.g. "tritongpu-coalesce" (links to TableGen `Pass<"...">`).
        options: the printed option block, e.g. "{num-stages=3}", or "".
        anchor: the op the pass ran on ("builtin.module", "tt.func", ...).
        header_line: 1-based line of the header in the stream.
        text: the IR that follows the header, up to the next header.
        func: the function a function-scoped pass ran on (`('func.func' operation: @add_kernel)`), else "".
        failed: an "IR Dump After X Failed" section (--mlir-print-ir-after-failure): the IR the pass left
            when it failed.
    """

    index: int
    when: str
    pass_class: str
    pass_arg: str
    options: str
    anchor: str
    header_line: int
    text: str = ""
    func: str = ""
    failed: bool = False


def _match_header(line: str) -> re.Match[str] | None:
    """A pass-manager dump header ("IR Dump Before/After X"); not a pass's own internal dumps."""
    if not line.startswith("// -----//"):
        return None
    return _TRITON_DUMP_HEADER.match(line) or _MLIR_DUMP_HEADER.match(line)


def split_pass_dumps(text: str, unreadable: list[int] | None = None) -> list[PassSnapshot]:
    """Split an MLIR_ENABLE_DUMP / --mlir-print-ir-*-all stream into per-pass snapshots.

    Lines that are not IR (diagnostics, ptxas output) stay inside the section they appear in;
    `parse_remarks` uses the same sectioning to name the pass that emitted each diagnostic. Dump
    headers that cannot be read (cut short by a killed run, or of an unknown form) also stay in the
    section before; their line numbers are appended to `unreadable` when given.
    """
    snapshots: list[PassSnapshot] = []
    body: list[str] = []
    internal = False  # inside a pass's own internal dump (the pipeliner's LowerLoops, ExpandLoops)
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _match_header(line)
        if m is None:
            if line.startswith("// -----//") and _PIPELINER_HEADER.match(line):
                # A mid-pass module: neither what the pass received nor what it left. Kept out of the
                # section, or the pass before would seem to triple the module's ops.
                internal = True
                continue
            if unreadable is not None and line.startswith("// -----// IR Dump"):
                unreadable.append(lineno)
            if snapshots and not internal:
                body.append(line)
            elif internal and DIAGNOSTIC_LINE.match(line):
                body.append(line)  # the pass is still running: its diagnostics stay in its section
            continue
        internal = False
        if snapshots:
            snapshots[-1].text = "\n".join(body).strip("\n")
        body = []
        groups = m.groupdict()
        snapshots.append(
            PassSnapshot(
                index=len(snapshots),
                when=groups.get("when") or "Before",
                pass_class=groups["cls"],
                pass_arg=groups["arg"],
                options=groups.get("opts") or "",
                anchor=groups.get("anchor") or "",
                header_line=lineno,
                func=groups.get("func") or "",
                failed=bool(groups.get("failed")),
            )
        )
    if snapshots:
        snapshots[-1].text = "\n".join(body).strip("\n")
    return snapshots


# Diagnostics (MLIR_ENABLE_DIAGNOSTICS=remarks,warnings)

# /tmp/k/scale.py:8:9: remark: Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1
# /tmp/k/mm.py:15:16: note: Target compute capability (90) supports MMA v3.
DIAGNOSTIC_LINE = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<sev>remark|warning|note|error): (?P<msg>.*\S)\s*$"
)


def parse_remarks(text: str) -> list[Remark]:
    """Compiler diagnostics in `text`, each tagged with the pass whose dump section it appeared in.

    A pass's diagnostics print while it runs, i.e. after its own "IR Dump Before" header and before
    the next one, so the enclosing section names the emitting pass. Duplicates (the same diagnostic
    printed for several pattern applications) are kept once.
    """
    remarks: list[Remark] = []
    seen: set[tuple[str, int, int, str, str]] = set()
    current_pass = ""
    for line in text.splitlines():
        header = _match_header(line)
        if header is not None:
            current_pass = header.group("arg") if "when" in header.groupdict() else ""
            if header.groupdict().get("when") == "After":
                # An "After X" dump prints once X is done: what follows belongs to no known pass yet.
                current_pass = ""
            continue
        m = DIAGNOSTIC_LINE.match(line)
        if m is None:
            continue
        key = (m["file"], int(m["line"]), int(m["col"]), m["sev"], m["msg"])
        if key in seen:
            continue
        seen.add(key)
        remarks.append(
            Remark(
                file=m["file"],
                line=int(m["line"]),
                col=int(m["col"]),
                severity=m["sev"],
                message=m["msg"],
                pass_name=current_pass,
            )
        )
    return remarks
