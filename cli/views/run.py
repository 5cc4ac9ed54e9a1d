"""How `kb run` shows a RunReport: one table per kernel, one row per case."""

from __future__ import annotations

from typing import Any

from harness.measurement import CaseResult, KernelRun, RunReport
from harness.roofline import copy_summary

__all__ = ["render_run"]

STAND_INS = {"eager": "PyTorch eager", "compiled": "torch.compile"}


def render_run(report: RunReport, console: Any) -> None:
    from rich.table import Table

    seed = f", seed {report.seed} (replay with --seed {report.seed})" if report.seed is not None else ""
    console.print(f"[bold]{report.task}[/] on {report.device} ({report.backend}){seed}")
    speedups = report.speedups()
    timed = any(c.timing for r in report.runs for c in r.cases)
    for run in report.runs:
        verdict = {"correct": f"[green]correct[/] (compared with {run.compared_with})",
                   "guards only": "[yellow]passed the guards only[/]: no reference, so its outputs were compared "
                                  "with nothing",
                   }.get(run.verdict, f"[red]rejected[/]: {run.rejected or _first_failure(run)}")
        if run.role in STAND_INS:
            verdict = "PyTorch stand-in, timed only"
        console.print(f"{run.role}: {run.source}  {verdict}")
        if not run.cases:
            continue
        table = Table(show_edge=False, pad_edge=False)
        columns = ["case", "seeds", "max abs err", "max rel err"]
        columns += ["median µs", "spread", "GB/s", "roofline"] if timed else []
        for column in columns:
            table.add_column(column, justify="left" if column == "case" else "right")
        if run.role == "candidate" and speedups:
            table.add_column("speedup", justify="right")
        problems = []
        for case in run.cases:
            row, problem = _row(case, run, speedups)
            table.add_row(*(row if timed else row[:4]))
            if problem:
                problems.append(f"  {case.label}: {problem}")
        console.print(table)
        for problem in problems:
            console.print(f"[red]{problem}[/]")
    for ref in STAND_INS:
        for role in ("baseline", "candidate"):
            over = report.speedups(ref, role)
            if report.run(ref) is not None and over:
                console.print(f"{role} over {STAND_INS[ref]}: " + ", ".join(f"{k} {v:.2f}x" for k, v in over.items()))
    ceil = report.ceilings
    if ceil:
        rates = ", ".join(f"{name} {ceil[key]:.0f}" for name, key in (
            ("bf16", "matmul_bf16_tflops"), ("fp16", "matmul_fp16_tflops"), ("tf32", "matmul_tf32_tflops"),
            ("fp32", "matmul_fp32_tflops"), ("int8", "matmul_int8_tops")) if ceil.get(key))
        console.print(f"ceilings ({ceil.get('measured', '?')}): {copy_summary(ceil)}, matmul TFLOP/s "
                      f"(int8: TOP/s): {rates}")
    for flag in report.flags():
        console.print(f"[yellow]review[/]: {flag}")
    for note in report.notes:
        console.print(f"note: {note}")
    if report.failure:
        console.print(f"[red]failure[/]: {report.failure}")


def _row(case: CaseResult, run: KernelRun, speedups: dict[str, float]) -> tuple[list[str], str]:
    from harness.task import SCALE_KEY

    label = case.label + (" (held out)" if SCALE_KEY in case.case or (case.heldout and not case.generated)
                          else " (drawn for this run)" if case.generated else "")
    problem = ""
    if case.error:
        problem = case.error
    elif not case.correct:
        bad = next(c for c in case.checks if not c.ok)
        parts = [f"{n} {what}" for n, what in ((bad.mismatched, "wrong"), (bad.nan_mismatch, "NaN mismatch"),
                                              (bad.inf_mismatch, "Inf mismatch"), (bad.unwritten, "unwritten")) if n]
        problem = f"output {bad.output}: {', '.join(parts)} element(s), first at index {bad.first_bad}"
    abs_err = max((c.max_abs_err for c in case.checks), default=0.0)
    rel_err = max((c.max_rel_err for c in case.checks), default=0.0)
    t, roof = case.timing, case.roofline
    row = [label, str(case.seeds), f"{abs_err:.2e}" if case.checks else "-", f"{rel_err:.2e}" if case.checks else "-",
           f"{t.median_us:.2f}" if t else "-", f"{100 * t.repeat_spread:.1f}%" if t and t.repeat_spread is not None else "-",
           f"{roof.achieved_gbps:.0f}" if roof and roof.achieved_gbps else "-",
           f"{100 * roof.fraction:.0f}% {roof.bound}" if roof else "-"]
    if run.role == "candidate" and speedups:
        s = speedups.get(case.label)
        row.append(f"{s:.2f}x" if s else "-")
    return row, problem


def _first_failure(run: KernelRun) -> str:
    for case in run.cases:
        if not case.correct:
            return f"case {case.label} is wrong" + (f" ({case.error})" if case.error else "")
    return "?"
