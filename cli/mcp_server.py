"""`kb mcp`: the knowledge base as an MCP server over stdio, for agent hosts (Claude Code, Cursor,
Codex and the like), on the official Python SDK.

Tools: `why`, `diagnose`, `search`, `symbols`, `run` (check and time a candidate against a task),
`optimize_round` (one diagnose -> candidate-from-the-host -> judge step of an optimize run) and
`rounds`. Each returns structured JSON with evidence ids and citations (the same records `--json`
prints); a problem the user can fix is a tool error of one line (problem and fix); long calls run
in a worker thread and report progress. The SDK points fd 1 at stderr while it serves, so compiler
and worker output cannot corrupt the protocol.

This module imports the SDK at the top: only `kb mcp` (cli/agent_host.py) imports it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from harness.errors import UserFacingError

__all__ = ["build_server"]

T = TypeVar("T")
_RUN_FIX = "call rounds to list them, or pass task to start one"
Progress = Callable[[str], None]

_INSTRUCTIONS = """kernel-kb answers why a Triton kernel is slow from compiler evidence (IR, remarks, ptxas,
compiler source), and judges rewrites in a sandbox. Typical session: `diagnose` a kernel (or ask `why`),
`search`/`symbols` to read the compiler source behind a finding, then `optimize_round` with a task to get
the current best kernel, its findings and a rewrite prompt; write a candidate and call `optimize_round`
again with it: the judge checks correctness against the reference (with guards against torch fallbacks
and other shortcuts) and times it against its parent. Cite evidence ids ([E3]) and sources as given."""


def build_server(home: str | None = None) -> MCPServer:
    """The server, its tools bound to the KB home `home` (None: $KB_HOME, else the default)."""
    server = MCPServer("kernel-kb", instructions=_INSTRUCTIONS)

    @server.tool(description="Answer a question about a Triton kernel (\"why isn't this load vectorized?\") from "
                             "compiler evidence. Give kernel (a .py path) with call (an example call of its launch "
                             "wrapper), or task (a task file).")
    async def why(question: str, ctx: Context, kernel: str | None = None, call: str | None = None,
                  task: str | None = None, release: str | None = None) -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _why(home, question, kernel, call, task, release, say))

    @server.tool(description="Diagnose why a kernel is slow: L1 pattern triage, L2 profile, L3 IR attribution, L4 "
                             "compiler source, escalating only as far as needed (strategy progressive) or to "
                             "level_max. Findings cite evidence ids; recommendations name catalog patterns.")
    async def diagnose(ctx: Context, kernel: str | None = None, call: str | None = None, task: str | None = None,
                       case: int | None = None, strategy: str = "progressive", level_max: str = "L4",
                       release: str | None = None) -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _diagnose(home, kernel, call, task, case, strategy, level_max,
                                                           release, say))

    @server.tool(description="Search the KB: compiler source (corpus compiler), the pattern catalog (patterns) or "
                             "indexed IR. Exact symbol hits first, then BM25 + vectors. Each hit has its citation.")
    async def search(query: str, ctx: Context, corpus: str = "compiler", k: int = 5, release: str | None = None,
                     mode: str = "hybrid") -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _search(home, query, corpus, k, release, mode))

    @server.tool(description="A compiler symbol (function, class, pass argument, op such as ttg.convert_layout, "
                             "or a diagnostic message): definitions, pass record, references, cross-layer links.")
    async def symbols(name: str, ctx: Context, release: str | None = None, max_refs: int = 10) -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _symbols(home, name, release, max_refs))

    @server.tool(description="Check a kernel against a task's reference (every case, guards against shortcuts) and "
                             "time it: the task's own kernel, or a candidate (a file path, or its source text) "
                             "timed against it. backend auto: cuda with a GPU, else the CPU interpreter (checks "
                             "only mean something there, not times).")
    async def run(ctx: Context, task: str | None = None, kernel: str | None = None, call: str | None = None,
                  reference: str | None = None, candidate: str | None = None, candidate_source: str | None = None,
                  backend: str = "auto", time: bool = True, seeds: int = 2, atol: float | None = None,
                  rtol: float | None = None) -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _run(home, task, kernel, call, reference, candidate,
                                                      candidate_source, backend, time, seeds, say, atol, rtol))

    @server.tool(description="One step of an optimize run driven by you. Without candidate: the run's current best "
                             "kernel, its findings and the rewrite prompt (evidence, history, cases, rules); the "
                             "first call needs task and starts the run. With candidate (the complete module's "
                             "source): the judge checks it and times it against its parent as the run's next "
                             "round: accepted, or rejected with the reason. finding: which finding it answers.")
    async def optimize_round(ctx: Context, run: str | None = None, task: str | None = None,
                             candidate: str | None = None, finding: str = "", backend: str = "auto") -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _optimize_round(home, run, task, candidate, finding, backend, say))

    @server.tool(description="Optimize runs under the KB home (run omitted), or one run's rounds: hypothesis, "
                             "level, outcome, speedup and why, with the LLM cost where a model was asked.")
    async def rounds(ctx: Context, run: str | None = None) -> dict[str, Any]:
        return await _in_thread(ctx, lambda say: _rounds(home, run))

    return server


async def _in_thread(ctx: Context, work: Callable[[Progress], T]) -> T:
    """`work` in a worker thread (the event loop keeps answering), its messages sent as progress; a
    UserFacingError is the tool's one-line error."""
    steps = 0

    def say(message: str) -> None:
        nonlocal steps
        steps += 1
        with contextlib.suppress(Exception):  # a client gone or not asking for progress loses nothing
            anyio.from_thread.run(ctx.report_progress, steps, None, message)

    try:
        return await anyio.to_thread.run_sync(lambda: work(say))
    except UserFacingError as exc:
        raise ToolError(str(exc)) from exc


