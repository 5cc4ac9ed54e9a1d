"""The query path reads the stores directly: a fresh `kb search` must not import llama-index, and
its fusion must stay the one llama-index computes (the index is still built through llama-index)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from kb.retrieve import Hit, Searcher, _dist_fusion
from kb.symbols import SymbolStore

# Runs `kb search` in this interpreter, then reports what got imported.
_SEARCH_AND_LIST_MODULES = """
import json, sys
from kb.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    sys.stdout.flush()
    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)
"""


def _search_in_fresh_process(home: str, *args: str) -> tuple[list[dict], set[str]]:
    proc = subprocess.run([sys.executable, "-c", _SEARCH_AND_LIST_MODULES, "--home", home, "search", *args, "--json"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), set(json.loads(proc.stderr.strip().splitlines()[-1]))


def test_a_fresh_search_imports_neither_llama_index_nor_torch(built_home):
    # a sentence (vectors + BM25 + symbols joining the fusion) and a name (symbol hits first)
    for query in ("where is the mask alignment of a load decided", "getMaskAlignment"):
        hits, modules = _search_in_fresh_process(str(built_home.root), query, "--release", "fixture-1")
        assert hits, query
        assert not modules & {"llama_index", "torch", "sentence_transformers", "transformers"}, query
        assert "onnxruntime" in modules or query == "getMaskAlignment"  # the sentence was embedded


def test_fusion_equals_llama_index_query_fusion_on_real_rankings(built_home):
    """`_dist_fusion` must compute what `QueryFusionRetriever(mode="dist_based_score")` does with
    the same weights, on the rankings the fixture KB really produces."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.schema import NodeWithScore, TextNode

    searcher = Searcher(built_home, "compiler", "fixture-1")
    weights = [1.0 - searcher.bm25_weight, searcher.bm25_weight]
    reference = QueryFusionRetriever([], llm=MockLLM(), mode="dist_based_score", retriever_weights=weights,
                                     num_queries=1, use_async=False)
    for query in ("pass that gives loads coalesced layouts", "mask alignment of a load", "accelerate matmul"):
        rankings = [searcher.vector_hits(query), searcher.bm25_hits(query)]
        assert rankings[0] and rankings[1], query
        as_nodes = {(query, i): [NodeWithScore(node=TextNode(id_=h.id, text=h.text, metadata=h.metadata), score=h.score)
                                 for h in ranking] for i, ranking in enumerate(rankings)}
        expected = reference._relative_score_fusion(as_nodes, dist_based=True)
        ours = _dist_fusion(rankings, weights)
        assert [(h.id, h.score) for h in ours] == [(n.node.node_id, n.score) for n in expected], query


def test_fusion_edge_cases():
    def hit(i: str, score: float) -> Hit:
        return Hit(i, f"text {i}", score, {"file": i})

    assert _dist_fusion([[], []], [0.3, 0.7]) == []
    one = _dist_fusion([[hit("a", 2.0)], []], [0.3, 0.7])  # one score: no spread, counts fully
    assert [(h.id, h.score) for h in one] == [("a", 0.3)]
    both = _dist_fusion([[hit("a", 1.0), hit("b", 0.5)], [hit("b", 9.0), hit("c", 1.0)]], [0.3, 0.7])
    assert [h.id for h in both][0] == "b"  # found by both lists: scores add up


def test_symbol_hits_and_chunks_read_texts_and_metadata_from_the_store(built_home):
    searcher = Searcher(built_home, "compiler", "fixture-1")
    store = SymbolStore(built_home.symbols_db)
    try:
        hits = searcher.symbol_hits("where is getMaskAlignment decided", store)
    finally:
        store.close()
    assert hits and hits[0].via == "symbol" and hits[0].metadata["file"] == "include/triton/Analysis/AxisInfo.h"
    assert "getMaskAlignment" in hits[0].text
    assert not {"_node_content", "_node_type", "doc_id"} & set(hits[0].metadata)  # the chunk's own metadata only
    assert searcher.chunks(["no-such-id", hits[0].id]) == [searcher.chunks([hits[0].id])[0]]
