"""L3: how each tl.dot was lowered — wgmma (MMA v3), mma.sync (MMA v2) or FMA — and why.

Evidence: the TTGIR op and its result encoding, the PTX instruction counts, the compiler's remark
with its pass, and (for FMA on fp32) the dot's input precision in TTIR.
"""

from __future__ import annotations

import re

from diagnose.analyzers.common import short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.artifacts import Artifacts

__all__ = ["analyze"]

# TTIR prints inputPrecision only when it is not the default (IEEE; TritonOps.td DotOp).
_PRECISION = re.compile(r"inputPrecision\s*=\s*(\w+)")
_OPERAND_TYPE = re.compile(r":\s*tensor<[\dx]+x(?P<elt>\w+)")


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
        if re.search(r"->\s*tensor<[^>]*#mma", op.text) and "versionMajor = 2" in _mma_encoding(ttgir):
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
            pm = _PRECISION.search(ttir_op.text)
            precision = pm.group(1) if pm else "ieee"
            em = _OPERAND_TYPE.search(ttir_op.text)
            elt = em.group("elt") if em else ""
            chain.append(log.add(
                "L3", "ttir",
                f"in TTIR the dot's operands are {elt or '?'} with input precision {precision}"
                + (" (not printed: IEEE is the default of tt.dot's inputPrecision)" if not pm else ""),
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
    m = re.search(r"^#mma\w* = (#ttg\.nvidia_mma<\{.*\}>)", ttgir, re.MULTILINE)
    return m.group(1) if m else ""
