"""L4, compiler-source analysis: from a finding and its pattern, find the deciding code at the matching
compiler release.

Walks the symbol store: the pass named by the remark (or the pattern) -> its TableGen definition ->
the pipeline call that adds it and the file implementing it; the remark's text -> the function that
emits it; the pattern's C++/Python symbols -> their definitions. Every hit is
logged as Evidence citing file:line@release with the source text it rests on.
"""

from __future__ import annotations

import re
from typing import Any

from diagnose.records import CompilerReason, EvidenceLog, Finding
from kb.patterns import Pattern
from kb.symbols import SymbolStore

__all__ = ["escalate"]

_MAX_EXCERPT_LINES = 8


def escalate(finding: Finding, pattern: Pattern | None, store: SymbolStore, release: str, chunk_text: Any,
             log: EvidenceLog, backend: str = "nvidia") -> tuple[CompilerReason | None, list[str]]:
    """Return the compiler reason for `finding` (or None) and notes on what could not be found."""
    notes: list[str] = []
    evidence: list[str] = []
    parts: list[str] = []
    pass_args = [a for a in [finding.deciding_pass, *(pattern.compiler_refs.passes if pattern else ())]
                 if a and a != "ptxas"]
    for arg in dict.fromkeys(pass_args):
        p = store.pass_by_argument(arg, release)
        if p is None:
            if arg == finding.deciding_pass:
                parts.append(f"the remark was emitted during pass `{arg}`")
            notes.append(f"pass `{arg}` has no TableGen definition in the indexed {release} files")
            continue
        eid = log.add("L4", "source", f"pass `{p.argument}` is defined as {p.def_name}: {p.summary}", p.cite(),
                      p.description[:400])
        evidence.append(eid)
        added = [lk.src for lk in store.links_of(p.argument, release) if lk.relation == "adds-pass"]
        where = ""
        for call in added[:1]:
            # The same call appears in every backend's pipeline; cite the target's.
            calls = sorted(store.find(call, release), key=lambda s: (f"/{backend}/" not in f"/{s.file}", s.file))
            sym = next(iter(calls), None)
            if sym is not None:
                stage = sym.kind.split(":", 1)[-1]
                evidence.append(log.add("L4", "source", f"`{call}` adds it to the {stage} pipeline", sym.cite(),
                                        call + "(pm, ...)"))
                where = f", added by `{call}` in {stage}"
        impl = next((lk for lk in store.links_of(p.argument, release) if lk.relation == "implemented-in"), None)
        if impl is not None:
            file, _, line = impl.dst.rpartition(":")
            evidence.append(log.add("L4", "source", f"`{p.def_name}` is implemented in {file}", f"{impl.dst}@{release}",
                                    f"#define GEN_PASS_DEF_{p.def_name.upper()}"))
            where += f", implemented in {file}"
        role = "emitted the remark" if arg == finding.deciding_pass else "runs on this code"
        parts.append(f"pass `{p.argument}` ({p.def_name}: {p.summary}) {role} [{eid}]{where}")
    ref_names = list(pattern.compiler_refs.symbols) if pattern else []
    blocking: tuple[str, str] | None = None  # (evidence id, the line)
    for remark in _remarks_of(finding, log):
        for emit in store.find_message(remark, release, limit=1):
            eid = log.add("L4", "source", f"the remark is emitted by `{emit.scope or '?'}` ({emit.kind.split(':')[-1]})",
                          emit.cite(), f'"{emit.name}"')
            evidence.append(eid)
            parts.append(f"the remark comes from `{emit.scope}` at {emit.file}:{emit.line} [{eid}]")
            if blocking is None and emit.scope:
                blocking = _blocking_in(emit.scope.split("::")[-1], emit.file, store, release, chunk_text, ref_names,
                                        log, evidence)
    for name in ref_names:
        leaf = name.split("::")[-1]
        # Exact spelling: a case-insensitive hit (`axisInfo` for `AxisInfo`) is another symbol.
        hits = [s for s in store.find(name, release) if s.role in ("def", "decl") and s.name == leaf]
        if not hits:
            notes.append(f"`{name}` is not in the indexed {release} sources (index a source checkout with "
                         "`kb index compiler --source DIR` to reach .cpp files)")
            continue
        # Another backend's copy of a helper (third_party/amd for an NVIDIA kernel) is the wrong citation.
        sym = min(hits, key=lambda s: (s.file.startswith("third_party/") and f"/{backend}/" not in f"/{s.file}",
                                       s.role != "decl", s.file.count("/"), s.line))
        excerpt = _excerpt(chunk_text(sym.chunk_id), sym) if sym.chunk_id else ""
        eid = log.add("L4", "source", f"`{sym.name}` ({sym.kind}) is {'declared' if sym.role == 'decl' else 'defined'}"
                      f" at {sym.file}:{sym.line}", sym.cite(), excerpt)
        evidence.append(eid)
        parts.append(f"`{sym.name}` {'declared' if sym.role == 'decl' else 'defined'} at {sym.file}:{sym.line} [{eid}]")
        if blocking is None and sym.role == "def":
            blocking = _blocking_in(sym.name, sym.file, store, release, chunk_text,
                                    [n for n in ref_names if n.split("::")[-1] != sym.name], log, evidence)
    if not evidence:
        return None, notes
    statement = f"At {release}: " + "; ".join(parts) + "."
    if blocking is not None:
        statement += f" Deciding code: `{blocking[1]}` [{blocking[0]}]."
    if pattern is not None and pattern.unblock:
        statement += f" A rewrite must ensure {pattern.unblock} (pattern `{pattern.id}`)."
    return CompilerReason(finding.kind, statement, evidence), notes


