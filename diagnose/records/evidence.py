"""Evidence and what is concluded from it: every claim printed traces to an Evidence entry.

Evidence is collected in an `EvidenceLog`, which hands out stable ids (E1, E2, ...); findings,
recommendations and compiler reasons refer to evidence by id only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["LEVELS", "REPORT_CONFIDENCE", "STRATEGIES", "CompilerReason", "Escalation", "Evidence", "EvidenceLog",
           "Finding", "Level", "Recommendation", "Strategy"]


class Level(StrEnum):
    """How deep a diagnosis went: pattern triage, profile, IR, compiler source."""

    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"


class Strategy(StrEnum):
    """How far a diagnosis escalates: until it is confident, to the profile alone, or every level."""

    PROGRESSIVE = "progressive"
    PROFILE_ONLY = "profile-only"
    ALWAYS_DEEP = "always-deep"


# The names as they are written in answers, options and rounds (records keep the plain strings, so
# their JSON is what it always was).
LEVELS: tuple[str, ...] = tuple(level.value for level in Level)
STRATEGIES: tuple[str, ...] = tuple(strategy.value for strategy in Strategy)

# Below this confidence a finding is an opportunity (worth a try), not a diagnosed defect.
REPORT_CONFIDENCE = 0.5


@dataclass(frozen=True)
class Evidence:
    """One grounded fact.

    Attributes:
        id: "E1", "E2", ... unique within one answer.
        level: "L1" pattern, "L2" profile, "L3" IR, "L4" compiler source.
        kind: remark, ptx, ttir, ttgir, ptxas, pass-dump, pattern, source, kernel.
        claim: what the fact says, in one sentence.
        source: where it is: "ptx:68", "scale.py:8", "include/.../AxisInfo.h:314@triton-3.9.0", "pattern:x".
        excerpt: the verbatim text it rests on (an IR line, a remark, a source snippet).
    """

    id: str
    level: str
    kind: str
    claim: str
    source: str
    excerpt: str = ""


class EvidenceLog:
    def __init__(self) -> None:
        self.items: list[Evidence] = []
        self._by_key: dict[tuple[str, str, str], str] = {}

    def add(self, level: str, kind: str, claim: str, source: str, excerpt: str = "") -> str:
        key = (kind, source, claim)
        if key in self._by_key:
            return self._by_key[key]
        eid = f"E{len(self.items) + 1}"
        self.items.append(Evidence(eid, level, kind, claim, source, excerpt.strip()))
        self._by_key[key] = eid
        return eid


@dataclass
class Finding:
    """A root-cause hypothesis (or a clean bill of health) with its evidence chain.

    Attributes:
        kind: dotted finding kind patterns match on ("vectorization.mask", "dot.fma", ...);
            healthy findings end in ".ok".
        topic: what question it answers ("vectorization", "tensor-cores", "registers").
        title: one line.
        explanation: the causal chain in words; every statement backed by `evidence`.
        evidence: evidence ids, in chain order.
        kernel_lines: kernel source lines involved.
        deciding_pass: the pass argument that made the decision, when known.
        level: the level at which it became visible.
        confidence: how strongly the evidence supports it (0-1). Static suspicions (L1) are weaker
            than what the compiled IR shows (L3); below REPORT_CONFIDENCE it is an opportunity.
        gain: the most fixing it could speed the kernel up (x), estimated from the launch's numbers
            (SMs over programs, bytes moved over bytes used); None where nothing bounds it.
    """

    kind: str
    topic: str
    title: str
    explanation: str
    evidence: list[str]
    kernel_lines: list[int] = field(default_factory=list)
    deciding_pass: str = ""
    level: str = "L3"
    confidence: float = 0.9
    gain: float | None = None

    @property
    def healthy(self) -> bool:
        return self.kind.endswith(".ok")

    @property
    def defect(self) -> bool:
        return not self.healthy and self.confidence >= REPORT_CONFIDENCE


@dataclass
class Recommendation:
    """A concrete source change justified by a pattern."""

    pattern_id: str
    title: str
    summary: str
    before: str
    after: str
    risk: str
    for_finding: str
    evidence: list[str]
    match: str  # "symptom" (the finding kind) or "retrieved" (similar text)
    preconditions: list[str] = field(default_factory=list)  # what must hold for the rewrite to be valid


@dataclass
class CompilerReason:
    """Where in the compiler the decision is made, at the indexed release (L4)."""

    for_finding: str
    statement: str
    evidence: list[str]


@dataclass
class Escalation:
    """Why the engine went from one level to the next (or stopped, or skipped a level)."""

    level: str  # the level this decision was taken after ("L1"...), or the level skipped
    action: str  # "escalate" | "stop" | "skip"
    reason: str


