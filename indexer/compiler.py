"""Index a compiler release: a source checkout (`index_compiler_tree`) or the installed wheel.

Files are C++ (tree-sitter), Python (tree-sitter; `passes.<ns>.add_<x>(pm)` pipeline calls inside
`make_*` stage functions), TableGen (pass and op records) and MLIR lit tests; each parses into a
release-agnostic `ParsedFile` (cached by content), the release is assembled from them, links are
resolved across all files (`indexer.links`), and the result is published as one (corpus, release)
index plus its symbol-store rows. The installed wheel (3.9 ships `include/**/*.td` and headers, no
.cpp) is indexed the same way with a filter on what of it is the compiler.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.ir.files import entries_under, os_reason
from indexer.code import DEFAULT_MAX_CHARS, grammar_versions, parse_code
from indexer.links import resolve_links
from indexer.mlir import parse_lit_test
from indexer.parsed import PARSER_VERSION, ParseCache, ParsedFile, Unit, content_key
from indexer.tablegen import parse_tablegen
from kb.home import KBHome
from kb.index import Chunk, Manifest, publish, texts_to_embed
from kb.lexical import code_lead, name_words
from kb.releases import check_corpus, check_name, check_release_name
from kb.symbols import PassDef, SourceFile, Symbol, SymbolStore

if TYPE_CHECKING:
    from kb.embed import OfflineEmbedding


__all__ = ["COMPILER_CORPUS", "IndexReport", "collect_compiler_files", "index_compiler_tree", "index_installed_triton"]

COMPILER_CORPUS = "compiler"
MAX_FILE_BYTES = 512 * 1024
_LANG_BY_SUFFIX = {".td": "tablegen", ".h": "cpp", ".hpp": "cpp", ".cpp": "cpp", ".cc": "cpp", ".py": "python",
                   ".mlir": "mlir"}


@dataclass
class IndexReport:
    release: str
    files_indexed: Counter[str] = field(default_factory=Counter)
    files_skipped: Counter[str] = field(default_factory=Counter)
    files_parsed: int = 0  # parsed now
    files_reused: int = 0  # content seen before: taken from the parse cache
    chunks: int = 0
    texts_to_embed: int = 0  # distinct embedding texts (cases of one lit test share one)
    texts_new: int = 0  # of those, not in the embedding cache: what this run embeds
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


# Vendor SDK headers and build outputs inside source checkouts: not the compiler (HIP/roctracer
# headers alone are ~1 MB in triton's tree).
_VENDOR = re.compile(r"(^|/)(third_party/[^/]+/backend/include|build|llvm-project)/")


def collect_compiler_files(root: Path, report: IndexReport, include: Callable[[str], bool] | None = None
                           ) -> list[tuple[Path, str]]:
    """Files to index under `root` with their language; everything else is counted as skipped."""
    files = []
    real_root = root.resolve()
    def unlistable(rel: str, reason: str) -> None:
        report.files_skipped["unreadable directory"] += 1
        report.notes.append(f"skipped {rel}/: unreadable directory ({reason})")

    for path in entries_under(root, unlistable, prune=(".git", "__pycache__")):
        if "__pycache__" in path.parts or ".git" in path.parts:  # a tree checked out inside one, too
            continue
        rel = path.relative_to(root).as_posix()
        if not path.is_file():  # a link to nothing (or a loop), a FIFO, a socket: said, not read
            why = "broken link" if path.is_symlink() else "not a regular file"
            report.files_skipped[why] += 1
            report.notes.append(f"skipped {rel!r}: {why}")
            continue
        try:
            rel.encode("utf-8")  # a name in another encoding decodes to surrogates: no store takes it
        except UnicodeEncodeError:
            report.files_skipped["file name not UTF-8"] += 1
            report.notes.append(f"skipped {rel.encode('utf-8', 'surrogateescape')!r}: its name is not UTF-8")
            continue
        if any(ord(c) < 32 for c in rel):  # a newline in a name would break every one-line citation of it
            report.files_skipped["control character in file name"] += 1
            report.notes.append(f"skipped {rel!r}: its name holds a control character")
            continue
        if path.is_symlink() and not path.resolve().is_relative_to(real_root):
            report.files_skipped["link out of the tree"] += 1
            report.notes.append(f"skipped {rel}: a link to {path.resolve()}, outside the tree")
            continue
        if include is not None and not include(rel):
            report.files_skipped["outside the compiler"] += 1
            continue
        if include is None and _VENDOR.search(rel):
            report.files_skipped["vendor headers / build output"] += 1
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


def index_installed_triton(home: KBHome, embedder: OfflineEmbedding, progress: Callable[[str, int, int], None] | None = None,
                           publish_lock: Callable[[], AbstractContextManager[None]] | None = None
                           ) -> tuple[Manifest, IndexReport]:
    root, version = installed_triton_root()
    release = f"triton-{version}"

    def wheel_filter(rel: str) -> bool:
        return rel.startswith(_WHEEL_PARTS) and not _WHEEL_EXCLUDED.match(rel)

    manifest, report = index_compiler_tree(home, embedder, root, release, progress=progress, include=wheel_filter,
                                           source={"kind": "installed-wheel", "path": str(root), "version": version},
                                           publish_lock=publish_lock)
    if not any(lang == "tablegen" for lang in report.files_indexed):
        report.notes.append(
            f"triton {version} ships no .td pass definitions (wheels before 3.9 do not): passes are known only "
            "by their pipeline calls; index a source checkout with `kb index compiler --source DIR` for more"
        )
    return manifest, report


def index_compiler_tree(
    home: KBHome,
    embedder: OfflineEmbedding,
    root: Path,
    release: str,
    *,
    corpus: str = COMPILER_CORPUS,
    source: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    include: Callable[[str], bool] | None = None,
    publish_lock: Callable[[], AbstractContextManager[None]] | None = None,
) -> tuple[Manifest, IndexReport]:
    """Parse, chunk, embed and publish every supported file under `root` as (corpus, release).

    Files whose content was parsed before (any release, any path) come from the parse cache and
    chunks whose text was embedded before come from the embedding cache, so indexing a new tag
    costs roughly its changed files; an interrupted run resumes from both caches.

    The caller holds the home's write lock, or, with `publish_lock` (`home.lock(write=True)`),
    only the build lock: parsing and embedding then run while readers keep querying, and the write
    lock is taken to store and publish.
    """
    check_name(corpus, "--corpus")
    check_release_name(home, release, ir_dump=False)
    check_corpus(home, corpus, release)
    report = IndexReport(release)
    files = collect_compiler_files(root, report, include)
    parsed_files: list[tuple[str, str, ParsedFile]] = []  # (rel, sha256, parsed)
    cache = ParseCache(home.parse_cache_db)
    try:
        for i, (path, lang) in enumerate(files):
            if progress:
                progress("parse", i + 1, len(files))
            rel = path.relative_to(root).as_posix()
            try:
                raw = path.read_bytes()
            except OSError as exc:  # unreadable (permissions, a file gone since the walk): skipped and named
                report.files_skipped["unreadable"] += 1
                report.notes.append(f"skipped {rel}: unreadable ({os_reason(exc)})")
                continue
            text, why_not = _source_bytes(path, raw)
            if why_not:
                report.files_skipped[why_not] += 1
                if why_not != "generated":  # generated files are many and expected; the others are news
                    report.notes.append(f"skipped {rel}: {why_not}")
                continue
            if text != raw:
                report.notes.append(f"{rel}: bytes that are not UTF-8 were replaced (U+FFFD) to index the rest")
                raw = text
            key = content_key(lang, raw)
            parsed = cache.get(key)
            if parsed is None:
                parsed = _parse(raw, lang)
                cache.put(key, parsed)
                report.files_parsed += 1
            else:
                report.files_reused += 1
            report.files_indexed[lang] += 1
            parsed_files.append((rel, hashlib.sha256(raw).hexdigest(), parsed))
    finally:
        cache.close()

    chunks, symbols, passes, source_files = _assemble(parsed_files, release)
    if not chunks:
        from harness.errors import UserFacingError

        skipped = ", ".join(f"{n} {why}" for why, n in report.files_skipped.most_common()) or "no files at all"
        raise UserFacingError(f"nothing to index in {root}: no C++, Python, TableGen or MLIR source ({skipped})",
                              "point --source at a compiler checkout's root; the index of any earlier run is unchanged")
    links, op_symbols = resolve_links([(rel, pf) for rel, _, pf in parsed_files], passes, symbols, release)
    symbols += _attach_chunks(op_symbols, chunks)
    distinct = texts_to_embed(chunks)
    report.texts_to_embed = len(distinct)
    if publish_lock is not None:
        # The slow part, into the embedding cache: publishing below then reads every vector from it.
        report.texts_new = embedder.fill_cache(
            distinct, on_progress=(lambda done: progress("embed", done, len(distinct))) if progress else None)
    else:
        report.texts_new = len(embedder.missing(distinct)) if hasattr(embedder, "missing") else len(distinct)
    with publish_lock() if publish_lock is not None else nullcontext():
        store = SymbolStore(home.symbols_db)
        try:
            manifest = publish(
                home, corpus, release, chunks,
                chunker={"kind": "tree-sitter+tablegen+lit", "max_chars": DEFAULT_MAX_CHARS,
                         "grammars": grammar_versions(), "parser_version": PARSER_VERSION},
                source={**(source or {"path": str(root.resolve())}), "files": len(source_files)},
                embedder=embedder,
                progress=(lambda done, total: progress("store" if publish_lock else "embed", done, total))
                if progress else None,
                before_switch=lambda collection: store.mark_publishing(release, collection),
            )
            store.replace_release(release, symbols, passes, links, source_files)  # clears the mark
        finally:
            store.close()
    report.chunks, report.symbols, report.passes, report.links = len(chunks), len(symbols), len(passes), len(links)
    return manifest, report


# A source file that is UTF-8 but for a few stray bytes (a Latin-1 name in a comment) is indexed with
# them replaced; more bad bytes than this (or than 1% of the file) means it is in another encoding.
_MAX_BAD_BYTES = 16


def _source_bytes(path: Path, raw: bytes) -> tuple[bytes, str]:
    """The bytes to index and why the file cannot be indexed as source text ("" when it can)."""
    if b"\0" in raw[:8192]:
        return raw, "binary"
    try:
        head = raw.decode("utf-8")[:300]
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        if text.count("\ufffd") > max(_MAX_BAD_BYTES, len(raw) // 100):
            return raw, "not utf-8"
        raw, head = text.encode(), text[:300]
    if path.name.endswith(".inc") or "GENERATED" in head:
        return raw, "generated"
    return raw, ""


def _parse(raw: bytes, lang: str) -> ParsedFile:
    if lang == "tablegen":
        return parse_tablegen(raw)
    if lang == "mlir":
        return parse_lit_test(raw)
    return parse_code(raw, lang)


def _assemble(parsed_files: list[tuple[str, str, ParsedFile]], release: str
              ) -> tuple[list[Chunk], list[Symbol], list[PassDef], list[SourceFile]]:
    """Release-agnostic parses -> this release's chunks, symbols, passes and file list."""
    chunks: list[Chunk] = []
    symbols: list[Symbol] = []
    passes: list[PassDef] = []
    source_files: list[SourceFile] = []
    for rel, sha, parsed in parsed_files:
        ids: list[str] = []
        seen: Counter[str] = Counter()
        for unit in parsed.units:
            text = unit.text if parsed.lang == "tablegen" and unit.kind == "pass" else _with_header(rel, unit,
                                                                                                     parsed.lang)
            digest = hashlib.sha1(text.encode()).hexdigest()[:12]
            seen[digest] += 1
            cid = f"{rel}#{digest}" + (f"~{seen[digest]}" if seen[digest] > 1 else "")
            ids.append(cid)
            embed = f"{name_words(rel)}\n{unit.summary}" if unit.summary else ""
            if not embed and not unit.symbol and parsed.lang in ("cpp", "python"):
                embed = _glue_summary(rel, unit.text)
            elif not embed and parsed.lang in ("cpp", "python"):
                embed = f"{code_lead(rel, unit.scope, unit.symbol)}\n{unit.text}"
            chunks.append(Chunk(cid, text, {
                "file": rel, "start_line": unit.start_line, "end_line": unit.end_line, "symbol": unit.symbol,
                "scope": unit.scope, "kind": unit.kind, "lang": parsed.lang, "release": release}, embed))
        for sym in parsed.symbols:
            symbols.append(Symbol(release, sym.name, sym.kind, parsed.lang, rel, sym.line, sym.end_line, sym.role,
                                  ids[sym.unit] if 0 <= sym.unit < len(ids) else "", sym.scope, sym.digest))
        for p in parsed.passes:
            passes.append(PassDef(release, p["def_name"], p["argument"], p["summary"], p["description"],
                                  p["options"], rel, p["line"], p["end_line"], p.get("constructor", "")))
        source_files.append(SourceFile(release, rel, sha, parsed.lang, len(parsed.units)))
    return chunks, symbols, passes, source_files


