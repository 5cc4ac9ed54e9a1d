"""Hybrid retrieval: exact symbol hits, BM25 and vectors.

Vectors come from chroma through llama-index; BM25 from `kb.lexical`; both are llama-index
retrievers fused by `QueryFusionRetriever` (distribution-based score fusion, BM25 weighted 0.7; no
LLM query rewriting: `num_queries=1`, `MockLLM`). Exact symbol hits lead for name-like queries and
join the ranking by reciprocal rank for sentences (`Searcher.answer`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore

from harness.errors import UserFacingError
from kb.home import KBHome
from kb.index import Manifest, list_manifests, load_manifest
from kb.lexical import IDENT, LexicalIndex

__all__ = ["Hit", "Searcher", "default_release"]

_RRF_CANDIDATES = 30
# Files that show or exercise the compiler rather than implement it.
_AUX_PATH = re.compile(r"(^|/)(tests?|unittests?|tutorials?|examples?|benchmarks?|docs?|pytest_ut)(/|$)"
                       r"|(^|/)test_[^/]*\.py$|_test\.(py|cpp)$")
_ASKS_FOR_AUX = re.compile(r"\b(tests?|lit|unittests?|examples?|tutorials?|benchmarks?|FileCheck)\b", re.IGNORECASE)


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
    fusion_mode = "dist_based_score"
    bm25_weight = 0.7
    symbols_first_max_words = 3  # queries this short are names: exact symbol hits lead

    def __init__(self, home: KBHome, corpus: str, release: str | None = None, embedder: Any = None) -> None:
        from kb.embed import OfflineEmbedding

        release = release or default_release(home, corpus)
        manifest = load_manifest(home, corpus, release) if release else None
        if manifest is None:
            known = sorted({f"{m.corpus}@{m.release}" for m in list_manifests(home)}) or ["none"]
            raise UserFacingError(
                f"no index for corpus {corpus!r}" + (f" release {release!r}" if release else "")
                + f" in {home.root} (indexed: {', '.join(known)})",
                "build it with `kb index patterns` or `kb index compiler --installed`",
            )
        self.home = home
        self.manifest: Manifest = manifest
        self.embedder = embedder or OfflineEmbedding(cache_path=home.embed_cache_db)
        self._fusion: Any = None

    @property
    def release(self) -> str:
        return self.manifest.release

    def _build(self) -> Any:
        from llama_index.core import VectorStoreIndex
        from llama_index.core.llms import MockLLM
        from llama_index.core.retrievers import QueryFusionRetriever
        from llama_index.vector_stores.chroma import ChromaVectorStore

        from kb.vectors import chroma_client, get_collection

        collection = get_collection(chroma_client(self.home), self.manifest.collection)
        self._store = ChromaVectorStore(chroma_collection=collection)
        # Chunks arrive pre-split by syntax and embedded by us; naming our embedder as the only
        # transformation keeps llama-index from building its default splitter (a tiktoken load).
        index = VectorStoreIndex.from_vector_store(
            self._store, embed_model=self.embedder, transformations=[self.embedder]
        )
        self._vector = index.as_retriever(similarity_top_k=_RRF_CANDIDATES)
        self._bm25 = _BM25Retriever(self.home, self.manifest, self._store)
        self._fusion = QueryFusionRetriever(
            [self._vector, self._bm25],
            llm=MockLLM(),
            mode=self.fusion_mode,
            retriever_weights=[1.0 - self.bm25_weight, self.bm25_weight],
            similarity_top_k=_RRF_CANDIDATES,
            num_queries=1,
            use_async=False,
        )
        return self._fusion

    def search(self, query: str, k: int = 5, mode: str = "hybrid", where: dict[str, Any] | None = None,
               one_per_file: bool = True) -> list[Hit]:
        """Top-k hits; `mode` is hybrid, bm25 or vector; `where` filters on metadata equality.

        Two priors apply to every mode: tests, tutorials and examples rank after compiler source
        unless the query asks for them, and (with `one_per_file`) a file appears once, at its best
        chunk, so five hits are five places to look.
        """
        fusion = self._fusion or self._build()
        retriever = {"hybrid": fusion, "bm25": self._bm25, "vector": self._vector}[mode]
        hits = [_hit(n, mode) for n in retriever.retrieve(query)]
        if where:
            hits = [h for h in hits if all(h.metadata.get(key) == val for key, val in where.items())]
        if not _ASKS_FOR_AUX.search(query):
            hits.sort(key=lambda h: bool(_AUX_PATH.search(h.metadata.get("file", ""))))  # stable: keeps rank order
        if one_per_file:
            hits = _one_per_file(hits)
        return hits[:k]

    def answer(self, query: str, k: int = 5, mode: str = "hybrid", store: Any = None) -> list[Hit]:
        """What `kb search` returns. In hybrid mode, a query that is a name (a few words at most)
        gets the chunks defining it first (exact, from the symbol store), then the fused ranking;
        in a sentence, identifiers are one clue among others, so their definitions join the
        fusion as a third ranked list instead of jumping the queue."""
        symbol_hits = self.symbol_hits(query, store) if mode == "hybrid" and store is not None else []
        if len(query.split()) <= self.symbols_first_max_words or not symbol_hits:
            hits = symbol_hits[:k]
            seen = {h.id for h in hits}
            hits += [h for h in self.search(query, k=k + len(hits), mode=mode) if h.id not in seen]
            return _one_per_file(hits)[:k]
        fused = self.search(query, k=_RRF_CANDIDATES, mode=mode)
        scores: dict[str, float] = {}
        by_id: dict[str, Hit] = {}
        for ranking in (fused, symbol_hits):
            for rank, hit in enumerate(ranking):
                scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (60 + rank)
                by_id.setdefault(hit.id, hit)
        ranked = sorted(by_id.values(), key=lambda h: -scores[h.id])
        return _one_per_file(ranked)[:k]

    def chunks(self, ids: list[str]) -> list[Hit]:
        """Stored chunks by id (order of `ids`; unknown ids are left out)."""
        if self._fusion is None:
            self._build()
        by_id = {n.node_id: n for n in self._store.get_nodes(node_ids=ids)} if ids else {}
        return [Hit(i, by_id[i].get_content(), 1.0, dict(by_id[i].metadata), via="id") for i in ids if i in by_id]

    def symbol_hits(self, query: str, store: Any) -> list[Hit]:
        """Chunks that define an identifier written in the query (exact match): definitions first,
        then at most two uses, so a name used everywhere does not crowd out the ranking.

        Identifiers include pass arguments and flags (`tritongpu-coalesce`, `--enable-auto-multi-buffer`);
        a flag with no symbol of its own also tries its CamelCase record name (`EnableAutoMultiBuffer`),
        the convention of MLIR option and pass records."""
        names = [t for t in IDENT.findall(query) if _looks_like_symbol(t)]
        names += [m.group(1) for m in _FLAG.finditer(query)]
        definitions: list[str] = []
        uses: list[str] = []
        for name in dict.fromkeys(names):
            found = store.find(name, release=self.release)
            if not found and name.count("-") >= 2:
                found = store.find("".join(part.capitalize() for part in name.split("-")), release=self.release)
            for sym in found:
                bucket = definitions if sym.role in ("def", "decl") else uses
                if sym.chunk_id and sym.chunk_id not in definitions + uses:
                    bucket.append(sym.chunk_id)
        hits = self.chunks(definitions + uses[:2])
        for hit in hits:
            hit.via = "symbol"
        return hits


# tritongpu-coalesce, --enable-auto-multi-buffer; hyphenated English ("non-trivial") finds no symbol
_FLAG = re.compile(r"(?<![\w-])-{0,2}([a-z][a-z0-9]*(?:-[a-z0-9]+)+)")


def _one_per_file(hits: list[Hit]) -> list[Hit]:
    seen: set[str] = set()
    unique = []
    for h in hits:
        file = h.metadata.get("file") or h.id
        if file not in seen:
            seen.add(file)
            unique.append(h)
    return unique


def _looks_like_symbol(token: str) -> bool:
    # CamelCase, snake_case, dotted or scoped names; plain English words are left to BM25/vectors.
    return len(token) >= 4 and bool(re.search(r"[a-z][A-Z]|_|\.|::", token))


def _hit(node_with_score: Any, via: str) -> Hit:
    node = node_with_score.node
    return Hit(node.node_id, node.get_content(), float(node_with_score.score or 0.0), dict(node.metadata), via)


class _BM25Retriever(BaseRetriever):
    """BM25 over code tokens, as a llama-index retriever; node texts come from the vector store by id."""

    def __init__(self, home: KBHome, manifest: Manifest, store: Any) -> None:
        super().__init__()
        self._lexical = LexicalIndex.load(home.lexical_dir / manifest.collection)
        self._store = store

    def _retrieve(self, query_bundle: Any) -> list[NodeWithScore]:
        scored = self._lexical.search(query_bundle.query_str, _RRF_CANDIDATES)
        if not scored:
            return []
        nodes = {n.node_id: n for n in self._store.get_nodes(node_ids=[i for i, _ in scored])}
        return [NodeWithScore(node=nodes[i], score=s) for i, s in scored if i in nodes]