def _blocking_in(function: str, file: str, store: SymbolStore, release: str, chunk_text: Any, names: list[str],
                 log: EvidenceLog, evidence: list[str]) -> tuple[str, str] | None:
    """The line inside `function`'s definition that uses one of `names` (the quantities the pattern
    says decide), logged as evidence: where the compiler takes the decision the finding is about."""
    leaves = [n.split("::")[-1] for n in names if n.split("::")[-1] != function]
    if not leaves:
        return None
    defs = [s for s in store.find(function, release) if s.role == "def" and s.file == file and s.chunk_id]
    for sym in defs:
        chunk = chunk_text(sym.chunk_id)
        if chunk is None:
            continue
        text, meta = chunk
        lines = text.splitlines()
        for leaf in leaves:  # the pattern lists its most specific symbol first
            for lineno in range(sym.line, sym.end_line + 1):
                idx = _chunk_index(lines, meta, lineno)
                if not 0 <= idx < len(lines):
                    continue
                code = lines[idx].strip()
                if re.search(rf"\b{re.escape(leaf)}\b", code) and not _is_logging(code):
                    eid = log.add("L4", "source", f"`{function}` decides it at {sym.file}:{lineno}",
                                  f"{sym.file}:{lineno}@{release}", code)
                    evidence.append(eid)
                    return eid, code
    return None


def _is_logging(code: str) -> bool:
    """Comments and debug output mention the deciding quantities without deciding anything."""
    return code.startswith(("//", "LDBG", "LLVM_DEBUG", "DBGS", "#")) or "<<" in code or "dbgs()" in code


def _remarks_of(finding: Finding, log: EvidenceLog) -> list[str]:
    """Messages of the remark evidence in the finding's chain (the compiler's own words)."""
    by_id = {e.id: e for e in log.items}
    return list(dict.fromkeys(by_id[i].excerpt for i in finding.evidence
                              if i in by_id and by_id[i].kind == "remark" and by_id[i].excerpt))


def _excerpt(chunk: tuple[str, dict[str, Any]] | None, sym: Any) -> str:
    if chunk is None:
        return ""
    text, meta = chunk
    lines = text.splitlines()
    start = _chunk_index(lines, meta, sym.line)
    end = min(_chunk_index(lines, meta, sym.end_line) + 1, start + _MAX_EXCERPT_LINES)
    return "\n".join(lines[max(start, 0):max(end, start + 1)])


def _chunk_index(lines: list[str], meta: dict[str, Any], lineno: int) -> int:
    """Index into a chunk's lines of source line `lineno`; C++/Python chunks open with a one-line
    location header the source does not have."""
    header = 1 if lines and lines[0].startswith(("//", "#")) and meta.get("lang") in ("cpp", "python") else 0
    return lineno - int(meta.get("start_line", 1)) + header
