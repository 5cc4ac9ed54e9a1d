"""Hybrid retrieval: exact symbol hits, BM25 and vectors.

Indexes are built through llama-index (`kb.index.publish`), but the query path reads the stores
directly: the chroma collection (nearest vectors, texts and metadata by id), our BM25
(`kb.lexical`) and the symbol store. The two rankings are fused here by the same
distribution-based score fusion llama-index's `QueryFusionRetriever` computes (BM25 weighted 0.7,
one query, no LLM), so results are unchanged while a fresh `kb search` no longer imports
llama-index (~2.7 s of a ~4 s command, docs/benchmarks.md). Exact symbol hits lead for name-like
queries and join the ranking by reciprocal rank for sentences (`Searcher.answer`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.errors import UserFacingError
from kb.home import KBHome
from kb.index import Manifest, list_manifests, load_manifest
from kb.lexical import IDENT, LexicalIndex
from kb.releases import IR_CORPUS

if TYPE_CHECKING:
    from kb.embed import OfflineEmbedding
    from kb.symbols import SymbolStore


__all__ = ["Hit", "Searcher", "default_release"]

# Candidates each retriever returns for fusion. More than a page: the priors below (tests last,
# the named vendor's backend first, files with several matching chunks first) re-sort within them,
# so a longer list lets them reach answers ranked 30-100 by the raw scores (dev split: 30 -> 100
# raised hybrid recall@5 from 0.78 to 0.84 at ~40 ms a query).
_RRF_CANDIDATES = 100
# Files that show or exercise the compiler rather than implement it.
_AUX_PATH = re.compile(r"(^|/)(tests?|unittests?|tutorials?|examples?|benchmarks?|docs?|pytest_ut)(/|$)"
                       r"|(^|/)test_[^/]*\.py$|_test\.(py|cpp)$")
_ASKS_FOR_AUX = re.compile(r"\b(tests?|lit|unittests?|examples?|tutorials?|benchmarks?|FileCheck)\b", re.IGNORECASE)
# A Triton tree keeps each vendor's backend under third_party/<vendor>/; a question that names a
# vendor (by name or by its hardware and toolchain words) is about that backend, not the others.
_VENDOR_WORDS = {
    "ascend": re.compile(r"\b(ascend|npu|cann|hivm|bishengir|aic|aiv|ai ?cores?)\b", re.IGNORECASE),
    "nvidia": re.compile(r"\b(nvidia|cuda|ptx|ptxas|cubin|hopper|blackwell|wgmma|tcgen05|sm_?\d{2,3})\b", re.IGNORECASE),
    "amd": re.compile(r"\b(amd|rocm|hip|mfma|wmma|gfx\d+|cdna\d?|rdna\d?)\b", re.IGNORECASE),
}
_VENDOR_DIR = re.compile(r"(^|/)third_party/(" + "|".join(_VENDOR_WORDS) + r")/")


@dataclass
class Hit:
    id: str
    text: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)
    via: str = "hybrid"  # symbol | hybrid | bm25 | vector

    def cite(self) -> str:
        m = self.metadata
        if m.get("file"):
            return f"{m['file']}:{m.get('start_line', 0)}@{m.get('release', '?')}"
        return self.id

    def cited_text(self) -> str:
        """The hit's text from where it cites: without the chunk's own `// path symbol` header (the
        citation says it), and from the definition it is pinned to when that lies inside the chunk
        (see `_pinned`; a chunk's source is its last lines, since a lit test's summary leads it)."""
        m, text = self.metadata, self.text
        if m.get("file") and text.startswith((f"// {m['file']}", f"# {m['file']}")):
            text = text.split("\n", 1)[-1]
        first, last = m.get("chunk_start_line"), m.get("chunk_end_line")
        if isinstance(first, int) and isinstance(last, int) and m.get("start_line", 0) > first:
            lines = text.split("\n")[-(last - first + 1):]
            text = "\n".join(lines[m["start_line"] - first:])
        return text


def installed_triton_release() -> str | None:
    try:
        from importlib.metadata import version

        return f"triton-{version('triton')}"
    except Exception:  # noqa: BLE001
        return None


def default_release(home: KBHome, corpus: str) -> str | None:
    """The release matching the installed triton if indexed, else the newest indexed one."""
    manifests = [m for m in list_manifests(home) if m.corpus == corpus]
    if not manifests:
        return None
    installed = installed_triton_release()
    for m in manifests:
        if m.release == installed:
            return m.release
    return max(manifests, key=lambda m: m.created).release


class Searcher:
    """Search one published index (corpus, release). Cheap to keep; load once per process."""

    # Chosen on the dev split of the gold set (docs/benchmarks.md): on compiler source BM25 is the
    # stronger retriever, so scores are fused by distribution with BM25 weighted 0.7, not by
    # equal-weight reciprocal rank.
    bm25_weight = 0.7
    # A file whose other chunks also match is more likely the place to look than one lucky chunk:
    # each chunk ranks by its fused score plus this share of its file's other candidates' scores
    # (hybrid mode; 0.2 on the dev split, 0.1 and 0.4 scored a little lower).
    file_weight = 0.2
    symbols_first_max_words = 3  # queries this short are names: exact symbol hits lead

    def __init__(self, home: KBHome, corpus: str, release: str | None = None, embedder: OfflineEmbedding | None = None) -> None:
        from kb.embed import embedder_for

        release = release or default_release(home, corpus)
        manifest = load_manifest(home, corpus, release) if release else None
        if manifest is None:
            elsewhere = sorted({m.corpus for m in list_manifests(home) if m.release == release})
            if release and elsewhere:  # `--release RUN` of a dump with the default corpus, say
                raise UserFacingError(f"{release!r} is indexed in corpus {', '.join(elsewhere)}, not {corpus}",
                                      f"search it with --corpus {elsewhere[0]}")
            known = sorted({f"{m.corpus}@{m.release}" for m in list_manifests(home)}) or ["none"]
            raise UserFacingError(
                f"no index for corpus {corpus!r}" + (f" release {release!r}" if release else "")
                + f" in {home.root} (indexed: {', '.join(known)})",
                "index the dump with `kb index ir PATH --name NAME`" if corpus == IR_CORPUS
                else f"index it with `kb index compiler --source DIR --release {release}`, or pick an indexed "
                "release with --release" if release
                else "build it with `kb index patterns` or `kb index compiler --installed`",
            )
        if home.symbols_db.exists():  # a patterns-only home has no symbol store; opening one would create it
            from kb.releases import check_published
            from kb.symbols import SymbolStore

            store = SymbolStore(home.symbols_db)
            try:  # chunks without their symbols would cite definitions the store does not have
                check_published(store, [manifest])
            finally:
                store.close()
        self.home = home
        self.manifest: Manifest = manifest
        self.embedder = embedder or embedder_for(home, manifest.embed_model)  # the model that built it
        self._collection: Any = None
        self._lexical: LexicalIndex | None = None

    @property
    def release(self) -> str:
        return self.manifest.release

    def _chroma(self) -> Any:
        """The live chroma collection, opened on first use (importing chromadb costs ~0.6 s)."""
        if self._collection is None:
            from kb.vectors import chroma_client, get_collection

            self._collection = get_collection(chroma_client(self.home), self.manifest.collection)
        return self._collection

    def _bm25(self) -> LexicalIndex:
        if self._lexical is None:
            directory = self.home.lexical_dir / self.manifest.collection
            try:
                self._lexical = LexicalIndex.load(directory)
            except (OSError, ValueError, EOFError) as exc:  # deleted or cut short (np.load: EOFError), a full disk
                from kb.releases import reindex_command

                raise UserFacingError(
                    f"the BM25 index of {self.manifest.corpus}@{self.release} ({directory}) is missing or unreadable "
                    f"({type(exc).__name__})", f"rebuild it: {reindex_command(self.manifest)}") from exc
        return self._lexical

    def vector_hits(self, query: str, k: int = _RRF_CANDIDATES) -> list[Hit]:
        """Nearest chunks by cosine distance; score exp(-distance), as llama-index's chroma store gives."""
        found = self._chroma().query(query_embeddings=[self.embedder.query_vector(query)], n_results=k)
        return [_stored_hit(i, text, meta, math.exp(-dist), "vector") for i, text, meta, dist in
                zip(found["ids"][0], found["documents"][0], found["metadatas"][0], found["distances"][0])]

    def bm25_hits(self, query: str, k: int = _RRF_CANDIDATES) -> list[Hit]:
        """BM25 over code tokens; texts and metadata come from the vector store by id."""
        scored = self._bm25().search(query, k)
        stored = {h.id: h for h in self._stored([i for i, _ in scored], "bm25")} if scored else {}
        return [Hit(i, stored[i].text, s, stored[i].metadata, "bm25") for i, s in scored if i in stored]

    def hybrid_hits(self, query: str) -> list[Hit]:
        rankings = [self.vector_hits(query), self.bm25_hits(query)]
        return _dist_fusion(rankings, [1.0 - self.bm25_weight, self.bm25_weight])[:_RRF_CANDIDATES]

    def _stored(self, ids: list[str], via: str) -> list[Hit]:
        found = self._chroma().get(ids=ids)
        return [_stored_hit(i, text, meta, 1.0, via)
                for i, text, meta in zip(found["ids"], found["documents"], found["metadatas"])]

    def search(self, query: str, k: int = 5, mode: str = "hybrid", where: dict[str, Any] | None = None,
               one_per_file: bool = True) -> list[Hit]:
        """Top-k hits; `mode` is hybrid, bm25 or vector; `where` filters on metadata equality.

        Two priors apply to every mode: tests, tutorials and examples rank after compiler source
        unless the query asks for them, and (with `one_per_file`) a file appears once, at its best
        chunk, so five hits are five places to look (in an IR dump, each pass step is a place).
        """
        retrieve: dict[str, Callable[[str], list[Hit]]] = {
            "hybrid": self.hybrid_hits, "bm25": self.bm25_hits, "vector": self.vector_hits}
        if mode not in retrieve:
            raise UserFacingError(f"unknown search mode {mode!r}", "use hybrid, bm25 or vector")
        hits = [Hit(h.id, h.text, h.score, h.metadata, mode) for h in retrieve[mode](query)]
        if where:
            hits = [h for h in hits if all(h.metadata.get(key) == val for key, val in where.items())]
        if mode == "hybrid":
            hits = _with_file_support(hits, self.file_weight)
        if not _ASKS_FOR_AUX.search(query):
            hits.sort(key=_is_aux)  # stable: keeps rank order
        hits = _named_vendor_first(hits, query)
        hits = _ir_direction_first(hits, query)
        if one_per_file:
            hits = _one_per_file(hits)
        return hits[:k]

    def answer(self, query: str, k: int = 5, mode: str = "hybrid", store: SymbolStore | None = None) -> list[Hit]:
        """What `kb search` returns. In hybrid mode, a query that is a name (a few words at most)
        gets the chunks defining it first (exact, from the symbol store), then the fused ranking;
        in a sentence, identifiers are one clue among others, so their definitions join the
        fusion as a third ranked list instead of jumping the queue."""
        symbol_hits = self.symbol_hits(query, store) if mode == "hybrid" and store is not None else []
        if len(query.split()) <= self.symbols_first_max_words:
            hits = symbol_hits[:k]
            seen = {h.id for h in hits}
            hits += [h for h in self.search(query, k=k + len(hits), mode=mode) if h.id not in seen]
            return _one_per_file(hits)[:k]
        ranked = self.search(query, k=_RRF_CANDIDATES, mode=mode)
        symbol_hits = _named_vendor_first(symbol_hits, query)  # the same prior as the fused list's
        if symbol_hits:
            scores: dict[str, float] = {}
            by_id: dict[str, Hit] = {}
            for ranking in (ranked, symbol_hits):  # first seen first among equal scores
                for rank, hit in enumerate(ranking):
                    scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (60 + rank)
                    if hit.id not in by_id or ranking is symbol_hits:
                        by_id[hit.id] = hit  # a symbol hit's copy cites the definition; the slot stays
            ranked = sorted(by_id.values(), key=lambda h: -scores[h.id])
        if mode == "hybrid" and store is not None:
            ranked = self._with_pass_implementations(ranked, store, query)
        return _one_per_file(_named_vendor_first(ranked, query))[:k]

    def _with_pass_implementations(self, ranked: list[Hit], store: SymbolStore, query: str) -> list[Hit]:
        """Each TableGen pass record in the ranking gives its place to the code it describes.

        A record (`def SplitMixKernel : Pass<...>`) matches a question's words well because its
        summary spells out what the pass does, but the answer to "where/how is X done" is the
        implementing class, reached through the symbol store's pass links; a question about tests
        gets the pass's lit test instead. The record itself follows the candidates (`kb symbols`
        shows it with its links): kept in place, records whose code was added pushed the other
        candidates down (dev split: recall@5 0.59 vs 0.63 for sentences)."""
        wants_tests = bool(_ASKS_FOR_AUX.search(query))
        out: list[Hit] = []
        placed: set[str] = set()  # ids in `out`
        later: list[Hit] = []
        for hit in ranked[:_RRF_CANDIDATES]:
            code = []
            if hit.metadata.get("kind") == "pass" and hit.metadata.get("lang") == "tablegen":
                code = [h for h in self._pass_code(hit.metadata.get("symbol", ""), store, wants_tests)
                        if h.id not in placed]
                out += code
                placed.update(h.id for h in code)
            if hit.id not in placed:
                if code:
                    later.append(hit)
                else:
                    out.append(hit)
                    placed.add(hit.id)
        return out + later + ranked[_RRF_CANDIDATES:]

    def _pass_code(self, def_name: str, store: SymbolStore, tests: bool) -> list[Hit]:
        record = store.pass_by_def(def_name, self.release) if def_name else None
        if record is None:
            return []
        links = store.links_of(record.argument, self.release)
        ids: list[str] = []
        matched: dict[str, Any] = {}
        if tests:
            files = [lk.src for lk in links if lk.relation == "tests-pass"]
            # the test named after the pass (hivm-mark-multi-buffer -> mark-multi-buffer.mlir) first
            words = set(record.argument.split("-"))
            files.sort(key=lambda f: -len(words & set(re.split(r"[-_.]", f.rsplit("/", 1)[-1]))))
            ids = [i for i in (self._first_chunk_of(f) for f in files[:1]) if i]
        else:
            for lk in links:
                if lk.relation == "implemented-by":
                    # The link says where the class is: another of its name elsewhere
                    # (regbase/PlanMemory.cpp beside PlanMemory.cpp) is not this pass's. Stores
                    # written before links had dst_file say it in the evidence ("base-class at F:L").
                    where = lk.dst_file or (lk.evidence.rsplit(" at ", 1)[-1].rsplit(":", 1)[0]
                                            if " at " in lk.evidence else "")
                    defs = [sym for sym in store.find(lk.dst, release=self.release)
                            if sym.role == "def" and sym.chunk_id]
                    for sym in sorted(defs, key=lambda d: d.file != where)[:1]:
                        ids.append(sym.chunk_id)
                        matched[sym.chunk_id] = sym
            if not ids:
                files = [lk.dst.rsplit(":", 1)[0] for lk in links if lk.relation == "implemented-in"]
                ids = [i for i in (self._first_chunk_of(f) for f in files[:1]) if i]
        hits = [_pinned(h, matched.get(h.id)) for h in self.chunks(ids)]
        for hit in hits:
            hit.via = "pass-link"
        return hits

    def _first_chunk_of(self, file: str) -> str | None:
        found = self._chroma().get(where={"file": file}, limit=1, include=[])
        return found["ids"][0] if found["ids"] else None

    def chunks(self, ids: list[str]) -> list[Hit]:
        """Stored chunks by id (order of `ids`; unknown ids are left out)."""
        by_id = {h.id: h for h in self._stored(ids, "id")} if ids else {}
        return [by_id[i] for i in ids if i in by_id]

    def symbol_hits(self, query: str, store: SymbolStore) -> list[Hit]:
        """Chunks that define an identifier written in the query (exact match): definitions first,
        then at most two uses, so a name used everywhere does not crowd out the ranking.

        Identifiers include pass arguments and flags (`tritongpu-coalesce`, `--enable-auto-multi-buffer`);
        a flag with no symbol of its own also tries its CamelCase record name (`EnableAutoMultiBuffer`),
        the convention of MLIR option and pass records."""
        names = [t for t in IDENT.findall(query) if _looks_like_symbol(t)]
        names += [m.group(1) for m in _FLAG.finditer(query)]
        definitions: list[str] = []
        uses: list[str] = []
        matched: dict[str, Any] = {}  # chunk id -> the symbol that led to it
        for name in dict.fromkeys(names):
            found = store.find(name, release=self.release)
            if not found and name.count("-") >= 2:
                found = store.find("".join(part.capitalize() for part in name.split("-")), release=self.release)
            for sym in found:
                bucket = definitions if sym.role in ("def", "decl") else uses
                if sym.chunk_id and sym.chunk_id not in definitions + uses:
                    bucket.append(sym.chunk_id)
                    matched[sym.chunk_id] = sym
        if _ASKS_HOW_LOWERED.search(query):
            definitions = self._patterns_rewriting(names, store) + definitions
        hits = [_pinned(h, matched.get(h.id)) for h in self.chunks(list(dict.fromkeys(definitions + uses[:2])))]
        for hit in hits:
            hit.via = "symbol"
        return hits

    def _patterns_rewriting(self, names: list[str], store: SymbolStore) -> list[str]:
        """Definition chunks of the rewrite patterns that match an op named in the query: asked how
        `tl.dot` is lowered, the answer is a pattern on `tt.dot` (the symbol store's `rewrites`
        links), not the op's own definition."""
        ids: list[str] = []
        for name in names:
            if "." not in name and "_" not in name:
                continue
            for pattern in store.rewrite_patterns(name, self.release):
                ids += [s.chunk_id for s in store.find(pattern, release=self.release)
                        if s.role == "def" and s.chunk_id][:1]
        return list(dict.fromkeys(ids))


