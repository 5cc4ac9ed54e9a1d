"""The diagnosis engine: L1 pattern triage -> L2 profile -> L3 IR attribution -> L4 compiler source.

`diagnose` escalates only as far as the strategy says:

- progressive (default): stop at the first level whose best hypothesis is confident (>= 0.8) and has
  a pattern whose risk that level may act on (L1/L2: low-risk rewrites only; L3: low; anything
  riskier, or a defect no pattern covers, goes to L4 for the compiler's exact blocking condition).
  A level that cannot run (no measurements for L2, no indexed compiler for L4) is skipped, with why.
- profile-only: L2 alone — what a profiler-driven engineer sees, no source, IR or compiler code.
- always-deep: every level up to --level-max.

Each decision is recorded as an Escalation; every claim in the Answer cites Evidence. `why` is the
same engine on the topics a question asks about, always deep.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from diagnose.analyzers import TOPICS, run_analyzers
from diagnose.compiler_source import escalate
from diagnose.launch_triage import LAUNCH_KINDS
from diagnose.records import (
    LEVELS,
    STRATEGIES,
    Answer,
    Escalation,
    EvidenceLog,
    Finding,
    Recommendation,
    ranked_defects,
)
from diagnose.request import DEFAULT_TARGET, DiagnosisRequest
from diagnose.triage import SOURCE_KINDS
from harness.errors import UserFacingError
from harness.ir.artifacts import Artifacts
from kb.home import KBHome
from kb.patterns import Pattern, catalog_for

__all__ = ["CONFIDENT", "diagnose", "kb_unsearchable", "question_topics", "why"]

CONFIDENT = 0.8
_RISK_ORDER = {"low": 0, "medium": 1, "high": 2}
# The riskiest rewrite each level may stop on; L4 is the last level and stops on anything
# (`sufficient` stops there before consulting this).
_STOP_RISK = {"L1": "low", "L2": "low", "L3": "low"}
_GENERIC = ("slow", "fast", "perf", "optimi", "speed", "bottleneck", "improve", "wrong with")
_MAX_KINDS = 3  # recommendations and compiler reasons for the top defects only
_MEMORY_FAMILIES = ("vectorization", "memory", "pipelining", "index")


def question_topics(question: str) -> list[str]:
    q = question.lower()
    topics = [t for t, words in TOPICS.items() if any(w in q for w in words)]
    if not topics and any(w in q for w in _GENERIC):
        topics = list(TOPICS)
    if not topics:
        raise UserFacingError(
            f"the compiler evidence cannot answer {question!r}",
            "ask about vectorization / memory accesses, tensor cores / dots, register spills, pipelining, layouts, "
            "reductions, index math, atomics, or why it is slow",
        )
    return topics


def _backend(target: str) -> str:
    return "ascend" if target.split(":")[0] in ("npu", "ascend") else {"hip": "hip"}.get(target.split(":")[0], "cuda")


def diagnose(
    request: DiagnosisRequest,
    home: KBHome | None,
    release: str | None = None,
    strategy: str = "progressive",
    level_max: str = "L4",
    question: str = "",
    topics: list[str] | None = None,
) -> Answer:
    if strategy not in STRATEGIES:
        raise UserFacingError(f"unknown strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    if level_max not in LEVELS:
        raise UserFacingError(f"unknown level {level_max!r}", "use --level-max L1, L2, L3 or L4")
    if strategy == "profile-only" and LEVELS.index(level_max) < LEVELS.index("L2"):
        raise UserFacingError("--strategy profile-only runs L2, above --level-max " + level_max,
                              "drop --level-max or set it to L2 or deeper")
    if strategy == "profile-only" and request.report is None:
        raise UserFacingError("--strategy profile-only needs measurements",
                              "pass --measurements REPORT.json from `kb run --json --profile` on the device")
    log = EvidenceLog()
    state = _State(request, log, home, release, topics, question)
    state.compile_ok = strategy != "profile-only" and LEVELS.index(level_max) >= LEVELS.index("L3")
    allowed = LEVELS[: LEVELS.index(level_max) + 1]
    plan = ("L2",) if strategy == "profile-only" else allowed
    for level in plan:
        if level not in allowed:
            break
        ran = state.run(level)
        if not ran:
            continue
        if strategy == "progressive" and state.sufficient(level):
            break
    return state.answer(strategy)


def why(question: str, kernel: DiagnosisRequest | list[Artifacts], home: KBHome | None,
        release: str | None = None) -> Answer:
    """Answer a question about a compiled kernel (its artifacts, or a request that compiles it): every
    level, restricted to the question's topics. What was compiled says which source and target it is."""
    topics = question_topics(question)
    artifacts = kernel.compiled() if isinstance(kernel, DiagnosisRequest) else kernel
    report = kernel.report if isinstance(kernel, DiagnosisRequest) else None
    source = artifacts[0].source_file if artifacts and artifacts[0].source_file else None
    launches = kernel.launches if isinstance(kernel, DiagnosisRequest) else None  # L1 reads the launch too
    request = DiagnosisRequest(source, lambda: artifacts, report, artifacts[0].target if artifacts else DEFAULT_TARGET,
                               launch_facts=launches)
    answer = diagnose(request, home, release, "always-deep", "L4", question, topics)
    if not answer.findings:
        asked = " / ".join(topics)
        raise UserFacingError(
            f"the compiled kernel holds no evidence about {asked} (nothing of that kind was compiled)",
            "ask about what the kernel does (e.g. a kernel without tl.dot cannot answer a tensor-core question)",
        )
    return answer