# ------------------------------------------------------------------------------------------------ the tools
def _kernel_input(kernel: str | None, call: str | None, task: str | None, case: int | None = None) -> Any:
    from diagnose.request import KernelInput

    if task is None and (kernel is None or call is None):
        raise UserFacingError("give kernel (a .py path) with call (an example call), or task (a task file)",
                              'e.g. kernel="k.py", call="scale(torch.randn(1000003), 2.0)"')
    given = KernelInput(task=task, kernel=kernel, call=call, case=case)
    given.check()
    return given


def _diagnosis_home(home: str | None) -> Any:
    from kb.home import KBHome

    return KBHome.if_present(home)


def _why(home: str | None, question: str, kernel: str | None, call: str | None, task: str | None,
         release: str | None, say: Progress) -> dict[str, Any]:
    from cli.diagnose import answer_for
    from diagnose.engine import question_topics
    from diagnose.engine import why as answer_why
    from diagnose.render import to_json

    question_topics(question)  # an unanswerable question is refused before anything compiles
    given = _kernel_input(kernel, call, task)
    say("compiling the kernel and reading its IR")
    answer = answer_for(given, _diagnosis_home(home), None,
                        lambda request, kb_home: answer_why(question, request, kb_home, release))
    return dict(json.loads(to_json(answer)))


def _diagnose(home: str | None, kernel: str | None, call: str | None, task: str | None, case: int | None, strategy: str,
              level_max: str, release: str | None, say: Progress) -> dict[str, Any]:
    from cli.diagnose import answer_for
    from diagnose.engine import diagnose as run_diagnosis
    from diagnose.records import LEVELS, STRATEGIES
    from diagnose.render import to_json

    if strategy not in STRATEGIES or level_max not in LEVELS:
        raise UserFacingError(f"strategy {strategy!r} / level_max {level_max!r} is not known",
                              f"strategy is one of {', '.join(STRATEGIES)}; level_max one of {', '.join(LEVELS)}")
    given = _kernel_input(kernel, call, task, case)
    say("diagnosing: L1 triage, then as deep as the strategy goes")
    answer = answer_for(given, _diagnosis_home(home), None,
                        lambda request, kb_home: run_diagnosis(request, kb_home, release, strategy, level_max))
    return dict(json.loads(to_json(answer)))


def _search(home: str | None, query: str, corpus: str, k: int, release: str | None, mode: str) -> dict[str, Any]:
    from cli.options import home_at
    from cli.query import search_hits

    if mode not in ("hybrid", "bm25", "vector"):
        raise UserFacingError(f"mode {mode!r} is not known", "mode is hybrid, bm25 or vector")
    searcher, hits = search_hits(home_at(home), query, corpus, release, max(1, k), mode)
    return {"corpus": corpus, "release": searcher.release,
            "hits": [{"cite": h.cite(), "via": h.via, "score": h.score, "text": h.cited_text(),
                      "metadata": h.metadata} for h in hits]}


