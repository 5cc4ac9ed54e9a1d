"""Shared fixtures: an isolated environment per test, and one real KB built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = REPO / "corpora" / "examples"


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's KB, chroma server or LLM settings."""
    for key in list(os.environ):
        if key.startswith(("KB_", "MLIR_", "TRITON_")):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KB_LOCK_WAIT_S", "1")


@pytest.fixture(scope="session")
def built_home(tmp_path_factory: pytest.TempPathFactory):
    """A real KB home (chroma directory, SQLite symbols, BM25): the pattern catalog and the fixture
    compiler tree, indexed as release `fixture-1`."""
    from indexer.compiler import index_compiler_tree
    from indexer.patterns import index_patterns
    from kb.embed import OfflineEmbedding
    from kb.home import KBHome

    home = KBHome(tmp_path_factory.mktemp("kb-home")).ensure()
    embedder = OfflineEmbedding(cache_path=home.embed_cache_db)
    with home.lock(write=True):
        index_patterns(home, embedder)
        index_compiler_tree(home, embedder, FIXTURES / "compiler_tree", "fixture-1")
    return home


@pytest.fixture(scope="session")
def scale_artifacts(tmp_path_factory: pytest.TempPathFactory):
    from harness.capture import capture_call

    cache = tmp_path_factory.mktemp("compile-cache")
    return capture_call(EXAMPLES / "scale.py", "scale(torch.randn(1000003), 2.0)", cache_dir=cache)
