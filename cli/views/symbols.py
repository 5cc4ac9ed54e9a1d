"""`kb symbols NAME`: one name, everything the symbol store knows about it, with citations.

Gathers definitions, the TableGen pass record, references (calls, lit-test uses, IR steps), the
diagnostics matching a printed message, and the cross-layer links reachable in two hops (pipeline
call -> pass -> implementing class / factory / lit tests).
"""

from __future__ import annotations

import difflib
import json
import re
from collections import deque
from dataclasses import asdict, dataclass, field

from kb.symbols import Link, PassDef, Symbol, SymbolStore

__all__ = ["SymbolView", "describe", "render"]

_MAX_LINKS = 60
_GEN_PASS = re.compile(r"GEN_PASS_(?:DEF|DECL)_(?P<record>\w+)")


@dataclass
class SymbolView:
    name: str
    definitions: list[Symbol] = field(default_factory=list)
    passes: list[PassDef] = field(default_factory=list)
    references: list[Symbol] = field(default_factory=list)
    reference_count: int = 0
    diagnostics: list[Symbol] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    similar: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.definitions or self.passes or self.references or self.diagnostics or self.links)

    def to_json(self) -> str:
        return json.dumps({k: ([asdict(x) for x in v] if isinstance(v, list) and v and not isinstance(v[0], str)
                               else v) for k, v in self.__dict__.items()}, indent=1)


def describe(store: SymbolStore, name: str, release: str | None = None, max_refs: int = 10) -> SymbolView:
    from harness.ir import dump_header_pass

    name = dump_header_pass(name) or name  # a pasted "IR Dump Before X: x-arg" line means its pass
    view = SymbolView(name)
    found = store.find(name, release)
    view.definitions = [s for s in found if s.role in ("def", "decl")]
    uses = [s for s in found if s.role not in ("def", "decl")]
    view.reference_count = len(uses)
    view.references = uses[:max_refs]
    releases = [release] if release else store.releases()  # a scan of the store: once, not per lookup
    for lookup in (store.pass_by_argument, store.pass_by_def):
        for rel in releases:
            p = lookup(name, rel)
            if p is not None and p not in view.passes:
                view.passes.append(p)
    if macro := _GEN_PASS.fullmatch(name):
        # GEN_PASS_DEF_TRITONGPUCOALESCE is generated from the record `def TritonGPUCoalesce`.
        view.passes += [p for rel in releases for p in store.passes(rel)
                        if p.def_name.upper() == macro["record"] and p not in view.passes]
    if not found and (" " in name.strip() or len(name) > 40):
        view.diagnostics = store.find_message(name, release)
    seeds = {name} | {p.argument for p in view.passes} | {d.qualified for d in view.definitions}
    if any(d.kind == "pybind" for d in view.definitions):  # its links name the call: passes.ttir.add_x
        seeds |= set(store.pipeline_calls_of(name, release))
    seeds |= {d.scope for d in view.diagnostics if d.scope}
    seeds |= {d.name for d in view.diagnostics}
    view.links = _walk(store, seeds, release)
    if not view.found:
        short = name.split("::")[-1]
        candidates = {s.name for s in store.search_names(short[:5], release, 500)}
        view.similar = difflib.get_close_matches(short, sorted(candidates), n=5, cutoff=0.75)
    return view


# The second hop goes only through passes, factories and pipeline calls (pass -> createX <- add_x).
# Not through a lit test (its other passes are not this one's), a class (another class of that name
# implements another pass: PlanMemoryPass in regbase/), an op or a file: those fan out to neighbours.
_WALKED_KINDS = frozenset({"pass", "function", "pipeline-call"})


def _walk(store: SymbolStore, seeds: set[str], release: str | None, depth: int = 2) -> list[Link]:
    """Links reachable from `seeds` in `depth` hops (both directions), de-duplicated, capped."""
    seen: dict[Link, None] = {}
    frontier = deque((s, 0) for s in sorted(seeds))  # sorted: under the cap, which links show must not vary by run
    visited = set(seeds)
    while frontier and len(seen) < _MAX_LINKS:
        node, level = frontier.popleft()
        for link in store.links_of(node, release):
            seen.setdefault(link)
            if level + 1 < depth:
                for nxt, kind in ((link.src, link.src_kind), (link.dst, link.dst_kind)):
                    if nxt not in visited and kind in _WALKED_KINDS:
                        visited.add(nxt)
                        frontier.append((nxt, level + 1))
    return list(seen)[:_MAX_LINKS]


def render(view: SymbolView) -> str:
    out = [view.name]
    releases = sorted({x.release for xs in (view.passes, view.definitions, view.diagnostics, view.references)
                       for x in xs})
    if len(releases) > 1:  # without --release every release answers; say so before the list repeats itself
        out.append(f"  in {len(releases)} releases: {', '.join(releases)} (one of them: --release NAME)")
    for p in view.passes:
        out.append(f"  pass {p.def_name} ({p.argument}) {p.cite()}: {p.summary}")
        if p.options:
            out.append("    options: " + ", ".join(f"{o.get('argument')}={o.get('default', '')}" for o in p.options))
        if p.constructor:
            out.append(f"    factory: {p.constructor}")
    for d in view.definitions:
        # A pybind binding's scope is the factory it binds, not a namespace it lives in.
        label = f"{d.name} (binds {d.scope})" if d.kind == "pybind" and d.scope else d.qualified
        out.append(f"  {d.role} {d.kind} {label}  {d.cite()}")
    for d in view.diagnostics:
        out.append(f"  {d.kind} \"{d.name}\"  emitted by {d.scope or '?'}  {d.cite()}")
    if view.references:
        more = view.reference_count - len(view.references)
        out.append(f"  used ({view.reference_count}):")
        for r in view.references:
            by = f" in {r.scope}" if r.scope else ""
            out.append(f"    {r.kind}{by}  {r.cite()}")
        if more > 0:
            out.append(f"    ... {more} more (--refs N)")
    if view.links:
        out.append("  links:")
        for lk in sorted(view.links, key=lambda lk: lk.release):  # stable: each release's links together
            out.append(f"    {lk.src_kind} {lk.src} -{lk.relation}-> {lk.dst_kind} {lk.dst}  [{lk.evidence}; {lk.release}]")
    return "\n".join(out)
