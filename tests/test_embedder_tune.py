"""`kb embedder tune`: pairs mined from indexed source, a model trained and kept in the home, indexes
built and searched with the model that made them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from harness.errors import UserFacingError
from kb.tune import _code_pairs

_META = {"file": "lib/Transforms/Vectorize.cpp", "lang": "cpp", "symbol": "widthOf", "scope": "mlir::vec",
         "kind": "function"}

_CPP = """// lib/Transforms/Vectorize.cpp mlir::vec::widthOf
// Copyright 2024 Someone. Licensed under the Apache License, Version 2.0.
#include "Vectorize.h"
/// Decide the vector width of a global load from the contiguity of its offsets.
unsigned widthOf(LoadOp op, AxisInfo &info) {
  unsigned contiguity = info.getContiguity(op.getPtr());
  return std::min(contiguity, maxWidthInBits / elementBits(op));
}
// TODO: handle masked loads once the alignment analysis knows about them properly
unsigned maskedWidthOf(LoadOp op) { return 1; }
// Short comment here.
int unused = compute(alpha, beta, gamma, delta, epsilon, zeta, eta, theta);
"""


def test_a_comment_is_paired_with_the_code_below_it_only():
    pairs = _code_pairs(_CPP, _META)
    assert [p.query for p in pairs] == ["Decide the vector width of a global load from the contiguity of its offsets."]
    doc = pairs[0].document
    assert doc.splitlines()[0] == "lib transforms vectorize cpp: mlir vec width of"  # the indexer's lead line
    assert "getContiguity" in doc and "maskedWidthOf" not in doc  # stops at the next comment block
    assert "Decide the vector width" not in doc  # the comment is the question, not part of the answer


def test_a_docstring_is_paired_with_its_function_and_licences_todos_and_short_comments_are_not():
    text = '''# backends/nvidia/compiler.py make_ttgir
def make_ttgir(mod, metadata, options, capability):
    """Run the TritonGPU pipeline: coalesce, accelerate matmul, pipeline loops, then prefetch."""
    pm = ir.pass_manager(mod.context)
    passes.ttgpuir.add_coalesce(pm)
    passes.ttgpuir.add_accelerate_matmul(pm)
    pm.run(mod)
    return mod
'''
    pairs = _code_pairs(text, {"file": "backends/nvidia/compiler.py", "lang": "python", "symbol": "make_ttgir",
                               "scope": "", "kind": "function"})
    assert [(p.origin, p.query) for p in pairs] == [
        ("docstring", "Run the TritonGPU pipeline: coalesce, accelerate matmul, pipeline loops, then prefetch.")]
    assert "add_accelerate_matmul" in pairs[0].document and "Run the TritonGPU" not in pairs[0].document


_COMMENTED_HEAD = "// Written for kernel-kb's tests: functions whose comments say what they do.\nnamespace mlir::vec {\n"
_FUNCTIONS = [
    ("Decide the vector width of a global load from the contiguity of its offsets", "widthOf", "getContiguity"),
    ("Split a reduction along the fastest varying dimension into per warp partial sums", "splitReduce", "warpSum"),
    ("Keep scalar loads when the mask alignment is too small to prove vector access", "keepScalar", "maskAlign"),
    ("Plan the shared memory buffers of every local allocation in the module", "planShared", "allocOffsets"),
    ("Rewrite a broadcast of a scalar into a splat of the same element type", "splatBroadcast", "makeSplat"),
    ("Hoist loop invariant address computations out of the innermost software pipelined loop", "hoistAddr", "isInv"),
    ("Convert a blocked layout into a linear layout so the two can be compared", "toLinear", "basesOf"),
    ("Insert a barrier between the last shared memory store and the first load of it", "insertBarrier", "lastStore"),
]


def _commented_tree(root: Path) -> Path:
    tree = root / "tree"
    shutil.copytree(FIXTURES / "compiler_tree", tree)
    body = "\n".join(
        f"/// {say}.\nunsigned {fn}(Operation *op, OpBuilder &builder) {{\n  auto value = {call}(op, builder);\n"
        f"  return value.{fn}Width() + builder.getIndexAttr(op->getNumOperands()).getInt();\n}}\n"
        for say, fn, call in _FUNCTIONS)
    (tree / "lib/Dialect/TritonGPU/Transforms/Vectorize.cpp").write_text(_COMMENTED_HEAD + body + "}\n")
    return tree


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, _model_cache: Path):
    """A home with the commented tree indexed, then a model tuned on it (a few steps) and used."""
    from cli import main

    root = tmp_path_factory.mktemp("tune")
    tree, home = _commented_tree(root), root / "home"
    runner = CliRunner()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KB_MODEL_CACHE", str(_model_cache))
        first = runner.invoke(main, ["--home", str(home), "index", "compiler", "--source", str(tree), "--release", "r"])
        assert first.exit_code == 0, first.output
        tune = runner.invoke(main, ["--home", str(home), "embedder", "tune", "--release", "r", "--name", "t1",
                                    "--batch-size", "4", "--epochs", "2", "--learning-rate", "1e-4"])
    return home, tree, tune


def test_tune_mines_the_tree_and_keeps_a_complete_model_that_new_indexes_use(tuned):
    from kb.embed import active_model, tuned_models
    from kb.home import KBHome
    from kb.tune import mine_pairs

    home, _, tune = tuned
    assert tune.exit_code == 0, tune.output
    home = KBHome(home)
    pairs = mine_pairs(home, "compiler", ["r"])
    by_query = {p.query: p for p in pairs}
    for say, fn, call in _FUNCTIONS:
        assert f"{fn}(Operation" in by_query[say + "."].document and call in by_query[say + "."].document
    (coalesce,) = [p for p in pairs if p.origin == "pass-record"]  # the fixture's one pass, with its class
    assert "CoalescePass" in coalesce.document
    assert f"mined {len(pairs)} training pairs from r" in tune.output
    (model,) = tuned_models(home)
    assert model.name == "t1" and model.id.startswith("tuned/t1@") and active_model(home) == model
    assert {"model.onnx", "tokenizer.json", "kb-model.json"} <= {p.name for p in model.directory.iterdir()}
    assert model.info["pairs"] == len(pairs) and model.info["steps"] == 2 * (len(pairs) // 4)
    assert model.info["releases"] == ["r"]
    assert not list(home.models_dir.glob(".tmp-*"))


def test_the_tuned_model_embeds_differently_and_the_old_index_keeps_its_own_model(tuned, _model_cache, monkeypatch):
    from kb.embed import BASE_MODEL, OfflineEmbedding, active_model
    from kb.home import KBHome
    from kb.retrieve import Searcher

    monkeypatch.setenv("KB_MODEL_CACHE", str(_model_cache))
    home = KBHome(tuned[0])
    text = _FUNCTIONS[0][0]
    base = np.array(OfflineEmbedding(home.embed_cache_db).embed_many([text])[0])
    mine = np.array(OfflineEmbedding(home.embed_cache_db, model=active_model(home)).embed_many([text])[0])
    assert abs(float(np.linalg.norm(mine)) - 1.0) < 1e-4 and float(base @ mine) < 0.9999
    searcher = Searcher(home, "compiler", "r")  # indexed before tuning
    assert searcher.manifest.embed_model == BASE_MODEL.id and searcher.embedder.model == BASE_MODEL


def test_reindexing_builds_with_the_tuned_model_and_drop_is_refused_while_an_index_uses_it(tuned, _model_cache,
                                                                                           monkeypatch):
    from cli import main
    from kb.embed import active_model
    from kb.home import KBHome
    from kb.retrieve import Searcher

    monkeypatch.setenv("KB_MODEL_CACHE", str(_model_cache))
    home_dir, tree, _ = tuned
    runner = CliRunner()
    again = runner.invoke(main, ["--home", str(home_dir), "index", "compiler", "--source", str(tree), "--release", "r2"])
    assert again.exit_code == 0, again.output
    home = KBHome(home_dir)
    model = active_model(home)
    searcher = Searcher(home, "compiler", "r2")
    assert searcher.manifest.embed_model == model.id and searcher.embedder.model == model
    hits = searcher.answer("where is the vector width of a global load decided", k=3, mode="vector")
    assert hits and hits[0].metadata["file"].endswith("Vectorize.cpp")

    listed = runner.invoke(main, ["--home", str(home_dir), "embedder", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["t1"]["active"] and rows["t1"]["indexes"] == ["compiler__r2"] and "compiler__r" in rows["base"]["indexes"]

    refused = runner.invoke(main, ["--home", str(home_dir), "embedder", "drop", "t1"])
    assert refused.exit_code == 2 and "t1 built the indexes compiler__r2" in refused.output
    taken = runner.invoke(main, ["--home", str(home_dir), "embedder", "tune", "--release", "r", "--name", "t1"])
    assert taken.exit_code == 2 and "an embedding model named 't1' exists" in taken.output


def test_an_index_whose_model_is_gone_is_a_clear_error(tmp_path):
    from kb.home import KBHome
    from kb.index import load_manifest

    home = KBHome(tmp_path / "home").ensure()
    home.manifests_dir.mkdir()
    (home.manifests_dir / "compiler__r.json").write_text(json.dumps({
        "corpus": "compiler", "release": "r", "collection": "c", "count": 1, "schema_version": 2,
        "embed_model": "tuned/gone@0123456789ab", "embed_dim": 384, "chunker": {}, "source": {}, "created": 0.0}))
    with pytest.raises(UserFacingError, match="embedding model tuned/gone@0123456789ab, which .* no longer has"):
        load_manifest(home, "compiler", "r")


def test_a_save_killed_before_the_rename_leaves_no_model(tmp_path, monkeypatch):
    import kb.embed
    from kb.embed import tuned_models
    from kb.home import KBHome
    from kb.tune import save_model

    class Killed(Exception):
        pass

    def dies(model, path):
        path.write_bytes(b"half an onnx file")
        raise Killed

    class Model:
        def save(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "model.safetensors").write_bytes(b"weights")

    home = KBHome(tmp_path / "home").ensure()
    monkeypatch.setattr(kb.embed, "_export_onnx", dies)
    with pytest.raises(Killed):
        save_model(home, Model(), "t", {})
    assert tuned_models(home) == [] and not (home.models_dir / "t").exists()
    monkeypatch.setattr(kb.embed, "_export_onnx", lambda model, path: path.write_bytes(b"onnx"))
    saved = save_model(home, Model(), "t", {})
    assert [m.id for m in tuned_models(home)] == [saved.id] and not list(home.models_dir.glob(".tmp-*"))


def test_bad_names_and_unknown_models_are_refused_in_one_line(tmp_path):
    from kb.home import KBHome
    from kb.tune import check_model_name, use_model

    home = KBHome(tmp_path / "home").ensure()
    for bad in ("base", "../x", ""):
        with pytest.raises(UserFacingError, match="is not usable"):
            check_model_name(home, bad)
    with pytest.raises(UserFacingError, match="no embedding model named 'nope'.*"):
        use_model(home, "nope")


def test_a_corrupt_choice_of_model_is_a_clear_error_and_use_repairs_it(tmp_path):
    from kb.embed import BASE_MODEL, active_model
    from kb.home import KBHome
    from kb.tune import use_model

    home = KBHome(tmp_path / "home").ensure()
    home.models_dir.mkdir()
    (home.models_dir / "active.json").write_text("{not json")
    with pytest.raises(UserFacingError, match="active.json is unreadable"):
        active_model(home)
    use_model(home, "base")
    assert active_model(home) == BASE_MODEL
