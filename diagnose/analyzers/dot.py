"""L3: how each tl.dot was lowered — wgmma (MMA v3), mma.sync (MMA v2) or FMA — and why.

Evidence: the TTGIR op and its result encoding, the PTX instruction counts, the compiler's remark
with its pass, and (for FMA on fp32) the dot's input precision in TTIR.
"""

from __future__ import annotations

from diagnose.analyzers.common import short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]

# TTIR prints inputPrecision only when it is not the default (IEEE; TritonOps.td DotOp).


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ttgir, ttir, ptx = (art.stages.get(k, "") for k in ("ttgir", "ttir", "ptx"))
    dots = ir.op_source_lines(ttgir, {"tt.dot", "ttng.warp_group_dot"})
    if not dots:
        return []
    src = short(art.source_file)
    counts = {name: ptx.count(name) for name in ("wgmma.mma_async", "mma.sync", "fma.rn.f32")}
    ptx_ev = log.add(
        "L3", "ptx",
        "PTX has " + ", ".join(f"{n} x `{k}`" for k, n in counts.items()),
        "ptx", next((ln.strip() for ln in ptx.splitlines() if any(k in ln for k in counts)), ""),
    )
    findings = []
    ttir_dots = {op.loc.line: op for op in ir.op_source_lines(ttir, {"tt.dot"}) if op.loc}
    for op in dots:
        line = op.loc.line if op.loc else 0
        op_ev = log.add("L3", "ttgir", f"the dot at {src}:{line} is `{op.op}` in TTGIR", f"ttgir:{op.ir_line}", op.text)
        chain = [op_ev, ptx_ev]
        remarks = [r for r in art.remarks if r.line == line and ("MMA" in r.message or "FMA" in r.message)]
        for r in remarks:
            chain.append(log.add(
                "L3", "remark",
                f"the compiler reports at {src}:{line}: {r.message}"
                + (f" (emitted during pass {r.pass_name})" if r.pass_name else ""),
                f"{src}:{r.line}:{r.col}", r.message,
            ))
        deciding = next((r.pass_name for r in remarks if r.pass_name), "tritongpu-accelerate-matmul")
        if op.op == "ttng.warp_group_dot" or "versionMajor = 3" in _mma_encoding(ttgir):
            findings.append(Finding("dot.ok", "tensor-cores", f"the dot at {src}:{line} runs on wgmma (MMA v3)",
                                    "The dot was converted to a Hopper warp-group MMA.", chain, [line], deciding))
            continue
        if _result_on_mma(op) and "versionMajor = 2" in _mma_encoding(ttgir):
            findings.append(Finding(
                "dot.mma-v2", "tensor-cores", f"the dot at {src}:{line} uses mma.sync (MMA v2), not wgmma",
                "supportMMA(dot, 3) failed for this dot's shape, warps or element type, so the v2 path was taken.",
                chain, [line], deciding,
            ))
            continue
        # FMA: a blocked result encoding and no MMA instructions.
        ttir_op = ttir_dots.get(line)
        precision = "ieee"
        elt = ""
        if ttir_op is not None:
            written = ir.attribute(ttir_op.text, "inputPrecision")
            precision = written or "ieee"
            elt = next((t.element for t in ir.shaped_types(ttir_op.text) if t.static), "")
            chain.append(log.add(
                "L3", "ttir",
                f"in TTIR the dot's operands are {elt or '?'} with input precision {precision}"
                + (" (not printed: IEEE is the default of tt.dot's inputPrecision)" if not written else ""),
                f"ttir:{ttir_op.ir_line}", ttir_op.text,
            ))
        if elt == "f32" and precision == "ieee":
            explanation = (
                "An fp32 x fp32 dot qualifies for tensor cores only with TF32 input precision; with "
                "input_precision=\"ieee\" neither MMA v3 nor v2 applies, the result keeps a blocked layout and "
                "the dot is lowered to per-thread fma.rn.f32 chains."
            )
        else:
            explanation = "No MMA version applies to this dot (operand types, shape or capability), so it falls back to FMA."
        findings.append(Finding("dot.fma", "tensor-cores", f"the dot at {src}:{line} runs on CUDA-core FMA, not tensor cores",
                                explanation, chain, [line], deciding))
    return findings


def _mma_encoding(ttgir: str) -> str:
    return next((value for alias, value in ir.attribute_aliases(ttgir).items()
                 if alias.startswith("#mma") and value.startswith("#ttg.nvidia_mma<{") and value.endswith("}>")), "")


def _result_on_mma(op: ir.OpLine) -> bool:
    """Whether the op's result (the type after `->`) is laid out in an #mma encoding."""
    result = ir.shaped_types(op.text.rpartition("->")[2]) if "->" in op.text else []
    return bool(result) and result[0].encoding.startswith("#mma")
