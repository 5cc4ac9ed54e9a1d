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
from cli import main
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


def test_a_pass_record_gives_its_place_to_the_implementation_or_the_lit_test(built_home):
    searcher = Searcher(built_home, "compiler", "fixture-1")
    store = SymbolStore(built_home.symbols_db)
    try:
        code = searcher.answer("which pass gives loads coalesced layouts", k=3, store=store)
        tests = searcher.answer("lit test of the pass that gives loads coalesced layouts", k=3, store=store)
        name = searcher.answer("TritonGPUCoalesce", k=3, store=store)  # a name: its record first
        macro = searcher.answer("GEN_PASS_DEF_TRITONGPUCOALESCE", k=1, store=store)
    finally:
        store.close()
    assert code[0].metadata["file"] == "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp" and code[0].via == "pass-link"
    # Coalesce.cpp is one chunk, named after its largest definition (LoadVectorizer, from line 1):
    # found through the pass link or a name, it cites the definition that led to it.
    assert (code[0].metadata["symbol"], code[0].metadata["start_line"]) == ("CoalescePass", 23)
    assert (macro[0].metadata["symbol"], macro[0].cite()) == (
        "GEN_PASS_DEF_TRITONGPUCOALESCE", "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:8@fixture-1")
    assert tests[0].metadata["file"] == "test/TritonGPU/coalesce.mlir"
    assert name[0].metadata["file"].endswith("Passes.td")


def _hits(*files: str, scores: list[float] | None = None) -> list[Hit]:
    scores = scores or [1.0 - i / 10 for i in range(len(files))]
    return [Hit(f"{f}#{i}", f"text {i}", s, {"file": f}) for i, (f, s) in enumerate(zip(files, scores))]


def test_a_named_vendor_backend_comes_first_and_other_vendors_last():
    from kb.retrieve import _named_vendor_first

    hits = _hits("third_party/amd/a.cpp", "lib/shared.cpp", "third_party/ascend/b.cpp", "third_party/nvidia/c.cpp")
    files = lambda hs: [h.metadata["file"] for h in hs]  # noqa: E731
    assert files(_named_vendor_first(hits, "how is tl.dot lowered on the NPU")) == [
        "third_party/ascend/b.cpp", "lib/shared.cpp", "third_party/amd/a.cpp", "third_party/nvidia/c.cpp"]
    assert files(_named_vendor_first(hits, "where is ptxas invoked"))[0] == "third_party/nvidia/c.cpp"
    assert _named_vendor_first(hits, "where is the layout decided") == hits  # no vendor named: unchanged
    # The vendor's own tests stay after source, shared source included, unless the question asks for tests.
    tested = _hits("third_party/ascend/test/test_dot.py", "lib/shared.cpp", "third_party/ascend/b.cpp")
    assert files(_named_vendor_first(tested, "how is tl.dot lowered on the NPU")) == [
        "third_party/ascend/b.cpp", "lib/shared.cpp", "third_party/ascend/test/test_dot.py"]
    assert files(_named_vendor_first(tested, "which NPU test covers tl.dot"))[0] == "third_party/ascend/test/test_dot.py"


def test_a_file_with_several_matching_chunks_outranks_one_lucky_chunk():
    from kb.retrieve import _with_file_support

    hits = _hits("lucky.cpp", "solid.cpp", "solid.cpp", "solid.cpp", scores=[1.0, 0.9, 0.5, 0.5])
    assert _with_file_support(hits, 0.2)[0].metadata["file"] == "solid.cpp"  # 0.9 + 0.2 x 1.0 > 1.0
    assert _with_file_support(hits, 0.0)[0].metadata["file"] == "lucky.cpp"


def test_new_collections_search_wider_than_the_candidates_asked_for(tmp_path):
    from kb.home import KBHome
    from kb.retrieve import _RRF_CANDIDATES
    from kb.vectors import HNSW_EF_SEARCH, chroma_client, create_collection

    home = KBHome(tmp_path / "home").ensure()
    collection = create_collection(chroma_client(home), "c__r__b1")
    assert collection.configuration["hnsw"]["ef_search"] == HNSW_EF_SEARCH > _RRF_CANDIDATES


_PATTERN = """// Written for kernel-kb's tests: a conversion pattern on ttg.convert_layout.
namespace {
struct ConvertLayoutOpConversion : public ConvertOpToLLVMPattern<triton::gpu::ConvertLayoutOp> {
  LogicalResult matchAndRewrite(triton::gpu::ConvertLayoutOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    return lowerDistributedToDistributed(op, adaptor, rewriter);
  }
};
} // namespace
"""


def test_a_lowering_question_about_an_op_leads_with_the_patterns_that_rewrite_it(tmp_path):
    import shutil

    from conftest import FIXTURES

    from indexer.compiler import index_compiler_tree
    from kb.embed import OfflineEmbedding
    from kb.home import KBHome

    tree = tmp_path / "tree"
    shutil.copytree(FIXTURES / "compiler_tree", tree)
    (tree / "lib/Conversion").mkdir(parents=True)
    (tree / "lib/Conversion/ConvertLayoutOpToLLVM.cpp").write_text(_PATTERN)
    home = KBHome(tmp_path / "home").ensure()
    index_compiler_tree(home, OfflineEmbedding(cache_path=home.embed_cache_db), tree, "r")
    searcher = Searcher(home, "compiler", "r")
    store = SymbolStore(home.symbols_db)
    try:
        assert store.rewrite_patterns("ttg.convert_layout", "r") == ["ConvertLayoutOpConversion"]
        assert store.rewrite_patterns("convert_layout", "r") == ["ConvertLayoutOpConversion"]  # by its last part
        lowered = searcher.symbol_hits("how is ttg.convert_layout lowered to LLVM", store)
        defined = searcher.symbol_hits("where is ttg.convert_layout defined", store)
    finally:
        store.close()
    assert lowered[0].metadata["symbol"] == "ConvertLayoutOpConversion"
    assert defined and "ConvertLayoutOpConversion" not in [h.metadata["symbol"] for h in defined]