def _symbols(home: str | None, name: str, release: str | None, max_refs: int) -> dict[str, Any]:
    from cli.options import home_at
    from cli.query import symbol_view

    return dict(json.loads(symbol_view(home_at(home), name, release, max(0, max_refs)).to_json()))


def _backend(name: str) -> Any:
    from harness.backends import BACKENDS, detect_backend

    if name != "auto" and name not in BACKENDS:
        raise UserFacingError(f"backend {name!r} is not known", f"use auto or one of {', '.join(BACKENDS)}")
    return detect_backend() if name == "auto" else name


def _run(home: str | None, task: str | None, kernel: str | None, call: str | None, reference: str | None,
         candidate: str | None, candidate_source: str | None, backend: str, time: bool, seeds: int,
         say: Progress, atol: float | None = None, rtol: float | None = None) -> dict[str, Any]:
    from cli.options import task_spec
    from diagnose.judging import why_rejected
    from harness.run import RunOptions, run_task

    spec = task_spec(task, kernel, call, reference, atol, rtol)
    if candidate and candidate_source:
        raise UserFacingError("give candidate (a path) or candidate_source (its text), not both", "pass one of them")
    if candidate_source is not None:
        candidate = str(_scratch_file(home, candidate_source))
    elif candidate is not None and not Path(candidate).is_file():
        raise UserFacingError(f"{candidate} does not exist", "pass the path of the candidate's .py file")
    options = RunOptions(backend=_backend(backend), seeds=max(1, seeds), time=time)
    say("checking" + (" and timing" if time else "") + (" the candidate" if candidate else " the task's kernel"))
    report = run_task(spec, options, candidate=str(Path(candidate).resolve()) if candidate else None)
    role = "candidate" if candidate else "baseline"
    run = report.run(role)
    correct = bool(run and run.correct and not report.failure)
    verdict = "correct" if correct else why_rejected(report, role)
    speedups = report.speedups() if candidate and correct and time else {}
    return {"correct": correct, "verdict": verdict, "speedups": speedups, "report": report.to_dict()}


def _scratch_file(home: str | None, source: str) -> Path:
    """Source text sent by the host, as a file the judge can load (under the KB home's scratch/)."""
    import hashlib

    from kb.home import KBHome

    folder = Path(KBHome.resolve(home).root) / "scratch"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"candidate_{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
    path.write_text(source)
    return path


def _optimize_round(home: str | None, run: str | None, task: str | None, candidate: str | None, finding: str,
                    backend: str, say: Progress) -> dict[str, Any]:
    from cli.optimize import find_run, runs_root
    from diagnose.agent_step import agent_step
    from diagnose.optimize import OptimizeOptions
    from harness.task import TaskSpec, task_name
    from kb.home import KBHome

    if run is None and task is None:
        raise UserFacingError("give task to start an optimize run, or run to continue one", "e.g. task=\"ops/softmax/task.py\"")
    spec = None
    if task is not None:
        if not Path(task).is_file():
            raise UserFacingError(f"{task} does not exist", "pass the path of a task .py file")
        spec = TaskSpec.of_file(task)
    if run is not None:
        try:
            run_dir = find_run(home, run, _RUN_FIX)
        except UserFacingError:
            if spec is None:
                raise
            run_dir = Path(run) if "/" in run else runs_root(home) / run  # a new run, named by the host
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = KBHome.resolve(home).ensure().runs_dir / f"{task_name(str(task))}-{stamp}"
    options = OptimizeOptions(backend=_backend(backend), references=())
    step = agent_step(spec, options, run_dir, candidate=candidate, finding=finding, home=_diagnosis_home(home),
                      log=say)
    return step.to_dict()


def _rounds(home: str | None, run: str | None) -> dict[str, Any]:
    from cli.optimize import find_run, runs_in, runs_root
    from diagnose.rounds import RoundsStore
    from diagnose.run_summary import report

    dirs = [find_run(home, run, _RUN_FIX)] if run else runs_in(runs_root(home))
    summaries = []
    for d in dirs:
        store = RoundsStore(d)
        try:
            summaries.append(report(store).to_dict())
        finally:
            store.close()
    return {"runs": summaries}
