"""Diagnosis records, the floor of `diagnose`: the engine, the analyzers and the rewriters stand on
them, and they import nothing of the rooms above (tests/test_layering.py)."""

from diagnose.records.answer import Answer
from diagnose.records.evidence import (
                                       LEVELS,
                                       REPORT_CONFIDENCE,
                                       STRATEGIES,
                                       CompilerReason,
                                       Escalation,
                                       Evidence,
                                       EvidenceLog,
                                       Finding,
                                       Level,
                                       Recommendation,
                                       Strategy,
)
from diagnose.records.rank import IMPACT, finding_score, ranked_defects

__all__ = ["IMPACT", "LEVELS", "REPORT_CONFIDENCE", "STRATEGIES", "Answer", "CompilerReason", "Escalation", "Evidence",
           "EvidenceLog", "Finding", "Level", "Recommendation", "Strategy", "finding_score", "ranked_defects"]
