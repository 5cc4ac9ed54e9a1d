"""`kb optimize`, `kb rounds list|show` and `kb synthesize`: the optimize loop, its runs, what they teach."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.app import main
from cli.options import (
    backend_option,
    breadth_option,
    cite_releases,
    diagnosis_home,
    json_option,
    llm_options,
    open_home,
    stand_ins,
    strategy_option,
    task_input,
    task_spec,
    timing_window_options,
    user_errors,
)
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from diagnose.rounds import RoundsStore
    from diagnose.run_summary import RunSummary
    from harness.backends import BackendName


def runs_root(home: str | None) -> Path:
    """The KB home's runs/ (`home`: --home as given, None for $KB_HOME or the default)."""
    from kb.home import KBHome

    return KBHome.resolve(home).runs_dir


def runs_in(root: Path) -> list[Path]:
    """Optimize run directories directly under `root` (each holds a rounds.sqlite)."""
    return sorted(p.parent for p in root.glob("*/rounds.sqlite")) if root.is_dir() else []


def _runs_of(ctx: click.Context, run: str) -> list[Path]:
    """A run (directory or id), or every run of a bench directory (`kb bench`)."""
    if (Path(run) / "bench.json").is_file():
        from diagnose.bench import bench_runs

        return bench_runs(Path(run))
    return [find_run(ctx.obj.get("home"), run)]


def find_run(home: str | None, run: str, fix: str = "see `kb rounds list`") -> Path:
    """A run given as a directory, or as a run id under the KB home's runs/."""
    path = Path(run)
    if (path / "rounds.sqlite").is_file():
        return path
    named = runs_root(home) / run
    if (named / "rounds.sqlite").is_file():
        return named
    raise UserFacingError(f"no optimize run {run!r} (neither a run directory nor an id under {runs_root(home)})", fix)


@main.command()
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@task_input
@click.option("--rounds", default=5, show_default=True, help="Rounds to run (a resumed run keeps its own).")
@click.option("--time-budget", "time_budget", type=float, default=None, help="Seconds after which no round starts.")
@click.option("--llm", type=click.Choice(["none", "openai"]), default="none", show_default=True,
              help="openai: also ask an OpenAI-compatible endpoint (KB_LLM_BASE_URL, KB_LLM_MODEL, KB_LLM_API_KEY).")
@llm_options
@strategy_option("How far each round's diagnosis escalates.")
@click.option("--untargeted/--no-untargeted", default=True, show_default=True,
              help="Once the findings and the launch search are spent, try the catalog's other rewrites that apply "
                   "to the kernel (rounds no finding asked for; a resumed run keeps its own).")
@click.option("--repair-baseline", "repair_baseline", is_flag=True, default=False,
              help="When the task's own kernel fails its checks and its diagnosis names a repair (a sum the IR adds in "
                   "bf16/fp16), start from the repaired kernel, checked first; speedups are then over it.")
@backend_option()
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the run lives (default: runs/<task>-<time> under the KB home).")
@click.option("--resume", "resume_run", default=None, help="Continue a run (its directory or id).")
@cite_releases
@click.option("--stop-after", "stop_after", type=float, default=None,
              help="Seconds from now after which no round starts; the run is left paused, to --resume later.")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled", "none"]), multiple=True, default=("eager",),
              show_default=True, help="PyTorch stand-ins timed beside the initial and best kernels at the end "
                                      "(none: no stand-in).")
@timing_window_options
@breadth_option
@click.option("--check-workers", "check_workers", type=click.IntRange(min=1), default=None,
              help="Processes that check a round's variants side by side (default: a quarter of the cores, at most 4).")
