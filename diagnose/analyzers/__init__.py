"""L3 analyzers: each reads Artifacts and returns Findings whose claims are logged as Evidence."""

from __future__ import annotations

from collections.abc import Callable

from diagnose.analyzers import dot, spills, vectorization
from diagnose.records import EvidenceLog, Finding
from harness.artifacts import Artifacts

__all__ = ["ANALYZERS", "TOPICS"]

Analyzer = Callable[[Artifacts, EvidenceLog], list[Finding]]

# topic -> analyzer; a question is routed to the topics it asks about.
ANALYZERS: dict[str, Analyzer] = {
    "vectorization": vectorization.analyze,
    "tensor-cores": dot.analyze,
    "registers": spills.analyze,
}

# Words that put a question on a topic (lower-case substrings).
TOPICS: dict[str, tuple[str, ...]] = {
    "vectorization": ("vectoriz", "vector width", "128-bit", "128 bit", "ld.global", "coalesc", "load", "store",
                      "memory access", "aligned", "alignment", "bandwidth", "scalar"),
    "tensor-cores": ("tensor core", "tensor-core", "mma", "wgmma", "matmul", "dot", "fma", "tf32", "gemm"),
    "registers": ("spill", "register", "local memory", "stack frame"),
}