_ASKS_HOW_LOWERED = re.compile(r"\b(lower(s|ed|ing)?|conver(t|ts|ted|sion)|rewrit\w*|legaliz\w*|translat\w*)\b",
                               re.IGNORECASE)
# tritongpu-coalesce, --enable-auto-multi-buffer; hyphenated English ("non-trivial") finds no symbol
_FLAG = re.compile(r"(?<![\w-])-{0,2}([a-z][a-z0-9]*(?:-[a-z0-9]+)+)")


# "where did the vectorized load disappear" / "which pass introduced this convert_layout"
_ASKS_REMOVED = re.compile(r"\b(disappear\w*|vanish\w*|remov\w*|lost|lose\w*|gone|drop\w*|eliminat\w*|delet\w*|"
                           r"erase\w*|fold\w*)\b", re.IGNORECASE)
_ASKS_ADDED = re.compile(r"\b(introduc\w*|appear\w*|add(?:s|ed|ing)?|creat\w*|insert\w*|emit\w*|come from|came from|"
                         r"produc\w*|generat\w*)\b", re.IGNORECASE)


def _ir_direction_first(hits: list[Hit], query: str) -> list[Hit]:
    """A question about an op disappearing (or appearing) ranks first the pass steps that removed
    (or added) an op its words name: `vectorized load` names `vector.load`, `convert_layout` itself.
    The chunks of both steps name the op, so word overlap alone ranks the two either way.

    A layout the question names (`#mma`, `the dot operand layout`) comes before the op: coalesce adds
    convert_layouts, but the one "to #mma" comes from accelerate-matmul, the step where `nvidia_mma`
    first appears (while it adds no convert_layout, it rewrites one)."""
    removed, added = bool(_ASKS_REMOVED.search(query)), bool(_ASKS_ADDED.search(query))
    if removed == added:  # neither, or both (which is asked is unclear)
        return hits
    key = "ops_removed" if removed else "ops_added"
    words = [w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) >= 3]
    layout_words = [w for w in _named_layouts(query) if len(w) >= 3]

    def said(part: str, among: list[str] = words) -> bool:
        return any(w.startswith(part) or part.startswith(w) for w in among)

    def names_layout(hit: Hit) -> bool:
        kinds = str(hit.metadata.get("layouts_removed" if removed else "layouts_added", "")).split()
        return any(said(part, layout_words) for kind in kinds for part in kind.lower().split("_") if len(part) >= 3)

    def how_well_named(hit: Hit) -> int:
        """Parts of the best-named op the step added/removed: an op counts once the query says its
        name (`load`); saying its dialect too (`vector`) ranks it above another dialect's op."""
        best = 0
        for op in str(hit.metadata.get(key, "")).split():
            parts = [p for p in re.split(r"[._()@]", op.lower()) if len(p) >= 3]
            name = [p for p in parts if p not in _DIALECTS]
            if name and all(said(p) for p in name):
                best = max(best, sum(said(p) for p in parts))
        return best

    return sorted(hits, key=lambda h: (not names_layout(h), -how_well_named(h)))  # stable


