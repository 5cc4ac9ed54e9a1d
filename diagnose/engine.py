"""`kb why`: answer a question about a kernel from compiler evidence.

Flow: capture (harness) -> L3 analyzers on the topics the question asks about -> L1 patterns whose
symptoms match each defect (plus patterns retrieved for the question) -> L4 the deciding compiler
code at the matching release -> an Answer whose every claim cites Evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diagnose.analyzers import ANALYZERS, TOPICS
from diagnose.l4 import escalate
from diagnose.records import Answer, EvidenceLog, Finding, Recommendation
from harness.artifacts import Artifacts
from harness.errors import UserFacingError
from kb.home import KBHome
from kb.patterns import Pattern, load_catalog

__all__ = ["question_topics", "why"]

_GENERIC = ("slow", "fast", "perf", "optimi", "speed", "bottleneck", "improve", "wrong with")
_RISK_ORDER = {"low": 0, "medium": 1, "high": 2}


def question_topics(question: str) -> list[str]:
    q = question.lower()
    topics = [t for t, words in TOPICS.items() if any(w in q for w in words)]
    if not topics and any(w in q for w in _GENERIC):
        topics = list(TOPICS)
    if not topics:
        raise UserFacingError(
            f"the compiler evidence cannot answer {question!r}",
            "ask about vectorization / memory accesses, tensor cores / dots, register spills, or why it is slow",
        )
    return topics


def why(
    question: str,
    artifacts: list[Artifacts],
    home: KBHome | None,
    release: str | None = None,
    log_progress: Callable[[str], None] | None = None,
) -> Answer:
    topics = question_topics(question)
    log = EvidenceLog()
    findings: list[Finding] = []
    for art in artifacts:
        for topic in topics:
            findings.extend(ANALYZERS[topic](art, log))
    if not findings:
        asked = " / ".join(topics)
        raise UserFacingError(
            f"the compiled kernel holds no evidence about {asked} (nothing of that kind was compiled)",
            "ask about what the kernel does (e.g. a kernel without tl.dot cannot answer a tensor-core question)",
        )
    levels = ["L3"]
    notes: list[str] = []
    for art in artifacts:
        if note := art.metadata.get("note"):
            notes.append(note)
    catalog = {p.id: p for p in load_catalog()}
    kb = _KBView.open(home, release, notes)
    recommendations: list[Recommendation] = []
    reasons = []
    defects = [f for f in findings if not f.healthy]
    backend = {"cuda": "nvidia", "hip": "amd"}.get(artifacts[0].target.split(":")[0], "")
    # One recommendation set and one compiler reason per finding kind: a masked load and a masked
    # store share their cause, their fix and their deciding code.
    for finding in {f.kind: f for f in defects}.values():
        patterns = _patterns_for(finding, question, catalog, kb)
        if patterns:
            levels.append("L1")
        for pattern, how in patterns[:2]:
            ev = log.add("L1", "pattern", f"pattern `{pattern.id}` ({pattern.title}) addresses {finding.kind}: "
                         f"{pattern.rationale}", f"pattern:{pattern.id}", pattern.path)
            recommendations.append(Recommendation(
                pattern.id, pattern.title, pattern.rewrite.summary.strip(), pattern.rewrite.before,
                pattern.rewrite.after, pattern.risk, finding.kind, [ev], how,
            ))
        if kb.store is not None and kb.release:
            top = patterns[0][0] if patterns else None
            reason, missing = escalate(finding, top, kb.store, kb.release, kb.chunk_text, log, backend)
            notes.extend(m for m in missing if m not in notes)
            if reason is not None:
                reasons.append(reason)
                levels.append("L4")
    kernel = ", ".join(sorted({a.kernel for a in artifacts}))
    return Answer(
        question=question,
        kernel=kernel,
        target=artifacts[0].target,
        release=kb.release or f"triton-{artifacts[0].triton_version} (not indexed)",
        findings=findings,
        recommendations=recommendations,
        reasons=reasons,
        evidence=log.items,
        levels=sorted(set(levels)),
        notes=notes,
    )


def _patterns_for(finding: Finding, question: str, catalog: dict[str, Pattern], kb: "_KBView"
                  ) -> list[tuple[Pattern, str]]:
    """Patterns whose symptoms name the finding kind, then retrieved ones for context.

    Ranked by risk, then specificity: a pattern written for this one symptom beats a broad one
    (autotuning lists many symptoms) at equal risk.
    """
    matched = sorted((p for p in catalog.values() if finding.kind in p.symptoms),
                     key=lambda p: (_RISK_ORDER[p.risk], len(p.symptoms), p.id))
    out = [(p, "symptom") for p in matched]
    for pid in kb.retrieve_patterns(f"{question} {finding.title}"):
        p = catalog.get(pid)
        if p is not None and p not in matched and finding.kind.split(".")[0] == p.family and len(out) < 3:
            out.append((p, "retrieved"))
    return out


class _KBView:
    """The parts of the knowledge base `why` reads; absent parts degrade to notes, never errors."""

    def __init__(self) -> None:
        self.store: Any = None
        self.release: str | None = None
        self._patterns: Any = None
        self._compiler: Any = None

    @classmethod
    def open(cls, home: KBHome | None, release: str | None, notes: list[str]) -> "_KBView":
        view = cls()
        if home is None:
            notes.append("no knowledge base given: L1 retrieval and L4 compiler-source citations skipped")
            return view
        from kb.index import load_manifest
        from kb.retrieve import Searcher, default_release
        from kb.symbols import SymbolStore

        if load_manifest(home, "patterns", "catalog") is not None:
            view._patterns = Searcher(home, "patterns", "catalog")
        else:
            notes.append(f"patterns are not indexed in {home.root}: run `kb index patterns` for retrieval")
        view.release = release or default_release(home, "compiler")
        if view.release is None:
            notes.append(f"no compiler release is indexed in {home.root}: run `kb index compiler --installed` "
                         "for compiler-source citations (L4)")
            return view
        view._compiler = Searcher(home, "compiler", view.release, embedder=getattr(view._patterns, "embedder", None))
        view.store = SymbolStore(home.symbols_db)
        return view

    def retrieve_patterns(self, query: str) -> list[str]:
        # BM25 alone: the exact symptom match already ranks patterns, and skipping the query
        # embedding keeps `kb why` from loading the embedding model.
        if self._patterns is None:
            return []
        return [h.metadata.get("pattern_id", "") for h in self._patterns.search(query, k=5, mode="bm25")]

    def chunk_text(self, chunk_id: str) -> tuple[str, dict[str, Any]] | None:
        if self._compiler is None:
            return None
        hits = self._compiler.chunks([chunk_id])
        return (hits[0].text, hits[0].metadata) if hits else None
