"""`kb eval retrieval|diagnosis`: the KB measured on its gold sets."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from cli.app import main
from cli.options import (
    cite_releases,
    diagnosis_home,
    json_option,
    level_max_option,
    open_home,
    progress_bar,
    strategy_option,
    user_errors,
)
from harness.errors import UserFacingError


@main.group("eval")
def eval_group() -> None:
    """Measure the KB on gold sets."""


@eval_group.command("retrieval")
@click.option("--queries", "queries_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of gold query files (default: corpora/queries).")
@click.option("--mode", "modes", type=click.Choice(["bm25", "vector", "hybrid"]), multiple=True,
              help="Modes to measure (default: all three).")
@json_option("Print the full report (with each query's rank) as JSON.")
@click.pass_context
@user_errors
def eval_retrieval(ctx: click.Context, queries_dir: Path | None, modes: tuple[str, ...], as_json: bool) -> None:
    """Recall@1/5/10 and MRR per source set and query kind, BM25 vs vectors vs hybrid."""
    from kb.evaluate import MODES, evaluate_retrieval, load_gold_sets

    sets = load_gold_sets(queries_dir)
    home = open_home(ctx)
    with home.lock(write=False), progress_bar("evaluating") as bar:
        task = bar.add_task("queries", total=None)
        report = evaluate_retrieval(home, sets, modes or MODES,
                                    progress=lambda done, total: bar.update(task, completed=done, total=total))
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    # The modes side by side: one row per set and query kind, R@1 R@5 R@10 MRR under each mode.
    shown = [mode for mode in MODES if mode in report["overall"]]

    def cells(m: dict[str, float] | None) -> str:
        if not m:
            return f"{'-':>23}"
        return f"{m['recall@1']:>5.2f} {m['recall@5']:>5.2f} {m['recall@10']:>5.2f} {m['mrr']:>5.2f}"

    click.echo(f"{'':<24} {'':<7} {'':>4}" + "".join(f" | {mode:^23}" for mode in shown))
    click.echo(f"{'set':<24} {'kind':<7} {'n':>4}" + f" | {'R@1':>5} {'R@5':>5} {'R@10':>5} {'MRR':>5}" * len(shown))
    rows = [(label, kind, {mode: per_mode[mode].get(kind) for mode in shown})
            for label, per_mode in [*report["sets"].items(), ("overall", report["overall"])]
            for kind in dict.fromkeys(k for mode in shown for k in per_mode[mode])]
    rows += [(f"split {split}", "all", {mode: per_mode.get(mode) for mode in shown})
             for split, per_mode in report["splits"].items()]
    for label, kind, by_mode in rows:
        n = next((m["n"] for m in by_mode.values() if m), 0)
        if n:
            click.echo(f"{label:<24} {kind:<7} {n:>4}" + "".join(f" | {cells(by_mode[mode])}" for mode in shown))
    for skipped in report["skipped"]:
        click.echo(f"skipped: {skipped}")
    for target in report["unknown_targets"]:
        click.echo(f"expected file not in the index (this question cannot score through it): {target}")


@eval_group.command("diagnosis")
@click.option("--cases", "cases_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Gold cases YAML (default: corpora/diagnosis/cases.yaml).")
@click.option("--only", default=None, help="Comma-separated case ids to run.")
@strategy_option()
@level_max_option
@cite_releases
@json_option("Print the full report (every case's ranking) as JSON.")
@click.pass_context
@user_errors
def eval_diagnosis(ctx: click.Context, cases_file: Path | None, only: str | None, strategy: str, level_max: str,
                   release: str | None, as_json: bool) -> None:
    """Top-1/top-3 root cause, level accuracy, false positives on healthy kernels, citation validity."""
    from diagnose.evaluate import evaluate_diagnosis, load_cases

    cases = load_cases(cases_file)
    if only:
        wanted = {c.strip() for c in only.split(",")}
        unknown = wanted - {c.id for c in cases}
        if unknown:
            raise UserFacingError(f"no gold case named {', '.join(sorted(unknown))}", "see the ids in the cases file")
        cases = [c for c in cases if c.id in wanted]
    home = diagnosis_home(ctx)
    with (home.lock(write=False) if home else contextlib.nullcontext()), progress_bar("diagnosing") as bar:
        task = bar.add_task("cases", total=len(cases))
        report = evaluate_diagnosis(cases, home, release, strategy, level_max,
                                    progress=lambda done, total: bar.update(task, completed=done))
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    click.echo(f"{'case':<24} {'expected':<36} {'top-ranked':<36} {'level':>9} {'s':>6}")
    for o in report["per_case"]:
        got = o["ranked"][0] if o["ranked"] else ("healthy" if not o["error"] else "error")
        mark = "ok " if o["top1"] else "MISS"
        click.echo(f"{o['id']:<24} {o['root_cause']:<36} {got:<36} {o['stopped_at'] or '-':>4}/{o['expected_level']} "
                   f"{o['seconds']:>6.2f} {mark}")

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0%}"

    click.echo(f"\n{report['cases']} cases ({report['defect_cases']} with a defect, {report['healthy_cases']} healthy), "
               f"strategy {strategy}, up to {level_max}")
    click.echo(f"top-1 {pct(report['top1'])} (all cases, healthy ones included: {pct(report['top1_all'])})  "
               f"top-3 {pct(report['top3'])}  level accuracy {pct(report['level_accuracy'])}  "
               f"false positives on healthy {pct(report['false_positive_rate'])}  citation validity "
               f"{pct(report['citation_validity'])} of {report['citations']}  median {report['median_seconds']} s per case")
    for err in report["errors"]:
        click.echo(f"error: {err}")