# `#mma`, `#ttg.dot_op`, "the mma layout", "dot operand encoding": the words that name a layout.
_LAYOUT_NAMED = re.compile(r"#(?:\w+\.)?(\w+)|\b(\w+)[ _-]+(?:(\w+)[ _-]+)?(?:layouts?|encodings?)\b", re.IGNORECASE)


def _named_layouts(query: str) -> list[str]:
    out: list[str] = []
    for m in _LAYOUT_NAMED.finditer(query):
        if m[1]:
            out += m[1].lower().split("_")
        else:  # the one or two words before "layout": "dot operand layout", not "convert_layout"
            out += [w.lower() for w in (m[2], m[3]) if w and w.lower() not in ("convert", "the", "a", "its")]
    return out


# Dialect prefixes name no op by themselves (`ttg` in ttg.convert_layout).
_DIALECTS = {"tt", "ttg", "ttng", "nvgpu", "nvvm", "llvm", "arith", "math", "scf", "memref", "vector", "tensor",
             "linalg", "hivm", "hir", "hfusion", "func", "gpu", "amdgpu", "rocdl", "amdg", "cf", "annotation"}


def _is_aux(hit: Hit) -> bool:
    """Whether the hit's file shows or exercises the compiler (tests, tutorials, examples)."""
    return bool(_AUX_PATH.search(hit.metadata.get("file", "")))


