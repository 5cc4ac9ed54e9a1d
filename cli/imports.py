"""`kb import`: task suites made from public benchmarks (`kb import tritonbench`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.app import main
from cli.options import backend_option, progress_bar, user_errors

if TYPE_CHECKING:
    from harness.backends import BackendName
    from indexer.tritonbench import DraftOutcome


@main.group("import")
def import_group() -> None:
    """Make task suites from public benchmarks (run them with `kb bench --suite DIR`)."""


@import_group.command("tritonbench")
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where the task folders go (outside the repository; the import resumes from it).")
@click.option("--models", default=None,
              help="Draft files (jsonl stems) in the order to try, comma-separated (default: all, non-RAG first, "
                   "general-purpose before coder-specific, then by name).")
@click.option("--ops", default=None, help="Comma-separated T operators (default: all).")
@backend_option()
@click.option("--workers", default=2, show_default=True, help="Operators checked at once.")
@click.option("--seeds", default=2, show_default=True, help="Random input sets per case in each check.")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds a draft's check may take.")
@click.option("--perf-cases", type=click.Choice(["all", "smallest"]), default=None,
              help="Timed cases each check covers (default: all on a GPU, the smallest on the interpreter). "
                   "The test's calls are always checked.")
@click.option("--stop-after", "stop_after", type=float, default=None,
              help="Seconds from now after which no draft's check starts (the import resumes from --out).")
@user_errors
def tritonbench(root: Path, out: Path, models: str | None, ops: str | None, backend: BackendName, workers: int,
                seeds: int, timeout_s: float, perf_cases: str | None, stop_after: float | None) -> None:
    """TritonBench-T's operators, each with the first LLM draft that passes the judge (ROOT: a clone of
    thunlp/TritonBench; only its T half is read)."""
    from indexer.tritonbench import ImportOptions, import_tritonbench
    from indexer.tritonbench.source import TritonBenchT

    options = ImportOptions(out=out, models=models.split(",") if models else None,
                            ops=ops.split(",") if ops else None, backend=backend, workers=workers, seeds=seeds,
                            timeout_s=timeout_s, perf_cases=perf_cases or ("smallest" if backend == "interpreter" else "all"),
                            stop_at=time.time() + stop_after if stop_after is not None else None)
    with progress_bar("import") as bar:
        task = bar.add_task("operators", total=len(options.ops or TritonBenchT(root).operators()))

        def progress(op: str, outcome: DraftOutcome | None) -> None:
            if outcome is None:
                bar.advance(task)
            else:
                verdict = "passed" if outcome.failure is None else outcome.failure.value
                bar.console.print(f"{op}: {outcome.model}: {verdict}", highlight=False)

        summary = import_tritonbench(root, options, progress)
    click.echo(f"{len(summary.imported)} operator(s) imported into {out}; {len(summary.failed)} with no passing "
               f"draft, {len(summary.unusable)} not importable: {out / 'IMPORT.md'}")
    if summary.unfinished:
        click.echo(f"{len(summary.unfinished)} operator(s) not finished: run the same command again to go on")
    else:
        click.echo(f"run them: kb bench --suite {out}")
