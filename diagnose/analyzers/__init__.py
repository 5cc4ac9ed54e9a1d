"""L3 analyzers: each reads Artifacts and returns Findings whose claims are logged as Evidence.

Every analyzer runs on every compiled kernel (they are text scans, milliseconds each); a question
(`kb why`) keeps only the findings on the topics it asks about.
"""

from __future__ import annotations

from collections.abc import Callable

from diagnose.analyzers import ascend, dot, index, layout, pipelining, precision, resources, spills, vectorization
from diagnose.records import EvidenceLog, Finding
from harness.ir.artifacts import Artifacts

__all__ = ["ANALYZERS", "TOPICS", "run_analyzers"]

Analyzer = Callable[[Artifacts, EvidenceLog], list[Finding]]

ANALYZERS: dict[str, Analyzer] = {
    "vectorization": vectorization.analyze,
    "dot": dot.analyze,
    "spills": spills.analyze,
    "pipelining": pipelining.analyze,
    "layout": layout.analyze,
    "index": index.analyze,
    "resources": resources.analyze,
    "precision": precision.analyze,
    "ascend": ascend.analyze,
}

# Finding topic -> words that put a question on it (lower-case substrings).
TOPICS: dict[str, tuple[str, ...]] = {
    "vectorization": ("vectoriz", "vector width", "128-bit", "128 bit", "ld.global", "coalesc", "load", "store",
                      "memory access", "aligned", "alignment", "bandwidth", "scalar"),
    "tensor-cores": ("tensor core", "tensor-core", "mma", "wgmma", "matmul", "dot", "fma", "tf32", "gemm"),
    "registers": ("spill", "register", "local memory", "stack frame"),
    "pipelining": ("pipelin", "prefetch", "cp.async", "async copy", "latency", "num_stages", "stages"),
    "layout": ("layout", "convert_layout", "shared memory", "transpose", "bank conflict"),
    "reduction": ("reduc", "tl.sum", "tl.max", "warp", "barrier", "bar.sync"),
    "index-math": ("int64", "64-bit", "index", "offset", "division", "modulo", "div/mod", "//"),
    "resources": ("shared memory", "occupancy", "outofresources", "out of resources", "smem"),
    "atomics": ("atomic",),
    "precision": ("precision", "accura", "accumulat", "bf16", "fp16", "half", "rounding", "numeric", "wrong value",
                  "mismatch", "differ", "tolerance"),
    "parallelism": ("parallel", "grid", "program", "occupancy", "idle", "fill the", "sms", "masked lanes"),
    "math": ("libdevice", "pow", "exp", "precise", "math"),
    "ascend-memory": ("discrete", "ub overflow", "unified buffer", "scalar", "dma", "load", "store"),
    "ascend-compute": ("int64", "int32", "vector op", "scalar"),
    "ascend-launch": ("grid", "core", "block dim"),
    "ascend-pipeline": ("multi-buffer", "multibuffer", "ping-pong", "double buffer", "overlap", "pipelin"),
}


def run_analyzers(art: Artifacts, log: EvidenceLog, topics: list[str] | None = None) -> list[Finding]:
    """All analyzers on one compiled kernel; only the kept findings' evidence enters `log`."""
    scratch = EvidenceLog()
    findings = [f for analyze in ANALYZERS.values() for f in analyze(art, scratch)]
    kept = findings if topics is None else [f for f in findings if f.topic in topics]
    by_id = {e.id: e for e in scratch.items}
    for f in kept:
        f.evidence = [log.add(e.level, e.kind, e.claim, e.source, e.excerpt) for e in (by_id[i] for i in f.evidence)]
    return kept
