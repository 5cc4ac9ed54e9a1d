"""The `kb` front door through click's runner: answers, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

from click.testing import CliRunner
from conftest import EXAMPLES, FIXTURES

from cli import main

WHY = ["why", "why isn't this load vectorized?", "--kernel", str(EXAMPLES / "scale.py"),
       "--call", "scale(torch.randn(1000003), 2.0)"]


def test_help_does_not_import_heavy_layers():
    code = ("import sys; from cli import main; "
            "heavy = [m for m in ('torch', 'triton', 'chromadb', 'llama_index') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0


def test_why_answers_in_json_with_citations(built_home):
    result = CliRunner().invoke(main, ["--home", str(built_home.root), *WHY, "--release", "fixture-1", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["findings"][0]["kind"] == "vectorization.mask"
    assert answer["recommendations"][0]["pattern_id"] == "masked-tail-split"
    assert any(e["source"].endswith("@fixture-1") for e in answer["evidence"])


def test_why_markdown_without_a_kb(tmp_path):
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "none"), *WHY])
    assert result.exit_code == 0, result.output
    assert "masked-tail-split" in result.output and "## Evidence" in result.output
    assert "no knowledge base given" in result.output


def _one_line_error(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bad_inputs_are_one_line_errors(tmp_path):
    home = ["--home", str(tmp_path / "h")]
    assert "does not import" in _one_line_error(
        [*home, "why", "why slow?", "--kernel", str(FIXTURES / "kernels/broken_import.py"), "--call", "x"])
    assert "made no Triton launch" in _one_line_error(
        [*home, "why", "why slow?", "--kernel", str(FIXTURES / "kernels/no_launch.py"), "--call", "helper(1)"])
    assert "cannot answer" in _one_line_error([*home, *WHY[:1], "what time is it?", *WHY[2:]])
    assert "give --kernel FILE" in _one_line_error([*home, "why", "why slow?"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert "not a kernel-kb home" in _one_line_error(["--home", str(foreign), "index", "patterns"])
    assert "no knowledge base" in _one_line_error([*home, "status"])
    below_a_file = ["--home", str(foreign / "notes.txt" / "home"), "index", "patterns"]
    assert "cannot create the KB home" in _one_line_error(below_a_file)  # not a NotADirectoryError traceback


def test_version_and_a_shared_store_that_does_not_answer(built_home, monkeypatch):
    import socket

    version = CliRunner().invoke(main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("kb, version ")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("KB_CHROMA_URL", f"http://127.0.0.1:{port}")
    shown = CliRunner().invoke(main, ["--home", str(built_home.root), "status"])
    assert shown.exit_code == 1 and "(unreachable: cannot reach the chroma server" in shown.output
    info = CliRunner().invoke(main, ["--home", str(built_home.root), "status", "--json"])
    assert info.exit_code == 1 and "cannot reach" in json.loads(info.stdout)["vector_store_unreachable"]


def test_status_and_search(built_home):
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "status", "--json"])
    info = json.loads(result.stdout)
    assert {(i["corpus"], i["release"]) for i in info["indexes"]} == {("patterns", "catalog"), ("compiler", "fixture-1")}
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "search", "getMaskAlignment",
                                       "--release", "fixture-1", "--json"])
    hits = json.loads(result.stdout)
    assert hits[0]["via"] == "symbol" and hits[0]["metadata"]["file"].endswith("AxisInfo.h")
    # Coalesce.cpp is one chunk led by LoadVectorizer: the hit cites CoalescePass at line 23, and its
    # preview shows that definition, not the chunk's first lines.
    shown = CliRunner().invoke(main, ["--home", str(built_home.root), "search", "CoalescePass", "-k", "1",
                                      "--release", "fixture-1"]).output.splitlines()
    assert shown[0].startswith("1. lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:23@fixture-1  CoalescePass")
    assert shown[1].strip().startswith("struct CoalescePass"), shown
    # A lit-test case starts with its file's summary line: the preview still starts at the cited op.
    used = CliRunner().invoke(main, ["--home", str(built_home.root), "search", "tt.store", "-k", "1",
                                     "--release", "fixture-1"]).output.splitlines()
    assert used[0].startswith("1. test/TritonGPU/coalesce.mlir:13@fixture-1") and used[1].strip().startswith(
        "tt.store %arg0"), used


def test_symbols_shows_definitions_references_and_links(built_home):
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", "tritongpu-coalesce"])
    for pasted in ("// -----// IR Dump Before TritonGPUCoalesce: tritongpu-coalesce ('builtin.module' operation) //----- //",
                   "IR Dump After TritonGPUCoalesce (tritongpu-coalesce)"):
        assert CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", pasted]).output == result.output
    assert result.exit_code == 0, result.output
    assert "pass TritonGPUCoalesce (tritongpu-coalesce) include/triton/Dialect/TritonGPU/Transforms/Passes.td:4" \
        in result.output
    assert "-implemented-by-> class CoalescePass" in result.output
    assert "-adds-pass-> pass tritongpu-coalesce  [pybind binding" in result.output
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", "--json",
                                       "Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1"])
    view = json.loads(result.stdout)
    assert view["diagnostics"][0]["scope"].endswith("LoadVectorizer::matchAndRewrite")
    # The generated macro and the pybind binding reach the pass's links too.
    macro = CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", "GEN_PASS_DEF_TRITONGPUCOALESCE"])
    assert "pass TritonGPUCoalesce (tritongpu-coalesce)" in macro.output and "-implemented-by-> class CoalescePass" \
        in macro.output
    binding = CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", "add_coalesce"]).output
    assert "def pybind add_coalesce (binds " in binding and "-adds-pass-> pass tritongpu-coalesce" in binding
    # A use names the function it is in.
    used = CliRunner().invoke(main, ["--home", str(built_home.root), "symbols", "getMaskAlignment"]).output
    assert "call in mlir::triton::gpu::LoadVectorizer::matchAndRewrite  lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:13" \
        in used
    missing = _one_line_error(["--home", str(built_home.root), "symbols", "getMaskAlignmnt"])
    assert "no symbol 'getMaskAlignmnt' (similar: getMaskAlignment)" in missing


def test_releases_commands(tmp_path):
    home = ["--home", str(tmp_path / "h")]
    runner = CliRunner()
    for release in ("a", "b"):
        result = runner.invoke(main, [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"),
                                      "--release", release])
        assert result.exit_code == 0, result.output
    assert "0 files parsed, 7 from the parse cache; 0 texts embedded" in result.output
    # Not a terminal (a log, a CI job): progress also comes as plain lines while the work runs.
    assert re.search(r"^parse: 7/7 \(\d+ s\)$", result.stderr, re.MULTILINE), result.stderr
    listing = json.loads(runner.invoke(main, [*home, "releases", "list", "--json"]).stdout)
    assert [r["name"] for r in listing] == ["a", "b"] and listing[0]["corpora"]["compiler"] > 0
    # Symbols are kept per release: a second corpus of release a would replace a's.
    assert "already indexed as corpus compiler" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "a", "--corpus", "mine"])
    found = runner.invoke(main, [*home, "search", "where are loads coalesced"])
    assert found.output.startswith("searching compiler@b (the newest of 2; choose with --release)\n"), found.output
    previews = [ln for ln in found.output.splitlines() if ln.startswith("   ")]
    assert previews and not any(ln.lstrip().startswith(("// lib/", "// include/")) for ln in previews)  # code, not header
    diff = json.loads(runner.invoke(main, [*home, "releases", "diff", "a", "b", "--json"]).stdout)
    assert diff["files"] == {"added": [], "removed": [], "changed": [], "renamed": []}
    assert "not indexed" in _one_line_error([*home, "releases", "diff", "a", "zzz"])
    assert "release 'zzz' is not indexed (known: a, b)" in _one_line_error([*home, "symbols", "x", "--release", "zzz"])
    assert "--release zzz`, or pick an indexed release" in _one_line_error([*home, "search", "x", "--release", "zzz"])
    assert "the query is empty" in _one_line_error([*home, "search", "  "])
    assert runner.invoke(main, [*home, "search", "x", "-k", "-3"]).exit_code == 2  # click's range check
    # A dump and a source release sharing a name would share (and overwrite) one symbol-store release.
    assert "name of an indexed source release" in _one_line_error(
        [*home, "index", "ir", str(FIXTURES / "ir/stream.txt"), "--name", "a"])
    assert runner.invoke(main, [*home, "symbols", "getMaskAlignment", "--release", "a"]).exit_code == 0
    both = runner.invoke(main, [*home, "symbols", "getMaskAlignment"]).output
    assert both.splitlines()[1] == "  in 2 releases: a, b (one of them: --release NAME)"
    assert runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/stream.txt"), "--name", "run"]).exit_code == 0
    assert "name of an indexed IR dump" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "run"])
    assert "is an IR dump, not a source release" in _one_line_error([*home, "releases", "diff", "a", "run"])
    assert "'a' is a source release, not an IR dump" in _one_line_error([*home, "ir", "trace", "a", "tt.load"])
    assert "'a' is indexed in corpus compiler, not ir — search it with --corpus compiler" in _one_line_error(
        [*home, "search", "x", "--corpus", "ir", "--release", "a"])
    assert "kb index ir PATH --name NAME" in _one_line_error([*home, "search", "x", "--corpus", "ir", "--release", "zz"])
    assert "'run' is indexed in corpus ir, not compiler — search it with --corpus ir" in _one_line_error(
        [*home, "search", "x", "--release", "run"])
    assert runner.invoke(main, [*home, "releases", "drop", "run"]).exit_code == 0
    assert runner.invoke(main, [*home, "releases", "drop", "a"]).output.strip() == "dropped a (compiler)"
    assert [r["name"] for r in json.loads(runner.invoke(main, [*home, "releases", "list", "--json"]).stdout)] == ["b"]


def test_index_ir_and_trace_an_op(tmp_path):
    home = ["--home", str(tmp_path / "h")]
    runner = CliRunner()
    result = runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/malformed.txt"), "--name", "bad"])
    assert result.exit_code == 0, result.output
    assert "malformed (left out): malformed.txt:18: section for tritongpu-remove-layout-conversions" in result.output
    result = runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/stream.txt"), "--name", "copy"])
    assert result.exit_code == 0, result.output
    trace = runner.invoke(main, [*home, "ir", "trace", "copy", "convert_layout"])
    assert trace.exit_code == 0, trace.output
    assert "tritongpu-coalesce" in trace.output and "at copy.py:7" in trace.output
    assert re.search(r"^copy_kernel\s+1 tritongpu-coalesce", trace.output, re.MULTILINE)  # "IR pass 1/3" in search
    assert "first present after: tritongpu-coalesce [stream.txt:1]" in trace.output
    # A pass whose section is in the dump is found from its pasted header, whether it changed the IR or not.
    pasted = runner.invoke(main, [*home, "symbols", "IR Dump Before TritonGPUReorderInstructions: "
                                  "tritongpu-reorder-instructions ('builtin.module' operation)"]).output
    assert "def ir-pass (no snapshot after it) copy_kernel::tritongpu-reorder-instructions  stream.txt:38@copy" in pasted
    assert "no op or layout matching 'wgmma'" in _one_line_error([*home, "ir", "trace", "copy", "wgmma"])
    assert "no op given" in _one_line_error([*home, "ir", "trace", "copy", " "])  # would match every op
    assert "no kernel 'nope' in IR dump copy (kernels: copy_kernel)" in _one_line_error(
        [*home, "ir", "trace", "copy", "convert_layout", "--kernel", "nope"])
    # Stage files in another IR language are not compared with the stage before: ld.global is new in PTX.
    assert runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/triton_dump"), "--name", "dd"]).exit_code == 0
    trace = runner.invoke(main, [*home, "ir", "trace", "dd", "ld.global", "--kernel", "copy_kernel"])
    assert trace.exit_code == 0, trace.output
    assert trace.output.startswith("copy_kernel compiled with cuda:90, num_warps=4\n")  # from its metadata JSON
    [row] = [ln for ln in trace.output.splitlines() if re.match(r"copy_kernel\s+\d", ln)]
    assert " ptx " in row and "(new in this IR)" in row and "first present after: ptx" in trace.output
    gone = runner.invoke(main, [*home, "ir", "trace", "dd", "tt.load"])
    assert "last present after: ttgir in copy_kernel" in gone.output, gone.output
    assert "no IR found" in _one_line_error([*home, "index", "ir", str(FIXTURES / "kernels")])
    # Names become file names: two that differ only in other characters would share one index.
    assert "e.g. --name bad-name-x" in _one_line_error(
        [*home, "index", "ir", str(FIXTURES / "ir/stream.txt"), "--name", "bad name/x"])
    assert "e.g. --release a-b" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "a b"])
    # Chroma refuses ".." in a collection name, and a file name holds 255 bytes: refused before any work.
    assert "e.g. --release r1.x" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "r1..x"])
    assert "is 300 characters long; at most 100" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "r" * 300])
    dotted = tmp_path / "dump..1.txt"  # the default name comes from the file's stem
    shutil.copy(FIXTURES / "ir/stream.txt", dotted)
    assert "indexed ir@dump.1:" in runner.invoke(main, [*home, "index", "ir", str(dotted)]).output
    assert "is built by `kb index ir`" in _one_line_error(
        [*home, "index", "compiler", "--source", str(FIXTURES / "compiler_tree"), "--release", "src", "--corpus", "ir"])
    again = runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/triton_dump"), "--name", "copy"])
    assert f"replaced the earlier ir@copy (from {FIXTURES / 'ir/stream.txt'})" in again.output


def test_ir_trace_follows_a_layout(tmp_path):
    """A layout is no op: `ir trace run '#mma'` names the step after which it first appears, and the one
    after which the dot-operand layout is gone, with the dump line of each."""
    home = ["--home", str(tmp_path / "h")]
    runner = CliRunner()
    assert runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/accelerate_matmul.txt"), "--name", "mm"]
                         ).exit_code == 0
    trace = runner.invoke(main, [*home, "ir", "trace", "mm", "#mma"])
    assert trace.exit_code == 0, trace.output
    assert re.search(r"^k\s+3 tritongpu-accelerate-matmul\s+nvidia_mma \(first seen after it\)  "
                     r"\[accelerate_matmul.txt:\d+\]$", trace.output, re.MULTILINE), trace.output
    rows = json.loads(runner.invoke(main, [*home, "ir", "trace", "mm", "#ttg.dot_op", "--json"]).stdout)
    assert [(r["pass"], r["event"]) for r in rows] == [("convert-triton-to-tritongpu", "present"),
                                                        ("tritongpu-accelerate-matmul", "vanishes")]
    # The first snapshot has no snapshot before it: its layouts are where the dump starts, said as such.
    # `#blocked1` is a numbered alias of the kind `blocked`.
    blocked = runner.invoke(main, [*home, "ir", "trace", "mm", "#blocked1"]).output
    assert re.search(r"^k\s+1 convert-triton-to-tritongpu\s+blocked \(in the first snapshot\)", blocked, re.M), blocked
    assert "no op or layout matching '#swizzled_shared'" in _one_line_error(
        [*home, "ir", "trace", "mm", "#swizzled_shared"])
    # An op name still traces the op.
    assert "tritongpu-coalesce" in runner.invoke(main, [*home, "ir", "trace", "mm", "convert_layout"]).output
    # The layout is a symbol of the dump, linked to the step that brought it in.
    assert "ir-pass tritongpu-accelerate-matmul -introduces-> layout nvidia_mma  [first seen after it, at " \
        "accelerate_matmul.txt:" in runner.invoke(main, [*home, "symbols", "nvidia_mma", "--release", "mm"]).output


def test_an_ir_name_that_extends_another_keeps_its_timeline(tmp_path):
    """`mm` and `mm.bf16`: indexing or dropping one must not remove the other's pass timeline."""
    home = ["--home", str(tmp_path / "h")]
    runner = CliRunner()
    for name in ("mm.bf16", "mm"):
        assert runner.invoke(main, [*home, "index", "ir", str(FIXTURES / "ir/stream.txt"), "--name", name]).exit_code == 0
    assert runner.invoke(main, [*home, "releases", "drop", "mm"]).exit_code == 0
    trace = runner.invoke(main, [*home, "ir", "trace", "mm.bf16", "convert_layout"])
    assert trace.exit_code == 0 and "tritongpu-coalesce" in trace.output, trace.output


