"""Compiler-source and IR indexers: syntax chunks, cross-layer links, incremental releases, IR steps."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import FIXTURES

from harness.errors import UserFacingError
from harness.ir import parse_remarks, read_ir_dump
from indexer.code import parse_code
from indexer.compiler import index_compiler_tree
from indexer.ir import index_ir_dump, load_timeline, summarize_dump
from indexer.mlir import parse_lit_test
from indexer.tablegen import op_names, parse_records, parse_tablegen
from kb.home import KBHome
from kb.index import list_manifests, load_manifest
from kb.releases import diff_releases, drop_release, list_releases
from kb.retrieve import Searcher
from kb.symbols import SymbolStore

TREE = FIXTURES / "compiler_tree"
IR = FIXTURES / "ir"


# ------------------------------------------------------------------------------------- parsing
def test_cpp_chunks_never_cut_a_function_and_know_patterns_and_passes():
    parsed = parse_code((TREE / "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp").read_bytes(), "cpp", max_chars=300)
    assert len(parsed.units) > 1  # the budget forces a split ...
    for sym in parsed.symbols:
        if sym.role == "def" and sym.kind in ("method", "function"):  # ... but never inside a function
            unit = parsed.units[sym.unit]
            assert unit.start_line <= sym.line and sym.end_line <= unit.end_line, sym
    kinds = {(s.name, s.kind, s.scope) for s in parsed.symbols if s.role == "def"}
    assert ("LoadVectorizer", "rewrite-pattern", "mlir::triton::gpu") in kinds
    assert ("runOnOperation", "method", "mlir::triton::gpu::CoalescePass") in kinds
    facts = {(f.kind, f.a, f.b) for f in parsed.facts}
    assert {("gen-pass-def", "TRITONGPUCOALESCE", ""), ("implements-base", "CoalescePass", "TritonGPUCoalesce"),
            ("rewrites-op", "LoadVectorizer", "LoadOp")} <= facts
    emitted = {(s.name, s.scope) for s in parsed.symbols if s.role == "emit"}
    assert ("Warning: vectorization fails vec = origin vec =",
            "mlir::triton::gpu::LoadVectorizer::matchAndRewrite") in emitted
    assert ("getMaskAlignment", 13) in {(s.name, s.line) for s in parsed.symbols if s.role == "ref"}


def test_huge_functions_split_between_statements_not_inside_them():
    body = "\n".join(f'  m.def("op{i}", [](int x) {{ return x + {i}; }});' for i in range(400))
    source = f"void init_ir(py::module &m) {{\n{body}\n}}\n".encode()
    units = parse_code(source, "cpp").units
    assert len(units) > 1
    for unit in units[1:]:
        assert all(line.startswith("  m.def(") or line == "}" for line in unit.text.splitlines())


def test_every_piece_of_a_split_function_is_labelled_with_it_and_packs_with_no_neighbour():
    helpers = "\n".join(f"static int helper{i}(int x) {{ return x * {i}; }}" for i in range(8))
    statements = "\n".join(f"  acc += helper{i % 8}(values[{i}]) * weights[{i}];  // term {i}" for i in range(260))
    source = (f"namespace mlir {{\n{helpers}\nint hugeAccumulate(const int *values, const int *weights) {{\n"
              f"  int acc = 0;\n{statements}\n  return acc;\n}}\n"
              "struct BlockedToMMA : public OpRewritePattern<DotOp> {};\n}  // namespace mlir\n").encode()
    units = parse_code(source, "cpp").units
    huge = [u for u in units if "acc +=" in u.text or "hugeAccumulate" in u.text]
    assert len(huge) > 1 and {u.symbol for u in huge} == {"hugeAccumulate"}
    assert huge[0].text.startswith("int hugeAccumulate(")  # not packed after the helpers
    assert [u.symbol for u in units if "helper0(int" in u.text] == ["helper0"]
    assert [u.symbol for u in units if "BlockedToMMA" in u.text] == ["BlockedToMMA"]


def test_a_small_file_is_labelled_by_its_function_not_its_namespace():
    source = b"namespace mlir {\nnamespace gpu {\nunsigned getMaskAlignment(Value mask) { return 1; }\n}\n}\n"
    [unit] = parse_code(source, "cpp").units
    assert (unit.symbol, unit.scope) == ("getMaskAlignment", "mlir::gpu")
    # Packed small definitions: the chunk is named by the one taking most of it.
    body = "\n".join(f"  step{i}(op);" for i in range(12))
    source = f"static int helperAlpha() {{ return 1; }}\nvoid CoalescePass::runOnOperation() {{\n{body}\n}}\n".encode()
    [unit] = parse_code(source, "cpp").units
    assert unit.symbol == "runOnOperation"
    # Methods of a class too big for one chunk are named by the methods, not by the class.
    methods = "\n".join(f"    def visit_{i}(self, node):\n" + "".join(f"        self.emit({i}, {j})\n" for j in range(12))
                        for i in range(12))
    units = parse_code(f"class CodeGenerator:\n{methods}".encode(), "python").units
    assert units[0].symbol == "CodeGenerator" and len(units) > 1  # the chunk where the class starts
    assert all(u.symbol.startswith("visit_") for u in units[1:])


def test_namespace_braces_join_the_code_they_wrap_instead_of_chunks_of_their_own():
    body = "\n".join(f"  total += compute{i}(value, {i});" for i in range(90))  # ~3 KB: a chunk of its own
    source = f"namespace mlir {{\nint accumulateAll(int value) {{\n  int total = 0;\n{body}\n  return total;\n}}\n" \
             f"}}  // namespace mlir\n".encode()
    [unit] = parse_code(source, "cpp").units
    assert unit.symbol == "accumulateAll" and unit.text.startswith("namespace mlir {") and unit.text.endswith("mlir")


def test_pybind_bindings_are_read_from_both_macro_and_lambda_forms():
    parsed = parse_code((TREE / "python/src/passes.cc").read_bytes(), "cpp")
    assert {(f.a, f.b) for f in parsed.facts if f.kind == "binding"} == {
        ("add_coalesce", "createTritonGPUCoalesce"),
        ("add_accelerate_matmul", "createTritonGPUAccelerateMatmul"),
        ("add_reorder_instructions", "createTritonGPUReorder"),
    }


def test_tablegen_names_ops_through_their_class_chain():
    records = parse_records((TREE / "include/triton/Dialect/TritonGPU/IR/TritonGPUOps.td").read_text())
    assert [op for _, op in op_names(records)] == ["ttg.convert_layout"]
    hivm = parse_records(
        'def HIVM_Dialect : Dialect {\n  let name = "hivm";\n}\n'
        'class HIVM_Op<string mnemonic, list<Trait> traits = []>\n'
        '    : Op<HIVM_Dialect, !strconcat("hir.", mnemonic), traits> {\n}\n'
        'class HIVM_DmaOp<string mnemonic, list<Trait> traits = []> : HIVM_Op<mnemonic, traits> {\n}\n'
        'def LoadOp : HIVM_DmaOp<"load", [Pure]> {\n}\n')
    assert [op for _, op in op_names(hivm)] == ["hivm.hir.load"]
    parsed = parse_tablegen(
        b'def HIVMPlanMemory : Pass<"hivm-plan-memory", "func::FuncOp"> {\n'
        b'  let summary = "plan memory";\n  let constructor = "mlir::hivm::createPlanMemoryPass()";\n}\n')
    assert parsed.passes[0]["constructor"] == "mlir::hivm::createPlanMemoryPass"


def test_lit_tests_split_by_case_and_name_the_passes_they_run():
    parsed = parse_lit_test((TREE / "test/TritonGPU/coalesce.mlir").read_bytes())
    assert [u.symbol for u in parsed.units] == ["load_vec4", "masked_store"]
    assert [(f.kind, f.a) for f in parsed.facts] == [("run-pass", "tritongpu-coalesce")]
    assert "tt.store" in parsed.units[1].summary and "tritongpu-coalesce" in parsed.units[1].summary
    # An op's use is cited where it is written, not at the start of its case.
    assert {(s.name, s.line) for s in parsed.symbols if s.kind == "op-use"} == {
        ("tt.func", 4), ("tt.load", 5), ("tt.func", 12), ("tt.store", 13)}
    pipeline = parse_lit_test(b'// RUN: opt %s --pass-pipeline="builtin.module(func.func(cse, hivm-plan-memory))"'
                              b' -split-input-file | FileCheck %s\nfunc.func @f() {\n  return\n}\n')
    assert [f.a for f in pipeline.facts] == ["cse", "hivm-plan-memory"]


# ------------------------------------------------------------------------------------- links
def test_release_links_cross_every_layer(built_home):
    store = SymbolStore(built_home.symbols_db)
    links = {(lk.src, lk.relation, lk.dst, lk.evidence) for lk in store.links_of("tritongpu-coalesce", "fixture-1")}
    assert ("tritongpu-coalesce", "implemented-by", "CoalescePass",
            "base-class at lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:23") in links  # where: names can repeat
    assert ("tritongpu-coalesce", "implemented-in", "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:8",
            "GEN_PASS_DEF") in links
    assert ("tritongpu-coalesce", "created-by", "createTritonGPUCoalesce", "generated-name") in links
    assert ("passes.ttgpuir.add_coalesce", "adds-pass", "tritongpu-coalesce",
            "pybind binding at backends/nvidia/compiler.py:7") in links  # the call site
    assert ("test/TritonGPU/coalesce.mlir", "tests-pass", "tritongpu-coalesce", "RUN line") in links
    lambda_bound = store.links_of("passes.ttgpuir.add_reorder_instructions", "fixture-1")
    assert ("adds-pass", "tritongpu-reorder-instructions", "pybind binding at backends/nvidia/compiler.py:9") in {
        (lk.relation, lk.dst, lk.evidence) for lk in lambda_bound}
    [remark] = store.find_message("Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1",
                                  "fixture-1")
    assert remark.scope.endswith("LoadVectorizer::matchAndRewrite") and remark.file.endswith("Coalesce.cpp")
    # As an engineer pastes it: with its location and severity, cut short, or a few of its words.
    for pasted in ("/tmp/k.py:12:20: remark: Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8",
                   "k.py:3:1: remark: Warning: vectorization fails vec = 1 ...", "vectorization fails"):
        assert [m.scope for m in store.find_message(pasted, "fixture-1")] == [remark.scope], pasted
    assert store.find_message("vectorization succeeds", "fixture-1") == []
    [op] = store.find("ttg.convert_layout", "fixture-1")
    assert (op.kind, op.file, op.line) == ("op", "include/triton/Dialect/TritonGPU/IR/TritonGPUOps.td", 11)
    assert op.chunk_id  # the op's definition is retrievable as a chunk
    store.close()


def test_a_pass_hit_cites_its_own_class_when_another_class_shares_its_name(tmp_path):
    """AscendNPU-IR has two structs PlanMemoryPass; only one derives the pass's generated base. A
    search that finds the pass record must cite that one, though the other sorts first by file."""
    tree = tmp_path / "tree"
    (tree / "include").mkdir(parents=True)
    (tree / "include/Passes.td").write_text(
        'def PlanMemory : Pass<"hivm-plan-memory", "mlir::ModuleOp"> {\n'
        '  let summary = "Plan the local buffer memory of every kernel";\n'
        '  let constructor = "mlir::hivm::createPlanMemoryPass()";\n}\n')
    for rel, base, body in (("lib/A_regbase/PlanMemory.cpp", "PassWrapper<PlanMemoryPass, OperationPass<>>",
                             "planRegisterBanks"),
                            ("lib/Transforms/PlanMemory.cpp", "impl::PlanMemoryBase<PlanMemoryPass>", "planLocalBuffers")):
        (tree / rel).parent.mkdir(parents=True)
        (tree / rel).write_text(f"struct PlanMemoryPass : public {base} {{\n  void runOnOperation() override {{\n"
                                f"    {body}(getOperation());\n  }}\n}};\n")
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        index_compiler_tree(home, embedder, tree, "r1")
    store = SymbolStore(home.symbols_db)
    [link] = [lk for lk in store.links_of("hivm-plan-memory", "r1") if lk.relation == "implemented-by"]
    assert (link.dst, link.dst_file) == ("PlanMemoryPass", "lib/Transforms/PlanMemory.cpp")
    hits = Searcher(home, "compiler", "r1", embedder=embedder).answer(
        "which pass plans the local buffer memory of every kernel", k=3, store=store)
    store.close()
    class_hits = [h for h in hits if h.metadata.get("symbol") == "PlanMemoryPass"]
    assert class_hits and class_hits[0].metadata["file"] == "lib/Transforms/PlanMemory.cpp", hits


def test_a_pass_view_lists_its_own_links_not_its_neighbours(tmp_path):
    """A lit test that runs two passes, and a class name two passes' classes share: the view of one
    pass shows its test and its class, not the other pass's links reached through them."""
    from cli.views.symbols import describe

    tree = tmp_path / "tree"
    (tree / "include").mkdir(parents=True)
    (tree / "include/Passes.td").write_text(
        'def PlanMemory : Pass<"hivm-plan-memory", "mlir::ModuleOp"> {\n  let summary = "plan memory";\n}\n'
        'def PlanMemoryRegbase : Pass<"hivm-plan-memory-regbase", "mlir::ModuleOp"> {\n'
        '  let summary = "plan register memory";\n}\n'
        'def AppendDeviceSpec : Pass<"hacc-append-device-spec", "mlir::ModuleOp"> {\n  let summary = "spec";\n}\n')
    for rel, base in (("lib/PlanMemory.cpp", "PlanMemoryBase"), ("lib/regbase/PlanMemory.cpp", "PlanMemoryRegbaseBase")):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(f"struct PlanMemoryPass : public impl::{base}<PlanMemoryPass> {{\n"
                                "  void runOnOperation() override {}\n};\n")
    (tree / "test").mkdir()
    (tree / "test/plan-memory.mlir").write_text(
        "// RUN: bishengir-opt %s -hacc-append-device-spec -hivm-plan-memory | FileCheck %s\n"
        "func.func @f() {\n  return\n}\n")
    home = KBHome(tmp_path / "home").ensure()
    with home.lock(write=True):
        index_compiler_tree(home, _embedder(home), tree, "r1")
    store = SymbolStore(home.symbols_db)
    links = {(lk.src, lk.relation, lk.dst) for lk in describe(store, "hivm-plan-memory", "r1").links}
    store.close()
    assert ("test/plan-memory.mlir", "tests-pass", "hivm-plan-memory") in links
    assert ("hivm-plan-memory", "implemented-by", "PlanMemoryPass") in links
    assert not {lk for lk in links if "hacc-append-device-spec" in lk or "hivm-plan-memory-regbase" in lk}, links


