"""Shared fixtures: an isolated environment per test, and one real KB built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = REPO / "corpora" / "examples"


@pytest.fixture(scope="session")
def _model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX export of the embedding model per test session, shared by every test's KB home."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch, _model_cache: Path, tmp_path: Path) -> None:
    """No test sees the developer's KB, chroma server, model cache or LLM settings. Without $KB_HOME the
    default home is the per-user data directory, which the README's first command fills: each test's
    default is a home of its own that does not exist until the test makes it."""
    for key in list(os.environ):
        if key.startswith(("KB_", "MLIR_", "TRITON_")):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KB_HOME", str(tmp_path / "default-kb-home"))
    monkeypatch.setenv("KB_LOCK_WAIT_S", "1")
    monkeypatch.setenv("KB_MODEL_CACHE", str(_model_cache))


@pytest.fixture(scope="session")
def built_home(tmp_path_factory: pytest.TempPathFactory, _model_cache: Path):
    """A real KB home (chroma directory, SQLite symbols, BM25): the pattern catalog and the fixture
    compiler tree, indexed as release `fixture-1`."""
    from indexer.compiler import index_compiler_tree
    from indexer.patterns import index_patterns
    from kb.embed import OfflineEmbedding
    from kb.home import KBHome

    home = KBHome(tmp_path_factory.mktemp("kb-home")).ensure()
    embedder = OfflineEmbedding(cache_path=home.embed_cache_db)
    with pytest.MonkeyPatch.context() as env, home.lock(write=True):
        env.setenv("KB_MODEL_CACHE", str(_model_cache))
        index_patterns(home, embedder)
        index_compiler_tree(home, embedder, FIXTURES / "compiler_tree", "fixture-1")
    return home


@pytest.fixture(scope="session")
def scale_artifacts(tmp_path_factory: pytest.TempPathFactory):
    from harness.capture import capture_call

    cache = tmp_path_factory.mktemp("compile-cache")
    return capture_call(EXAMPLES / "scale.py", "scale(torch.randn(1000003), 2.0)", cache_dir=cache)


def candidate_rejection(tmp_path: Path, original: str, candidate: str, entry: str, call: str, reference: str,
                        seeds: int = 2, seed: int = 20261205) -> str:
    """Why the interpreter rejects a rewritten kernel module against its original on one call ("" when it
    passes); the original must pass. The run's seed is fixed: the held-out sizes drawn from the call are
    the same in every run of the test."""
    import json

    from harness.run import RunOptions, run_task
    from harness.task import TaskSpec

    (tmp_path / "original.py").write_text(original)
    (tmp_path / "candidate.py").write_text(candidate)
    spec = TaskSpec(kernel=str(tmp_path / "original.py"), call=call, reference=reference)
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=seeds, seed=seed),
                      candidate=str(tmp_path / "candidate.py"), candidate_entry=entry)
    assert report.run("baseline").correct, report.to_dict()
    return "" if report.run("candidate").correct else json.dumps(report.to_dict()["runs"][-1])
