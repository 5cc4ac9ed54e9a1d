"""Run a task end to end: what `kb run` and the optimize loop call.

Order: the baseline is checked alone, then each candidate alone, each in its own worker (so a hang or
crash is pinned on the kernel that caused it, and no kernel's import can touch another's verdict),
then every kernel that passed is timed, interleaved across their workers. The judging itself is
harness.judge's; this module shapes its results into `RunReport`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.backends import TIMED, BackendName
from harness.judge import Checked, Judge, KernelSpec, TimedCases, check_in_parallel
from harness.measurement import CaseResult, KernelRun, RunReport
from harness.task import TaskSpec
from harness.timing import REP_MS, WARMUP_MS

__all__ = ["RunOptions", "capture_kernel", "kernel_launch_facts", "run_candidates", "run_task", "time_again"]



@dataclass
class RunOptions:
    backend: BackendName = "cuda"
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
    seed: int | None = None  # the run's seed (None: drawn from os.urandom); a report records it
    generated_heldout: int = 2  # held-out cases drawn per run from the task's heldout_ranges
    check_workers: int = 1  # candidates checked side by side (each in its own worker)


def _judge(spec: TaskSpec, options: RunOptions, judge: Judge | None) -> tuple[Judge, bool]:
    if judge is not None:
        return judge, False
    return Judge(spec, options.backend, timeout_s=options.timeout_s, spares=1), True


def _report(judge: Judge) -> RunReport:
    info = judge.info
    assert info is not None
    return RunReport(task=info.name, backend=judge.backend, device=judge.device, seed=info.seed)


def run_task(spec: TaskSpec, options: RunOptions, candidate: str | None = None,
             candidate_entry: str | None = None, judge: Judge | None = None,
             baseline: str | None = None) -> RunReport:
    """Check (and time) the task `spec` names, and `candidate` against it.

    `baseline`: a file whose entry stands in for the task's own kernel as the baseline (the optimize
    loop times each candidate against the current best)."""
    judge, own = _judge(spec, options, judge)
    try:
        info = judge.begin(options.seed, options.generated_heldout)
        report = _report(judge)
        entry = candidate_entry or info.entry
        kernels = [KernelSpec("baseline", file=baseline, entry=entry) if baseline else KernelSpec("baseline")]
        if candidate:
            kernels.append(KernelSpec("candidate", file=candidate, entry=entry))
        for kernel in kernels:
            _add(report, judge.check(kernel, options.cases, options.seeds))
        _notes(report, judge, options, bool(candidate))
        passed = [k for k, run in zip(kernels, report.runs) if run.correct]
        if options.time and options.backend in TIMED and passed:
            stand_ins = [KernelSpec(r, stand_in=r) for r in options.references if info.has_reference]
            _merge(report, judge.time(passed + stand_ins, options.cases, warmup_ms=options.warmup_ms,
                                      rep_ms=options.rep_ms, roofline=options.roofline), judge)
        if options.profile and passed:
            from harness.profile_cases import profile_cases

            profile_cases(report, judge, options, passed)
        return report
    finally:
        judge.end()
        if own:
            judge.close()


def run_candidates(spec: TaskSpec, options: RunOptions, baseline: str, candidates: list[str], entry: str,
                   judge: Judge) -> list[RunReport]:
    """Several candidates against one baseline that was validated before (the optimize loop's parent):
    each candidate is checked alone in a fresh worker (up to `options.check_workers` at a time), then
    the baseline and every passing candidate are timed together, interleaved, so the baseline is timed
    once per case instead of once per candidate. One report per candidate, in order, shaped as
    `run_task` would give it (roles baseline and candidate)."""
    try:
        judge.begin(options.seed, options.generated_heldout)
        checked = check_in_parallel(judge, [KernelSpec("candidate", file=c, entry=entry) for c in candidates],
                                    options.check_workers, cases=options.cases, seeds=options.seeds)
        reports = []
        for one in checked:
            report = _report(judge)
            report.runs.append(KernelRun(role="baseline", source=baseline))
            _add(report, one)
            _notes(report, judge, options, True)
            reports.append(report)
        passing = [i for i, c in enumerate(checked) if c.run.correct]
        if options.time and options.backend in TIMED and passing:
            kernels = [KernelSpec("baseline", file=baseline, entry=entry)]
            kernels += [KernelSpec(f"candidate.{i}", file=candidates[i], entry=entry) for i in passing]
            timed = judge.time(kernels, options.cases, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms,
                               roofline=options.roofline)
            for i in passing:
                timed_one = TimedCases(cases={"baseline": timed.cases.get("baseline", []),
                                        "candidate": timed.cases.get(f"candidate.{i}", [])},
                                 rejected={r.split(".")[0]: why for r, why in timed.rejected.items()
                                           if r in ("baseline", f"candidate.{i}")},
                                 notes=timed.notes, ceilings=timed.ceilings, failure=timed.failure)
                _merge(reports[i], timed_one, judge)
        return reports
    finally:
        judge.end()


def time_again(spec: TaskSpec, options: RunOptions, baseline: str, candidate: str, entry: str,
               judge: Judge) -> RunReport | None:
    """Two kernels that passed their checks, timed against each other once more, in a run of their own
    (a new seed; roles baseline and candidate; the timed calls' outputs still compared). None when
    `options.time` is off."""
    if not options.time or options.backend not in TIMED:
        return None
    try:
        judge.begin(options.seed, 0)
        report = _report(judge)
        report.runs = [KernelRun(role="baseline", source=baseline), KernelRun(role="candidate", source=candidate)]
        kernels = [KernelSpec("baseline", file=baseline, entry=entry), KernelSpec("candidate", file=candidate, entry=entry)]
        _merge(report, judge.time(kernels, options.cases, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms,
                                  roofline=options.roofline), judge)
        return report
    finally:
        judge.end()


def capture_kernel(spec: TaskSpec, file: str, entry: str, cache_dir: str | None = None, case: int = 0,
                   target: str | None = None, timeout_s: float = 600.0) -> list[Any]:
    """Compile one case of a kernel file's entry, as its launch specializes it, in a worker of its own:
    a rewritten kernel is imported there, never in the caller's process."""
    from harness.ir.artifacts import Artifacts

    answer = _capture_in_worker({"task": spec.to_json(), "file": file, "entry": entry, "case": case,
                                 "target": target, "cache_dir": cache_dir}, file, timeout_s)
    return [Artifacts.from_json(text) for text in answer["artifacts"]]


def kernel_launch_facts(spec: TaskSpec, file: str, entry: str, case: int = 0, target: str | None = None,
                        timeout_s: float = 600.0) -> list[Any]:
    """The launches one case of a kernel file's entry makes (grid, arguments, options; nothing compiled),
    in a worker of its own: what L1's launch triage reads of a rewritten kernel."""
    from harness.launches import LaunchFacts

    answer = _capture_in_worker({"task": spec.to_json(), "file": file, "entry": entry, "case": case,
                                 "target": target, "compile": False}, file, timeout_s)
    return [LaunchFacts.from_dict(d) for d in answer["facts"]]


def _capture_in_worker(request: dict[str, Any], file: str, timeout_s: float) -> dict[str, Any]:
    from harness.errors import UserFacingError
    from harness.sandbox import Worker

    with Worker("cuda") as worker:  # compiled, never interpreted, whatever the backend
        answer = worker.submit({"op": "capture", **request}, timeout_s)
    if answer.get("ok"):
        return dict(answer["answer"])
    if "user_error" in answer:
        raise UserFacingError(answer["user_error"], answer.get("fix", ""))
    raise UserFacingError(f"compiling {file} failed: {answer.get('failure')}", "run `kb why --kernel` on it to see why")


# --- shaping ---------------------------------------------------------------------------------

def _add(report: RunReport, checked: Checked) -> None:
    report.runs.append(checked.run)
    if checked.failure and not report.failure:
        report.failure = checked.failure


def _notes(report: RunReport, judge: Judge, options: RunOptions, candidate: bool) -> None:
    info = judge.info
    assert info is not None
    if options.time and options.backend not in TIMED:
        _note(report, f"the {options.backend} backend is never timed: its seconds say nothing about a kernel")
    if not info.has_reference:
        _note(report, "the task has no reference: the task's own kernel passed the guards only (its outputs were "
                      "compared with nothing)" + ("; the candidate was compared with the task's own kernel"
                                                  if candidate else ""))
        for role in options.references:
            _note(report, f"the task has no reference: --vs {role} is not timed")
    drawn = info.labels[len(info.labels) - info.generated:-1]  # the last is the scaled-input case, in every run
    if drawn:
        _note(report, f"held-out cases drawn for seed {info.seed}: {'; '.join(drawn)}")
    for label, why in judge.outside_domain().items():
        _note(report, f"held-out case {label} is held against no kernel: the task's own kernel fails it ({why})")


def _note(report: RunReport, text: str) -> None:
    if text not in report.notes:
        report.notes.append(text)


def _merge(report: RunReport, timed: TimedCases, judge: Judge) -> None:
    """A timing job's cases onto the report's runs (PyTorch stand-ins appended as runs of their own)."""
    info = judge.info
    assert info is not None
    if timed.failure and not report.failure:
        report.failure = timed.failure
    report.ceilings = timed.ceilings or report.ceilings
    for note in timed.notes:
        _note(report, note)
    for role, reason in timed.rejected.items():
        run = report.run(role)
        if run is not None and run.rejected is None:
            run.rejected = f"while timed: {reason}"
        if role == "baseline" and not report.failure:
            report.failure = f"baseline: {reason}"
    for role, cases in timed.cases.items():
        run = report.run(role)
        if run is None:  # a PyTorch stand-in: timed, never checked
            source = f"{info.path}: reference" + (" through torch.compile" if role == "compiled" else "")
            report.runs.append(KernelRun(role=role, source=source, cases=list(cases)))
            continue
        _copy_timings(cases, run)


def _copy_timings(cases: Sequence[CaseResult], target: KernelRun) -> None:
    """Timed cases onto `target`'s cases of the same label (added when it has none)."""
    by_label = {c.label: c for c in target.cases if not c.heldout}
    for case in cases:
        if case.label in by_label:
            by_label[case.label].timing = case.timing
            by_label[case.label].roofline = case.roofline
            by_label[case.label].input_bytes = case.input_bytes
        elif case.timing is not None:
            target.cases.append(case)
