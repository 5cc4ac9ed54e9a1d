"""`kb mcp` driven by the MCP SDK's own client over stdio: a real server process, a real KB home, the
real judge on the CPU interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from conftest import EXAMPLES, FIXTURES, REPO
from mcp import Client
from mcp.client.stdio import StdioServerParameters

TASK = FIXTURES / "optimize" / "task.py"
SOURCE = (FIXTURES / "optimize" / "rowsum.py").read_text()
CHEAT = SOURCE.replace("    rowsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=128, num_warps=1)\n    return out",
                       "    return x.sum(dim=-1)")
TOOLS = {"why", "diagnose", "search", "symbols", "run", "optimize_round", "rounds"}


def _server(home: Path) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k.startswith(("KB_", "HOME", "PATH", "TMP", "XDG_"))}
    env["PYTHONPATH"] = str(REPO)
    return StdioServerParameters(command=sys.executable, args=["-m", "cli", "--home", str(home), "mcp"], env=env,
                                 cwd=str(REPO))


def _session(home: Path, script: Any) -> Any:
    """Run `script(call)` against a fresh server; `call(tool, **args)` returns (result, progress messages)."""

    async def main() -> Any:
        async with Client(_server(home), read_timeout_seconds=600) as client:
            async def call(tool: str, **args: Any) -> tuple[Any, list[str]]:
                seen: list[str] = []

                async def progress(done: float, total: float | None, message: str | None) -> None:
                    seen.append(message or "")

                return await client.call_tool(tool, args, progress_callback=progress), seen

            tools = await client.list_tools()
            return await script(call, {t.name for t in tools.tools})

    return anyio.run(main)


def test_the_kb_tools_answer_with_structured_evidence_and_one_line_errors(built_home):
    async def script(call: Any, names: set[str]) -> None:
        assert names == TOOLS
        found, _ = await call("search", query="tritongpu-coalesce", k=3)
        assert not found.is_error, found.content
        hits = found.structured_content["hits"]
        assert hits and all(h["cite"].endswith("@fixture-1") or h["cite"].startswith("pattern") or ":" in h["cite"]
                            for h in hits)
        assert any("coalesce" in h["text"].lower() for h in hits)
        symbol, _ = await call("symbols", name="tritongpu-coalesce")
        assert not symbol.is_error and "fixture-1" in str(symbol.structured_content)
        answer, progress = await call("diagnose", kernel=str(EXAMPLES / "scale.py"),
                                      call="scale(torch.randn(1000003), 2.0)", level_max="L3")
        assert not answer.is_error, answer.content
        data = answer.structured_content
        ids = {e["id"] for e in data["evidence"]}
        assert data["findings"] and all(set(f["evidence"]) <= ids for f in data["findings"])
        assert progress  # the long call said what it was doing
        bad, _ = await call("diagnose", call="scale(x)")
        assert bad.is_error and "give kernel" in bad.content[0].text and "\n" not in bad.content[0].text
        missing, _ = await call("symbols", name="no-such-pass-anywhere")
        assert missing.is_error and "no symbol 'no-such-pass-anywhere'" in missing.content[0].text
        runs, _ = await call("rounds")
        assert runs.structured_content == {"runs": []}

    _session(built_home.root, script)


def test_an_agent_host_drives_optimize_rounds_through_the_judge(tmp_path):
    run_dir = tmp_path / "run"

    async def script(call: Any, names: set[str]) -> None:
        first, progress = await call("optimize_round", task=str(TASK), run=str(run_dir), backend="interpreter")
        assert not first.is_error, first.content
        step = first.structured_content
        assert step["judged"] is False and step["round"] == 1 and step["parent"] == 0
        assert "rowsum_kernel" in step["kernel"] and "## Kernel module" in step["prompt"]
        assert "no torch fallback" in step["rules"] and any("measuring the baseline" in p for p in progress)
        cheat, _ = await call("optimize_round", run=str(run_dir), candidate=CHEAT)
        judged = cheat.structured_content
        assert judged["judged"] and judged["outcome"] == "rejected" and "torch fallback" in judged["reason"]
        honest, _ = await call("optimize_round", run=str(run_dir), candidate=SOURCE + "# the same kernel, by the host\n")
        judged = honest.structured_content
        # It passed every check, so it went on to timing, which the CPU interpreter does not do: the
        # verdict is "no timed case" (on a GPU, a speedup), never a check's reason.
        assert judged["round"] == 2 and judged["outcome"] == "rejected" and judged["reason"].endswith("no timed case")
        assert "CPU interpreter" in judged["note"]
        shown, _ = await call("rounds", run=str(run_dir))
        (summary,) = shown.structured_content["runs"]
        assert [h["rewriter"] for h in summary["history"]] == ["host", "host"]
        checked, _ = await call("run", task=str(TASK), candidate_source=CHEAT, backend="interpreter", time=False)
        assert checked.structured_content["correct"] is False
        assert "torch fallback" in checked.structured_content["verdict"]
        unknown, _ = await call("optimize_round", run=str(tmp_path / "nowhere"))
        assert unknown.is_error and "no optimize run" in unknown.content[0].text

    _session(tmp_path / "home", script)
