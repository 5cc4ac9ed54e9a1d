"""`kb run`: check a task's kernel (and a candidate) in sandboxed workers, then time them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.app import main
from cli.options import backend_option, json_option, task_input, task_spec, user_errors
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from harness.backends import BackendName


@main.command("run")
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@task_input
@click.option("--candidate", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A rewritten kernel file to check and time against the task's own kernel.")
@click.option("--candidate-entry", default=None, help="Its launch wrapper (default: the task entry's name).")
@backend_option()
@click.option("--cases", default=None, help="Comma-separated case indices (default: all).")
@click.option("--seeds", default=3, show_default=True, help="Fresh random inputs per case.")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds a kernel may take per job.")
@click.option("--no-time", is_flag=True, help="Check correctness only.")
@click.option("--profile", is_flag=True,
              help="Profiler metrics per case: Nsight Compute on cuda (needs ncu), msprof op on npu (needs msprof).")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled"]), multiple=True,
              help="Also time the task's PyTorch version (its `eager`, else its reference) as written (eager) or "
                   "through torch.compile (compiled).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="The run's seed, to replay a report (it records its seed); default: a fresh one from os.urandom.")
@json_option("Print the report as JSON.")
@user_errors
def run_cmd(task_file: str | None, kernel_file: str | None, call: str | None, reference: str | None,
            atol: float | None, rtol: float | None, candidate: str | None, candidate_entry: str | None, backend: BackendName, cases: str | None, seeds: int,
            timeout_s: float, no_time: bool, profile: bool, versus: tuple[str, ...], seed: int | None,
            as_json: bool) -> None:
    """Check a task's kernel (and a candidate) for correctness, then time it: sandboxed, guarded.

    Exit status 0 when every kernel judged passed, 1 when one was rejected (the baseline included)."""
    from harness.run import RunOptions, run_task

    spec = task_spec(task_file, kernel_file, call, reference, atol, rtol)
    try:
        indices = [int(c) for c in cases.split(",")] if cases else None
    except ValueError as exc:
        raise UserFacingError(f"--cases {cases!r} is not a list of indices", "e.g. --cases 0,2") from exc
    options = RunOptions(backend=backend, cases=indices,
                         seeds=max(1, seeds), time=not no_time, timeout_s=timeout_s, profile=profile,
                         references=tuple(dict.fromkeys(versus)), seed=seed)
    report = run_task(spec, options, candidate=str(Path(candidate).resolve()) if candidate else None,
                      candidate_entry=candidate_entry)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        from rich.console import Console

        from cli.views.run import render_run

        render_run(report, Console())
    judged = [run for run in (report.run("baseline"), report.run("candidate")) if run is not None]
    if report.failure or not judged or not all(run.correct for run in judged):
        sys.exit(1)


