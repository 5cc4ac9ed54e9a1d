"""L3: index arithmetic — 64-bit offsets (N5) and runtime division/remainder in offsets (N5, N1)."""

from __future__ import annotations

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]



def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ttir = art.stages.get("ttir", "")
    if not ttir:
        return []
    src = short(art.source_file)
    ptx = art.stages.get("ptx", "")
    findings: list[Finding] = []
    wide = [op for op in ir.op_source_lines(ttir, {"tt.addptr"}) if any(t.static and t.element == "i64" and not t.encoding for t in ir.shaped_types(op.text))]
    if wide:
        op = wide[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttir", op, f"the pointer arithmetic at {at(src, line)} adds an i64 offset tensor")]
        i64_args = [a.name for a in ir.func_args(ttir) if a.type == "i64"]
        if i64_args:
            chain.append(log.add("L3", "ttir", f"argument(s) {', '.join(i64_args)} were specialized as i64 "
                                 "(values outside int32)", "ttir", ", ".join(i64_args)))
        n64 = sum(ptx.count(k) for k in ("add.s64", "mul.lo.s64", "setp.lt.s64", "setp.ge.s64", "shl.b64"))
        if n64:
            chain.append(log.add("L3", "ptx", f"PTX has {n64} 64-bit integer add/mul/compare/shift instructions",
                                 "ptx", "add.s64 / mul.lo.s64 / setp.*.s64"))
        findings.append(Finding(
            "index.int64", "index-math", f"offsets at {at(src, line)} are computed in int64",
            "Every per-element offset, compare and address add is a 64-bit operation (two registers and extra "
            "instructions per element); only the base needs 64 bits when a program addresses fewer than 2^31 "
            "elements.", chain, sorted({o.loc.line for o in wide if o.loc}), "", confidence=0.8))
    consts = {name for name, defined in ir.ssa_defs(ttir).items() if defined.startswith("arith.constant")}
    divs = []
    for op in ir.op_source_lines(ttir, {"arith.divsi", "arith.remsi", "arith.divui", "arith.remui"}):
        operands = ir.ssa_names(op.text.split("=", 1)[-1].split(":")[0])
        if len(operands) >= 2 and operands[1] not in consts and "tensor<" in op.text:
            divs.append(op)
    if divs:
        op = divs[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttir", o, f"`{o.op}` by a runtime value at {src}:{o.loc.line if o.loc else 0}")
                 for o in divs[:2]]
        n = sum(ptx.count(k) for k in ("div.s32", "rem.s32", "div.u32", "rem.u32", "div.s64", "rem.s64"))
        if n:
            chain.append(log.add("L3", "ptx", f"PTX has {n} integer division/remainder instructions (each a long "
                                 "emulated sequence)", "ptx", "div.s32 / rem.s32"))
        # The loads whose address goes through the division are the ones it can cost vectorization.
        from diagnose.analyzers.vectorization import _address_terms

        remark = next((r for r in art.remarks if "vectorization fails" in r.message and _address_terms(ttir, r.line)[2]),
                      None)
        if remark is not None:
            chain.append(log.add("L3", "remark", f"the compiler reports at {src}:{remark.line}: {remark.message}",
                                 f"{src}:{remark.line}:{remark.col}", remark.message))
        findings.append(Finding(
            "index.divmod", "index-math", f"offsets at {at(src, line)} use integer division/remainder by a runtime value",
            "Per-element `//` and `%` by a runtime divisor compile to emulated integer division, and AxisInfo cannot "
            "prove contiguity through them, so loads indexed by the result lose vectorization.",
            chain, sorted({o.loc.line for o in divs if o.loc}), "tritongpu-coalesce", confidence=0.85))
    return findings
