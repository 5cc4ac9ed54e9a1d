"""`kb why QUESTION` and `kb diagnose`: a kernel, however given, answered from compiler evidence."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.app import main
from cli.options import (
    cite_releases,
    diagnosis_home,
    json_option,
    kernel_input,
    level_max_option,
    strategy_option,
    user_errors,
)
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from collections.abc import Callable

    from diagnose.records import Answer
    from diagnose.request import DiagnosisRequest, KernelInput
    from harness.measurement import RunReport
    from kb.home import KBHome


def answer_for(kernel: KernelInput, kb_home: KBHome | None, target: str | None,
               engine: Callable[[DiagnosisRequest, KBHome | None], Answer], report: RunReport | None = None) -> Answer:
    """The kernel's request (compiled into the home's cache), answered by `engine` under the home's read
    lock, so an index being published meanwhile is never read half-written. `kb why`, `kb diagnose` and
    the MCP server's tools all answer through here."""
    from diagnose.request import request_from

    request = request_from(kernel, target, kb_home.compile_cache if kb_home else None, report)
    with kb_home.lock(write=False) if kb_home else contextlib.nullcontext():
        return engine(request, kb_home)


def _echo_answer(answer: Answer, as_json: bool, as_md: bool = False) -> None:
    from diagnose.render import to_json, to_markdown

    if as_json:
        click.echo(to_json(answer))
    elif as_md or not sys.stdout.isatty():
        click.echo(to_markdown(answer))
    else:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(to_markdown(answer)))


def _narrate(answer: Answer) -> None:
    """With an LLM endpoint configured, a narrative over the evidence; without one, nothing."""
    from diagnose.llm import LLMConfig, narrate

    config = LLMConfig.from_env()
    if config is not None:
        answer.narrative = narrate(answer, config)


@main.command()
@click.argument("question")
@kernel_input
@click.option("--task", "task_file", type=click.Path(dir_okay=False), default=None,
              help="A task file (entry, inputs, cases); its first case is compiled.")
@cite_releases
@json_option("Print the answer as JSON.")
@click.pass_context
@user_errors
def why(ctx: click.Context, question: str, kernel_file: str | None, call: str | None, task_file: str | None,
        dump_dir: str | None, target: str | None, release: str | None, as_json: bool) -> None:
    """Answer QUESTION about a kernel from compiler evidence (IR, remarks, ptxas, compiler source)."""
    from diagnose.engine import question_topics
    from diagnose.engine import why as answer_why
    from diagnose.request import KernelInput

    if task_file is None and dump_dir is None and (kernel_file is None or call is None):
        raise UserFacingError("give --kernel FILE with --call EXPR, --task FILE, or --dump DIR [--kernel FILE]",
                              'e.g. --kernel k.py --call "scale(torch.randn(1000003), 2.0)"')
    question_topics(question)  # reject unanswerable questions before compiling anything
    answer = answer_for(KernelInput(task=task_file, kernel=kernel_file, call=call, dump=dump_dir), diagnosis_home(ctx),
                        target, lambda request, kb_home: answer_why(question, request, kb_home, release))
    _narrate(answer)
    _echo_answer(answer, as_json)


@main.command()
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@kernel_input
@click.option("--case", "case_index", type=int, default=None,
              help="Which case of the task to compile (default: where --measurements leave the most headroom, "
                   "else the case that moves the most bytes).")
@click.option("--measurements", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A RunReport JSON from `kb run --json [--profile]` on the device: enables L2.")
@level_max_option
@strategy_option()
@cite_releases
@json_option("Print the diagnosis as JSON.")
@click.option("--md", "as_md", is_flag=True, help="Print plain Markdown (the default on a terminal is rendered).")
@click.pass_context
@user_errors
def diagnose(ctx: click.Context, task_file: str | None, kernel_file: str | None, call: str | None,
             dump_dir: str | None, case_index: int | None, target: str | None, measurements: str | None, level_max: str,
             strategy: str, release: str | None, as_json: bool, as_md: bool) -> None:
    """Why is this kernel slow? Escalates L1 pattern triage -> L2 profile -> L3 IR -> L4 compiler source."""
    from diagnose.engine import diagnose as run_diagnosis
    from diagnose.request import KernelInput
    from harness.measurement import RunReport

    kernel = KernelInput(task=task_file, kernel=kernel_file, call=call, dump=dump_dir, case=case_index)
    kernel.check_given()
    if (target or "").split(":")[0] in ("ascend", "npu") and dump_dir is None:
        raise UserFacingError("--target ascend diagnoses triton-ascend dumps: no NPU compiler is installed here",
                              "run the kernel with TRITON_DEBUG=1 on the NPU machine and pass --dump DIR")
    kernel.check()
    report = None
    if measurements:
        try:
            report = RunReport.from_dict(json.loads(Path(measurements).read_text()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserFacingError(f"{measurements} is not a run report ({type(exc).__name__}: {exc})",
                                  "pass the JSON that `kb run --json` prints") from exc
    answer = answer_for(kernel, diagnosis_home(ctx), target,
                        lambda request, kb_home: run_diagnosis(request, kb_home, release, strategy, level_max), report)
    _narrate(answer)
    _echo_answer(answer, as_json, as_md)


