"""The end of an optimize run: the best kernel timed against the task's own once more, with the PyTorch
stand-ins beside them, and the verdict of that timing over the chain of rounds that picked it.

Chained per-round speedups drift (each round is timed against its parent, not the original), and a
round's timing of a host-bound call is noisy: TritonBench-T's fused_mv_sigmoid_sub draft took 166 us
at 64x64 in the round that accepted num_warps=2 (its pick 176 us), and 175 us against the pick's 455 us
at the end. So the end-of-run timing judges the best kernel by the rules a round does (no timed case
slower than the initial kernel by more than the noise bar, and a gain beyond it): where it fails them,
the initial kernel stands, the run says why, and the report counts it as no round accepted. The verdict is a function of the
stored timing, so a finished run is judged again by the rules as they are (`rejudge_end`) without timing
anything: a rule mended after it ended applies to it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diagnose.judging import acceptable, decides, improvement, verdict
from diagnose.loop_options import OptimizeOptions
from diagnose.rounds import RoundsStore
from harness.measurement import RunReport, geomean
from harness.task import TaskSpec

if TYPE_CHECKING:
    from diagnose.judging import Judge

__all__ = ["final_record", "rejudge_end", "time_the_end"]


def time_the_end(store: RoundsStore, spec: TaskSpec, judge: Judge, entry: str, options: OptimizeOptions,
                 say: Callable[[str], None]) -> None:
    """Time the run's best kernel against the initial one (once: a resumed run that has the record for
    its best round keeps it) and record it, handing the initial kernel back where the timing rejects
    the best one."""
    info = store.run()
    best = info.best_round or 0
    if (info.final or {}).get("best_round") == best:
        rejudge_end(store, options, say)
        return
    final_judge = getattr(judge, "final", None)
    # A run that starts from a repaired kernel times against it: the task's own fails its checks.
    initial = str(store.dir / "round-000.py") if info.options.get("repaired") else None
    if not best and not options.references and info.baseline:
        # Nothing to time: the best kernel is the initial one and no stand-in is asked for.
        store.update_run(final=final_record(0, RunReport.from_dict(info.baseline), options))
        return
    if final_judge is not None:
        say(f"timing the best kernel (round {best}) against the task's own and PyTorch" if best
            else "timing the task's own kernel against PyTorch")
        report = final_judge(spec, info.best_path if best else None, entry, initial)
    elif best:
        say(f"timing the best kernel (round {best}) against the task's own")
        report = judge(spec, initial, info.best_path, entry)
    else:
        return
    why = _rejected(report, options) if best else None
    if why is not None:
        say(f"round {best}'s kernel does not hold up in the end-of-run timing ({why}): the initial kernel stands")
        _hand_back_initial(store, best, why)
        best = 0
    store.update_run(final=final_record(best, report, options))


def _rejected(report: RunReport, options: OptimizeOptions) -> str | None:
    """Why the end-of-run timing rejects the best kernel, or None where it stands (or the timing says
    nothing of it). The best kernel must pass a round's rules against the initial one, and beat it as a
    round's winner must (`improvement`): it is the most of many readings (variants, rounds), so its
    rounds' gains lean high, and a timing of its own that finds no gain beyond the noise shows none.
    ones_like's draft, a launch at the floor, kept BLOCK_SIZE=2048 on the H100 at 0.997x of itself."""
    if report.failure or not decides(report):
        return None
    kept, noise, why = acceptable(report, options)
    if kept is None:
        return why
    if improvement(report, options) is None:
        return f"no gain on the initial kernel beyond the noise: geomean {kept:.3f}x, noise {noise:.1%}"
    return None


def rejudge_end(store: RoundsStore, options: OptimizeOptions, say: Callable[[str], None] = lambda _: None) -> str | None:
    """Judge a finished run's end-of-run timing again, as recorded, by the rules as they are now: a rule
    mended after the run (what counts as noise) must not leave a best kernel the run would now reject.
    Nothing is timed. Hands the initial kernel back and returns why, or None where the best one stands
    (or there is no timed record of it to judge)."""
    info = store.run()
    final = info.final or {}
    best = final.get("best_round") or 0
    if not best or best != info.best_round or not final.get("report"):
        return None
    report = RunReport.from_dict(final["report"])
    why = _rejected(report, options)
    if why is None:
        return None
    say(f"round {best}'s kernel does not hold up in the end-of-run timing judged again ({why}): the initial "
        "kernel stands")
    _hand_back_initial(store, best, why)
    store.update_run(final=final_record(0, report, options))
    return why


def _hand_back_initial(store: RoundsStore, rejected: int, why: str) -> None:
    initial = store.dir / "round-000.py"
    store.update_run(best_round=0, best_path=str(initial),
                     note=f"round {rejected}'s kernel did not hold up in the end-of-run timing ({why}): "
                          "the initial kernel stands")
    header = (f'"""kernel-kb optimize: best kernel of run {store.run().id}: the initial kernel. Round {rejected}\'s '
              f"kernel, the best by the rounds' own timings, did not hold up against it at the end of the run: "
              f'{why}.\nHistory: kb rounds show {store.dir}\n"""\n')
    (store.dir / "best.py").write_text(header + initial.read_text())


def final_record(best: int, report: RunReport, options: OptimizeOptions) -> dict[str, Any]:
    """The end-of-run measurement: best over initial per case (1.0 when no round was accepted, or the
    end-of-run timing rejected the best: the best kernel is the initial one), and both over each PyTorch
    stand-in that was timed."""
    record: dict[str, Any] = {"best_round": best, "report": report.to_dict()}
    if best:
        record["per_case"] = report.speedups()
        record["geomean"] = verdict(report, options)[0]
    else:
        record["per_case"] = {label: 1.0 for label in report.speedups("baseline", "baseline")}
        baseline_run = report.run("baseline")
        record["geomean"] = 1.0 if baseline_run and baseline_run.correct else None
    for ref in ("eager", "compiled"):
        if report.run(ref) is None:
            continue
        kernels = {"initial": "baseline", "best": "candidate" if best else "baseline"}
        per_case = {name: report.speedups(ref, role) for name, role in kernels.items()}
        record[f"vs_{ref}"] = {name: {"per_case": cases, "geomean": geomean(cases.values())}
                               for name, cases in per_case.items()}
    return record