def test_a_build_killed_between_its_chunks_and_its_symbols_is_refused_until_run_again(tmp_path, monkeypatch):
    """The manifest switch publishes the chunks; the symbols follow in a second store. A build that
    dies in between must not pass for a finished one: every command names the command that repairs it."""
    from kb.symbols import SymbolStore

    home = ["--home", str(tmp_path / "h")]
    runner = CliRunner()
    tree = FIXTURES / "compiler_tree"
    assert runner.invoke(main, [*home, "index", "compiler", "--source", str(tree), "--release", "r1"]).exit_code == 0

    def killed(self, *args, **kwargs):
        raise SystemExit(137)  # what kill -9 leaves: nothing after this point ran

    with monkeypatch.context() as patch:
        patch.setattr(SymbolStore, "replace_release", killed)
        for args in (["compiler", "--source", str(tree), "--release", "r2"],
                     ["ir", str(FIXTURES / "ir/stream.txt"), "--name", "run"]):
            assert runner.invoke(main, [*home, "index", *args]).exit_code == 137
    listed = runner.invoke(main, [*home, "releases", "list"]).output
    assert f"before its symbols: kb index compiler --source {tree} --release r2" in listed, listed
    assert f"before its symbols: kb index ir {FIXTURES / 'ir/stream.txt'} --name run" in listed, listed
    assert re.search(rf"compiler@r2: \d+ chunks \(stopped before its symbols; finish it: kb index compiler "
                     rf"--source {re.escape(str(tree))} --release r2\)", runner.invoke(main, [*home, "status"]).output)
    fix = f"run it again to finish it: kb index compiler --source {tree} --release r2"
    assert fix in _one_line_error([*home, "search", "coalesce loads", "--release", "r2"])
    assert fix in _one_line_error([*home, "symbols", "getMaskAlignment", "--release", "r2"])
    assert fix in _one_line_error([*home, "releases", "diff", "r1", "r2"])
    assert fix in _one_line_error([*home, "embedder", "tune", "--release", "r2", "--name", "t", "--dry-run"])
    # The release indexed before is untouched, and running the command again finishes the build.
    assert runner.invoke(main, [*home, "search", "coalesce loads", "--release", "r1"]).exit_code == 0
    # Killed after the mark but before the switch: the live index is still the old one, whole.
    import kb.index

    with monkeypatch.context() as patch:
        patch.setattr(kb.index.os, "replace", killed)
        assert runner.invoke(main, [*home, "index", "compiler", "--source", str(tree), "--release", "r1"]
                             ).exit_code == 137
    assert runner.invoke(main, [*home, "symbols", "getMaskAlignment", "--release", "r1"]).exit_code == 0
    assert "--release r1" not in runner.invoke(main, [*home, "releases", "list"]).output
    assert runner.invoke(main, [*home, "index", "compiler", "--source", str(tree), "--release", "r2"]).exit_code == 0
    assert "getMaskAlignment" in runner.invoke(main, [*home, "symbols", "getMaskAlignment", "--release", "r2"]).output
    notes = [ln for ln in runner.invoke(main, [*home, "releases", "list"]).output.splitlines() if "before its" in ln]
    assert len(notes) == 1 and notes[0].endswith("--name run"), notes
    # Without --release, the dump still half-published does not block an answer drawn from r1 and r2.
    assert "getMaskAlignment" in runner.invoke(main, [*home, "symbols", "getMaskAlignment"]).output


