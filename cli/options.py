"""What every command shares: the one-line error contract, the KB home, progress bars, and the options
that mean the same everywhere (spelled once here, so their choices and help cannot drift apart)."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from harness.errors import UserFacingError

if TYPE_CHECKING:
    from rich.progress import Progress

    from harness.task import TaskSpec
    from kb.home import KBHome

__all__ = ["backend_option", "cite_releases", "diagnosis_home", "json_option", "kernel_input", "level_max_option", "open_home",
           "progress_bar", "stage_progress", "stand_ins", "strategy_option", "task_input", "task_spec", "timing_window_options",
           "user_errors"]

F = TypeVar("F", bound=Callable[..., Any])

# The engine's names, spelled here for click without importing the engine (`kb --help` stays instant);
# tests/test_layering.py checks they match diagnose.records.Strategy and Level.
STRATEGIES = ("progressive", "profile-only", "always-deep")
LEVELS = ("L1", "L2", "L3", "L4")
BACKENDS = ("auto", "cuda", "interpreter", "npu")


def user_errors(fn: F) -> F:
    """Bad input becomes one line on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserFacingError as exc:
            click.echo(f"error: {exc}", err=True)
            if exc.detail:
                click.echo("".join(f"  | {line}\n" for line in exc.detail.splitlines()), err=True, nl=False)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: what was already published stays live, and work done is cached; "
                       "run the same command again to resume", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def json_option(help: str = "Print JSON.") -> Callable[[F], F]:  # noqa: A002 - click's own word
    return click.option("--json", "as_json", is_flag=True, help=help)


def strategy_option(help: str | None = None) -> Callable[[F], F]:  # noqa: A002
    return click.option("--strategy", type=click.Choice(STRATEGIES), default="progressive", show_default=True,
                        help=help)


def level_max_option(fn: F) -> F:
    return click.option("--level-max", type=click.Choice(LEVELS), default="L4", show_default=True,
                        help="The deepest level the diagnosis may reach.")(fn)


def cite_releases(fn: F) -> F:
    """--release where it means the compiler releases a diagnosis cites (L4)."""
    return click.option("--release", default=None,
                        help="Compiler release(s) to cite at L4, comma-separated (default: the installed triton's).")(fn)


def _resolve_backend(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from harness.backends import detect_backend

    return detect_backend() if value == "auto" else value


def backend_option(help: str | None = None) -> Callable[[F], F]:  # noqa: A002
    """--backend, with "auto" resolved once here: commands see cuda, npu or interpreter."""
    return click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
                        callback=_resolve_backend,
                        help=help or "auto: cuda with an NVIDIA GPU, npu with an Ascend device, else the CPU "
                                     "interpreter.")


def kernel_input(fn: F) -> F:
    """--kernel, --call, --dump, --target: a kernel from the wild or a triton-ascend dump, as
    `diagnose.request.request_from` takes it (each command adds its own way to name a task file)."""
    fn = click.option("--target", default=None,
                      help="Compile target: cuda:90 (default: the GPU present, else cuda:90); npu/ascend needs --dump.")(fn)
    fn = click.option("--dump", "dump_dir", type=click.Path(file_okay=False), default=None,
                      help="A triton-ascend TRITON_DEBUG dump directory (with --kernel for its source).")(fn)
    fn = click.option("--call", default=None,
                      help='With --kernel: an expression that launches it, e.g. "scale(torch.randn(1000003), 2.0)".')(fn)
    return click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
                        help="A Python file with the @triton.jit kernel and its launch wrapper.")(fn)


