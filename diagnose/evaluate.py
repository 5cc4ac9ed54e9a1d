"""`kb eval diagnosis`: the engine against kernels whose root cause is known.

Per case: the ranked defects (top-1, top-3 against the known root cause), the level progressive
diagnosis stopped at against the level the case is annotated with, false positives on healthy
kernels (any defect reported at or above REPORT_CONFIDENCE), and citation validity: every
file:line an answer cites exists — kernel lines in the kernel file, IR lines in the compiled stage,
compiler lines in the indexed release's source tree.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from diagnose.engine import diagnose
from diagnose.records import LEVELS, Answer
from diagnose.request import DiagnosisRequest, KernelInput, request_from
from harness.errors import UserFacingError
from harness.measurement import RunReport
from kb.home import KBHome

__all__ = ["BOTTLENECK_CLASSES", "DEFAULT_CASES", "GoldCase", "bottleneck_class", "evaluate_diagnosis", "load_cases",
           "request_for"]

# What a profiler can label: the class of a bottleneck, not the mechanism behind it. A gold file whose
# labels come from measurements (`match: class`, corpora/diagnosis/wild.yaml) scores a finding by its
# class: ncu shows warps waiting on memory (latency-bound) whether or not the cause is an unpipelined loop.
# A wgmma the warpgroup waits on at once (`dot.wgmma-serialized`) leaves the tensor cores idle between
# MMAs: no unit is at its roof and warps stall on `wait`, which is what the label rule calls latency-bound.
# FMA or mma.sync dots (`dot.fma`, `dot.mma-v2`) lower the compute ceiling itself.
BOTTLENECK_CLASSES: dict[str, tuple[str, ...]] = {
    "latency": ("profile.latency-bound", "pipelining.", "dot.wgmma-serialized"),
    "parallelism": ("parallelism.",),
    "launch": ("profile.launch-bound", "profile.host-bound"),
    "memory-access": ("memory.uncoalesced", "vectorization.", "profile.memory-bound"),
    "compute": ("profile.compute-bound", "dot.", "profile.alu-bound"),
}


def bottleneck_class(kind: str) -> str:
    """The class of a finding kind ("" for one no profiler labels)."""
    return next((name for name, kinds in BOTTLENECK_CLASSES.items() if kind.startswith(kinds)), "")

DEFAULT_CASES = Path(__file__).resolve().parent.parent / "corpora" / "diagnosis" / "cases.yaml"


@dataclass(frozen=True)
class GoldCase:
    id: str
    kernel: Path
    root_cause: str  # a finding kind, or "healthy"
    level: str
    call: str = ""
    dump: Path | None = None
    target: str = "cuda:90"
    measurements: Path | None = None
    failure_mode: str = ""
    match: str = "kind"  # "class": a finding of the label's bottleneck class counts (measured labels, below)

    @property
    def healthy(self) -> bool:
        return self.root_cause == "healthy"


def load_cases(path: Path | None = None) -> list[GoldCase]:
    path = path or DEFAULT_CASES
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserFacingError(f"cannot read gold cases {path}: {str(exc).splitlines()[0]}", "pass --cases FILE") from exc
    entries = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserFacingError(f"{path}: no `cases:` list", "see corpora/diagnosis/cases.yaml for the format")
    base = path.parent
    match = data.get("match", "kind")
    if match not in ("kind", "class"):
        raise UserFacingError(f"{path}: match must be kind or class", "fix the top-level `match:`")
    cases, seen = [], set()
    for i, e in enumerate(entries):
        where = f"{path}: case {i + 1} ({e.get('id', '?') if isinstance(e, dict) else '?'})"
        if not isinstance(e, dict) or not {"id", "kernel", "root_cause", "level"} <= set(e):
            raise UserFacingError(f"{where}: needs id, kernel, root_cause and level", "fix the entry")
        if e["level"] not in LEVELS:
            raise UserFacingError(f"{where}: level must be one of {', '.join(LEVELS)}", "fix the entry")
        if not e.get("call") and not e.get("dump"):
            raise UserFacingError(f"{where}: give a `call` (compiled here) or a `dump` directory", "fix the entry")
        if e["id"] in seen:
            raise UserFacingError(f"{where}: id {e['id']!r} is used twice", "rename one")
        seen.add(e["id"])
        kernel = base / e["kernel"]
        if not kernel.is_file():
            raise UserFacingError(f"{where}: kernel {kernel} does not exist",
                                  str(data.get("rebuild") or "fix the path (relative to the cases file)"))
        cases.append(GoldCase(
            id=e["id"], kernel=kernel, root_cause=e["root_cause"], level=e["level"], call=e.get("call", ""),
            dump=base / e["dump"] if e.get("dump") else None, target=e.get("target", "cuda:90"),
            measurements=base / e["measurements"] if e.get("measurements") else None,
            failure_mode=e.get("failure_mode", ""), match=match))
    return cases


def request_for(case: GoldCase, cache_dir: Path | None = None) -> DiagnosisRequest:
    report = RunReport.from_dict(json.loads(case.measurements.read_text())) if case.measurements else None
    if case.dump is not None:  # the kernel is the dump's source
        return request_from(KernelInput(kernel=str(case.kernel), dump=str(case.dump)), case.target, cache_dir, report)
    return request_from(KernelInput(kernel=str(case.kernel), call=case.call), case.target, cache_dir, report)


@dataclass
class CaseOutcome:
    id: str
    root_cause: str
    expected_level: str
    ranked: list[str]
    stopped_at: str
    seconds: float
    top1: bool
    top3: bool
    level_ok: bool
    false_positive: bool
    citations: int
    invalid_citations: list[str] = field(default_factory=list)
    escalations: list[str] = field(default_factory=list)
    error: str = ""


def evaluate_diagnosis(cases: list[GoldCase], home: KBHome | None, release: str | None = None,
                       strategy: str = "progressive", level_max: str = "L4",
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    outcomes: list[CaseOutcome] = []
    roots = _release_roots(home)
    for i, case in enumerate(cases):
        started = time.perf_counter()
        try:
            request = request_for(case)
            answer = diagnose(request, home, release, strategy, level_max)
        except (UserFacingError, ValueError, KeyError, TypeError, AttributeError) as exc:
            outcomes.append(CaseOutcome(case.id, case.root_cause, case.level, [], "", 0.0, False, False, False,
                                        False, 0, [], [], f"{type(exc).__name__}: {exc}"))
            if progress:
                progress(i + 1, len(cases))
            continue
        seconds = time.perf_counter() - started
        kinds = list(dict.fromkeys(f.kind for f in answer.ranked()))
        checked, invalid = _check_citations(answer, case, roots, request)
        if case.healthy:
            top1 = top3 = not kinds
        elif case.match == "class":
            want = bottleneck_class(case.root_cause)
            top1 = bool(kinds) and bottleneck_class(kinds[0]) == want
            top3 = any(bottleneck_class(k) == want for k in kinds[:3])
        else:
            top1 = bool(kinds) and kinds[0] == case.root_cause
            top3 = case.root_cause in kinds[:3]
        outcomes.append(CaseOutcome(
            case.id, case.root_cause, case.level, kinds, answer.stopped_at, round(seconds, 3), top1, top3,
            answer.stopped_at == case.level, case.healthy and bool(kinds), checked, invalid,
            [f"{e.level} {e.action}: {e.reason}" for e in answer.escalations]))
        if progress:
            progress(i + 1, len(cases))
    return _summary(outcomes, strategy, level_max)


def _summary(outcomes: list[CaseOutcome], strategy: str, level_max: str) -> dict[str, Any]:
    defects = [o for o in outcomes if o.root_cause != "healthy"]
    healthy = [o for o in outcomes if o.root_cause == "healthy"]
    cited = sum(o.citations for o in outcomes)
    invalid = sum(len(o.invalid_citations) for o in outcomes)

    def rate(items: list[CaseOutcome], attr: str) -> float | None:
        return round(sum(bool(getattr(o, attr)) for o in items) / len(items), 3) if items else None

    return {
        "strategy": strategy,
        "level_max": level_max,
        "cases": len(outcomes),
        "defect_cases": len(defects),
        "healthy_cases": len(healthy),
        "top1": rate(defects, "top1"),
        # Every case: a defect case right at top-1, a healthy one with no defect reported.
        "top1_all": round((sum(o.top1 for o in defects) + sum(not o.false_positive and not o.error for o in healthy))
                          / len(outcomes), 3) if outcomes else None,
        "top3": rate(defects, "top3"),
        "level_accuracy": rate(outcomes, "level_ok"),
        "false_positive_rate": rate(healthy, "false_positive"),
        "citations": cited,
        "citation_validity": round(1 - invalid / cited, 4) if cited else None,
        "median_seconds": round(median(ok), 3) if (ok := [o.seconds for o in outcomes if not o.error]) else None,
        "errors": [f"{o.id}: {o.error}" for o in outcomes if o.error],
        "per_case": [asdict(o) for o in outcomes],
    }


_KERNEL_CITE = re.compile(r"^(?P<file>[\w.-]+\.py):(?P<line>\d+)")
_IR_CITE = re.compile(r"^(?P<stage>ttir|ttgir|llir|ptx|ttadapter|mlir):(?P<line>\d+)$")
_SOURCE_CITE = re.compile(r"^(?P<path>[^@:]+):(?P<line>\d+)@(?P<release>.+)$")


def _release_roots(home: KBHome | None) -> dict[str, Path]:
    if home is None:
        return {}
    from kb.index import list_manifests

    return {m.release: Path(m.source["path"]) for m in list_manifests(home)
            if m.corpus == "compiler" and m.source.get("path")}


def _lines(path: Path) -> int:
    try:
        return len(path.read_text(errors="replace").splitlines())
    except OSError:
        return -1


def _check_citations(answer: Answer, case: GoldCase, roots: dict[str, Path],
                     request: DiagnosisRequest) -> tuple[int, list[str]]:
    """(citations checked, the invalid ones). Sources without a line (pattern ids, metrics) are not counted."""
    stages = {stage: len(text.splitlines()) for a in request.compiled() for stage, text in a.stages.items()} \
        if request._compiled is not None else {}
    checked, invalid = 0, []
    for e in answer.evidence:
        src = e.source
        if m := _SOURCE_CITE.match(src):
            checked += 1
            root = roots.get(m["release"])
            n = _lines(root / m["path"]) if root else -1
            if not 0 < int(m["line"]) <= n:
                invalid.append(src)
        elif m := _KERNEL_CITE.match(src):
            checked += 1
            if not 0 < int(m["line"]) <= _lines(case.kernel):
                invalid.append(src)
        elif m := _IR_CITE.match(src):
            checked += 1
            if not 0 < int(m["line"]) <= stages.get(m["stage"], 0):
                invalid.append(src)
    return checked, invalid
