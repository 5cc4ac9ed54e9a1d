"""Stores and retrieval with real components: a chroma directory, SQLite, BM25, the offline model."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from harness.errors import UserFacingError
from indexer.tablegen import parse_passes
from kb.home import KBHome
from kb.index import Chunk, load_manifest, publish
from kb.lexical import code_tokens
from kb.patterns import load_catalog, load_pattern
from kb.retrieve import Searcher
from kb.symbols import SymbolStore


def test_catalog_has_at_least_15_valid_nvidia_patterns_with_compiler_reasons():
    patterns = load_catalog()
    nvidia = [p for p in patterns if "cuda" in p.backends]
    assert len(nvidia) >= 15
    assert all(p.compiler_refs.passes or p.compiler_refs.symbols or p.compiler_refs.files for p in nvidia)


def test_pattern_schema_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\ntitle: t\nfamily: f\nbackends: [cuda]\nsymptoms: []\nrewrite: {kind: k, summary: s}\n"
                   "rationale: r\ncompiler_refs: {}\nrisk: low\n")
    with pytest.raises(UserFacingError, match=r"bad.yaml: compiler_refs must name at least one"):
        load_pattern(bad)
    bad.write_text("id: x\n")
    with pytest.raises(UserFacingError, match=r"bad.yaml: missing key 'title'"):
        load_pattern(bad)
    # An unquoted "a: b" list item is a mapping: the catalog's own split-work pattern once crashed the
    # Markdown answer of every grid-underfilled diagnosis this way.
    bad.write_text("id: x\ntitle: t\nfamily: f\nbackends: [cuda]\nsymptoms: []\nrewrite: {kind: k, summary: s}\n"
                   "rationale: r\ncompiler_refs: {passes: [p]}\nrisk: low\npreconditions:\n  - one\n"
                   "  - the work can be combined: by atomics\n")
    with pytest.raises(UserFacingError, match=r"bad.yaml: item 2 of 'preconditions' is not text"):
        load_pattern(bad)


def test_tablegen_reader_on_the_installed_wheel_and_a_fixture():
    fixture = parse_passes((FIXTURES / "compiler_tree/include/triton/Dialect/TritonGPU/Transforms/Passes.td").read_text())
    assert [(p.def_name, p.argument, p.line) for p in fixture] == [
        ("TritonGPUCoalesce", "tritongpu-coalesce", 4),
        ("TritonGPUAccelerateMatmul", "tritongpu-accelerate-matmul", 13),
        ("TritonGPUReorder", "tritongpu-reorder-instructions", 23),
    ]
    assert fixture[1].options == [{"cpp_name": "computeCapability", "argument": "compute-capability",
                                   "type": "int32_t", "default": "80", "description": "device compute capability"}]
    assert fixture[2].summary == "Reorder instructions"  # strings concatenated across lines
    import triton

    td = Path(triton.__file__).parent / "include/triton/Dialect/TritonGPU/Transforms/Passes.td"
    if not td.exists():
        pytest.skip("this triton wheel ships no .td files (before 3.9)")
    wheel = {p.argument: p for p in parse_passes(td.read_text())}
    assert wheel["tritongpu-pipeline"].options[0]["argument"] == "num-stages"


def test_code_tokens_keep_identifiers_whole_and_split():
    tokens = code_tokens("getMaskAlignment tt.load BLOCK_SIZE")
    assert {"getmaskalignment", "get", "mask", "alignment", "tt.load", "tt", "load", "block_size", "block"} <= set(tokens)


def test_jax_brought_in_by_bm25s_never_takes_the_device(tmp_path):
    """bm25s runs a jax op at import when jax is installed; jax's GPU pool then took 75% of an H200
    from a bench job's KB lookup. A stand-in jax records the settings it was imported under."""
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\nSEEN = (os.environ.get('JAX_PLATFORMS'), os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))\n")
    (fake / "lax.py").write_text("def top_k(x, k):\n    return x[:k]\n")
    probe = "import kb.lexical, jax; print(jax.SEEN)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('cpu', 'false')"
    env["JAX_PLATFORMS"] = "cuda"  # the user's own choice is kept
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('cuda', 'false')"


def test_symbol_store_links_pipeline_calls_to_pass_definitions(built_home):
    store = SymbolStore(built_home.symbols_db)
    coalesce = store.pass_by_argument("tritongpu-coalesce", "fixture-1")
    assert coalesce.cite() == "include/triton/Dialect/TritonGPU/Transforms/Passes.td:4@fixture-1"
    links = {(lk.src, lk.dst) for lk in store.links_of("tritongpu-coalesce", "fixture-1")}
    assert ("passes.ttgpuir.add_coalesce", "tritongpu-coalesce") in links
    assert not store.links_of("passes.ttgpuir.add_not_a_pass", "fixture-1")  # no such pass: no link
    decl = store.find("ModuleAxisInfoAnalysis::getMaskAlignment", "fixture-1")
    # The scoped name picks the class's declaration; its uses (calls by the short name) stay listed.
    assert [(s.file, s.line, s.role) for s in decl] == [("include/triton/Analysis/AxisInfo.h", 12, "decl"),
                                                        ("lib/Dialect/TritonGPU/Transforms/Coalesce.cpp", 13, "ref")]
    store.close()


