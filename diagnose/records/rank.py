"""How findings are ordered: confidence times the typical cost of the failure mode.

Two findings can both be certain (ptxas spills and a serialized wgmma in the same kernel); the one
that usually costs more is the better root-cause hypothesis. The weights are the rough order of
slowdown each mode causes in failure-modes.md (a dot off tensor cores costs more than an int64
offset), not measured per kernel; L2 measurements, where present, re-rank by adding their own
evidence.
"""

from __future__ import annotations

import math

from diagnose.records.evidence import Finding

__all__ = ["IMPACT", "finding_score", "ranked_defects"]

IMPACT: dict[str, float] = {
    "resources.shared-memory-over-limit": 1.2,  # does not launch at all
    "ascend.ub-overflow": 1.2,  # does not compile at all
    "dot": 1.0,
    "ascend.discrete-access": 1.0,
    "vectorization": 0.9,
    "memory": 0.9,
    "pipelining": 0.85,
    "atomics": 0.85,
    # a GPU-wide barrier and an L1 invalidation per element store (sm90 SASS: MEMBAR.ALL.GPU, CCTL.IVALL per
    # ATOMG): relaxing index_add's scatter gave 1.29x on the H200, rows-per-program 1.10x on the same kernel
    "atomics.ordered": 1.0,
    "profile": 0.85,
    "parallelism": 1.0,  # idle SMs bound every other fix
    "attention": 1.0,  # a causal loop over every key block does up to twice the work
    "recurrence": 0.85,  # a step-at-a-time recurrence is latency-bound like an unpipelined loop
    "host": 0.9,  # a PyTorch pass in the wrapper costs what an unvectorized access does: a pass over memory
    "ascend": 0.8,
    "spills": 0.75,
    # a reduction inside a loop exchanges partials (shuffles, shared memory, two barriers) every iteration and
    # chains the iterations on one scalar: TritonBench-T's row-by-row GEMV ran at 0.09x of PyTorch that way
    "reduction.in-loop": 1.0,
    "reduction": 0.7,
    "resources": 0.7,
    "layout": 0.65,
    "index": 0.6,
    "math": 0.55,
}


def finding_score(finding: Finding) -> float:
    """Confidence x typical impact x what the launch's numbers say fixing it can gain at most: a
    finding that bounds the speedup at 16x (8 programs on 132 SMs) outranks one bounded at 1.1x."""
    family = finding.kind.split(".")[0]
    weight = IMPACT.get(finding.kind, IMPACT.get(family, 0.5))
    gain = 1.0 + 0.1 * math.log2(finding.gain) if finding.gain and finding.gain > 1 else 1.0
    return finding.confidence * weight * gain


def ranked_defects(findings: list[Finding]) -> list[Finding]:
    """Defects only, best-supported first: the order root-cause accuracy is scored on."""
    return sorted((f for f in findings if f.defect), key=lambda f: -finding_score(f))