@json_option("Print the final report as JSON.")
@click.pass_context
@user_errors
def optimize(ctx: click.Context, task_file: str | None, kernel_file: str | None, call: str | None,
             reference: str | None, atol: float | None, rtol: float | None, rounds: int, time_budget: float | None, llm: str, llm_settings: dict[str, Any],
             strategy: str, untargeted: bool, repair_baseline: bool, backend: BackendName, run_dir: Path | None, resume_run: str | None,
             release: str | None, stop_after: float | None, versus: tuple[str, ...], warmup_ms: int | None, rep_ms: int | None,
             breadth: int, check_workers: int | None, as_json: bool) -> None:
    """Rounds of diagnose -> rewrite -> validate on a task (a TASK file, or --kernel FILE --call EXPR);
    every step persisted, resumable."""
    import datetime

    from diagnose.optimize import OptimizeOptions
    from diagnose.optimize import optimize as run_loop
    from harness.task import task_name

    starting = task_file is not None or kernel_file is not None
    if starting == (resume_run is not None):
        raise UserFacingError("give a TASK file (or --kernel FILE --call EXPR) to start a run, or --resume RUN to "
                              "continue one", "e.g. kb optimize corpora/operators/softmax/task.py --rounds 5")
    spec = task_spec(task_file, kernel_file, call, reference, atol, rtol) if starting else None
    if llm == "openai":
        from diagnose.llm import LLMConfig

        if LLMConfig.from_env() is None:
            raise UserFacingError("--llm openai needs an endpoint", "set KB_LLM_BASE_URL (and KB_LLM_MODEL, KB_LLM_API_KEY)")
    options = OptimizeOptions(rounds=rounds, time_budget_s=time_budget, llm=llm, strategy=strategy,
                              untargeted=untargeted, repair_baseline=repair_baseline, backend=backend, release=release,
                              references=stand_ins(versus), warmup_ms=warmup_ms, rep_ms=rep_ms,
                              check_workers=check_workers, breadth=breadth, **llm_settings)
    if options.backend == "interpreter":
        raise UserFacingError("kb optimize needs a device to time on (cuda or npu): the CPU interpreter's time is "
                              "not kernel performance", "run it on the GPU machine (kb run checks correctness here)")
    if resume_run is not None:
        directory = find_run(ctx.obj.get("home"), resume_run)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # The default place is the KB home's runs/, so the home must be one (created if new).
        name = task_name(str(task_file)) if task_file else Path(str(kernel_file)).stem
        directory = run_dir or open_home(ctx, create=True).runs_dir / f"{name}-{stamp}"
    kb_home = diagnosis_home(ctx)
    if spec is None:
        from diagnose.rounds import RoundsStore

        store = RoundsStore(directory)
        spec = store.run().spec
        store.close()

    def say(message: str) -> None:
        click.echo(message, err=True)

    say(f"run: {directory}")
    try:
        store = run_loop(spec, options, directory, kb_home, log=say, resume=resume_run is not None,
                         stop_at=time.time() + stop_after if stop_after is not None else None)
    except KeyboardInterrupt:
        click.echo(f"interrupted: continue with `kb optimize --resume {directory}`", err=True)
        sys.exit(130)
    _show_run(store, as_json)


def _show_run(store: RoundsStore, as_json: bool) -> None:
    """A run's summary, as JSON or as the table of its rounds; the store is closed after."""
    from diagnose.run_summary import report

    summary = report(store)
    store.close()
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=1))
        return
    _echo_rounds(summary)


def _echo_rounds(summary: RunSummary) -> None:
    s = summary
    click.echo(f"run {s.run} ({s.task}): {s.status}, {s.rounds} rounds, best round {s.best_round} (diagnosed at "
               f"{s.best_level or '-'}), speedup over the initial kernel {s.speedup_vs_initial:.3f}x "
               + ("(measured)" if s.speedup_vs_initial_measured else "(chained over rounds)"))
    click.echo(f"{'round':>5} {'parent':>6} {'level':>5} {'finding':<30} {'pattern':<26} {'outcome':<9} {'speedup':>8}")
    for h in s.history:
        speed = f"{h.speedup:.3f}x" if h.speedup else "-"
        click.echo(f"{h.round:>5} {h.parent or 0:>6} {h.level or '-':>5} {(h.finding or 'search'):<30} "
                   f"{h.pattern:<26} {h.outcome or h.state:<9} {speed:>8}")
        if h.others:
            click.echo(f"{'':>13}judged beside it: {', '.join(h.others)}")
        if h.outcome in ("rejected", "failed"):
            click.echo(f"{'':>13}why: {h.reason}")
        if h.cost:
            click.echo(f"{'':>13}LLM: {_cost_line(h.cost)}")
    if s.per_case_vs_initial:
        click.echo("best vs initial per case: " + ", ".join(f"{k} {v:.3f}x" for k, v in s.per_case_vs_initial.items()))
    elif s.per_case_best:
        click.echo("best round per case: " + ", ".join(f"{k} {v:.3f}x" for k, v in s.per_case_best.items()))
    if s.llm_cost:
        click.echo(f"LLM cost of the run: {_cost_line(s.llm_cost)}")
    if s.note:
        click.echo(f"note: {s.note}")
    click.echo(f"best kernel: {s.dir}/best.py" if s.best_round else "no round beat the initial kernel")


