"""PTX (memory accesses and their vector width) and the ptxas -v report (registers, spills, shared memory)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.ir.artifacts import PtxasReport
from harness.ir.common import SourceLoc

# PTX

# 	.file	1 "/tmp/k/scale.py"
_PTX_FILE = re.compile(r'^\s*\.file\s+(?P<id>\d+)\s+"(?P<path>[^"]+)"')
# 	.loc	1 8 9                           // scale.py:8:9
_PTX_LOC = re.compile(r"^\s*\.loc\s+(?P<id>\d+)\s+(?P<line>\d+)\s+(?P<col>\d+)")
# 	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
# 	st.global.b32 [ %rd3 + 0 ], { %r9 };
# 	atom.global.gpu.acq_rel.add.f32 %f1, [%rd1], %f2;
_PTX_MEM = re.compile(
    r"^\s*(?P<pred>@!?%p\w*\s+)?(?P<inst>(?P<kind>ld|st|atom|red)\.global[\w.]*)\s"
)
_PTX_VEC = re.compile(r"\.v(?P<n>[248])\b")
_PTX_WIDTH = re.compile(r"\.[bfsu](?P<bits>8|16|32|64|128)\b")


@dataclass(frozen=True)
class MemAccess:
    """One global-memory instruction in PTX.

    Attributes:
        kind: "load", "store" or "atomic".
        instruction: the mnemonic, e.g. "ld.global.v4.b32".
        vector: elements per instruction (1, 2, 4 or 8).
        element_bits: bits per element of the instruction type.
        predicated: guarded by a predicate (a mask, or a redundant-thread guard).
        ptx_line: 1-based line in the PTX text.
        loc: kernel source location from the preceding `.loc` directive.
    """

    kind: str
    instruction: str
    vector: int
    element_bits: int
    predicated: bool
    ptx_line: int
    loc: SourceLoc | None

    @property
    def bits(self) -> int:
        return self.vector * self.element_bits


_KIND = {"ld": "load", "st": "store", "atom": "atomic", "red": "atomic"}


def ptx_memory_accesses(ptx: str) -> list[MemAccess]:
    """Global loads, stores and atomics in PTX, each mapped to its kernel source line."""
    lines = ptx.splitlines()
    files = {m["id"]: m["path"] for line in lines if (m := _PTX_FILE.match(line))}
    out: list[MemAccess] = []
    loc: SourceLoc | None = None
    for lineno, line in enumerate(lines, start=1):
        if m := _PTX_LOC.match(line):
            path = files.get(m["id"])
            if path is None and "//" in line:
                path = line.split("//", 1)[1].strip().rsplit(":", 2)[0]
            loc = SourceLoc(path or f"file{m['id']}", int(m["line"]), int(m["col"]))
            continue
        m = _PTX_MEM.match(line)
        if m is None:
            continue
        inst = m["inst"]
        vec = _PTX_VEC.search(inst)
        width = _PTX_WIDTH.findall(inst)
        out.append(
            MemAccess(
                kind=_KIND[m["kind"]],
                instruction=inst,
                vector=int(vec["n"]) if vec else 1,
                element_bits=int(width[-1]) if width else 0,
                predicated=bool(m["pred"]),
                ptx_line=lineno,
                loc=loc,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# ptxas -v

# ptxas-blackwell info    : Function properties for center_kernel
#     2976 bytes stack frame, 7880 bytes spill stores, 10368 bytes spill loads
# ptxas-blackwell info    : Used 64 registers, used 0 barriers, 2976 bytes cumulative stack size
# ptxas info    : Used 40 registers, 16384 bytes smem, 380 bytes cmem[0]
_PTXAS_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (?P<regs>\d+) registers")
_PTXAS_SMEM = re.compile(r"(?P<smem>\d+) bytes smem")


def parse_ptxas_log(text: str) -> PtxasReport | None:
    """The resource report in a `ptxas -v` log, or None when `text` holds none."""
    lines = [ln for ln in text.splitlines() if "ptxas" in ln or "bytes stack frame" in ln]
    joined = "\n".join(lines)
    regs = _PTXAS_REGS.search(joined)
    if regs is None:
        return None
    frame = _PTXAS_FRAME.search(joined)
    smem = _PTXAS_SMEM.search(joined)
    return PtxasReport(
        registers=int(regs["regs"]),
        spill_stores=int(frame["stores"]) if frame else 0,
        spill_loads=int(frame["loads"]) if frame else 0,
        stack_frame=int(frame["stack"]) if frame else 0,
        shared_bytes=int(smem["smem"]) if smem else 0,
        raw=joined,
    )