def test_hybrid_search_finds_the_right_chunks(built_home):
    patterns = Searcher(built_home, "patterns", "catalog")
    top = patterns.search("masked tail loads are not vectorized", k=3)
    assert "masked-tail-split" in [h.metadata["pattern_id"] for h in top]
    compiler = Searcher(built_home, "compiler", "fixture-1", embedder=patterns.embedder)
    store = SymbolStore(built_home.symbols_db)
    exact = compiler.symbol_hits("where is getMaskAlignment decided", store)
    assert exact and exact[0].metadata["file"] == "include/triton/Analysis/AxisInfo.h" and exact[0].via == "symbol"
    for mode in ("bm25", "vector", "hybrid"):
        hits = compiler.search("pass that gives loads coalesced layouts", k=2, mode=mode)
        assert hits and hits[0].metadata["file"].endswith("Passes.td"), mode


class _Boom(Exception):
    pass


class _FailingEmbedder:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def embed_many(self, texts):
        self.calls += 1
        if self.calls > 1:
            raise _Boom("killed mid-index")
        return self.real.embed_many(texts)


def test_a_failed_publish_leaves_the_previous_index_live(tmp_path):
    from kb.embed import OfflineEmbedding

    home = KBHome(tmp_path / "home").ensure()
    embedder = OfflineEmbedding(cache_path=home.embed_cache_db)
    first = publish(home, "c", "r1", [Chunk("a", "alpha text", {"file": "a"})], chunker={}, source={},
                    embedder=embedder)
    many = [Chunk(f"id{i}", f"text {i}", {"file": "b"}) for i in range(2100)]  # three batches
    with pytest.raises(_Boom):
        publish(home, "c", "r1", many, chunker={}, source={}, embedder=_FailingEmbedder(embedder))
    assert load_manifest(home, "c", "r1").collection == first.collection
    assert Searcher(home, "c", "r1", embedder=embedder).search("alpha", k=1, mode="bm25")[0].id == "a"
    second = publish(home, "c", "r1", many[:3], chunker={}, source={}, embedder=embedder)  # cleans leftovers
    from kb.vectors import chroma_client, list_collection_names

    assert [n for n in list_collection_names(chroma_client(home)) if n.startswith("c__r1")] == [second.collection]
    # A release whose only build died while storing left a collection no manifest names: `releases
    # drop` finds it, where it used to say the release is not indexed.
    from kb.releases import drop_release

    with pytest.raises(_Boom):
        publish(home, "c", "gone", many, chunker={}, source={}, embedder=_FailingEmbedder(embedder))
    assert any(n.startswith("c__gone__b") for n in list_collection_names(chroma_client(home)))
    assert drop_release(home, "gone") == ["leftovers of a killed build"]
    assert not any("gone" in n for n in list_collection_names(chroma_client(home)))
    assert [n for n in list_collection_names(chroma_client(home)) if n.startswith("c__r1")] == [second.collection]
    with pytest.raises(UserFacingError, match="'gone' is not indexed"):
        drop_release(home, "gone")


def _hold_lock(root: str, ready, release) -> None:
    home = KBHome(Path(root))
    with home.lock(write=True):
        ready.set()
        release.wait(10)


