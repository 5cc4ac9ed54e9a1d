"""Retrieval quality on a gold set: recall@1/5/10 and MRR per source set, query kind and mode.

A gold file (`corpora/queries/*.yaml`) names the index it is about (corpus, release) and lists
questions with the files and/or symbols a knowledgeable engineer would open first. A hit is
relevant when its file is one of the expected files or its symbol one of the expected symbols.
recall@k is the share of questions with a relevant hit in the top k (success@k: questions have
one to three targets, any of which answers them); MRR is the mean of 1/rank of the first relevant
hit within the top 10. All three modes are measured through the same call `kb search` makes.

Every query falls deterministically (by a hash of its id) into a `dev` split (two thirds), used to
look at failures and tune retrieval, or a `held-out` split (one third), whose failures are not
looked at: the gap between the two is how much tuning has fitted the gold set rather than the task.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserFacingError
from kb.home import KBHome

__all__ = ["GoldQuery", "GoldSet", "QUERIES_DIR", "evaluate_retrieval", "load_gold_sets"]

QUERIES_DIR = Path(__file__).resolve().parent.parent / "corpora" / "queries"
MODES = ("bm25", "vector", "hybrid")
CUTOFFS = (1, 5, 10)
_KINDS = ("nl", "symbol")


@dataclass
class GoldQuery:
    id: str
    kind: str
    query: str
    files: list[str]
    symbols: list[str]

    @property
    def split(self) -> str:
        return "held-out" if int(hashlib.sha1(self.id.encode()).hexdigest(), 16) % 3 == 0 else "dev"


@dataclass
class GoldSet:
    path: Path
    corpus: str
    release: str
    source: str
    queries: list[GoldQuery]

    @property
    def label(self) -> str:
        return self.release


def _fail(path: Path, where: str, problem: str) -> UserFacingError:
    return UserFacingError(f"{path.name}: {where}: {problem}",
                           "each query needs id, kind (nl|symbol), query and expect: {files: [...]} and/or symbols")


def load_gold_sets(directory: Path | None = None) -> list[GoldSet]:
    directory = directory or QUERIES_DIR
    paths = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if not paths:
        raise UserFacingError(f"no gold query files (*.yaml) in {directory}", "pass --queries DIR")
    sets = []
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise UserFacingError(f"{path.name} is not valid YAML ({exc})".replace("\n", " "),
                                  "fix the YAML syntax") from exc
        if not isinstance(data, dict):
            raise _fail(path, "top level", "expected a mapping with corpus, release, queries")
        for key in ("corpus", "release", "queries"):
            if key not in data:
                raise _fail(path, "top level", f"missing key {key!r}")
        queries, seen = [], set()
        for i, q in enumerate(data["queries"] or []):
            where = f"query {i + 1}"
            if not isinstance(q, dict):
                raise _fail(path, where, "expected a mapping")
            for key in ("id", "kind", "query", "expect"):
                if key not in q:
                    raise _fail(path, where, f"missing key {key!r}")
            if q["kind"] not in _KINDS:
                raise _fail(path, q["id"], f"kind must be one of {_KINDS}, not {q['kind']!r}")
            if q["id"] in seen:
                raise _fail(path, q["id"], "duplicate id")
            seen.add(q["id"])
            expect = q["expect"] or {}
            files, symbols = list(expect.get("files") or []), list(expect.get("symbols") or [])
            if not files and not symbols:
                raise _fail(path, q["id"], "expect names no files and no symbols")
            queries.append(GoldQuery(str(q["id"]), q["kind"], str(q["query"]), files, symbols))
        sets.append(GoldSet(path, str(data["corpus"]), str(data["release"]), str(data.get("source", "")), queries))
    return sets


def _relevant(hit: Any, query: GoldQuery) -> bool:
    meta = hit.metadata
    return meta.get("file") in query.files or (bool(query.symbols) and meta.get("symbol") in query.symbols)


@dataclass
class QueryResult:
    id: str
    kind: str
    split: str
    mode: str
    rank: int | None  # 1-based rank of the first relevant hit within the top 10, None if absent
    top: list[str] = field(default_factory=list)


def _summary(results: list[QueryResult]) -> dict[str, float]:
    if not results:
        return {}
    out = {f"recall@{k}": sum(1 for r in results if r.rank is not None and r.rank <= k) / len(results)
           for k in CUTOFFS}
    out["mrr"] = statistics.fmean(1.0 / r.rank if r.rank else 0.0 for r in results)
    out["n"] = len(results)
    return out


def evaluate_retrieval(home: KBHome, sets: list[GoldSet], modes: tuple[str, ...] = MODES,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run every gold query in every mode; returns per-set, per-kind and overall summaries plus
    each query's rank (so a regression can be traced to its question)."""
    from kb.index import load_manifest
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    missing = [s for s in sets if load_manifest(home, s.corpus, s.release) is None]
    if len(missing) == len(sets):
        raise UserFacingError(
            "none of the gold sets' indexes is built: " + ", ".join(f"{s.corpus}@{s.release}" for s in missing),
            "index the sources first, e.g. kb index compiler --source DIR --release " + missing[0].release)
    store = SymbolStore(home.symbols_db)
    report: dict[str, Any] = {"sets": {}, "skipped": [f"{s.corpus}@{s.release} ({s.path.name}): not indexed"
                                                       for s in missing], "unknown_targets": [], "queries": []}
    total = sum(len(s.queries) for s in sets if s not in missing) * len(modes)
    done = 0
    all_results: list[QueryResult] = []
    try:
        for gold in sets:
            if gold in missing:
                continue
            searcher = Searcher(home, gold.corpus, gold.release)
            # An expected file the index lacks (a typo, a file renamed in this release) can only score 0:
            # said, so a low score is not read as a retrieval failure.
            indexed = store.files(gold.release)
            report["unknown_targets"] += [f"{gold.label} {q.id}: {f}" for q in gold.queries for f in q.files
                                          if f not in indexed]
            results: list[QueryResult] = []
            for query in gold.queries:
                for mode in modes:
                    hits = searcher.answer(query.query, k=max(CUTOFFS), mode=mode, store=store)
                    rank = next((i for i, h in enumerate(hits, 1) if _relevant(h, query)), None)
                    results.append(QueryResult(query.id, query.kind, query.split, mode, rank,
                                               [h.metadata.get("file", h.id) for h in hits[:3]]))
                    done += 1
                    if progress:
                        progress(done, total)
            report["sets"][gold.label] = {
                mode: {"all": _summary([r for r in results if r.mode == mode]),
                       **{kind: _summary([r for r in results if r.mode == mode and r.kind == kind]) for kind in _KINDS}}
                for mode in modes}
            all_results += results
            report["queries"] += [{"set": gold.label, **r.__dict__} for r in results]
    finally:
        store.close()
    report["overall"] = {mode: {"all": _summary([r for r in all_results if r.mode == mode]),
                                **{kind: _summary([r for r in all_results if r.mode == mode and r.kind == kind])
                                   for kind in _KINDS}} for mode in modes}
    report["splits"] = {split: {mode: _summary([r for r in all_results if r.mode == mode and r.split == split])
                                for mode in modes} for split in ("dev", "held-out")}
    return report