def task_input(fn: F) -> F:
    """--kernel, --call, --reference: a kernel from the wild judged without a task file (`kb run`,
    `kb optimize`); `task_spec` makes them, or the TASK argument, into the run's TaskSpec."""
    tolerance = click.FloatRange(min=0.0)
    fn = click.option("--rtol", type=tolerance, default=None,
                      help="With --kernel: the relative tolerance of floating-point outputs (default per dtype: "
                           "fp32 1e-4, fp16 1e-2, bf16 2e-2); a sum's order moves it, so loosen it for reductions.")(fn)
    fn = click.option("--atol", type=tolerance, default=None,
                      help="With --kernel: the absolute tolerance of floating-point outputs (default per dtype: "
                           "fp32 1e-5, fp16 1e-3, bf16 1e-2).")(fn)
    fn = click.option("--reference", default=None,
                      help="With --kernel: a PyTorch callable its outputs must equal, e.g. torch.add "
                           "(default: the kernel's own outputs at the start).")(fn)
    fn = click.option("--call", default=None,
                      help='With --kernel: an example call of its launch wrapper, e.g. '
                           '"add(torch.randn(4096), torch.randn(4096))".')(fn)
    return click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
                        help="A kernel file from the wild (instead of a task file).")(fn)


def task_spec(task_file: str | None, kernel_file: str | None, call: str | None, reference: str | None,
              atol: float | None = None, rtol: float | None = None) -> TaskSpec:
    """The TaskSpec of a TASK argument or of --kernel/--call/--reference/--atol/--rtol; one line when neither
    or both. A tolerance given replaces that figure for every floating-point dtype, the other keeps its
    dtype's default; integer outputs stay exact."""
    from harness.task import DEFAULT_TOLERANCES, TaskSpec

    if (task_file is None) == (kernel_file is None):
        raise UserFacingError("give a TASK file, or --kernel FILE with --call EXPR",
                              'e.g. --kernel add.py --call "add(torch.randn(4096), torch.randn(4096))"')
    if kernel_file is not None and call is None:
        raise UserFacingError("--kernel needs --call EXPR, an example call of its launch wrapper",
                              'e.g. --call "add(torch.randn(4096), torch.randn(4096))"')
    if task_file is not None and (call or reference):
        raise UserFacingError("--call and --reference go with --kernel, not with a TASK file",
                              "put the cases and the reference in the task file, or pass --kernel FILE")
    if task_file is not None and (atol is not None or rtol is not None):
        raise UserFacingError("--atol and --rtol go with --kernel, not with a TASK file",
                              'set `tolerances = {"atol": ..., "rtol": ...}` in the task file')
    for path in (task_file, kernel_file):
        if path is not None and not Path(path).is_file():
            raise UserFacingError(f"{path} does not exist", "pass the path of a task or kernel .py file")
    given = {k: v for k, v in (("atol", atol), ("rtol", rtol)) if v is not None}
    if any(v < 0 for v in given.values()):
        raise UserFacingError(f"a tolerance is negative ({given})", "pass --atol / --rtol of 0 or more")
    tolerances = {dtype: {**default, **given} for dtype, default in DEFAULT_TOLERANCES.items()} if given else None
    return (TaskSpec.of_file(str(task_file)) if task_file else
            TaskSpec(kernel=str(Path(str(kernel_file)).resolve()), call=call, reference=reference,
                     tolerances=tolerances))


def breadth_option(fn: F) -> F:
    """Hypotheses judged side by side in a round (diagnose/composition.py)."""
    return click.option("--breadth", type=click.IntRange(min=1), default=1, show_default=True,
                        help="Hypotheses a round judges side by side against the same parent (after the first, "
                             "structural rewrites only: launch knobs keep their own rounds), keeping the best; where "
                             "several beat the parent, their rewrites stacked are judged too. 1: one a round.")(fn)


def timing_window_options(fn: F) -> F:
    """--warmup-ms / --rep-ms: the do_bench windows of every kernel-case timing (default: the harness's)."""
    window = click.IntRange(min=1)
    fn = click.option("--rep-ms", "rep_ms", type=window, default=None,
                      help="Measured window of each timing in ms (harness default 300).")(fn)
    return click.option("--warmup-ms", "warmup_ms", type=window, default=None,
                        help="Warm-up of each timing in ms (harness default 200).")(fn)


