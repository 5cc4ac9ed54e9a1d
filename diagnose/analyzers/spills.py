"""L3: register spills reported by ptxas, with the per-thread live state that explains them."""

from __future__ import annotations

from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]



def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    report = art.ptxas
    if report is None:
        return []
    line = next((ln.strip() for ln in report.raw.splitlines() if "spill" in ln), report.raw.splitlines()[0])
    ev = log.add(
        "L3", "ptxas",
        f"ptxas: {report.registers} registers, {report.spill_stores} bytes spill stores, "
        f"{report.spill_loads} bytes spill loads, {report.stack_frame} bytes stack frame",
        "ptxas -v", line,
    )
    if not report.spills:
        return [Finding("spills.ok", "registers", f"no register spills ({report.registers} registers per thread)",
                        "ptxas allocated every value to registers.", [ev])]
    chain = [ev]
    warps = int(art.options.get("num_warps", 4))
    largest = _largest_tensor(art.stages.get("ttgir", ""))
    if largest:
        elems, shape, ir_line, text = largest
        per_thread = elems // (32 * warps)
        chain.append(log.add(
            "L3", "ttgir",
            f"the largest tensor is {shape} = {elems} elements over {32 * warps} threads "
            f"(num_warps={warps}): {per_thread} values per thread for each live copy",
            f"ttgir:{ir_line}", text,
        ))
    return [Finding(
        "spills.registers", "registers",
        f"ptxas spills {report.spill_stores} bytes to local memory",
        "The live values per thread exceed the register budget, so ptxas keeps some in local memory (the stack "
        "frame); each spill is a round trip through L1/L2.",
        chain, [], "ptxas",
    )]


def _largest_tensor(ttgir: str) -> tuple[int, str, int, str] | None:
    best: tuple[int, str, int, str] | None = None
    for lineno, line in enumerate(ttgir.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for t in ir.shaped_types(line):
            if not t.static or not t.element[:1].islower():  # a tile of values, not of pointers
                continue
            if best is None or t.elements > best[0]:
                best = (t.elements, "x".join(map(str, (*t.shape, t.element))), lineno, line.strip())
    return best