def _cost_line(cost: dict) -> str:
    estimated = " (estimated: the endpoint reported no usage)" if cost.get("estimated") else ""
    return (f"{cost.get('calls', 0)} calls, {cost.get('tokens_in', 0)} tokens in, {cost.get('tokens_out', 0)} out, "
            f"{cost.get('seconds', 0):.1f} s{estimated}")


@main.group()
def rounds() -> None:
    """Optimize runs and their rounds."""


@rounds.command("list")
@json_option()
@click.pass_context
@user_errors
def rounds_list(ctx: click.Context, as_json: bool) -> None:
    """Runs under the KB home's runs/ directory."""
    from diagnose.rounds import RoundsStore
    from diagnose.run_summary import report

    root = runs_root(ctx.obj.get("home"))
    rows = []
    for d in runs_in(root):
        store = RoundsStore(d)
        rows.append(report(store))
        store.close()
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=1))
        return
    if not rows:
        click.echo(f"no runs under {root}")
    for r in rows:
        click.echo(f"{r.run:<40} {r.task:<20} {r.status:<12} {r.rounds:>3} rounds  best {r.best_round}  "
                   f"{r.speedup_vs_initial:.3f}x")


@rounds.command("show")
@click.argument("run")
@json_option()
@click.pass_context
@user_errors
def rounds_show(ctx: click.Context, run: str, as_json: bool) -> None:
    """One run's rounds: hypothesis, level, rewrite, outcome and why."""
    from diagnose.rounds import RoundsStore

    store = RoundsStore(find_run(ctx.obj.get("home"), run))
    _show_run(store, as_json)


# ---------------------------------------------------------------------------------------------- synthesis
@main.command()
@click.argument("runs", nargs=-1)
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write learned patterns here (e.g. corpora/patterns/learned) instead of the KB home.")
@json_option()
@click.pass_context
@user_errors
def synthesize(ctx: click.Context, runs: tuple[str, ...], into: Path | None, as_json: bool) -> None:
    """Fold finished optimize runs (run dirs, ids or bench dirs; default: all in the KB home) into pattern
    statistics and learned patterns."""
    from diagnose.synthesis import synthesize as fold

    home = open_home(ctx, create=True)
    dirs = [d for r in runs for d in _runs_of(ctx, r)] or runs_in(home.runs_dir)
    if not dirs:
        raise UserFacingError(f"no optimize runs under {home.runs_dir}", "run `kb optimize TASK` first, or name RUN dirs")
    with home.lock(write=True):
        summary = fold(home, dirs, into)
        from kb.index import load_manifest

        if summary["learned"] and load_manifest(home, "patterns", "catalog") is not None:
            from indexer.patterns import index_patterns
            from kb.embed import embedder_for

            index_patterns(home, embedder_for(home))
            summary["reindexed"] = True
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    click.echo(f"{summary['rounds']} new rounds from {len(dirs)} runs")
    for pid, s in summary["stats"].items():
        click.echo(f"  {pid:<32} {s['wins']}/{s['tries']} won" + (f"  ({s['status']})" if s.get("status") else ""))
    for pid in summary["learned"]:
        click.echo(f"  learned: {pid}")
    for pid in summary["demoted"]:
        click.echo(f"  demoted to high risk (its wins do not hold up): {pid}")