def _named_vendor_first(hits: list[Hit], query: str) -> list[Hit]:
    """When the query names a vendor's backend, hits in that vendor's backend directory come first,
    then code shared by all backends, then the other vendors' backends (stable, so each group keeps
    its rank order). Without a named vendor the order is unchanged."""
    named = {vendor for vendor, words in _VENDOR_WORDS.items() if words.search(query)}
    if not named:
        return hits
    aux_last = not _ASKS_FOR_AUX.search(query)

    def group(hit: Hit) -> tuple[bool, int]:
        match = _VENDOR_DIR.search(hit.metadata.get("file", ""))
        # Tests stay after source (the prior `search` applies), the vendor's own tests included.
        return (aux_last and _is_aux(hit), 1 if not match else (0 if match.group(2) in named else 2))

    return sorted(hits, key=group)


def _with_file_support(hits: list[Hit], weight: float) -> list[Hit]:
    """Hits re-ranked by score + `weight` x the scores of the other candidates from the same file."""
    total: dict[str, float] = {}
    best: dict[str, float] = {}
    for hit in hits:
        place = _place(hit)
        total[place] = total.get(place, 0.0) + hit.score
        best[place] = max(best.get(place, hit.score), hit.score)

    def support(hit: Hit) -> float:
        place = _place(hit)
        return hit.score + weight * (total[place] - best[place])

    return sorted(hits, key=support, reverse=True)


