"""The answer to a diagnosis: findings, recommendations and the evidence they rest on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.records.evidence import CompilerReason, Escalation, Evidence, Finding, Recommendation
from diagnose.records.rank import ranked_defects

__all__ = ["Answer"]


@dataclass
class Answer:
    question: str
    kernel: str
    target: str
    release: str
    findings: list[Finding]
    recommendations: list[Recommendation]
    reasons: list[CompilerReason]
    evidence: list[Evidence]
    levels: list[str]
    notes: list[str] = field(default_factory=list)
    strategy: str = "always-deep"
    stopped_at: str = ""
    escalations: list[Escalation] = field(default_factory=list)
    narrative: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per level

    def ranked(self) -> list[Finding]:
        """Defects only, best-supported first; the order root-cause accuracy is scored on."""
        return ranked_defects(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        """The answer `to_dict` wrote (a round's diagnosis, read back when the round resumes)."""
        records = {"findings": Finding, "recommendations": Recommendation, "reasons": CompilerReason,
                   "evidence": Evidence, "escalations": Escalation}
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name, record in records.items():
            fields[name] = [record(**item) for item in data.get(name, [])]
        return cls(**fields)
