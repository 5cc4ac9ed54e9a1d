"""L3: sums that accumulate in 16-bit floats (N-precision): `tl.sum` / `tl.cumsum` over a bf16 or fp16 tile.

Triton keeps a float operand's dtype through a sum (`_pick_sum_dtype` widens only integers), so the
combine region of the `tt.reduce` / `tt.scan` adds in bf16 (8 significant bits) or fp16 (11): each lane's
running sum rounds at every step, and a sum of thousands of terms can be off in its second digit. The
TTIR shows it as the region's `arith.addf ... : bf16`; a `tl.max` or `tl.min` rounds nothing and is left
alone, as are sums whose operand was widened first.
"""

from __future__ import annotations

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["LOW_PRECISION", "analyze"]

LOW_PRECISION = {"bf16": "bf16", "f16": "fp16"}
# A combine over so few terms rounds a handful of times: not worth a finding.
MIN_TERMS = 16


def _region(lines: list[str], opening: int) -> list[str]:
    """The lines of the region an op opens on line `opening` (1-based), its closing line included."""
    depth, out = 0, []
    for text in lines[opening - 1:]:
        out.append(text)
        code = text.split(" loc(")[0]
        depth += code.count("{") - code.count("}")
        if depth <= 0:
            break
    return out


def _added_type(region: list[str]) -> str | None:
    """The element type a combine region adds in ('bf16', 'f32', 'i32', ...), or None (a max, a min)."""
    for text in region[1:-1]:
        code = text.split(" loc(")[0]
        if "arith.addf" in code or "arith.addi" in code:
            return code.rsplit(":", 1)[-1].strip()
    return None


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ttir = art.stages.get("ttir", "")
    if not ttir:
        return []
    src = short(art.source_file)
    lines = ttir.splitlines()
    sites: list[tuple[ir.OpLine, str, int]] = []  # (op, element type, terms per reduced axis)
    # Lines that also hold a sum in another type: the rewrite widens every sum on a line it is given, and
    # an integer sum must not become a float one.
    mixed: set[int] = set()
    for op in ir.op_source_lines(ttir, {"tt.reduce", "tt.scan"}):
        region = _region(lines, op.ir_line)
        element = _added_type(region)
        if element not in LOW_PRECISION:
            if element is not None and op.loc:
                mixed.add(op.loc.line)
            continue
        closing = region[-1].split(" loc(")[0]
        shape = next((t.shape for t in ir.shaped_types(closing.split("})", 1)[-1]) if t.static), ())
        axis_text = ir.attribute(op.text, "axis")
        axis = int(axis_text) if axis_text and axis_text.isdigit() else 0
        terms = shape[axis] if axis < len(shape) else 0
        if terms >= MIN_TERMS:
            sites.append((op, str(element), terms))
    if not sites:
        return []
    op, element, terms = max(sites, key=lambda s: s[2])
    line = op.loc.line if op.loc else 0
    kind = "sum" if op.op == "tt.reduce" else "cumulative sum"
    chain = [log_op(log, "ttir", op, f"the {kind} at {at(src, line)} combines {terms} {LOW_PRECISION[element]} terms "
                                     f"per axis with `arith.addf ... : {element}`")]
    if len(sites) > 1:
        others = ", ".join(at(src, s[0].loc.line if s[0].loc else 0) for s in sites if s[0] is not op)
        chain.append(log.add("L3", "ttir", f"{len(sites) - 1} more sum(s) add in 16-bit floats: {others}", "ttir",
                             "; ".join(s[0].text[:120] for s in sites if s[0] is not op)))
    lines_of = sorted({s[0].loc.line for s in sites if s[0].loc} - mixed)
    return [Finding(
        "precision.low-precision-accumulation", "precision",
        f"{len(sites)} sum(s) accumulate in {LOW_PRECISION[element]}, e.g. at {at(src, line)} over {terms} terms",
        f"tl.sum and tl.cumsum keep a float operand's dtype (Triton widens only integers), so these reductions add "
        f"in {LOW_PRECISION[element]}: every partial sum is rounded to {8 if element == 'bf16' else 11} significant "
        "bits, and the error grows with the number of terms. Widening the operand to fp32 before the sum costs a "
        "register per lane and no memory traffic.",
        chain, lines_of, "", "L3", 0.9)]