def _place(hit: Hit) -> str:
    """Where an engineer would look: a source chunk's file; each pass step of an IR dump is its own
    place (one dump file holds every pass of a pipeline)."""
    if str(hit.metadata.get("kind", "")).startswith("ir-"):
        return hit.id
    return hit.metadata.get("file") or hit.id


def _pinned(hit: Hit, symbol: Any) -> Hit:
    """The hit labelled and cited as the definition that led to it. A chunk packs several small
    definitions under the name of its largest and starts at its first line: found through one of
    the others (an exact name, a pass link), it would cite the wrong name and line."""
    if symbol is None or hit.metadata.get("kind") == "pass":  # a TableGen pass record is its own chunk
        return hit
    # The chunk's own lines, so a preview can start at the cited line instead of the chunk's first.
    chunk_start = {key: hit.metadata.get(key, hit.metadata.get(key.removeprefix("chunk_")))
                   for key in ("chunk_start_line", "chunk_end_line")}
    if symbol.role not in ("def", "decl"):  # a use: cite its line, the chunk keeps its own name
        return Hit(hit.id, hit.text, hit.score, {**hit.metadata, **chunk_start, "start_line": symbol.line}, hit.via)
    return Hit(hit.id, hit.text, hit.score, {**hit.metadata, **chunk_start, "symbol": symbol.name,
                                             "start_line": symbol.line, "end_line": symbol.end_line}, hit.via)