def test_ir_trace_tells_each_compile_of_a_kernel_apart(tmp_path):
    """Two autotuning compiles in Triton's cache: each shows its options, and where the op first
    appears is said per compile."""
    for directory, warps in (("AAAA", 4), ("BBBB", 8)):
        shutil.copytree(FIXTURES / "ir/triton_dump/6f1c2a", tmp_path / "cache" / directory)
        (tmp_path / "cache" / directory / "copy_kernel.json").write_text(
            json.dumps({"name": "copy_kernel", "num_warps": warps, "target": {"backend": "cuda", "arch": 90}}))
    home = ["--home", str(tmp_path / "h")]
    indexed = CliRunner().invoke(main, [*home, "index", "ir", str(tmp_path / "cache"), "--name", "cache"])
    assert "  copy_kernel@BBBB: cuda:90, num_warps=8\n" in indexed.output, indexed.output
    trace = CliRunner().invoke(main, [*home, "ir", "trace", "cache", "ld.global"]).output
    assert "copy_kernel@AAAA compiled with cuda:90, num_warps=4\n" in trace
    assert "first present after: ptx in copy_kernel@AAAA [AAAA/copy_kernel.ptx:1]" in trace
    assert "first present after: ptx in copy_kernel@BBBB [BBBB/copy_kernel.ptx:1]" in trace
    # --kernel names every compile of the kernel; one compile without the op is named with its options.
    ptx = tmp_path / "cache" / "BBBB" / "copy_kernel.ptx"
    ptx.write_text(ptx.read_text().replace("ld.global", "ld.param"))
    assert CliRunner().invoke(main, [*home, "index", "ir", str(tmp_path / "cache"), "--name", "cache"]).exit_code == 0
    trace = CliRunner().invoke(main, [*home, "ir", "trace", "cache", "ld.global", "--kernel", "copy_kernel"]).output
    assert "first present after: ptx in copy_kernel@AAAA" in trace
    assert trace.rstrip().endswith("not in any snapshot of: copy_kernel@BBBB (cuda:90, num_warps=8)")