def test_an_unreadable_file_is_skipped_and_named_not_a_traceback(tmp_path, monkeypatch):
    """Permissions do not bite as root, so reading is made to fail as it does for another user."""
    import builtins
    from pathlib import Path

    def locked(path) -> bool:
        return Path(path).name.startswith("locked")

    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")) if locked(self) else read_bytes(self))
    monkeypatch.setattr("harness.ir.open", lambda file, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")) if locked(file) else builtins.open(file, *a, **k), raising=False)
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    (tree / "lib/locked.cpp").write_text("int f() { return 1; }\n")
    home = KBHome(tmp_path / "home").ensure()
    with home.lock(write=True):
        _, report = index_compiler_tree(home, _embedder(home), tree, "r1")
    assert report.files_skipped["unreadable"] == 1
    assert "skipped lib/locked.cpp: unreadable (Permission denied)" in report.notes
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    shutil.copy(IR / "stream.txt", dumps / "stream.txt")
    shutil.copy(IR / "stream.txt", dumps / "locked.txt")
    (dumps / "private").mkdir()
    shutil.copy(IR / "stream.txt", dumps / "private/stream.txt")
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": (_ for _ in ()).throw(PermissionError(
        13, "Permission denied", str(p))) if str(p).endswith("private") else scandir(p))
    dump = read_ir_dump(dumps)
    assert "locked.txt: unreadable (Permission denied)" in dump.skipped and dump.stages
    assert "private/: unreadable directory (Permission denied)" in dump.skipped