def test_a_second_writer_fails_clearly(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(home.root), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        start = time.monotonic()
        with pytest.raises(UserFacingError, match="is busy: another kb process"):
            with home.lock(write=True, wait_s=0.5):
                pass
        assert time.monotonic() - start < 5
    finally:
        release.set()
        holder.join(10)
    with home.lock(write=True, wait_s=1):  # free again once the holder is gone
        pass
    # A finished writer's pid is not left behind to be named as the holder of a later lock.
    assert (home.root / "lock").read_text() == ""


def test_a_writer_killed_with_its_pid_in_the_lock_file_is_not_named_later(tmp_path):
    """kill -9 skips the writer's clean-up, so its line stays in the lock file. When readers hold the
    lock later, the busy message must not name that dead process as the holder."""
    home = KBHome(tmp_path / "home").ensure()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (home.root / "lock").write_text(f"{dead.pid} kb --home {home.root}")
    with home.lock(write=False):
        with pytest.raises(UserFacingError) as busy:
            with home.lock(write=True, wait_s=0.3):
                pass
    assert "is busy: another kb process is" in str(busy.value) and f"pid {dead.pid}" not in str(busy.value)


def test_corrupt_caches_start_afresh_and_a_lost_bm25_index_names_its_rebuild(tmp_path, capsys):
    """The parse and embedding caches hold nothing that cannot be computed again; the BM25 index is
    part of a published index, so losing it is an error that says how to rebuild it."""
    from indexer.compiler import index_compiler_tree
    from kb.embed import OfflineEmbedding

    home = KBHome(tmp_path / "home").ensure()
    for cache in (home.embed_cache_db, home.parse_cache_db):
        cache.write_bytes(b"not a database " * 100)
    tree = FIXTURES / "compiler_tree"
    with home.lock(write=True):
        index_compiler_tree(home, OfflineEmbedding(cache_path=home.embed_cache_db), tree, "r1")
    assert capsys.readouterr().err.count("was unreadable (file is not a database); moved it to") == 2
    assert (home.root / f"{home.embed_cache_db.name}.corrupt").read_bytes().startswith(b"not a database")
    # A locked cache or a full disk is not a corrupt cache: raised as it is, the file and its rows kept.
    import sqlite3

    from kb.home import open_cache_db

    def full_disk(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    with pytest.MonkeyPatch.context() as patch, pytest.raises(sqlite3.OperationalError, match="full"):
        patch.setattr(sqlite3, "connect", full_disk)
        open_cache_db(home.parse_cache_db, "CREATE TABLE IF NOT EXISTS parsed (key TEXT PRIMARY KEY, blob BLOB)")
    assert sqlite3.connect(home.parse_cache_db).execute("SELECT COUNT(*) FROM parsed").fetchone()[0] > 0
    searcher = Searcher(home, "compiler", "r1")
    assert searcher.search("coalesce loads", k=1)
    shutil.rmtree(home.lexical_dir / searcher.manifest.collection)
    with pytest.raises(UserFacingError, match="BM25 index of compiler@r1 .* is missing") as lost:
        Searcher(home, "compiler", "r1").search("coalesce loads", k=1)
    assert lost.value.fix == f"rebuild it: kb index compiler --source {tree} --release r1"


def test_a_read_only_home_is_refused_in_one_line(tmp_path, monkeypatch):
    """A KB mounted read-only (or another user's) cannot even be queried: embedded chroma and SQLite
    write when they open. The refusal comes before a store fails and advises deleting itself."""
    import errno

    import kb.home

    home = KBHome(tmp_path / "home").ensure()

    def read_only_fs(path, mode="r", *args, **kwargs):  # what open() raises on a read-only mount
        if "r" not in mode or "+" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(kb.home, "open", read_only_fs, raising=False)
    with pytest.raises(UserFacingError, match="not writable here .Read-only file system., and its stores write") as e:
        with home.lock(write=False):
            pass
    assert f"cp -r {home.root} DIR" in e.value.fix
    with pytest.raises(UserFacingError, match="index into a home you can write"):
        with home.lock(write=True):
            pass


def test_foreign_and_corrupt_homes_are_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.txt").write_text("not ours")
    with pytest.raises(UserFacingError, match="is not a kernel-kb home"):
        KBHome(foreign).ensure()
    corrupt = KBHome(tmp_path / "corrupt").ensure()
    (corrupt.root / "kb-home.json").write_text("{oops")
    with pytest.raises(UserFacingError, match="is corrupt"):
        corrupt.validate()
    assert (foreign / "data.txt").read_text() == "not ours"


def test_the_onnx_encoder_computes_what_sentence_transformers_computes(tmp_path):
    import numpy as np

    from kb.embed import OfflineEmbedding, _sentence_transformer

    texts = ["where is the vector width of a global load decided", "x",
             (FIXTURES / "compiler_tree/lib/Dialect/TritonGPU/Transforms/Coalesce.cpp").read_text()]  # > 128 tokens
    embedder = OfflineEmbedding(cache_path=tmp_path / "embed.sqlite")
    ours = np.array(embedder.embed_many(texts))
    assert type(embedder._encoder()).__name__ == "_OnnxEncoder"
    reference = _sentence_transformer().encode(texts, normalize_embeddings=True)
    assert np.abs(ours - reference).max() < 1e-4
    # A query is embedded the same way, and leaves the cache as it found it.
    fresh = OfflineEmbedding(cache_path=tmp_path / "query.sqlite")
    assert np.abs(np.array(fresh.query_vector(texts[0])) - reference[0]).max() < 1e-4
    assert fresh.missing([texts[0]]) == [texts[0]]


def test_a_killed_embedding_keeps_what_it_computed_and_reports_progress(tmp_path):
    from kb.embed import OfflineEmbedding

    texts = [f"chunk number {i} of a long index" for i in range(7)]
    embedder = OfflineEmbedding(cache_path=tmp_path / "embed.sqlite")
    embedder.commit_every = 3
    encoder = embedder._encoder()
    real_encode, calls = encoder.encode, []

    def dies_on_the_third_slice(batch, **kwargs):
        calls.append(len(batch))
        if len(calls) == 3:
            raise _Boom("killed mid-embedding")
        return real_encode(batch, **kwargs)

    encoder.encode = dies_on_the_third_slice
    seen: list[int] = []
    with pytest.raises(_Boom):
        embedder.embed_many(texts, on_progress=seen.append)
    assert seen == [0, 3, 6]
    resumed = OfflineEmbedding(cache_path=tmp_path / "embed.sqlite")
    assert len(resumed.missing(texts)) == 1  # only the slice being embedded when it died
    assert len(resumed.embed_many(texts)) == 7
