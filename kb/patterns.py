"""Optimization patterns: the record, its YAML schema, and the loader that validates it.

A pattern says: when a kernel shows these symptoms (finding kinds that analyzers emit, remark
texts), and these preconditions hold, this rewrite helps, because of this compiler-side reason
(passes and symbols L4 looks up in the compiler source of the matching release).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from harness.errors import UserFacingError

if TYPE_CHECKING:
    from kb.home import KBHome

__all__ = ["CATALOG_DIR", "Pattern", "catalog_for", "load_catalog", "load_pattern"]

CATALOG_DIR = Path(__file__).resolve().parent.parent / "corpora" / "patterns"
RISKS = ("low", "medium", "high")
BACKENDS = ("cuda", "hip", "ascend")


@dataclass(frozen=True)
class CompilerRefs:
    """Where the compiler decides what the pattern is about (looked up per release at L4)."""

    passes: tuple[str, ...] = ()  # pass arguments, e.g. "tritongpu-coalesce"
    symbols: tuple[str, ...] = ()  # C++/Python names, e.g. "getMaskAlignment"
    files: tuple[str, ...] = ()  # repository-relative paths, e.g. "lib/Analysis/AxisInfo.cpp"


@dataclass(frozen=True)
class Rewrite:
    kind: str
    summary: str
    before: str = ""
    after: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pattern:
    """One entry of the pattern catalog (curated or learned)."""

    id: str
    title: str
    family: str
    backends: tuple[str, ...]
    failure_modes: tuple[str, ...]
    symptoms: tuple[str, ...]  # finding kinds, e.g. "vectorization.mask"
    remarks: tuple[str, ...]  # substrings of compiler remarks this pattern answers
    preconditions: tuple[str, ...]
    rewrite: Rewrite
    rationale: str
    compiler_refs: CompilerRefs
    citations: tuple[str, ...]
    risk: str
    provenance: dict[str, Any]
    stats: dict[str, Any]
    path: str = ""
    unblock: str = ""  # the source-level condition under which the compiler decides the other way

    def document(self) -> str:
        """The text that is embedded and searched."""
        parts = [
            f"{self.title} ({self.id}; family {self.family}; backends {', '.join(self.backends)})",
            f"Symptoms: {', '.join(self.symptoms)}. Remarks: {'; '.join(self.remarks)}",
            f"Rewrite ({self.rewrite.kind}): {self.rewrite.summary}",
            f"Why: {self.rationale}",
            f"Compiler: passes {', '.join(self.compiler_refs.passes)}; symbols {', '.join(self.compiler_refs.symbols)}",
        ]
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def win_rate(self, finding: str | None = None) -> float:
        """The pattern's record as a smoothed win rate, (wins + 1) / (tries + 2): 0.5 untried, falling
        with each rejection. With `finding`, only the rounds that tried it for that finding kind
        count, when there are any: a pattern can pay for one symptom and not another."""
        wins, tries = int(self.stats.get("wins", 0)), int(self.stats.get("tries", 0))
        if finding is not None:
            won = sum(1 for a in self.stats.get("applied", []) if a.get("finding", "") == finding)
            lost = sum(1 for f in self.stats.get("failed", []) if f.get("finding", "") == finding)
            if won + lost:
                wins, tries = won, won + lost
        return (wins + 1) / (tries + 2)


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "title": str,
    "family": str,
    "backends": list,
    "symptoms": list,
    "rewrite": dict,
    "rationale": str,
    "compiler_refs": dict,
    "risk": str,
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "failure_modes": list,
    "remarks": list,
    "preconditions": list,
    "citations": list,
    "provenance": dict,
    "stats": dict,
    "unblock": str,
}


def _type_name(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


def load_pattern(path: Path) -> Pattern:
    """Parse and validate one pattern file; every problem names the file and the key."""
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserFacingError(f"{where}: not readable YAML ({str(exc).splitlines()[0]})", "fix the file") from exc
    if not isinstance(data, dict):
        raise UserFacingError(f"{where}: a pattern must be a mapping", "see corpora/patterns/README.md")

    def fail(msg: str) -> UserFacingError:
        return UserFacingError(f"{where}: {msg}", "see the schema in corpora/patterns/README.md")

    for key, typ in _REQUIRED.items():
        if key not in data:
            raise fail(f"missing key {key!r}")
        if not isinstance(data[key], typ):
            raise fail(f"key {key!r} must be a {_type_name(typ)}")
    for key, typ in _OPTIONAL.items():
        if key in data and not isinstance(data[key], typ):
            raise fail(f"key {key!r} must be a {_type_name(typ)}")
    for key in ("symptoms", "failure_modes", "remarks", "preconditions", "citations"):
        # An unquoted "a: b" in a YAML list item is a mapping, not the sentence written.
        if bad := [i for i, item in enumerate(data.get(key) or []) if not isinstance(item, str)]:
            raise fail(f"item {bad[0] + 1} of {key!r} is not text (quote a line that holds ': ')")
    unknown = set(data) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise fail(f"unknown keys {sorted(unknown)}")
    if data["risk"] not in RISKS:
        raise fail(f"risk must be one of {RISKS}")
    if bad := [b for b in data["backends"] if b not in BACKENDS]:
        raise fail(f"unknown backends {bad}; known: {BACKENDS}")
    rewrite = data["rewrite"]
    if not {"kind", "summary"} <= set(rewrite):
        raise fail("rewrite needs 'kind' and 'summary'")
    refs = data["compiler_refs"]
    if not set(refs) <= {"passes", "symbols", "files"}:
        raise fail("compiler_refs takes passes, symbols, files")
    learned = dict(data.get("provenance", {})).get("kind") == "learned"
    if not learned and not any(refs.get(k) for k in ("passes", "symbols", "files")):
        raise fail("compiler_refs must name at least one pass, symbol or file (the compiler-side reason)")
    return Pattern(
        id=data["id"],
        title=data["title"],
        family=data["family"],
        backends=tuple(data["backends"]),
        failure_modes=tuple(data.get("failure_modes", [])),
        symptoms=tuple(data["symptoms"]),
        remarks=tuple(data.get("remarks", [])),
        preconditions=tuple(data.get("preconditions", [])),
        rewrite=Rewrite(
            kind=rewrite["kind"],
            summary=rewrite["summary"],
            before=rewrite.get("before", ""),
            after=rewrite.get("after", ""),
            parameters=dict(rewrite.get("parameters", {})),
        ),
        rationale=data["rationale"].strip(),
        compiler_refs=CompilerRefs(**{k: tuple(v) for k, v in refs.items()}),
        citations=tuple(data.get("citations", [])),
        risk=data["risk"],
        provenance=dict(data.get("provenance", {"kind": "curated"})),
        stats=dict(data.get("stats", {"tries": 0, "wins": 0})),
        path=where,
        unblock=" ".join(data.get("unblock", "").split()),
    )


def load_catalog(directory: Path | None = None) -> list[Pattern]:
    """All patterns under `directory` (recursively), validated; ids must be unique."""
    directory = directory or CATALOG_DIR
    if not directory.is_dir():
        raise UserFacingError(f"pattern catalog {directory} does not exist", "pass --catalog DIR with *.yaml patterns")
    patterns = [load_pattern(p) for p in sorted(directory.rglob("*.yaml"))]
    seen: dict[str, str] = {}
    for p in patterns:
        if p.id in seen:
            raise UserFacingError(f"pattern id {p.id!r} defined twice ({seen[p.id]}, {p.path})", "rename one")
        seen[p.id] = p.path
    if not patterns:
        raise UserFacingError(f"pattern catalog {directory} has no *.yaml patterns", "add patterns or fix --catalog")
    return patterns


def catalog_for(home: KBHome | None = None, directory: Path | None = None) -> list[Pattern]:
    """The catalog as diagnosis uses it: curated patterns, the home's learned patterns, and the
    statistics `kb synthesize` keeps (tries, wins, speedups) laid over both."""
    import json
    from dataclasses import replace

    patterns = load_catalog(directory)
    if home is None:
        return patterns
    learned_dir = Path(home.patterns_dir) / "learned"
    if learned_dir.is_dir() and any(learned_dir.glob("*.yaml")):
        known = {p.id for p in patterns}
        patterns += [p for p in load_catalog(learned_dir) if p.id not in known]
    stats_file = Path(home.patterns_dir) / "stats.json"
    try:
        stats = json.loads(stats_file.read_text()).get("patterns", {})
    except (OSError, ValueError):
        stats = {}
    out = []
    for p in patterns:
        s = stats.get(p.id)
        if s:
            p = replace(p, stats={**p.stats, **s}, risk=s.get("risk", p.risk))
        out.append(p)
    return out