def test_ir_trace_keeps_its_columns_when_a_change_spans_a_left_out_section(tmp_path):
    lines = (FIXTURES / "ir/stream.txt").read_text().splitlines()
    cut = tmp_path / "cut.txt"  # the middle section loses its closing braces
    cut.write_text("\n".join(ln for i, ln in enumerate(lines, 1) if not (18 <= i <= 36 and ln.startswith(("}", "  }")))))
    home = ["--home", str(tmp_path / "h")]
    assert CliRunner().invoke(main, [*home, "index", "ir", str(cut), "--name", "cut"]).exit_code == 0
    trace = CliRunner().invoke(main, [*home, "ir", "trace", "cut", "tt.load", "--all"])
    header, *rows = [ln for ln in trace.output.splitlines() if re.match(r"(kernel|copy_kernel)\s", ln)]
    assert rows[0].endswith("+ left out: tritongpu-remove-layout-conversions")
    assert {len(row[:header.index("after") + 5].rstrip()) for row in rows} == {header.index("after") + 5}  # aligned


def test_eval_retrieval_reports_every_mode(built_home, tmp_path):
    (tmp_path / "gold.yaml").write_text(
        "corpus: compiler\nrelease: fixture-1\nqueries:\n"
        "  - {id: q1, kind: symbol, query: getMaskAlignment, expect: {files: [include/triton/Analysis/AxisInfo.h]}}\n"
        "  - {id: q2, kind: nl, query: which pass gives loads coalesced layouts,\n"
        "     expect: {files: [include/triton/Dialect/TritonGPU/Transforms/Passes.td, lib/Gone.cpp]}}\n")
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "eval", "retrieval", "--queries", str(tmp_path),
                                       "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    hybrid = report["sets"]["fixture-1"]["hybrid"]
    assert hybrid["symbol"]["recall@1"] == 1.0 and hybrid["all"]["n"] == 2
    assert set(report["overall"]) == {"bm25", "vector", "hybrid"}
    assert {q["id"] for q in report["queries"]} == {"q1", "q2"}
    assert report["unknown_targets"] == ["fixture-1 q2: lib/Gone.cpp"]  # said, not silently scored 0
    table = CliRunner().invoke(main, ["--home", str(built_home.root), "eval", "retrieval", "--queries", str(tmp_path)])
    lines = table.stdout.splitlines()
    assert [w for w in lines[0].replace("|", " ").split()] == ["bm25", "vector", "hybrid"]  # side by side
    [overall] = [ln for ln in lines if ln.startswith("overall") and " all " in ln]
    assert overall.count("|") == 3 and len(overall.split()) == 3 + 3 * 5
    (tmp_path / "gold.yaml").write_text("corpus: compiler\nrelease: fixture-1\nqueries:\n  - {id: q1, kind: x}\n")
    assert "gold.yaml: query 1: missing key 'query'" in _one_line_error(
        ["--home", str(built_home.root), "eval", "retrieval", "--queries", str(tmp_path)])


def test_vs_none_goes_alone(tmp_path):
    task = tmp_path / "t.py"
    task.write_text("")
    assert "--vs none cannot go with --vs eager" in _one_line_error(
        ["--home", str(tmp_path / "h"), "optimize", str(task), "--backend", "cuda", "--vs", "none", "--vs", "eager"])
