"""Run a task end to end, sandboxed: what `kb run` and the optimize loop call.

Order: the baseline is checked alone, then the candidate alone (so a hang or crash is pinned on the
kernel that caused it), then every kernel that passed is timed in one worker, interleaved, so
their ratio comes from one process. Each step is a job in a `harness.sandbox.Worker`.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harness.errors import UserFacingError
from harness.measurement import KernelRun, RunReport
from harness.sandbox import Worker
from harness.timing import REP_MS, WARMUP_MS

__all__ = ["RunOptions", "run_candidates", "run_task", "split_timings", "time_again"]


@dataclass
class RunOptions:
    backend: str = "cuda"
    cases: list[int] | None = None
    seeds: int = 3
    time: bool = True
    roofline: bool = True
    timeout_s: float = 300.0
    profile: bool = False  # Nsight Compute metrics per timed case (cuda, when ncu is present)
    # PyTorch stand-ins timed with the kernels (roles "eager", "compiled": the task's `eager`, else its
    # reference, as written and through torch.compile); each case's speedup over them is in the report.
    references: tuple[str, ...] = ()
    # Each kernel-case timing: do_bench warm-up and measured window, run twice interleaved.
    warmup_ms: int = WARMUP_MS
    rep_ms: int = REP_MS


def run_task(task: dict[str, Any], options: RunOptions, candidate: str | None = None,
             candidate_entry: str | None = None, worker: Worker | None = None,
             baseline: str | None = None) -> RunReport:
    """`task` is {"path": FILE} or {"kernel": FILE, "call": EXPR, "reference": EXPR | None}.

    `baseline`: a file whose entry stands in for the task's own kernel as the baseline (the optimize
    loop times each candidate against the current best, in the same worker).
    """
    own = worker is None
    worker = worker or Worker(options.backend)
    try:
        return _run(task, options, candidate, candidate_entry, worker, baseline)
    finally:
        if own:
            worker.close()


def _check(task: dict[str, Any], options: RunOptions, kernel: dict[str, Any], worker: Worker) -> RunReport:
    """One kernel checked alone, so a hang or crash is pinned on it."""
    answer = worker.submit({"task": task, "backend": options.backend, "cases": options.cases, "seeds": options.seeds,
                            "kernels": [kernel], "check": True, "time": False}, options.timeout_s)
    return _report_or_failure(answer, kernel["role"], _task_name(task))


def _time_together(task: dict[str, Any], options: RunOptions, kernels: list[dict[str, Any]], worker: Worker,
                   role: str) -> RunReport:
    """Kernels that passed their checks, timed interleaved in one job (`role` names a failure)."""
    answer = worker.submit({"task": task, "backend": options.backend, "cases": options.cases, "seeds": options.seeds,
                            "kernels": kernels, "check": False, "time": True, "roofline": options.roofline,
                            "warmup_ms": options.warmup_ms, "rep_ms": options.rep_ms},
                           options.timeout_s * len(kernels))
    return _report_or_failure(answer, role, _task_name(task))


def _run(task: dict[str, Any], options: RunOptions, candidate: str | None, candidate_entry: str | None,
         worker: Worker, baseline: str | None = None) -> RunReport:
    kernels: list[dict[str, Any]] = [{"role": "baseline", "path": baseline, "entry": candidate_entry} if baseline
                                     else {"role": "baseline"}]
    if candidate:
        kernels.append({"role": "candidate", "path": candidate, "entry": candidate_entry})
    report: RunReport | None = None
    for kernel in kernels:
        checked = _check(task, options, kernel, worker)
        if report is None:
            report = checked
        else:
            report.runs.extend(checked.runs)
            report.failure = report.failure or checked.failure
            report.notes.extend(n for n in checked.notes if n not in report.notes)
    assert report is not None
    passed = [k for k, run in zip(kernels, report.runs) if run.correct]
    if options.time and passed:
        timed_kernels = passed + [{"role": r, "reference": r} for r in options.references]
        _merge_timings(report, _time_together(task, options, timed_kernels, worker,
                                              "candidate" if candidate else "baseline"))
    if options.profile and passed:
        from harness.profile import profile_cases

        profile_cases(report, task, options, passed)
    return report


def run_candidates(task: dict[str, Any], options: RunOptions, baseline: str, candidates: list[str], entry: str,
                   worker: Worker, checkers: Sequence[Worker] = ()) -> list[RunReport]:
    """Several candidates against one baseline that was validated before (the optimize loop's parent):
    each candidate is checked alone, then the baseline and every passing candidate are timed in one
    job, interleaved, so the baseline is timed once per case instead of once per candidate. Returns
    one report per candidate, in order, each shaped as `run_task` would give it (roles baseline and
    candidate). If the shared timing job fails, the passing candidates are timed one at a time, so
    one bad kernel cannot sink its siblings.

    `checkers`: more workers that share the checks with `worker` (each candidate still alone in its
    job). Checking is mostly compiling, CPU work that a many-core host does side by side; the timing
    job stays in `worker`, alone on the device, and finds the compiled kernels in Triton's cache.
    """
    checked = _check_each(task, options, [{"role": "candidate", "path": path, "entry": entry} for path in candidates],
                          [worker, *checkers])
    passing = [i for i, r in enumerate(checked) if r.run("candidate") and r.run("candidate").correct]
    timed: RunReport | None = None
    if options.time and passing:
        kernels = [{"role": "baseline", "path": baseline, "entry": entry}]
        kernels += [{"role": f"candidate.{i}", "path": candidates[i], "entry": entry} for i in passing]
        timed = _time_together(task, options, kernels, worker, "candidate")
        if timed.failure:
            return [run_task(task, options, candidate=candidates[i], candidate_entry=entry, worker=worker,
                             baseline=baseline) if i in passing else r for i, r in enumerate(checked)]
    return split_timings(checked, timed, baseline)


def _check_each(task: dict[str, Any], options: RunOptions, kernels: list[dict[str, Any]],
                workers: list[Worker]) -> list[RunReport]:
    """`_check` of every kernel, in order, each job in whichever worker is free. A helper worker that
    cannot start is dropped (the others take its share); Ctrl-C kills every worker at once, so no
    check left running holds the device after the caller is gone."""
    if not kernels:
        return []
    if len(workers) == 1 or len(kernels) == 1:
        return [_check(task, options, kernel, workers[0]) for kernel in kernels]
    free: queue.SimpleQueue[Worker] = queue.SimpleQueue()
    for w in workers:
        free.put(w)

    def check(kernel: dict[str, Any]) -> RunReport:
        while True:
            w = free.get()
            try:
                w.start()
            except UserFacingError:
                if w is workers[0]:
                    free.put(w)
                    raise
                w.close()
                continue
            try:
                return _check(task, options, kernel, w)
            finally:
                free.put(w)

    pool = ThreadPoolExecutor(max_workers=min(len(workers), len(kernels)))
    try:
        return list(pool.map(check, kernels))
    except BaseException as exc:
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the checks must not outlive us
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                w.close()
        raise
    finally:
        pool.shutdown(wait=True)


def time_again(task: dict[str, Any], options: RunOptions, baseline: str, candidate: str, entry: str,
               worker: Worker) -> RunReport | None:
    """Two kernels that passed their checks, timed against each other once more in a job of their own
    (roles baseline and candidate; no check). None when `options.time` is off."""
    if not options.time:
        return None
    kernels = [{"role": "baseline", "path": baseline, "entry": entry},
               {"role": "candidate", "path": candidate, "entry": entry}]
    return _time_together(task, options, kernels, worker, "candidate")


def split_timings(checked: list[RunReport], timed: RunReport | None, baseline: str) -> list[RunReport]:
    """One report per candidate out of the per-candidate checks and the shared timing job (roles
    baseline, candidate.<i>): the baseline's timings go into every report."""
    out = []
    for i, report in enumerate(checked):
        base_run = KernelRun(role="baseline", source=baseline)
        report.runs.insert(0, base_run)
        own = timed.run(f"candidate.{i}") if timed is not None else None
        if timed is not None and own is not None:
            report.ceilings = timed.ceilings
            report.notes.extend(n for n in timed.notes if n not in report.notes)
            _copy_timings(timed.run("baseline"), base_run)
            _copy_timings(own, report.run("candidate"))
        out.append(report)
    return out


def _copy_timings(source: KernelRun | None, target: KernelRun | None) -> None:
    """Timed cases of `source` onto `target`'s cases of the same label (added when `target` has none)."""
    if source is None or target is None:
        return
    by_label = {c.label: c for c in target.cases if not c.heldout}
    for case in source.cases:
        if case.label in by_label:
            by_label[case.label].timing = case.timing
            by_label[case.label].roofline = case.roofline
        elif case.timing is not None:
            target.cases.append(case)


def _task_name(task: dict[str, Any]) -> str:
    from harness.task import task_name

    return task_name(task.get("path") or task.get("kernel") or "task")


def _report_or_failure(answer: dict[str, Any], role: str, task_name: str) -> RunReport:
    if answer.get("ok"):
        return RunReport.from_dict(answer["report"])
    if "user_error" in answer:
        raise UserFacingError(answer["user_error"], answer.get("fix", ""))
    report = RunReport(task=task_name, backend="?", device="?")  # the worker died before it could say
    report.runs.append(KernelRun(role=role, source="", rejected=answer["failure"]))
    report.failure = f"{role}: {answer['failure']}"
    return report


def _merge_timings(report: RunReport, timed: RunReport) -> None:
    if timed.failure:
        report.failure = timed.failure
        for run in timed.runs:
            target = report.run(run.role)
            if target is not None and target.rejected is None:
                target.rejected = run.rejected
        return
    report.ceilings = timed.ceilings
    report.notes.extend(n for n in timed.notes if n not in report.notes)
    for run in timed.runs:
        if report.run(run.role) is None and run.cases:  # a PyTorch stand-in: timed, never checked
            report.runs.append(run)
            continue
        _copy_timings(run, report.run(run.role))