def test_a_reindex_leaves_no_copy_of_the_old_vectors_on_disk(tmp_path):
    """Chroma deletes a collection from its catalogue but not its HNSW directory (chroma#5259)."""
    import re

    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    for release in ("r1", "r2", "r1", "r1"):
        with home.lock(write=True):
            index_compiler_tree(home, embedder, TREE, release)
    segment_dirs = [d for d in home.chroma_dir.iterdir() if d.is_dir() and re.fullmatch(r"[0-9a-f-]{36}", d.name)]
    assert len(segment_dirs) == 2  # the two live collections' vectors only
    for release in ("r1", "r2"):  # re-indexing r1 took nothing of r2's
        assert Searcher(home, "compiler", release, embedder=embedder).search("coalesce loads", k=1, mode="vector")


# ------------------------------------------------------------------------------------- releases
def _embedder(home: KBHome):
    from kb.embed import OfflineEmbedding

    return OfflineEmbedding(cache_path=home.embed_cache_db)


def test_a_new_release_reparses_and_reembeds_only_what_changed_and_diffs(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        _, first = index_compiler_tree(home, embedder, tree, "r1")
    assert first.files_parsed == 7 and first.files_reused == 0
    coalesce = tree / "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp"
    coalesce.write_text(coalesce.read_text().replace("setCoalescedEncoding(axisInfo, mod);",
                                                     "setCoalescedEncoding(axisInfo, mod, /*vec=*/8);"))
    passes_td = tree / "include/triton/Dialect/TritonGPU/Transforms/Passes.td"
    passes_td.write_text(passes_td.read_text() + '\ndef TritonGPUPrefetch : Pass<"tritongpu-prefetch", '
                         '"mlir::ModuleOp"> {\n  let summary = "prefetch";\n}\n')
    (tree / "test/TritonGPU/coalesce.mlir").unlink()
    (tree / "include/triton/Analysis").rename(tree / "include/triton/Analyses")  # a moved file, content unchanged
    with home.lock(write=True):
        _, second = index_compiler_tree(home, embedder, tree, "r2")
    assert (second.files_parsed, second.files_reused) == (2, 4)
    assert 0 < second.texts_new <= 3 < second.chunks  # only the changed chunks were embedded

    diff = diff_releases(home, "r1", "r2")
    assert diff.files == {"added": [], "removed": ["test/TritonGPU/coalesce.mlir"],
                          "changed": ["include/triton/Dialect/TritonGPU/Transforms/Passes.td",
                                      "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp"],
                          "renamed": ["include/triton/Analysis/AxisInfo.h -> include/triton/Analyses/AxisInfo.h"]}
    # Its definitions moved with it: neither added nor removed.
    assert any(m.startswith("mlir::triton::ModuleAxisInfoAnalysis (class, ") and m.endswith(
        "include/triton/Analysis/AxisInfo.h -> include/triton/Analyses/AxisInfo.h)") for m in diff.symbols["moved"])
    assert not any("AxisInfo.h" in s for s in diff.symbols["added"] + diff.symbols["removed"])
    assert diff.passes["added"] == ["tritongpu-prefetch"] and not diff.passes["removed"]
    assert any(s.startswith("mlir::triton::gpu::CoalescePass::runOnOperation") for s in diff.symbols["changed"])
    assert not any("LoadVectorizer" in s for s in diff.symbols["changed"])

    assert {r.name for r in list_releases(home)} == {"r1", "r2"}
    with home.lock(write=True):
        assert drop_release(home, "r1") == ["compiler"]
    assert {r.name for r in list_releases(home)} == {"r2"}
    assert load_manifest(home, "compiler", "r1") is None and Searcher(home, "compiler").release == "r2"
    with pytest.raises(UserFacingError, match="release 'r1' is not indexed"):
        drop_release(home, "r1")


def test_unreadable_files_are_skipped_and_counted(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    (tree / "lib/blob.cpp").write_bytes(b"\x7fELF\x00\x00binary")
    (tree / "lib/latin1.py").write_bytes(("# caf\xe9 na\xefve d\xe9j\xe0 vu\n" * 8).encode("latin-1"))
    # One stray Latin-1 byte in a comment must not cost the whole file.
    (tree / "lib/author.cpp").write_bytes("// Copyright Jos\xe9\nint authoredHere() { return 1; }\n"
                                          .encode("latin-1"))
    (tree / "lib/huge.h").write_text("// filler\n" * 60000)
    os.mkdir(os.path.join(os.fsencode(tree / "lib"), b"na\xefve"))  # a Latin-1 directory name
    (tree / "lib" / os.fsdecode(b"na\xefve") / "x.cpp").write_text("int x() { return 0; }\n")
    (tree / "outside.h").symlink_to(tmp_path / "elsewhere.h")
    (tmp_path / "elsewhere.h").write_text("int elsewhere() { return 0; }\n")
    (tree / "lib/loop-a.cpp").symlink_to(tree / "lib/loop-b.cpp")  # a loop, and a link to nothing
    (tree / "lib/loop-b.cpp").symlink_to(tree / "lib/loop-a.cpp")
    (tree / "lib/gone.h").symlink_to(tree / "lib/deleted.h")
    os.mkfifo(tree / "lib/pipe.cpp")  # reading it would wait forever
    (tree / "lib/new\nline.cpp").write_text("int newline() { return 0; }\n")
    (tree / "lib/private").mkdir()  # listing it fails, as it does for another user (permissions do not bite root)
    (tree / "lib/private/hidden.cpp").write_text("int hidden() { return 0; }\n")
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": (_ for _ in ()).throw(PermissionError(
        13, "Permission denied", str(p))) if str(p).endswith("private") else scandir(p))
    home = KBHome(tmp_path / "home").ensure()
    with home.lock(write=True):
        _, report = index_compiler_tree(home, _embedder(home), tree, "r")
    assert report.files_skipped["unreadable directory"] == 1
    assert "skipped lib/private/: unreadable directory (Permission denied)" in report.notes
    assert (report.files_skipped["broken link"], report.files_skipped["not a regular file"],
            report.files_skipped["control character in file name"]) == (3, 1, 1)
    assert "skipped 'lib/new\\nline.cpp': its name holds a control character" in report.notes
    assert report.files_skipped["binary"] == 1 and report.files_skipped["not utf-8"] == 1
    assert report.files_skipped["too large"] == 1
    assert report.files_skipped["file name not UTF-8"] == 1 and report.files_skipped["link out of the tree"] == 1
    for name, why in (("huge.h", "KiB"), ("blob.cpp", "binary"), ("latin1.py", "not utf-8"), ("author.cpp", "replaced"),
                      ("na\\xefve/x.cpp", "name is not UTF-8"), ("outside.h", "outside the tree")):
        assert any(name in n and why in n for n in report.notes), (name, report.notes)
    assert sum(report.files_indexed.values()) == 8
    assert Searcher(home, "compiler", "r").search("authoredHere", k=1, mode="bm25")[0].metadata["file"] == "lib/author.cpp"