_BOILERPLATE = re.compile(r"^\s*(//|#\s*include|#\s*pragma|/\*|\*|import |from \S+ import|#|using namespace|$)")


def _glue_summary(rel: str, text: str) -> str:
    """Embedding text of a chunk that defines nothing (license, includes, glue): its path and first
    real lines. Licence headers and include lists say nothing a question asks, and at ~20% of C++
    chunks they would cost a fifth of the embedding time."""
    lines = [ln.strip() for ln in text.splitlines() if not _BOILERPLATE.match(ln)]
    return f"{name_words(rel)}\n" + " ".join(lines)[:300]


def _attach_chunks(op_symbols: list[Symbol], chunks: list[Chunk]) -> list[Symbol]:
    """Point each op symbol (named from TableGen records) at the chunk holding its def."""
    by_file: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_file.setdefault(c.metadata["file"], []).append(c)
    out = []
    for sym in op_symbols:
        chunk = next((c for c in by_file.get(sym.file, ())
                      if c.metadata["start_line"] <= sym.line <= c.metadata["end_line"]), None)
        out.append(Symbol(sym.release, sym.name, sym.kind, sym.lang, sym.file, sym.line, sym.end_line, sym.role,
                          chunk.id if chunk else ""))
    return out


def _header_line(rel: str, unit: Unit, lang: str) -> str:
    comment = "#" if lang == "python" else "//"
    name = f"{unit.scope}::{unit.symbol}" if unit.scope and unit.symbol else unit.symbol
    return f"{comment} {rel} {name}".rstrip()


def _with_header(rel: str, unit: Unit, lang: str) -> str:
    # A lit test's summary (the passes its RUN lines run, its ops) heads each of its cases, so
    # "lit tests for <pass>" finds the case that does not repeat the RUN line.
    summary = f"{unit.summary}\n" if unit.kind == "lit-test" and unit.summary else ""
    return f"{_header_line(rel, unit, lang)}\n{summary}{unit.text}"

