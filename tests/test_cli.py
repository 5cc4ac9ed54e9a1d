"""The `kb` front door through click's runner: answers, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from conftest import EXAMPLES, FIXTURES
from kb.cli import main

WHY = ["why", "why isn't this load vectorized?", "--kernel", str(EXAMPLES / "scale.py"),
       "--call", "scale(torch.randn(1000003), 2.0)"]


def test_help_does_not_import_heavy_layers():
    code = ("import sys; from kb.cli import main; "
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


def test_status_and_search(built_home):
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "status", "--json"])
    info = json.loads(result.stdout)
    assert {(i["corpus"], i["release"]) for i in info["indexes"]} == {("patterns", "catalog"), ("compiler", "fixture-1")}
    result = CliRunner().invoke(main, ["--home", str(built_home.root), "search", "getMaskAlignment",
                                       "--release", "fixture-1", "--json"])
    hits = json.loads(result.stdout)
    assert hits[0]["via"] == "symbol" and hits[0]["metadata"]["file"].endswith("AxisInfo.h")