def test_a_tree_with_nothing_to_index_is_a_clear_error_and_keeps_the_old_index(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    with home.lock(write=True):
        old, _ = index_compiler_tree(home, _embedder(home), TREE, "r")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("# not a compiler")
    with home.lock(write=True), pytest.raises(UserFacingError, match=r"nothing to index in .*1 other \(\.md\)"):
        index_compiler_tree(home, _embedder(home), empty, "r")
    assert load_manifest(home, "compiler", "r").collection == old.collection


def test_queries_answer_from_the_old_index_while_a_build_parses_and_embeds(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        index_compiler_tree(home, embedder, TREE, "r")
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    (tree / "lib/Dialect/TritonGPU/Transforms/Extra.cpp").write_text("int brandNewHelper() { return 7; }\n")
    answered: dict[str, bool] = {}

    def query_now(stage: str, done: int, total: int) -> None:
        if stage in answered:
            return
        try:
            with home.lock(write=False, wait_s=0):
                answered[stage] = bool(Searcher(home, "compiler", "r", embedder=embedder).search("coalesce", k=1))
        except UserFacingError:
            answered[stage] = False  # the build holds the write lock

    with home.build_lock():
        index_compiler_tree(home, embedder, tree, "r", progress=query_now,
                            publish_lock=lambda: home.lock(write=True))
    assert answered == {"parse": True, "embed": True, "store": False}
    with pytest.raises(UserFacingError, match="building an index"), home.build_lock():
        with home.build_lock(wait_s=0):  # a second build waits, then says why
            pass
    assert Searcher(home, "compiler", "r", embedder=embedder).search("brandNewHelper", k=1, mode="bm25")
    # Indexing an IR dump (a run's stream can take a minute) leaves queries answering the same way.
    answered.clear()
    with home.build_lock():
        index_ir_dump(home, embedder, IR / "stream.txt", "run", progress=query_now,
                      publish_lock=lambda: home.lock(write=True))
    assert answered == {"summarize": True, "embed": True, "store": False}


class _Killed(Exception):
    pass


def test_an_interrupted_index_keeps_the_old_one_and_the_next_run_resumes(tmp_path, monkeypatch):
    import kb.index

    home = KBHome(tmp_path / "home").ensure()
    real = _embedder(home)
    with home.lock(write=True):
        old, _ = index_compiler_tree(home, real, TREE, "r")

    class DiesAfterOneBatch:
        calls = 0

        def embed_many(self, texts):
            DiesAfterOneBatch.calls += 1
            if DiesAfterOneBatch.calls > 1:
                raise _Killed
            return real.embed_many(texts)

    monkeypatch.setattr(kb.index, "_BATCH", 2)
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    for path in tree.rglob("*.cpp"):
        path.write_text(path.read_text() + "\n// touched\n")
    with home.lock(write=True), pytest.raises(_Killed):
        index_compiler_tree(home, DiesAfterOneBatch(), tree, "r")
    assert load_manifest(home, "compiler", "r").collection == old.collection  # the old index is still live
    assert Searcher(home, "compiler", "r", embedder=real).search("coalesce", k=1, mode="bm25")
    with home.lock(write=True):
        _, resumed = index_compiler_tree(home, real, tree, "r")
    assert resumed.files_parsed == 0  # every parse survived the kill in the parse cache
    assert resumed.texts_new < resumed.texts_to_embed  # the batch embedded before the kill is not redone
    assert [m.release for m in list_manifests(home)] == ["r"]


# ------------------------------------------------------------------------------------- IR dumps
def test_a_cache_directory_names_each_compile_with_its_options(tmp_path):
    """TRITON_CACHE_DIR holds one directory per compile: the metadata JSON beside the stages is what
    tells an autotuner's compiles of one kernel apart."""
    for directory, metadata in (("AAAA", '{"name": "copy_kernel", "num_warps": 4, "num_stages": 3, "maxnreg": null}'),
                                ("BBBB", '{"name": "copy_kernel", "num_warps": 8, "num_stages": 3,\n "shared": 16'),
                                ("CCCC", None)):
        shutil.copytree(IR / "triton_dump" / "6f1c2a", tmp_path / directory, ignore=shutil.ignore_patterns("*.cubin"))
        (tmp_path / directory / "copy_kernel.json").unlink()
        if metadata:
            (tmp_path / directory / "copy_kernel.json").write_text(metadata)
    (tmp_path / "AAAA" / "__grp__copy_kernel.json").write_text('{"child_paths": {}}')
    (tmp_path / "DDDD").mkdir()
    (tmp_path / "DDDD" / "other.json").write_text("{}")
    dump = read_ir_dump(tmp_path)
    assert sorted({s.kernel for s in dump.stages}) == ["copy_kernel@AAAA", "copy_kernel@BBBB", "copy_kernel@CCCC"]
    # Without usable JSON, the TTGIR module's attributes still tell the warps.
    assert dump.configs == {"copy_kernel@AAAA": {"num_warps": 4, "num_stages": 3},
                            "copy_kernel@BBBB": {"num_warps": 4}, "copy_kernel@CCCC": {"num_warps": 4}}
    # A truncated JSON loses the options, never the stages, and names its file and line.
    assert dump.problems == ["BBBB/copy_kernel.json:2: compile metadata is not valid JSON (Expecting ',' delimiter); "
                             "the kernel's stages are kept without it"]
    assert dump.skipped == ["AAAA/__grp__copy_kernel.json: no IR in it", "DDDD/other.json: no IR in it"]


def test_huge_non_utf8_and_truncated_dump_files(tmp_path, monkeypatch):
    import harness.ir

    shutil.copytree(IR / "triton_dump" / "6f1c2a", tmp_path / "d" / "h1", ignore=shutil.ignore_patterns("*.cubin"))
    ptx = tmp_path / "d" / "h1" / "copy_kernel.ptx"
    ptx.write_bytes(ptx.read_bytes().replace(b"copy_kernel", "copy_k\u00e9rnel".encode("latin-1"), 1))
    ttgir = tmp_path / "d" / "h1" / "copy_kernel.ttgir"
    ttgir.write_text("\n".join(ttgir.read_text().splitlines()[:4]))  # the module opened at line 2 never closes
    (tmp_path / "d" / "big.txt").write_text("// -----// IR Dump Before X: x ('builtin.module' operation) //----- //\n"
                                          + "module {\n}\n" * 100)
    monkeypatch.setattr(harness.ir.dumps, "MAX_DUMP_BYTES", 1000)
    dump = read_ir_dump(tmp_path / "d")
    assert [s.name for s in dump.stages] == ["copy_kernel.ttir", "copy_kernel.llir", "copy_kernel.ptx"]
    assert dump.notes == ["h1/copy_kernel.ptx:1: 1 byte(s) that are not UTF-8 replaced by U+FFFD"]
    assert dump.problems == ["h1/copy_kernel.ttgir:2: 2 unclosed '{' (the block opened at line 2 never closes: truncated?)"]
    assert dump.skipped[0].startswith("big.txt: too large (0 MiB, the limit is 0 MiB); dump one kernel")


def test_every_dump_format_reads_into_ordered_stages():
    stream = read_ir_dump(IR / "stream.txt")
    assert [s.pass_arg for s in stream.stages] == ["tritongpu-coalesce", "tritongpu-remove-layout-conversions",
                                                  "tritongpu-reorder-instructions"]
    triton_dir = read_ir_dump(IR / "triton_dump")
    assert [s.pass_arg for s in triton_dir.stages] == ["ttir", "ttgir", "llir", "ptx"]
    assert triton_dir.skipped == ["6f1c2a/copy_kernel.cubin: binary"]
    assert triton_dir.configs == {"copy_kernel": {"target": "cuda:90", "num_warps": 4}}  # its copy_kernel.json
    ascend = read_ir_dump(IR / "ascend_debug")
    assert [s.name for s in ascend.stages] == ["kernel.ttir.mlir", "kernel.ttadapter.mlir", "kernel.mlir"]
    assert {s.kernel for s in ascend.stages} == {"add_kernel"}  # its function, not the directory
    bisheng = read_ir_dump(IR / "bishengir_after_all.txt")
    assert [(s.pass_arg, s.when) for s in bisheng.stages][1] == ("convert-linalg-to-hivm", "After")


def test_steps_attribute_changes_to_the_pass_that_made_them():
    before = {s.pass_arg: s for s in summarize_dump(read_ir_dump(IR / "stream.txt"))}
    assert before["tritongpu-coalesce"].delta == {"ttg.convert_layout": 2}
    # Coalesce also gave the load its new layout: same count, rewritten line.
    assert before["tritongpu-coalesce"].introduced_at == {"ttg.convert_layout": ["copy.py:7"], "tt.load": ["copy.py:7"]}
    assert before["tritongpu-coalesce"].churn["tt.load"] == [1, 1]
    assert before["tritongpu-remove-layout-conversions"].delta == {"ttg.convert_layout": -2}
    after = {s.pass_arg: s for s in summarize_dump(read_ir_dump(IR / "bishengir_after_all.txt"))}
    assert after["convert-linalg-to-hivm"].delta["hivm.hir.load"] == 1
    assert after["hivm-plan-memory"].delta["memref.alloc"] == -1


def _section(pass_arg: str, aliases: str, op_line: str) -> str:
    return (f"// -----// IR Dump Before P: {pass_arg} ('builtin.module' operation) //----- //\n{aliases}\n"
            "module {\n  tt.func public @k(%p: !tt.ptr<f32>) {\n"
            f"    {op_line}\n    tt.return\n  }}\n}}\n")


def test_a_replaced_op_shows_though_its_count_does_not(tmp_path):
    """accelerate-matmul turns a convert_layout to a dot operand into one to #mma: no count changes.
    Layout aliases are numbered anew in every dump, so lines compare with the aliases spelled out."""
    x, y, mma = "#ttg.blocked<{sizePerThread = [1]}>", "#ttg.blocked<{sizePerThread = [4]}>", "#ttg.nvidia_mma<{v = 3}>"
    cvt = "%1 = ttg.convert_layout %0 : tensor<64xf32, {}> -> tensor<64xf32, {}>"
    stream = tmp_path / "s.txt"
    stream.write_text(
        _section("renumber-only", f"#blocked = {x}\n#blocked1 = {y}", cvt.format("#blocked", "#blocked1"))
        + _section("accelerate-matmul", f"#blocked = {y}\n#blocked1 = {x}", cvt.format("#blocked1", "#blocked"))
        + _section("cse", f"#blocked = {x}\n#mma = {mma}", cvt.format("#blocked", "#mma"))
        + _section("last", f"#blocked = {x}\n#mma = {mma}", cvt.format("#blocked", "#mma")))
    # In a "Before" stream a pass's change is between its snapshot and the next one.
    renumber, accelerate, cse, _ = summarize_dump(read_ir_dump(stream))
    assert renumber.churn == {} and not renumber.delta  # only the alias names moved
    assert accelerate.churn == {"ttg.convert_layout": [1, 1]} and not accelerate.delta
    assert not cse.churn


def test_function_scoped_sections_go_each_to_its_function(tmp_path):
    """bishengir runs function passes once per function of the module: switching between them is not
    a new compile of the kernel. A failed pass is said, and its section kept."""
    def section(when: str, func: str, vectors: int) -> str:
        return (f"// -----// IR Dump After {when} ('func.func' operation: @{func}) //----- //\n"
                f"func.func @{func}() {{\n" + "  %0 = vector.load %m[%c0] : memref<8xf32>, vector<8xf32>\n" * vectors
                + "  return\n}\n")
    stream = tmp_path / "fs.txt"
    stream.write_text(section("Canonicalizer (canonicalize)", "add_kernel", 0) + section("Canonicalizer (canonicalize)", "helper", 0)
                      + section("HIVMLoadVectorize Failed (hivm-load-vectorize)", "add_kernel", 2)
                      + section("HIVMLoadVectorize (hivm-load-vectorize)", "helper", 0)
                      + section("CSE (cse)", "add_kernel", 1))
    dump = read_ir_dump(stream)
    assert [s.kernel for s in dump.stages] == ["add_kernel", "helper", "add_kernel", "helper", "add_kernel"]
    assert dump.notes == ["fs.txt:9: hivm-load-vectorize failed on add_kernel; its section holds the IR it left"]
    steps = {(s.kernel, s.pass_arg): s for s in summarize_dump(dump)}
    assert steps["add_kernel", "hivm-load-vectorize"].delta == {"vector.load": 2}
    assert steps["add_kernel", "cse"].delta == {"vector.load": -1}
    # Triton anchors some passes on a function but prints the whole module: still the kernel's pipeline.
    triton = (IR / "stream.txt").read_text().replace(
        "tritongpu-reorder-instructions ('builtin.module' operation)",
        "tritongpu-reorder-instructions ('tt.func' operation: @some_helper)")
    (tmp_path / "triton.txt").write_text(triton)
    assert {s.kernel for s in read_ir_dump(tmp_path / "triton.txt").stages} == {"copy_kernel"}


def test_a_pass_internal_dumps_are_neither_its_input_nor_a_pass(tmp_path):
    """The pipeliner prints mid-pass modules ("SoftwarePipeliner internal IR Dump After: LowerLoops")
    inside its own section; read as part of that section they tripled its ops and blamed the pass
    before for them."""
    lines = (IR / "stream.txt").read_text().splitlines()
    module = lines[1:17]  # the IR the coalesce pass received
    internal = ["// -----// SoftwarePipeliner internal IR Dump After: LowerLoops", *module,
                "/k/copy.py:7:12: remark: pipelined with 2 stages",
                "// -----// SoftwarePipeliner internal IR Dump After: ExpandLoops", *module]
    stream = tmp_path / "stream.txt"
    stream.write_text("\n".join(lines[:17] + internal + lines[17:]) + "\n")
    plain = [(s.pass_arg, s.delta) for s in summarize_dump(read_ir_dump(IR / "stream.txt"))]
    assert [(s.pass_arg, s.delta) for s in summarize_dump(read_ir_dump(stream))] == plain
    [remark] = parse_remarks(stream.read_text())
    assert remark.pass_name == "tritongpu-coalesce"  # still running when it printed


def test_a_run_stream_credits_each_kernel_and_compile_by_its_function(tmp_path):
    """One MLIR_ENABLE_DUMP stream of a run holds several kernels' pipelines, and autotuning
    compiles one kernel several times: comparing across them would invent changes."""
    copy = (IR / "stream.txt").read_text()
    ttir = ("// -----// IR Dump Before Inliner: inline ('builtin.module' operation) //----- //\n"
            "module {\n  tt.func public @copy_kernel() {\n    tt.return\n  }\n}\n")
    # After lowering to LLVM, libdevice callees are declared before the kernel: not kernels.
    llvm = ("// -----// IR Dump Before ConvertNVGPUToLLVM: convert-nv-gpu-to-llvm ('builtin.module' operation) //----- //\n"
            "module {\n  llvm.func @__nv_erff(f32) -> f32\n"
            "  llvm.func @copy_kernel() attributes {nvvm.kernel = 1 : ui1} {\n    llvm.return\n  }\n}\n")
    stream = tmp_path / "run.txt"
    stream.write_text(copy + llvm + copy.replace("copy_kernel", "scale_kernel") + ttir + copy + ttir)
    kernels = [s.kernel for s in read_ir_dump(stream).stages]
    assert kernels == ["copy_kernel"] * 4 + ["scale_kernel"] * 3 + ["copy_kernel#2"] * 4 + ["copy_kernel#3"]
    plain = {s.pass_arg: s.delta for s in summarize_dump(read_ir_dump(IR / "stream.txt"))}
    steps = summarize_dump(read_ir_dump(stream))
    assert {s.pass_arg: s.delta for s in steps if s.kernel == "scale_kernel"} == plain
    assert {s.kernel for s in read_ir_dump(IR / "triton_dump").stages} == {"copy_kernel"}


def test_a_change_across_a_left_out_section_names_it(tmp_path):
    lines = (IR / "stream.txt").read_text().splitlines()
    truncated = [ln for i, ln in enumerate(lines, 1) if not (18 <= i <= 36 and ln.startswith(("}", "  }")))]
    (tmp_path / "cut.txt").write_text("\n".join(truncated) + "\n")
    dump = read_ir_dump(tmp_path / "cut.txt")
    assert len(dump.problems) == 1 and "tritongpu-remove-layout-conversions" in dump.problems[0]
    coalesce, reorder = summarize_dump(dump)
    assert coalesce.spans_left_out == ["tritongpu-remove-layout-conversions"] and not reorder.spans_left_out


def test_malformed_ir_is_reported_with_file_and_line():
    dump = read_ir_dump(IR / "malformed.txt")
    assert dump.problems == [
        "malformed.txt:18: section for tritongpu-remove-layout-conversions: 2 unclosed '{' "
        "(the block opened at line 22 never closes: truncated?)",
        "malformed.txt:28: empty IR section after the header for tritongpu-reorder-instructions",
    ]
    assert [s.pass_arg for s in dump.stages] == ["tritongpu-coalesce"]


def test_indexed_dump_answers_which_pass_introduced_an_op(tmp_path):
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        manifest, _, steps = index_ir_dump(home, embedder, IR / "stream.txt", "copy-run")
    assert manifest.corpus == "ir" and manifest.count == 2  # the first snapshot, and the passes that changed it
    store = SymbolStore(home.symbols_db)
    introduced = [s for s in store.find("ttg.convert_layout", "copy-run") if s.kind == "ir-op-introduced"]
    assert [(s.scope, s.line) for s in introduced] == [("tritongpu-coalesce", 1)]
    store.close()
    hits = Searcher(home, "ir", "copy-run", embedder=embedder).search("which pass introduced ttg.convert_layout",
                                                                      k=1, mode="bm25")
    assert hits[0].metadata["pass_arg"] == "tritongpu-coalesce"
    # One dump file holds every step: each step is its own hit, not one per file.
    assert len(Searcher(home, "ir", "copy-run", embedder=embedder).search("ttg.convert_layout", k=5)) == 2
    assert [s.pass_arg for s in load_timeline(home, "copy-run").steps] == [s.pass_arg for s in steps]
    with pytest.raises(UserFacingError, match="no IR found"):
        index_ir_dump(home, embedder, FIXTURES / "kernels", "not-ir")


def test_a_question_about_an_op_disappearing_finds_the_step_that_removed_it(tmp_path):
    """One pass vectorizes the load, a later one scalarizes it again: both steps' chunks name
    vector.load and memref.load, so only what each did tells them apart."""
    def after(pass_class: str, arg: str, op: str) -> str:
        return (f"// -----// IR Dump After {pass_class} ({arg}) //----- //\nmodule {{\n  func.func @k(%m: memref<8xf32>) {{\n"
                f"    %0 = {op} %m[%c0] : memref<8xf32>, vector<8xf32>\n    return\n  }}\n}}\n")
    (tmp_path / "d.txt").write_text(after("Convert", "triton-to-linalg", "memref.load")
                                    + after("HIVMLoadVectorize", "hivm-load-vectorize", "vector.load")
                                    + after("HIVMScalarizeLoads", "hivm-scalarize-loads", "memref.load"))
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        index_ir_dump(home, embedder, tmp_path / "d.txt", "d")
    _assert_first_step(Searcher(home, "ir", "d", embedder=embedder), {
        "where did the vectorized load disappear": "hivm-scalarize-loads",
        "which pass removed the vector load": "hivm-scalarize-loads",
        "where did the vector load appear": "hivm-load-vectorize",
        "which pass introduced the memref load again": "hivm-scalarize-loads"})


def _assert_first_step(searcher: Searcher, first_step: dict[str, str]) -> None:
    """Each question's top hit, in hybrid and in BM25 mode, is the named pass step."""
    for question, step in first_step.items():
        for mode in ("hybrid", "bm25"):
            assert searcher.search(question, k=1, mode=mode)[0].metadata["pass_arg"] == step, (question, mode)


def test_a_question_naming_a_layout_finds_the_step_where_that_layout_first_appears(tmp_path):
    """Coalesce adds a convert_layout; accelerate-matmul only turns the one to a dot operand into
    one to #mma (same count). "the convert_layout to #mma" is accelerate-matmul's, which op counts
    alone cannot tell: the layout has to be matched."""
    home = KBHome(tmp_path / "home").ensure()
    embedder = _embedder(home)
    with home.lock(write=True):
        _, _, steps = index_ir_dump(home, embedder, IR / "accelerate_matmul.txt", "mm")
    accelerate = steps[-1]
    assert (accelerate.delta, accelerate.layouts_new, accelerate.layouts_gone) == ({}, ["nvidia_mma"], ["dot_op"])
    assert steps[1].layouts_new == [] and steps[1].delta == {"ttg.convert_layout": 1}
    _assert_first_step(Searcher(home, "ir", "mm", embedder=embedder), {
        "which pass introduced the convert_layout to #mma": "tritongpu-accelerate-matmul",
        "which pass introduced the mma layout": "tritongpu-accelerate-matmul",
        "where did the dot operand layout disappear": "tritongpu-accelerate-matmul",
        "which pass introduced another ttg.convert_layout": "tritongpu-coalesce"})


def test_parse_cache_blob_is_the_whole_parsed_file():
    """`ParsedFile.to_bytes` spells out its fields instead of `asdict`: a field added later must
    not be silently dropped from the cache."""
    import dataclasses
    import json
    import zlib

    from indexer.parsed import ParsedFile

    parsed = parse_code((FIXTURES / "compiler_tree/lib/Dialect/TritonGPU/Transforms/Coalesce.cpp").read_bytes(), "cpp")
    assert parsed.units and parsed.symbols and parsed.facts
    assert json.loads(zlib.decompress(parsed.to_bytes())) == dataclasses.asdict(parsed)
    assert ParsedFile.from_bytes(parsed.to_bytes()) == parsed


def test_a_form_feed_does_not_shift_chunk_lines():
    """str.splitlines also breaks at a form feed (old sources separate pages with one), tree-sitter
    does not: every chunk after it was cited a line early and lost its last line."""
    body = "".join(f"  int v{i} = {i} * {i} + {i};\n" for i in range(8))
    source = f"int first() {{\n{body}  return 1;\n}}\n\f\nint second() {{\n{body}  return 2;\n}}\n"
    parsed = parse_code(source.encode(), "cpp", max_chars=250)
    second = next(u for u in parsed.units if u.symbol == "second")
    assert (second.start_line, second.end_line) == (13, 23)
    assert second.text.startswith("int second()") and second.text.endswith("return 2;\n}")


def test_a_comment_above_a_definition_is_chunked_with_it():
    """The doc comment of a function went into the chunk of the function before it, where neither
    search nor the embedder (which reads a chunk's start) tied it to the function it documents."""
    body = "".join(f"  int v{i} = {i} * {i} + {i};\n" for i in range(30))
    source = (f"int first() {{\n{body}  return 1;\n}}\n\n"
              "/// Computes how many elements each thread holds.\n/// Second line of the doc.\n"
              f"int elemsPerThread() {{\n{body}  return 2;\n}}\n\n"
              "// A note about the file, with a blank line after it.\n\n"
              f"int third() {{\n{body}  return 3;\n}}\n")
    units = {u.symbol: u for u in parse_code(source.encode(), "cpp").units}
    assert units["elemsPerThread"].text.startswith("/// Computes how many elements each thread holds.")
    assert units["elemsPerThread"].start_line == 35
    assert "Computes how many" not in units["first"].text
    assert units["third"].text.startswith("int third()")  # a comment set apart by a blank line is not its doc


def test_an_out_of_line_definition_is_a_method_only_when_its_qualifier_is_a_class():
    source = (b"namespace triton {\nstd::unique_ptr<Pass> createAutoBlockifyPass();\n}\n"
              b"std::unique_ptr<Pass> triton::createAutoBlockifyPass() { return nullptr; }\n"
              b"bool CTAPlanner::processForward(Value v) { return true; }\n")
    kinds = {s.name: s.kind for s in parse_code(source, "cpp").symbols if s.role == "def"}
    assert kinds == {"triton": "namespace", "createAutoBlockifyPass": "function", "processForward": "method"}


def test_a_call_names_the_innermost_function_it_is_in():
    source = (b"struct Planner {\n  void run() {\n    auto f = [&]() { helper(); };\n    other();\n  }\n};\n"
              b"int x = global_init();\n")
    calls = {s.name: s.scope for s in parse_code(source, "cpp").symbols if s.kind == "call"}
    assert calls["other"] == "Planner::run" and calls["helper"] == "Planner::run"  # a lambda is not a definition
    assert calls["global_init"] == ""
