"""Index a compiler's own files: pass definitions (TableGen), C++ headers, Python (pipelines, runtime).

`index_installed_triton` indexes the triton wheel that is installed: from 3.9 it ships
`include/**/*.td` and headers; earlier wheels ship only Python, which is indexed and the gap
reported. The pass pipeline order comes from `backends/*/compiler.py` (`passes.<ns>.add_<x>(pm)`
calls inside `make_*` stage functions), linked to the TableGen pass definitions by name.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.code import DEFAULT_MAX_CHARS, grammar_versions, parse_units
from indexer.tablegen import parse_passes
from kb.home import KBHome
from kb.index import Chunk, Manifest, publish
from kb.symbols import Link, PassDef, Symbol, SymbolStore

__all__ = ["COMPILER_CORPUS", "IndexReport", "collect_compiler_files", "index_compiler_tree", "index_installed_triton"]

COMPILER_CORPUS = "compiler"
MAX_FILE_BYTES = 512 * 1024
_LANG_BY_SUFFIX = {".td": "tablegen", ".h": "cpp", ".hpp": "cpp", ".cpp": "cpp", ".cc": "cpp", ".py": "python"}
# passes.ttgpuir.add_coalesce(pm)   nvidia.passes.ttnvgpuir.add_tma_lowering(pm)
_PIPELINE_CALL = re.compile(r"\b(?P<call>(?:\w+\.)*passes\.(?P<ns>\w+)\.add_(?P<name>\w+))\s*\(")
_STAGE_FN = re.compile(r"^\s*def (?P<name>make_\w+|add_stages|\w+_to_\w+)\(")
# Prefixes dropped when matching a pipeline call name (`add_coalesce`) to a pass argument.
_PASS_PREFIXES = ("tritongpu-", "triton-nvidia-gpu-", "triton-nvidia-", "tritonamdgpu-", "triton-amdgpu-",
                  "triton-", "ttg-", "ttng-", "nvgpu-", "convert-", "")


@dataclass
class IndexReport:
    release: str
    files_indexed: Counter[str] = field(default_factory=Counter)
    files_skipped: Counter[str] = field(default_factory=Counter)
    chunks: int = 0
    symbols: int = 0
    passes: int = 0
    links: int = 0
    notes: list[str] = field(default_factory=list)


def installed_triton_root() -> tuple[Path, str]:
    import importlib.util
    from importlib.metadata import version

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        from harness.errors import UserFacingError

        raise UserFacingError("triton is not installed", "pip install triton (>= 3.9 ships the .td pass definitions)")
    return Path(spec.origin).parent, version("triton")


def collect_compiler_files(root: Path, report: IndexReport, include: Callable[[str], bool] | None = None
                           ) -> list[tuple[Path, str]]:
    """Files to index under `root` with their language; everything else is counted as skipped."""
    files = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or ".git" in path.parts:
            continue
        if include is not None and not include(path.relative_to(root).as_posix()):
            report.files_skipped["outside the compiler"] += 1
            continue
        lang = _LANG_BY_SUFFIX.get(path.suffix)
        if lang is None:
            report.files_skipped[f"other ({path.suffix or 'no suffix'})"] += 1
            continue
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            report.files_skipped["too large"] += 1
            report.notes.append(f"skipped {path.relative_to(root)}: {size // 1024} KiB > {MAX_FILE_BYTES // 1024} KiB")
            continue
        files.append((path, lang))
    return files


# What of an installed wheel is the compiler: its own headers and pass definitions, the stage
# pipelines, and the Python front end and runtime. Vendor SDK headers (backends/*/include: CUDA,
# HIP), profilers, tools and experimental dialects are left out.
_WHEEL_PARTS = ("include/", "backends/", "compiler/", "runtime/", "language/", "knobs.py", "testing.py")
_WHEEL_EXCLUDED = re.compile(r"^backends/[^/]+/(include|lib|bin)/")


def index_installed_triton(home: KBHome, embedder: Any, progress: Callable[[str, int, int], None] | None = None
                           ) -> tuple[Manifest, IndexReport]:
    root, version = installed_triton_root()
    release = f"triton-{version}"

    def wheel_filter(rel: str) -> bool:
        return rel.startswith(_WHEEL_PARTS) and not _WHEEL_EXCLUDED.match(rel)

    manifest, report = index_compiler_tree(home, embedder, root, release, progress=progress, include=wheel_filter,
                                           source={"kind": "installed-wheel", "path": str(root), "version": version})
    if not any(lang == "tablegen" for lang in report.files_indexed):
        report.notes.append(
            f"triton {version} ships no .td pass definitions (wheels before 3.9 do not): passes are known only "
            "by their pipeline calls; index a source checkout with `kb index compiler --source DIR` for more"
        )
    return manifest, report


def index_compiler_tree(
    home: KBHome,
    embedder: Any,
    root: Path,
    release: str,
    *,
    corpus: str = COMPILER_CORPUS,
    source: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    include: Callable[[str], bool] | None = None,
) -> tuple[Manifest, IndexReport]:
    """Parse, chunk, embed and publish every supported file under `root` as (corpus, release)."""
    report = IndexReport(release)
    files = collect_compiler_files(root, report, include)
    chunks: list[Chunk] = []
    symbols: list[Symbol] = []
    passes: list[PassDef] = []
    pipeline: list[Symbol] = []
    for i, (path, lang) in enumerate(files):
        rel = path.relative_to(root).as_posix()
        if progress:
            progress("parse", i + 1, len(files))
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            report.files_skipped["binary"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            report.files_skipped["not utf-8"] += 1
            continue
        if path.name.endswith(".inc") or "GENERATED" in text[:300]:
            report.files_skipped["generated"] += 1
            continue
        report.files_indexed[lang] += 1
        if lang == "tablegen":
            _index_tablegen(rel, text, release, chunks, symbols, passes)
        else:
            _index_code(rel, raw, lang, release, chunks, symbols)
            if lang == "python":
                pipeline.extend(_pipeline_calls(rel, text, release))
    symbols.extend(pipeline)
    links = _link_pipeline_to_passes(pipeline, passes, release)

    manifest = publish(
        home, corpus, release, chunks,
        chunker={"kind": "tree-sitter+tablegen", "max_chars": DEFAULT_MAX_CHARS, "grammars": grammar_versions()},
        source=source or {"path": str(root)},
        embedder=embedder,
        progress=(lambda done, total: progress("embed", done, total)) if progress else None,
    )
    store = SymbolStore(home.symbols_db)
    try:
        store.replace_release(release, symbols, passes, links)
    finally:
        store.close()
    report.chunks, report.symbols, report.passes, report.links = len(chunks), len(symbols), len(passes), len(links)
    return manifest, report


def _chunk_id(corpus_release: str, rel: str, start: int, text: str) -> str:
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{corpus_release}:{rel}#{start}:{digest}"


def _index_tablegen(rel: str, text: str, release: str, chunks: list[Chunk], symbols: list[Symbol],
                    passes: list[PassDef]) -> None:
    for p in parse_passes(text):
        cid = _chunk_id(release, rel, p.line, p.text)
        options = "; ".join(f"{o.get('argument')}={o.get('default', '')} ({o.get('description', '')})"
                            for o in p.options)
        doc = (f"Pass {p.def_name} ({p.argument}): {p.summary}\n{p.description}\n"
               + (f"Options: {options}\n" if options else "") + f"\n{p.text}")
        chunks.append(Chunk(cid, doc[:6000], _meta(rel, p.line, p.end_line, p.def_name, "pass", "tablegen", release)))
        passes.append(PassDef(release, p.def_name, p.argument, p.summary, p.description, p.options, rel, p.line,
                              p.end_line))
        for name in (p.def_name, p.argument):
            symbols.append(Symbol(release, name, "pass", "tablegen", rel, p.line, p.end_line, "def", cid))
    if not parse_passes(text):
        # Op, attribute and dialect definitions: chunk by syntax-free line windows of whole records.
        _index_tablegen_records(rel, text, release, chunks, symbols)


_RECORD = re.compile(r"^(?:def|class|multiclass)\s+(?P<name>\w+)", re.MULTILINE)


def _index_tablegen_records(rel: str, text: str, release: str, chunks: list[Chunk], symbols: list[Symbol]) -> None:
    starts = [m for m in _RECORD.finditer(text)]
    lines = text.splitlines()
    bounds = [text.count("\n", 0, m.start()) for m in starts] + [len(lines)]
    group_start = 0
    group: list[tuple[str, int, int]] = []
    size = 0
    for m, start, end in zip(starts, bounds, bounds[1:]):
        record_len = sum(len(lines[i]) + 1 for i in range(start, end))
        if group and size + record_len > DEFAULT_MAX_CHARS:
            _emit_record_group(rel, lines, release, group_start, group, chunks, symbols)
            group, size = [], 0
        if not group:
            group_start = start
        group.append((m["name"], start, end))
        size += record_len
    if group:
        _emit_record_group(rel, lines, release, group_start, group, chunks, symbols)


def _emit_record_group(rel: str, lines: list[str], release: str, start: int, group: list[tuple[str, int, int]],
                       chunks: list[Chunk], symbols: list[Symbol]) -> None:
    end = group[-1][2]
    text = "\n".join(lines[start:end]).strip()
    if not text:
        return
    cid = _chunk_id(release, rel, start + 1, text)
    chunks.append(Chunk(cid, text, _meta(rel, start + 1, end, group[0][0], "tablegen-def", "tablegen", release)))
    for name, s, e in group:
        symbols.append(Symbol(release, name, "tablegen-def", "tablegen", rel, s + 1, e, "def", cid))


def _index_code(rel: str, raw: bytes, lang: str, release: str, chunks: list[Chunk], symbols: list[Symbol]) -> None:
    for unit in parse_units(raw, lang):
        cid = _chunk_id(release, rel, unit.start_line, unit.text)
        header = f"// {rel} {unit.symbol}\n" if lang == "cpp" else f"# {rel} {unit.symbol}\n"
        chunks.append(Chunk(cid, header + unit.text,
                            _meta(rel, unit.start_line, unit.end_line, unit.symbol, unit.kind, lang, release)))
        for name, kind, line, end in unit.definitions:
            role = "decl" if kind == "declaration" else "def"
            symbols.append(Symbol(release, name, kind, lang, rel, line, end, role, cid))


def _meta(rel: str, start: int, end: int, symbol: str, kind: str, lang: str, release: str) -> dict[str, Any]:
    return {"file": rel, "start_line": start, "end_line": end, "symbol": symbol, "kind": kind, "lang": lang,
            "release": release}


def _pipeline_calls(rel: str, text: str, release: str) -> list[Symbol]:
    """`passes.<ns>.add_<x>(...)` calls, tagged with the stage function (make_ttgir, ...) they are in."""
    out = []
    stage = ""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _STAGE_FN.match(line):
            stage = m["name"]
        for m in _PIPELINE_CALL.finditer(line):
            call = m["call"].split("passes.", 1)[1]  # ttgpuir.add_coalesce
            out.append(Symbol(release, f"passes.{call}", f"pipeline-call:{stage}", "python", rel, lineno, lineno, "ref"))
    return out


def _normalize(name: str) -> str:
    return re.sub(r"[-_]", "", name.lower())


def _link_pipeline_to_passes(pipeline: list[Symbol], passes: list[PassDef], release: str) -> list[Link]:
    """Link each pipeline call to the pass it adds: `add_remove_layout_conversions` -> `tritongpu-remove-layout-conversions`.

    The binding table lives in C++ (python/src/passes.cc), which wheels do not ship, so the match
    is by name with dialect prefixes dropped, and marked as such.
    """
    by_key: dict[str, list[PassDef]] = {}
    for p in passes:
        for prefix in _PASS_PREFIXES:
            if p.argument.startswith(prefix):
                by_key.setdefault(_normalize(p.argument[len(prefix):]), []).append(p)
        by_key.setdefault(_normalize(p.def_name), []).append(p)
    links = []
    for sym in pipeline:
        short = sym.name.rsplit(".add_", 1)[1]
        candidates = by_key.get(_normalize(short), [])
        unique = {p.argument: p for p in candidates}
        if len(unique) == 1:
            p = next(iter(unique.values()))
            links.append(Link(release, "pipeline-call", sym.name, "adds-pass", "pass", p.argument, "name-match"))
    return links