def llm_options(fn: F) -> F:
    """The LLM rewriter's options (`kb optimize`, `kb bench`), handed to the command as one dict
    `llm_settings` whose keys are `OptimizeOptions` fields."""
    options = [
        click.option("--llm-model", "llm_model", default=None, help="The model to ask (default: KB_LLM_MODEL)."),
        click.option("--candidates", type=click.IntRange(min=1), default=2, show_default=True,
                     help="LLM candidates per round: the round's finding, then the next findings, then samples."),
        click.option("--repairs", type=click.IntRange(min=0), default=2, show_default=True,
                     help="Repair turns per LLM candidate that fails to parse, compile or pass a check (the exact "
                          "error is sent)."),
        click.option("--context-tokens", "context_tokens", type=click.IntRange(min=500), default=8000,
                     show_default=True,
                     help="Token budget of each LLM prompt; lower-ranked context (old history, patterns) is cut first."),
        click.option("--llm-first", "llm_first", is_flag=True,
                     help="Ask the model before the catalog's deterministic rewrites of each finding (default: after)."),
        click.option("--max-tokens-per-run", "max_tokens_per_run", type=click.IntRange(min=1), default=None,
                     help="Stop asking the LLM once a run's calls have used this many tokens (in + out)."),
    ]
    keys = ("llm_model", "candidates", "repairs", "context_tokens", "llm_first", "max_tokens_per_run")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["llm_settings"] = {k: kwargs.pop(k) for k in keys}
        return fn(*args, **kwargs)

    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def stand_ins(versus: tuple[str, ...]) -> tuple[str, ...]:
    """`--vs` values as the loop takes them: `none` alone means no stand-in."""
    if "none" in versus:
        if len(set(versus)) > 1:
            raise UserFacingError(f"--vs none cannot go with --vs {' --vs '.join(v for v in versus if v != 'none')}",
                                  "give --vs none alone, or only the stand-ins to time")
        return ()
    return tuple(dict.fromkeys(versus))


def open_home(ctx: click.Context, create: bool = False, build_hint: str | None = None) -> KBHome:
    """The KB home this command works on (--home, else $KB_HOME, else the default): created when asked,
    else it must already be a sound one."""
    return home_at(ctx.obj.get("home"), create, build_hint)


def home_at(home: str | None, create: bool = False, build_hint: str | None = None) -> KBHome:
    """`open_home` for a front door without a click context (`kb mcp`): `home` as --home gives it."""
    from kb.home import KBHome

    found = KBHome.resolve(home)
    if create:
        return found.ensure()
    found.validate(*([build_hint] if build_hint else []))
    return found


def diagnosis_home(ctx: click.Context) -> KBHome | None:
    """The KB home if one exists (it must then be sound); None means "answer from the kernel and IR only"."""
    from kb.home import KBHome

    return KBHome.if_present(ctx.obj.get("home"))


def progress_bar(description: str) -> Progress:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Progress goes to stderr: stdout carries results (`--json` must stay parseable).
    return Progress(TextColumn(description + " {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False, console=Console(stderr=True))


def stage_progress(bar: Progress) -> Callable[[str, int, int], None]:
    """A `progress(stage, done, total)` callback drawing one bar per stage (parse, embed, ...).

    Written to a log or a CI job (not a terminal), a rich bar shows only once it is done: there,
    each stage also prints a line at every tenth of its work."""
    tasks: dict[str, Any] = {}
    tenths: dict[str, int] = {}
    started: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
            started[stage] = time.monotonic()
        bar.update(tasks[stage], completed=done)
        if not bar.console.is_terminal and total > 0:
            tenth = done * 10 // total
            if tenth > tenths.get(stage, 0):
                tenths[stage] = tenth
                bar.console.print(f"{stage}: {done}/{total} ({time.monotonic() - started[stage]:.0f} s)",
                                  highlight=False)

    return progress