class _State:
    def __init__(self, request: DiagnosisRequest, log: EvidenceLog, home: KBHome | None, release: str | None,
                 topics: list[str] | None, question: str) -> None:
        self.request, self.log, self.home, self.release = request, log, home, release
        self.topics, self.question = topics, question
        self.findings: list[Finding] = []
        self.levels: list[str] = []
        self.escalations: list[Escalation] = []
        self.notes: list[str] = [request.case_note] if request.case_note else []
        self.timings: dict[str, float] = {}
        self.recommendations: list[Recommendation] = []
        self.reasons: list[Any] = []
        self.catalog = [p for p in catalog_for(home) if _backend(request.target) in p.backends]
        self.compile_ok = True  # False when the strategy reads no IR (profile-only, or --level-max below L3)
        self._kb: _KBView | None = None

    # ------------------------------------------------------------------ levels
    def run(self, level: str) -> bool:
        started = time.perf_counter()
        ran = getattr(self, f"_{level.lower()}")()
        self.timings[level] = round(time.perf_counter() - started, 4)
        if ran:
            self.levels.append(level)
        return ran

    def _l1(self) -> bool:
        if not self.request.kernel_file:
            self.escalations.append(Escalation("L1", "skip", "no kernel source: only IR was given"))
            return False
        from diagnose.features import kernel_features
        from diagnose.launch_triage import launch_triage
        from diagnose.triage import triage

        launches = self.request.launches()
        # The wrapper's file, then the files that define the kernels it launches (libraries keep them apart).
        files = dict.fromkeys([str(Path(self.request.kernel_file).resolve()),
                               *(str(Path(f.source_file).resolve()) for f in launches if Path(f.source_file).is_file())])
        for file in files:
            features = kernel_features(file)
            found = triage(features, self.log, self.request.target)
            found = launch_triage(features, launches, found, self.log, self.notes)
            self.findings += [f for f in found if self.topics is None or f.topic in self.topics]
        return True

    def _l2(self) -> bool:
        if self.request.report is None:
            self.escalations.append(Escalation("L2", "skip", "no measurements: run `kb run --json --profile` on the "
                                               "device and pass the report with --measurements"))
            return False
        from diagnose.bottleneck import classify
        from diagnose.work import kernel_work

        launches = self.request.launches() if self.request.kernel_file else []
        work = kernel_work(launches)
        if work is not None and not work.complete and self.compile_ok:
            # Dots that are no GEMM of the launch's tensors (attention): their FLOPs come from the IR,
            # compiled once for L2 and L3 both.
            from harness.compile_errors import CompileFailed

            try:
                work = kernel_work(launches, self.request.compiled())
            except CompileFailed:
                pass
        found = classify(self.request.report, self.log, work)
        self.findings += [f for f in found if self.topics is None or f.topic in self.topics or f.kind.startswith("profile.")]
        self._temper_by_measurements(self.findings)
        return True

    def _l3(self) -> bool:
        from harness.compile_errors import CompileFailed

        try:
            artifacts = self.request.compiled()
        except CompileFailed as exc:
            if not self.levels:  # nothing else was read: the compile error is the answer
                raise
            # A kernel written for another Triton still has its source, its launch and its measurements.
            self.escalations.append(Escalation("L3", "skip", f"{exc.problem} ({exc.fix})"))
            self.request._compiled = []
            return False
        if not artifacts:
            self.escalations.append(Escalation("L3", "skip", "nothing compiled to analyze"))
            return False
        found: list[Finding] = []
        for art in artifacts:
            found += run_analyzers(art, self.log, self.topics)
            if note := art.metadata.get("note"):
                self.notes.append(note)
        # The IR settles what L1 could only suspect: a suspicion it shows is replaced by the IR's finding
        # (keeping the source line as the chain's first link); one it does not show is dropped.
        l3_kinds: dict[str, Finding] = {}
        for f in found:
            l3_kinds.setdefault(f.kind, f)
        kept = []
        for f in self.findings:
            if f.level == "L1" and f.kind in SOURCE_KINDS and f.kind in l3_kinds:
                f.evidence = [*f.evidence, *l3_kinds.pop(f.kind).evidence]  # the IR shows what the source decides
                kept.append(f)
            elif f.level != "L1" or f.kind.startswith(LAUNCH_KINDS + SOURCE_KINDS):
                kept.append(f)  # the launch's own facts (its grid, its strides), the loops' trip counts:
                # no IR stage shows them
            elif f.kind in l3_kinds:
                l3_kinds[f.kind].evidence = [*f.evidence, *l3_kinds[f.kind].evidence]
                self.notes.append(f"L1 suspected {f.kind}; the IR confirms it")
            elif f.confidence >= 0.5:
                self.notes.append(f"L1 suspected {f.kind}; the compiled IR does not show it")
        # What the source alone decides (a fold, a trip count) the IR may only back up: without the L1
        # finding, an IR-side sighting of the same kind is not one.
        found = [f for f in found if f.kind not in SOURCE_KINDS]
        self._temper_by_measurements(found)
        self.findings = kept + found
        return True

    def _temper_by_measurements(self, found: list[Finding]) -> None:
        """Measured evidence outranks a suspicion of slowness it contradicts. A kernel measured at a roof
        (near the copy bandwidth or its matmul ceiling, or ncu's DRAM or SM throughput near peak) is bound
        by what it moves or computes: an IR or source defect in how it does so is listed as worth checking,
        not as the cause. Accesses ncu measured coalesced retire the source's suspicion that they are not."""
        near_roof = next((f for f in self.findings if f.kind == "profile.ok"), None)
        coalesced = next((f for f in self.findings if f.kind == "memory.ok"), None)
        for f in found:
            if not f.defect or f.level == "L2":
                continue
            if coalesced is not None and f.kind == "memory.uncoalesced":
                f.confidence = min(f.confidence, 0.3)
                f.evidence = [*f.evidence, *coalesced.evidence]
                self.notes.append(f"{f.kind} was suspected from the source, but ncu measured the accesses coalesced")
            elif near_roof is not None and not f.kind.startswith(LAUNCH_KINDS):
                f.confidence = min(f.confidence, 0.45)
                f.evidence = [*f.evidence, *near_roof.evidence]
                self.notes.append(f"{f.kind} is real in the {'IR' if f.level == 'L3' else 'source'}, but the measured "
                                  f"run is {near_roof.title}: it is listed as worth checking, not as the cause of slowness")

    def _l4(self) -> bool:
        kb = self._kb_view()
        if kb.store is None or not kb.releases:
            self.escalations.append(Escalation("L4", "skip", "no compiler release indexed: run `kb index compiler "
                                               "--installed` (or --source DIR) for compiler-source citations"))
            return False
        backend = {"cuda": "nvidia", "hip": "amd"}.get(_backend(self.request.target), "ascend")
        for finding in self._top_kinds():
            patterns = self.patterns_for(finding)
            top = patterns[0][0] if patterns else None
            # A compiler can span repositories (triton-ascend + bishengir): each release answers what it holds.
            missing_all: list[str] = []
            found = False
            for release in kb.releases:
                reason, missing = escalate(finding, top, kb.store, release, kb.chunk_text, self.log, backend)
                if reason is not None:
                    self.reasons.append(reason)
                    found = True
                missing_all += missing
            if not found:
                self.notes.extend(m for m in missing_all if m not in self.notes)
        return True

    # ------------------------------------------------------------------ decisions
    def ranked(self) -> list[Finding]:
        return ranked_defects(self.findings)

    def _top_kinds(self) -> list[Finding]:
        """The best finding of each of the top defect kinds (a masked load and store share one cause)."""
        best: dict[str, Finding] = {}
        for f in self.ranked():
            best.setdefault(f.kind, f)
        return list(best.values())[:_MAX_KINDS]

    def sufficient(self, level: str) -> bool:
        """Whether progressive diagnosis stops after `level`; records the decision either way."""
        ranked = self.ranked()
        if level == "L4":
            self.escalations.append(Escalation(level, "stop", "compiler source is the last level"))
            return True
        if not ranked:
            if level == "L3":
                self.escalations.append(Escalation(level, "stop", "the compiled IR shows no defect"))
                return True
            self.escalations.append(Escalation(level, "escalate", "no hypothesis at this level"))
            return False
        best = ranked[0]
        if level == "L1" and self.request.report is not None:
            self.escalations.append(Escalation(level, "escalate", f"measurements are at hand: {best.kind} is weighed "
                                               "against them at L2 before anything stops on it"))
            return False
        if level == "L2" and best.level == "L1" and (contradiction := self._contradicted(best)):
            self.escalations.append(Escalation(level, "escalate", f"the measurements contradict {best.kind}: "
                                               f"{contradiction}"))
            return False
        patterns = self.patterns_for(best)
        if best.confidence < CONFIDENT:
            self.escalations.append(Escalation(level, "escalate", f"best hypothesis {best.kind} has confidence "
                                               f"{best.confidence:.2f} < {CONFIDENT}"))
            return False
        if not patterns:
            self.escalations.append(Escalation(level, "escalate", f"no pattern covers {best.kind}: look for the "
                                               "deciding compiler code"))
            return False
        pattern = patterns[0][0]
        if _RISK_ORDER[pattern.risk] > _RISK_ORDER[_STOP_RISK[level]]:
            self.escalations.append(Escalation(level, "escalate", f"{best.kind}: the rewrite `{pattern.id}` is "
                                               f"{pattern.risk}-risk; find the compiler's exact condition first"))
            return False
        self.escalations.append(Escalation(level, "stop", f"{best.kind} (confidence {best.confidence:.2f}) is "
                                           f"justified by the {pattern.risk}-risk pattern `{pattern.id}`"))
        return True

    def _contradicted(self, finding: Finding) -> str:
        """Why the measured run contradicts an L1 hypothesis ("" when it does not): a memory-side defect
        in a kernel measured near the copy roofline, or a latency fix in a kernel whose grid leaves the
        device idle."""
        kinds = {f.kind: f for f in self.findings}
        if "profile.ok" in kinds and finding.kind.split(".")[0] in _MEMORY_FAMILIES:
            return kinds["profile.ok"].title
        idle = next((f for f in self.findings if f.kind == "parallelism.grid-underfilled" and f.defect), None)
        if idle is not None and finding is not idle and finding.kind.split(".")[0] in ("pipelining", "vectorization"):
            return idle.title
        return ""

    def patterns_for(self, finding: Finding) -> list[tuple[Pattern, str]]:
        """Patterns whose symptoms name the finding kind, ranked by risk, then their record (wins over
        tries, smoothed), then specificity; then patterns retrieved for the question, for context."""
        matched = sorted((p for p in self.catalog if finding.kind in p.symptoms),
                         key=lambda p: (_RISK_ORDER[p.risk], -p.win_rate(finding.kind), len(p.symptoms), p.id))
        out = [(p, "symptom") for p in matched]
        if self.home is not None:
            ids = {p.id: p for p in self.catalog}
            for pid in self._kb_view().retrieve_patterns(f"{self.question} {finding.title}".strip()):
                p = ids.get(pid)
                if p is not None and p not in matched and finding.kind.split(".")[0] == p.family and len(out) < 3:
                    out.append((p, "retrieved"))
        return out

    def _kb_view(self) -> _KBView:
        if self._kb is None:
            self._kb = _KBView.open(self.home, self.release, self.notes)
        return self._kb

    # ------------------------------------------------------------------ answer
    def answer(self, strategy: str) -> Answer:
        for finding in self._top_kinds():
            for pattern, how in self.patterns_for(finding)[:2]:
                ev = self.log.add("L1", "pattern", f"pattern `{pattern.id}` ({pattern.title}) addresses {finding.kind}: "
                                  f"{pattern.rationale}", f"pattern:{pattern.id}", pattern.path)
                self.recommendations.append(Recommendation(
                    pattern.id, pattern.title, pattern.rewrite.summary.strip(), pattern.rewrite.before,
                    pattern.rewrite.after, pattern.risk, finding.kind, [ev], how, list(pattern.preconditions)))
        arts = self.request._compiled or []
        kernel = ", ".join(sorted({a.kernel for a in arts})) or (self.request.kernel_file or "").rsplit("/", 1)[-1]
        target = arts[0].target if arts else self.request.target
        kb = self._kb
        release = (", ".join(kb.releases) if kb and kb.releases else
                   f"triton-{arts[0].triton_version} (not indexed)" if arts else "(not indexed)")
        findings = self.ranked() + [f for f in self.findings if not f.defect]
        answer = Answer(question=self.question or "why is this kernel slow?", kernel=kernel, target=target,
                        release=release, findings=findings, recommendations=self.recommendations,
                        reasons=self.reasons, evidence=[], levels=list(self.levels), notes=self.notes,
                        strategy=strategy, stopped_at=self.levels[-1] if self.levels else "",
                        escalations=self.escalations)
        answer.evidence = _referenced(self.log, answer)
        answer.timings = self.timings
        return answer


