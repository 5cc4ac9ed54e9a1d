"""`kb bench` (the optimize loop over a suite, resumable) and `kb bench-report`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.app import main
from cli.options import (
    backend_option,
    breadth_option,
    json_option,
    llm_options,
    open_home,
    progress_bar,
    timing_window_options,
    user_errors,
)
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from diagnose.bench import Job
    from harness.backends import BackendName


@main.command()
@click.option("--suite", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Operator folders, each with task.py (default: corpora/operators).")
@click.option("--ops", default=None, help="Comma-separated operators (default: the whole suite); with --resume, "
              "operators of the suite added to the bench.")
@click.option("--rounds", default=5, show_default=True, help="Rounds per operator.")
@click.option("--time-budget", "time_budget", type=float, default=None, help="Seconds per operator run.")
@click.option("--strategy", default="progressive", show_default=True,
              help="Diagnosis strategies, comma-separated; each one is a condition run over the whole suite.")
@click.option("--workers", default=1, show_default=True, help="Jobs at once, one per GPU (CUDA_VISIBLE_DEVICES).")
@click.option("--llm", type=click.Choice(["none", "openai"]), default="none", show_default=True,
              help="openai: the runs also ask an OpenAI-compatible endpoint (KB_LLM_BASE_URL, KB_LLM_MODEL).")
@llm_options
@backend_option()
@click.option("--bench-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the bench lives (default: bench/<time> under the KB home).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Continue a bench: finished runs are kept, paused ones resumed, the rest started.")
@click.option("--stop-after", "stop_after", type=float, default=None,
              help="Seconds from now after which no job or round starts (a GPU machine lent for minutes).")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled"]), multiple=True, default=("eager",),
              show_default=True, help="PyTorch stand-ins each operator's initial and best kernels are timed against.")
@click.option("--ray", "ray_address", default=None,
              help="Run the jobs on a Ray cluster, one GPU each: auto (the running cluster), ray://HOST:PORT, or "
                   "local (start one here). Every node needs this checkout at the same path and the bench dir shared.")
@click.option("--retime", "retime_ops", default=None,
              help="With --resume: comma-separated operators whose finished runs take their end-of-run measurement "
                   "again (after their task's stand-in or initial kernel changed).")
@click.option("--rerun", "rerun_ops", default=None,
              help="With --resume: comma-separated operators whose runs are set aside under replaced/ and run "
                   "afresh (after a change to what chooses or makes their rounds); needs --why.")
@click.option("--why", "rerun_why", default="", help="With --rerun: what changed (commits), for the bench's note.")
@timing_window_options
@breadth_option
@json_option("Print the report as JSON.")
@click.pass_context
@user_errors
def bench(ctx: click.Context, suite: Path | None, ops: str | None, rounds: int, time_budget: float | None,
          strategy: str, workers: int, llm: str, llm_settings: dict[str, Any], backend: BackendName, bench_dir: Path | None, resume_dir: Path | None,
          stop_after: float | None, versus: tuple[str, ...], ray_address: str | None, retime_ops: str | None,
          rerun_ops: str | None, rerun_why: str, warmup_ms: int | None, rep_ms: int | None, breadth: int,
          as_json: bool) -> None:
    """The optimize loop over a benchmark suite, resumable, then its report (JSON, Markdown, PNG)."""
    import datetime

    from diagnose.bench import (
        DEFAULT_SUITE,
        BenchSpec,
        Condition,
        add_operators,
        create_bench,
        load_bench,
        load_suite,
        rejudge,
        rerun,
        retime,
        run_bench,
        set_timing_windows,
        write_report,
    )
    from diagnose.records import STRATEGIES

    if resume_dir is not None:
        directory = resume_dir
        named = [x.strip() for x in f"{rerun_ops or ''},{retime_ops or ''}".split(",") if x.strip()]
        unknown = [op for op in named if op not in load_bench(directory).operators]
        if unknown:  # before anything is changed
            raise UserFacingError(f"no operator {', '.join(unknown)} in the bench {directory}",
                                  f"pick among: {', '.join(load_bench(directory).operators)}")
        if rerun_ops:
            aside = rerun(directory, [x.strip() for x in rerun_ops.split(",") if x.strip()], rerun_why)
            click.echo(f"{len(aside)} run(s) set aside under {directory / 'replaced'}, to run afresh", err=True)
        if retime_ops:
            again = retime(directory, [x.strip() for x in retime_ops.split(",") if x.strip()])
            click.echo(f"{len(again)} finished run(s) will take their end-of-run measurement again", err=True)
        for run, why in rejudge(directory).items():  # a rule mended since a run ended applies to it too
            click.echo(f"{run}: its best kernel does not hold up in its end-of-run timing judged again ({why}): "
                       "the initial kernel stands", err=True)
        if ops:  # a bench run session by session: the operators the earlier sessions did not take
            added = add_operators(directory, [x.strip() for x in ops.split(",") if x.strip()])
            click.echo(f"{len(added)} operator(s) added to the bench", err=True)
        set_timing_windows(directory, warmup_ms, rep_ms)  # the jobs still to run take the new windows
    elif retime_ops or rerun_ops:
        raise UserFacingError(f"{'--retime' if retime_ops else '--rerun'} works on an existing bench",
                              "use it with --resume DIR")
    else:
        strategies = [x.strip() for x in strategy.split(",") if x.strip()]
        bad = [x for x in strategies if x not in STRATEGIES]
        if bad or not strategies:
            raise UserFacingError(f"unknown strategy {', '.join(bad) or strategy!r}", f"use {', '.join(STRATEGIES)}")
        chosen = backend
        if chosen == "interpreter":
            raise UserFacingError("kb bench times kernels on a device (cuda or npu)", "run it on the GPU machine")
        suite_dir = suite or DEFAULT_SUITE
        names = [x.strip() for x in ops.split(",") if x.strip()] if ops else list(load_suite(suite_dir))
        # Each job resolves the home as this command does (--home, else $KB_HOME, else the default).
        home = str(Path(ctx.obj["home"]).resolve()) if ctx.obj.get("home") else None
        spec = BenchSpec(str(suite_dir.resolve()), names, [Condition(x, x, home) for x in strategies], rounds,
                         time_budget, llm, chosen, references=list(dict.fromkeys(versus)), warmup_ms=warmup_ms,
                         rep_ms=rep_ms, llm_options=llm_settings if llm == "openai" else {}, breadth=breadth)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        directory = bench_dir or open_home(ctx, create=True).root / "bench" / stamp
        create_bench(directory, spec)
    click.echo(f"bench: {directory}", err=True)
    bar = progress_bar("bench")

    def event(what: str, job: Job) -> None:
        if what == "replaced":
            bar.console.print(f"{job.condition.name}/{job.operator}: its task changed since its run began; that run "
                              f"is set aside under {directory / 'replaced'} and the job starts afresh")
        if what == "done":
            bar.advance(task)
            bar.console.print(f"{job.condition.name}/{job.operator}: {job.state} in {job.seconds:.0f} s "
                              f"(log {job.log})")

    from diagnose.bench import jobs, load_bench

    todo = [j for j in jobs(directory, load_bench(directory)) if j.state in ("new", "partial", "stale")]
    with bar:
        task = bar.add_task("jobs", total=len(todo))
        try:
            result = run_bench(directory, workers, stop_after, event, ray_address=ray_address)
        except KeyboardInterrupt:
            click.echo(f"interrupted: continue with `kb bench --resume {directory}`", err=True)
            sys.exit(130)
    data = write_report(directory)
    left = [j for j in result if j.state in ("new", "partial")]
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo((directory / "report.md").read_text())
    if left:
        click.echo(f"{len(left)} job(s) not finished: continue with `kb bench --resume {directory}`", err=True)


@main.command("bench-report")
@click.argument("bench_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write report.json/.md/.png here (default: the bench directory; with several benches, "
                   "compare.md and compare.json here).")
@json_option()
@user_errors
def bench_report_cmd(bench_dirs: tuple[Path, ...], into: Path | None, as_json: bool) -> None:
    """Re-render a bench's report from its runs (a bench cut short reports what finished); given several
    benches (our suite, imported first drafts), their suite figures side by side with the published ones."""
    from diagnose.bench import bench_report, compare_markdown, write_report

    if len(bench_dirs) > 1:
        reports = [bench_report(d) for d in bench_dirs]
        text = compare_markdown(reports)
        if into is not None:
            into.mkdir(parents=True, exist_ok=True)
            (into / "compare.md").write_text(text, encoding="utf-8")
            (into / "compare.json").write_text(json.dumps(reports, indent=1), encoding="utf-8")
        click.echo(json.dumps(reports, indent=1) if as_json else text)
        return
    bench_dir = bench_dirs[0]
    data = write_report(bench_dir, into)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    click.echo(((into or bench_dir) / "report.md").read_text())