def _one_per_file(hits: list[Hit]) -> list[Hit]:
    seen: set[str] = set()
    unique = []
    for h in hits:
        place = _place(h)
        if place not in seen:
            seen.add(place)
            unique.append(h)
    return unique


def _looks_like_symbol(token: str) -> bool:
    # CamelCase, snake_case, dotted or scoped names; plain English words are left to BM25/vectors.
    return len(token) >= 4 and bool(re.search(r"[a-z][A-Z]|_|\.|::", token))


# Keys llama-index's chroma store adds beside a node's own metadata (`node_to_metadata_dict`).
_STORE_KEYS = {"_node_content", "_node_type", "document_id", "doc_id", "ref_doc_id"}


def _stored_hit(chunk_id: str, text: str | None, meta: dict[str, Any] | None, score: float, via: str) -> Hit:
    """A chunk as the index stored it: the chunk's own metadata is the node's (in `_node_content`,
    exactly what llama-index would rebuild), else the flat chroma metadata minus the store's keys."""
    meta = meta or {}
    try:
        metadata = dict(json.loads(meta["_node_content"])["metadata"])
    except (KeyError, TypeError, ValueError):
        metadata = {k: v for k, v in meta.items() if k not in _STORE_KEYS}
    return Hit(chunk_id, text or "", score, metadata, via)


def _dist_fusion(rankings: list[list[Hit]], weights: list[float]) -> list[Hit]:
    """Distribution-based score fusion, as llama-index's `QueryFusionRetriever` computes it in
    `dist_based_score` mode with one query: each list's scores are scaled to [mean - 3 sd,
    mean + 3 sd] -> [0, 1] and weighted; a chunk found by both lists (same text and metadata)
    sums its scores and keeps the first list's record; ties keep first-seen order."""
    fused: dict[tuple[str, str], Hit] = {}
    for ranking, weight in zip(rankings, weights):
        if not ranking:
            continue
        scores = [h.score for h in ranking]
        mean = sum(scores) / len(scores)
        sd = (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5
        low, high = mean - 3 * sd, mean + 3 * sd
        for hit in ranking:
            scaled = (1.0 if high > 0 else 0.0) if high == low else (hit.score - low) / (high - low)
            key = (hit.text, str(hit.metadata))
            if key in fused:
                fused[key].score += scaled * weight
            else:
                fused[key] = Hit(hit.id, hit.text, scaled * weight, hit.metadata, hit.via)
    return sorted(fused.values(), key=lambda h: h.score, reverse=True)