def _referenced(log: EvidenceLog, answer: Answer) -> list[Any]:
    """Only evidence something in the answer cites (refuted L1 suspicions leave theirs behind)."""
    cited = {i for f in answer.findings for i in f.evidence}
    cited |= {i for r in answer.recommendations for i in r.evidence}
    cited |= {i for r in answer.reasons for i in r.evidence}
    return [e for e in log.items if e.id in cited]


def kb_unsearchable(home: KBHome | None) -> str | None:
    """Why the knowledge base cannot be searched in this process (no home, or the KB stack not
    installed: a GPU worker's image may lack llama-index, chromadb, bm25s), None where it can. Diagnosis
    then goes on without L1 retrieval and L4; a bench says so, since its strategies then stop at L3."""
    if home is None:
        return "no knowledge base given"
    try:
        import kb.retrieve  # noqa: F401 - what a search imports first
    except ImportError as exc:
        return f"the knowledge base at {home.root} cannot be searched here ({exc.name} is not installed)"
    return None


class _KBView:
    """The parts of the knowledge base diagnosis reads; absent parts degrade to notes, never errors."""

    def __init__(self) -> None:
        self.store: Any = None
        self.releases: list[str] = []
        self._patterns: Any = None
        self._compilers: list[Any] = []

    @classmethod
    def open(cls, home: KBHome | None, release: str | None, notes: list[str]) -> _KBView:
        """`release` may name several, comma-separated (a compiler spread over repositories)."""
        view = cls()
        unsearchable = kb_unsearchable(home)
        if unsearchable is not None:
            notes.append(f"{unsearchable}: L1 retrieval and L4 compiler-source citations skipped")
            return view
        assert home is not None
        from kb.index import load_manifest
        from kb.retrieve import Searcher, default_release
        from kb.symbols import SymbolStore

        if load_manifest(home, "patterns", "catalog") is not None:
            view._patterns = Searcher(home, "patterns", "catalog")
        else:
            notes.append(f"patterns are not indexed in {home.root}: run `kb index patterns` for retrieval")
        names = [r.strip() for r in release.split(",") if r.strip()] if release else []
        if not names and (default := default_release(home, "compiler")):
            names = [default]
        if not names:
            notes.append(f"no compiler release is indexed in {home.root}: run `kb index compiler --installed` "
                         "for compiler-source citations (L4)")
            return view
        for name in names:
            if load_manifest(home, "compiler", name) is None:
                raise UserFacingError(f"compiler release {name!r} is not indexed in {home.root}",
                                      "see `kb releases list`, or index it with `kb index compiler --source DIR`")
        embedder = getattr(view._patterns, "embedder", None)
        try:
            view._compilers = [Searcher(home, "compiler", name, embedder=embedder) for name in names]
        except UserFacingError as exc:  # a release whose last index stopped half-published: L4 waits for it
            notes.append(f"{exc.problem} ({exc.fix}): L4 compiler-source citations skipped")
            return view
        view.releases = names
        view.store = SymbolStore(home.symbols_db)
        return view

    def retrieve_patterns(self, query: str) -> list[str]:
        # BM25 alone: the exact symptom match already ranks patterns, and skipping the query
        # embedding keeps diagnosis from loading the embedding model.
        if self._patterns is None:
            return []
        return [h.metadata.get("pattern_id", "") for h in self._patterns.search(query, k=5, mode="bm25")]

    def chunk_text(self, chunk_id: str) -> tuple[str, dict[str, Any]] | None:
        for searcher in self._compilers:
            hits = searcher.chunks([chunk_id])
            if hits:
                return hits[0].text, hits[0].metadata
        return None
