"""The optimize loop: measure, then rounds of diagnose -> hypothesis -> rewrite -> validate -> decide.

Every step is committed to the run's rounds store (diagnose/rounds.py) before the next starts, so a
Ctrl-C, kill -9 or lost machine leaves a run that `resume` continues without repeating a finished
round. A candidate is accepted only if every case passes, the geometric mean of its per-case
speedups over the current best exceeds 1 + the measured noise (the larger repeat spread of the two
kernels, at least `noise_floor`) and no timed case is slower than 1 - that noise, and again when the
pick is timed against its parent a second time, alone; that second figure is the round's speedup.
A hypothesis (finding, pattern, rewriter) already tried on the same parent kernel is not tried again.

Rewriters: the deterministic pattern rewriters (diagnose/rewriters/), and with `llm="openai"` an
LLM through any OpenAI-compatible endpoint: several candidates a round, each repaired with the judge's
exact error, asked with the round's evidence and the run's history (diagnose/llm_round.py).
Timing goes through a `Judge`, by default the sandboxed harness (`HarnessJudge`); tests inject one
that checks correctness through the same harness and times deterministically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.composition import judged_stacks, picked, tagged, winners
from diagnose.end_of_run import time_the_end
from diagnose.judging import (
    POOLED_NOTE,
    HarnessJudge,
    Judge,
    acceptable,
    confirmed,
    improvement,
    second_look,
    validate_variants,
    why_rejected,
)
from diagnose.llm import EndpointError
from diagnose.llm_round import ask_for_round, budget_left
from diagnose.loop_options import KEPT_ON_RESUME, OptimizeOptions
from diagnose.planning import breadth_first, hypotheses
from diagnose.records import Answer
from diagnose.rewriters import Variant, rewrite, unified_diff
from diagnose.rounds import Hypothesis, Round, RoundsStore, RunStatus
from diagnose.small_shapes import small_shape_variant
from harness.entries import entry_name
from harness.errors import UserFacingError, first_line
from harness.measurement import RunReport
from harness.task import Task, TaskSpec

if TYPE_CHECKING:
    from kb.home import KBHome

# The loop, and the round machinery an agent host's steps (diagnose/agent_step.py) drive the same way.
__all__ = ["HarnessJudge", "Hypothesis", "Judge", "OptimizeOptions", "best_kernel_path", "check_rewritable",
           "diagnose_kernel", "diagnosis_markdown", "ensure_baseline", "finish_round", "last_report", "locked_run",
           "open_run", "optimize", "source_sha"]


def source_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def optimize(spec: TaskSpec, options: OptimizeOptions, run_dir: Path, home: KBHome | None = None,
             judge: Judge | None = None, log: Callable[[str], None] | None = None, resume: bool = False,
             stop_at: float | None = None) -> RoundsStore:
    """Run (or, with `resume`, continue) the loop in `run_dir`; returns the store for reporting.

    `stop_at` (a `time.time()` value) is this invocation's deadline, not the run's budget: no round
    starts after it and the run is left `paused`, to be resumed (a GPU machine lent for 10 minutes).
    One process at a time works in a run directory (an exclusive lock on `run_dir/.lock`)."""
    with locked_run(run_dir):
        return _optimize(spec, options, run_dir, home, judge, log, resume, stop_at)


@contextlib.contextmanager
def locked_run(run_dir: Path) -> Iterator[None]:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserFacingError(f"another kb optimize is working in {run_dir}",
                                  "wait for it to finish, or stop it and resume the run") from None
        yield


def open_run(spec: TaskSpec, options: OptimizeOptions, run_dir: Path, task: Task,
             resume: bool) -> tuple[RoundsStore, OptimizeOptions]:
    """The run's store, new or resumed, and the options it runs with (a resumed run keeps its own)."""
    if resume:
        store = RoundsStore(run_dir)
        info = store.run()
        options = OptimizeOptions(**{**asdict(options), **{k: v for k, v in info.options.items()
                                                           if k in KEPT_ON_RESUME}})
        if info.status in (RunStatus.PAUSED, RunStatus.INTERRUPTED):
            store.update_run(status=RunStatus.RUNNING, note=None)
        return store, options
    if RoundsStore.status_of(run_dir) is not None:
        raise UserFacingError(f"{run_dir} already holds a run", f"resume it with `kb optimize --resume {run_dir}`")
    store = RoundsStore(run_dir, create=True)  # new, or left empty by a kill before its record was written
    shutil.copyfile(task.kernel_file or task.source_file, run_dir / "round-000.py")
    # The family travels in the spec so that synthesis can file the rounds without loading the task.
    store.create_run(run_dir.name, task.name, replace(spec, family=task.family), asdict(options))
    return store, options


def ensure_baseline(store: RoundsStore, spec: TaskSpec, judge: Judge, entry: str, say: Callable[[str], None],
                    task: Task, options: OptimizeOptions, home: KBHome | None) -> None:
    """The task's own kernel measured once per run, before any round; a run whose kernel fails is FAILED,
    unless its diagnosis names a repair and the run may start from it (`repair_baseline`)."""
    if store.run().baseline is not None:
        return
    say("measuring the baseline")
    base = judge(spec, None, None, entry)
    if base.failure:  # the worker crashed or timed out: say so, and leave the run to resume
        raise UserFacingError(f"measuring the task's own kernel failed: {base.failure}",
                              f"check the device, then `kb optimize --resume {store.dir}`")
    baseline_run = base.run("baseline")
    if not (baseline_run and baseline_run.correct):
        base = _repaired_baseline(store, spec, judge, entry, say, task, options, home, why_rejected(base, "baseline"))
    store.update_run(baseline=base.to_dict(), best_round=0, best_path=str(store.dir / "round-000.py"))


def _repaired_baseline(store: RoundsStore, spec: TaskSpec, judge: Judge, entry: str, say: Callable[[str], None],
                       task: Task, options: OptimizeOptions, home: KBHome | None, why: str) -> RunReport:
    """The report of the failing initial kernel's repair, checked and timed as the run's baseline, which
    round-000.py then holds (the original kept as round-000.original.py); else the run FAILED, and the
    error says whether a repair exists."""
    from diagnose.baseline_repair import repair_from

    def failed(problem: str, fix: str) -> UserFacingError:
        store.update_run(status=RunStatus.FAILED, note=f"the task's own kernel is not correct: {why}")
        return UserFacingError(problem, fix)

    problem = f"the task's own kernel fails its checks: {why}"
    initial = store.dir / "round-000.py"
    say("the task's own kernel fails its checks: diagnosing it for a repair")
    repair = repair_from(lambda path: diagnose_kernel(store, task, path, entry, options, home)[0], initial)
    if repair is None:
        raise failed(problem, "fix the task or its kernel first (kb run TASK shows the cases)")
    if not options.repair_baseline:
        raise failed(f"{problem}; the diagnosis found {repair.describe()}",
                     "start the run with --repair-baseline to begin from that rewrite, or fix the kernel")
    repaired = store.dir / "round-000.repaired.py"
    repaired.write_text(repair.source)
    say(f"checking the repair: {repair.describe()}")
    base = judge(spec, str(repaired), None, entry)
    if base.failure:
        raise UserFacingError(f"measuring the repaired kernel failed: {base.failure}",
                              f"check the device, then `kb optimize --resume {store.dir}`")
    if not (run := base.run("baseline")) or not run.correct:
        raise failed(f"{problem}; its repair ({repair.describe()}) fails too: {why_rejected(base, 'baseline')}",
                     "fix the task or its kernel first (kb run TASK shows the cases)")
    shutil.copyfile(initial, store.dir / "round-000.original.py")
    shutil.copyfile(repaired, initial)
    for r in base.runs:
        r.source = str(initial)
    info = store.run()
    store.update_run(options={**info.options, "repaired": repair.record("round-000.original.py", why)},
                     note=f"the task's own kernel failed its checks ({why}); the run starts from its repair, "
                          f"{repair.describe()} on lines {repair.lines}, and its speedups are over the repaired kernel")
    say(f"round 0 is the repaired kernel ({repair.pattern}); the original is round-000.original.py")
    return base


def _optimize(spec: TaskSpec, options: OptimizeOptions, run_dir: Path, home: KBHome | None, judge: Judge | None,
              log: Callable[[str], None] | None, resume: bool, stop_at: float | None) -> RoundsStore:
    from harness.task import load_job_task

    say = log or (lambda _msg: None)
    task = load_job_task(spec)
    entry = entry_name(task.entry)
    check_rewritable(task, entry)
    store, options = open_run(spec, options, run_dir, task, resume)
    own_judge = None
    if judge is None:
        judge = own_judge = HarnessJudge(options)
    started = time.monotonic()
    try:
        ensure_baseline(store, spec, judge, entry, say, task, options, home)
        while True:
            rounds = store.rounds()
            pending = next((r for r in rounds if r.state != "done"), None)
            if pending is None and len(rounds) >= options.rounds:
                break
            if stop_at is not None and time.time() >= stop_at:
                store.update_run(status=RunStatus.PAUSED, note=f"paused after {len(rounds)} rounds: resume to go on")
                say(f"paused after {len(rounds)} rounds (deadline); resume with `kb optimize --resume {run_dir}`")
                return store
            if options.time_budget_s is not None and time.monotonic() - started > options.time_budget_s:
                store.update_run(note=f"time budget of {options.time_budget_s:g} s reached after {len(rounds)} rounds")
                break
            if pending is not None:
                say(f"round {pending.idx}: resuming from {pending.state}")
                finish_round(store, pending, spec, task, entry, judge, options, home, say)
                continue
            planned = _plan(store, spec, task, entry, options, home, len(rounds) + 1, say)
            if planned is None:
                store.update_run(note=f"no untried hypothesis left after {len(rounds)} rounds")
                break
            finish_round(store, planned, spec, task, entry, judge, options, home, say)
        time_the_end(store, spec, judge, entry, options, say)
        store.update_run(status=RunStatus.FINISHED)
    except KeyboardInterrupt:
        store.update_run(status=RunStatus.INTERRUPTED)
        raise
    except EndpointError as exc:  # the model could not answer: its round stays open, to resume
        store.update_run(status=RunStatus.INTERRUPTED, note=f"interrupted: {exc.problem}")
        raise
    except UserFacingError as exc:
        # A step that could not be taken (the device, a compile, the kernel file): the run says why and
        # waits to be resumed, rather than reading "running" with no process behind it. A failed
        # baseline has set FAILED already.
        if store.run().status == RunStatus.RUNNING:
            store.update_run(status=RunStatus.INTERRUPTED, note=f"interrupted: {exc.problem}")
        raise
    finally:
        if own_judge is not None:
            own_judge.close()
    return store


def check_rewritable(task: Task, entry: str) -> None:
    """One line, before any round, when the loop could not rewrite the kernel: neither the file the
    entry's code lives in nor one file of kernels it names defines a Triton kernel (what each round
    rewrites), or the entry's file names the entry differently."""
    from harness.entries import attribute_path, kernel_files_named_by
    from harness.guards import defines_kernel
    from harness.loading import load_kernel_module

    if not defines_kernel(task.kernel_file or task.source_file):
        named = kernel_files_named_by(task.entry)
        if len(named) > 1:
            raise UserFacingError(f"the entry {entry} runs code in {task.source_file}, which defines no @triton.jit "
                                  f"kernel, and launches kernels of {len(named)} files ({', '.join(named)})",
                                  "make the entry a wrapper that launches the kernels of one file")
        raise UserFacingError(f"the entry {entry} runs code in {task.source_file}, which defines no @triton.jit kernel "
                              "and names none it launches: there is nothing to rewrite",
                              "make the entry the launch wrapper of the kernel (for an autograd Function, its "
                              ".apply; for a partial, the function it wraps)")
    if attribute_path(load_kernel_module(task.source_file), entry) is None:
        raise UserFacingError(f"{task.source_file} has no attribute path {entry!r} for the entry, so a rewrite of it "
                              "could not be called", "make the entry a module-level function or Function.apply there")


# ------------------------------------------------------------------------------------ planning
def best_kernel_path(store: RoundsStore) -> tuple[int, Path]:
    info = store.run()
    return int(info.best_round or 0), Path(info.best_path or store.dir / "round-000.py")


def _plan(store: RoundsStore, spec: TaskSpec, task: Task, entry: str, options: OptimizeOptions, home: KBHome | None,
          idx: int, say: Callable[[str], None]) -> Round | None:
    parent_idx, parent = best_kernel_path(store)
    source = parent.read_text()
    answer, launched = diagnose_kernel(store, task, parent, entry, options, home)
    rounds = store.rounds()
    lineage = _lineage(rounds, parent_idx)
    seen = _measured_sources(store)
    from kb.patterns import catalog_for

    catalog = catalog_for(home)
    # A wide round's further hypotheses are structural rewrites, one per pattern: the launch knobs search
    # a space of their own in their own rounds. In the H100's eight wide rounds (2026-12-05) knob searches
    # beside a structural rewrite made 50 of the 79 variants and none won (one joined a stack at +0.3%).
    knobs = {p.id for p in catalog if p.rewrite.kind == "launch-config-search"}
    # rejected on this kernel: dropped; on an ancestor: once more, after the untried (breadth_first)
    r: Round | None = None
    for hyp in breadth_first(hypotheses(answer, options, catalog), rounds, lineage):
        if hyp.rewriter == "llm" and not budget_left(store.rounds(), options.max_tokens_per_run):
            continue
        if r is not None and (hyp.rewriter != "pattern" or hyp.pattern in knobs
                              or hyp.pattern in {h.pattern for h in [r.hypothesis, *r.others]}):
            continue
        hyp.launched = launched
        if hyp.rewriter == "pattern":
            try:
                variants = rewrite(hyp.pattern, source, _context(task, hyp, parent))
            except Exception as exc:  # noqa: BLE001 - a rewriter's bug on a kernel it never met skips its pattern, not the run
                say(f"round {idx}: {hyp.pattern}'s rewriter failed on this kernel, skipped "
                    f"({type(exc).__name__}: {first_line(exc)})")
                continue
            fresh = [v for v in variants if source_sha(v.source) not in seen]
            if not fresh:
                continue  # no rewrite, or every variant was measured already in this run
        if r is not None:
            r.others.append(hyp)
        else:
            key = f"{source_sha(source)}:{hyp.finding}:{hyp.pattern}:{hyp.rewriter}"
            r = Round(idx, parent_idx, "planned", hyp, key, hyp.level, hyp.evidence, hyp.rewriter)
        if hyp.rewriter != "pattern" or len(r.others) + 1 >= options.breadth:
            break
    if r is None:
        return None
    store.plan(r)
    for hyp in [r.hypothesis, *r.others]:
        asked_by = hyp.finding or ("untargeted" if hyp.untargeted else "search")
        say(f"round {idx}: {asked_by} -> {hyp.pattern} ({hyp.rewriter}, from {hyp.level}, "
            f"record {hyp.record:.2f})")
    (store.dir / f"round-{idx:03d}.diagnosis.md").write_text(diagnosis_markdown(answer))
    if r.rewriter == "llm":  # its prompt is built from the records, also when the round resumes
        (store.dir / f"round-{idx:03d}.diagnosis.json").write_text(json.dumps(answer.to_dict()))
    return r


def _lineage(rounds: list[Round], idx: int) -> set[int]:
    """`idx` and the rounds its kernel descends from (0 is the task's own kernel)."""
    parents = {r.idx: r.parent or 0 for r in rounds}
    out = {idx}
    while idx in parents and idx != 0:
        idx = parents[idx]
        out.add(idx)
    return out | {0}


def _measured_sources(store: RoundsStore) -> set[str]:
    """Hashes of every kernel source validated in this run (the original included)."""
    seen = {source_sha((store.dir / "round-000.py").read_text())}
    for r in store.rounds():
        for v in (r.timings or {}).get("variants", []):
            if v.get("sha"):
                seen.add(v["sha"])
    return seen


def diagnose_kernel(store: RoundsStore, task: Task, parent: Path, entry: str, options: OptimizeOptions,
                    home: KBHome | None) -> tuple[Answer, dict[str, dict[str, int]]]:
    """The parent's diagnosis, and what it intercepted of each kernel's launch: its options, its programs,
    and the SMs of the device it was diagnosed for (0 where not a GPU's)."""
    from diagnose.engine import diagnose
    from diagnose.request import KernelInput, request_from

    # On the loop's own backend: an npu run is diagnosed against the Ascend patterns.
    target = "npu" if options.backend == "npu" else None
    spec = store.run().spec
    # the rewrite stands in for the task's kernel: a task file's, or a wild kernel's under its call
    given = (KernelInput(task=spec.path, rewrite=str(parent), entry=entry) if spec.path is not None else
             KernelInput(kernel=spec.kernel, call=spec.call, rewrite=str(parent), entry=entry))
    request = request_from(given, target, store.dir / "compile-cache", last_report(store))
    answer = diagnose(request, home, options.release, options.strategy)
    return answer, launch_record(request.launches())  # intercepted for L1 already (cached): no second launch


def launch_record(launches: list[Any]) -> dict[str, dict[str, int]]:
    """What a rewriter's context carries of a kernel's launches (`LaunchFacts`): per kernel its first launch's
    options, its programs, and the SMs of the device it was intercepted for (0 where not a GPU's)."""
    from harness.cuda_shim import device_model_for

    launched: dict[str, dict[str, int]] = {}
    for facts in launches:
        sms = device_model_for(facts.target).sm_count if facts.target.startswith("cuda") else 0
        launched.setdefault(facts.kernel, {"num_warps": facts.num_warps, "num_stages": facts.num_stages,
                                           "programs": facts.programs or 0, "sms": sms})
    return launched


def _stacked_context(store: RoundsStore, spec: TaskSpec, task: Task, hyp: Hypothesis, source: str, entry: str,
                     options: OptimizeOptions) -> dict[str, Any]:
    """A rewriter's context for a stack's next step: the facts of the kernel it rewrites (a winner's, which may
    launch another grid, other options, or a kernel of another name), not the parent's. Its launches are
    intercepted on the case the round's diagnosis read; where that fails the step goes without them."""
    from diagnose.request import diagnosed_case
    from harness.run import kernel_launch_facts

    file = store.dir / f".stacked-{source_sha(source)[:12]}.py"  # beside the round's files, as its parent is
    file.write_text(source)
    try:
        case = diagnosed_case(task, last_report(store))[0] if spec.path is not None else 0
        target = "npu" if options.backend == "npu" else None
        launched = launch_record(kernel_launch_facts(spec, str(file), entry, case=case, target=target))
    except UserFacingError:
        launched = {}
    try:
        return _context(task, replace(hyp, launched=launched), file)
    finally:
        file.unlink(missing_ok=True)


def last_report(store: RoundsStore) -> RunReport | None:
    """The current best kernel's latest measurements, for L2."""
    info = store.run()
    best = info.best_round or 0
    for r in reversed(store.rounds()):
        if r.idx == best and r.timings and r.timings.get("report"):
            report = RunReport.from_dict(r.timings["report"])
            # The accepted candidate is the best now: present it as the measured baseline.
            report.runs = [run for run in report.runs if run.role == "candidate"]
            for run in report.runs:
                run.role = "baseline"
            return report
    return RunReport.from_dict(info.baseline) if info.baseline else None


def _context(task: Task, hyp: Hypothesis, source_file: Path | None = None) -> dict[str, Any]:
    from diagnose.features import kernel_features
    from harness.task import tolerance_for

    loops = bool(source_file and kernel_features(source_file).loops)
    return {"finding": hyp.finding, "fp32_rtol": tolerance_for(task, "float32")["rtol"],
            "features": "loop" if loops else "", "launched": hyp.launched}


def diagnosis_markdown(answer: Answer) -> str:
    from diagnose.render import to_markdown

    return to_markdown(answer)


# ------------------------------------------------------------------------------------ rewrite + validate
def finish_round(store: RoundsStore, r: Round, spec: TaskSpec, task: Task, entry: str, judge: Judge,
                 options: OptimizeOptions, home: KBHome | None, say: Callable[[str], None]) -> None:
    """Rewrite and validate the round from where it stands, adding the time this takes to its record
    (a Ctrl-C or an error mid-way too; a kill -9 loses this invocation's share)."""
    started = time.monotonic()
    try:
        _work_round(store, r, spec, task, entry, judge, options, home, say)
    finally:
        store.add_work(r.idx, time.monotonic() - started)


def _work_round(store: RoundsStore, r: Round, spec: TaskSpec, task: Task, entry: str, judge: Judge,
                options: OptimizeOptions, home: KBHome | None, say: Callable[[str], None]) -> None:
    parent = store.dir / f"round-{r.parent or 0:03d}.py"
    source = parent.read_text()
    hyp = r.hypothesis
    llm_file = store.dir / f"round-{r.idx:03d}.llm.json"
    if r.state == "planned":
        llm = None
        lines: list[str] | None = None  # a wide round's params lines, each naming its pattern
        try:
            if hyp.rewriter == "llm":
                from kb.patterns import catalog_for

                llm = ask_for_round(store, r, source, entry, options, catalog_for(home), last_report(store),
                                    _checker(judge, spec, parent, entry))
                variants = llm.variants
            elif hyp.rewriter == "host":  # written by an agent host (agent_step), kept since it was planned
                variants = [Variant({"from": "agent host"}, (store.dir / f"round-{r.idx:03d}.host.py").read_text())]
            else:
                variants = rewrite(hyp.pattern, source, _context(task, hyp, parent))
                lines = [tagged(hyp.pattern, v.params) for v in variants] if r.others else None
                for other in r.others:
                    try:
                        extra = rewrite(other.pattern, source, _context(task, other, parent))
                    except Exception as exc:  # noqa: BLE001 - as in planning: this pattern is skipped, not the round
                        say(f"round {r.idx}: {other.pattern}'s rewriter failed on this kernel, skipped "
                            f"({type(exc).__name__}: {first_line(exc)})")
                        continue
                    variants += extra
                    lines = [*(lines or []), *(tagged(other.pattern, v.params) for v in extra)]
        except EndpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - a rewriter that fails is a failed round, not a failed run
            store.done(r.idx, "failed", f"rewrite failed: {type(exc).__name__}: {first_line(exc)}")
            return
        if llm is not None:
            llm_file.write_text(json.dumps(llm.to_dict()))
            store.set_cost(r.idx, llm.cost.to_dict())
            if not variants:
                judged = any(a.outcome == "rejected" for a in llm.attempts)
                store.done(r.idx, "rejected" if judged else "failed",
                           f"no candidate passed the checks: {llm.why_none_passed()}", {"llm": llm.to_dict()})
                say(f"round {r.idx}: {'rejected' if judged else 'failed'} (no candidate passed the checks)")
                return
        seen = _measured_sources(store)
        kept: list[tuple[Variant, str]] = []
        for v, line in zip(variants, lines or [repr(v.params) for v in variants]):
            if source_sha(v.source) not in seen:  # measured in this run, or made by another pattern of the round
                seen.add(source_sha(v.source))
                kept.append((v, line))
        if not kept:
            store.done(r.idx, "rejected", "the rewrite produced no change not already measured in this run")
            return
        for i, (v, _) in enumerate(kept):
            (store.dir / f"round-{r.idx:03d}.v{i}.py").write_text(v.source)
        (store.dir / f"round-{r.idx:03d}.variants").write_text("\n".join(line for _, line in kept) + "\n")
        variants = [v for v, _ in kept]
        store.rewritten(r.idx, str(store.dir / f"round-{r.idx:03d}.v0.py"), unified_diff(source, variants[0].source))
    variant_files, params = store.variants(r.idx)
    say(f"round {r.idx}: validating {len(variant_files)} variant(s): " + ", ".join(params))
    reports = validate_variants(judge, spec, parent, variant_files, entry, lambda msg: say(f"round {r.idx}: {msg}"))
    if isinstance(reports, str):
        store.done(r.idx, "failed", reports)
        say(f"round {r.idx}: failed (device memory)")
        return
    results = [(file, params[i] if i < len(params) else "", report, acceptable(report, options))
               for i, (file, report) in enumerate(zip(variant_files, reports))]
    results = second_look(judge, spec, results, parent, entry, options, lambda msg: say(f"round {r.idx}: {msg}"))
    if r.others:
        by_pattern = {h.pattern: h for h in [r.hypothesis, *r.others]}
        results += judged_stacks(store.dir, r.idx, judge, spec, parent, entry, options, results,
                                 lambda pattern, text: rewrite(pattern, text, _stacked_context(
                                     store, spec, task, by_pattern[pattern], text, entry, options)),
                                 lambda msg: say(f"round {r.idx}: {msg}"))
    composed = small_shape_variant(store.dir, r.idx, source, results, entry, options)
    if composed is not None:  # a winner on large inputs that lost the small ones: the parent's code there
        say(f"round {r.idx}: validating a small-shape path: {composed[1]}")
        more = validate_variants(judge, spec, parent, [composed[0]], entry, lambda msg: say(f"round {r.idx}: {msg}"))
        if not isinstance(more, str):
            results.append((composed[0], composed[1], more[0], acceptable(more[0], options)))
    passing = [(file, p, report, (g, n, w)) for file, p, report, (g, n, w) in results if g is not None]
    best = max(passing, key=lambda x: x[3][0]) if passing else None
    summary = [{"variant": p, "sha": source_sha(f.read_text()), "geomean": v[0], "noise": v[1], "why": v[2]}
               for f, p, _, v in results]
    llm_record = {"llm": json.loads(llm_file.read_text())} if llm_file.is_file() else {}
    others = [{"pattern": h.pattern, "finding": h.finding, "outcome": "lost"} for h in r.others]
    if best is None:
        store.done(r.idx, "rejected", "; ".join(f"{p or 'variant'}: {v[2]}" for _, p, _, v in results),
                   {"variants": summary, **llm_record, **({"others": others} if others else {})})
        return
    file, p, report, (geomean, noise, why) = best
    # A wide round is the pick's hypothesis's, whatever the verdict: its kernel, diff and figures are the pick's.
    if r.others:
        hyp, others = picked(store, r, p, {w.pattern for w in winners(results, options)})
    chosen = store.dir / f"round-{r.idx:03d}.py"
    shutil.copyfile(file, chosen)
    store.rewritten(r.idx, str(chosen), unified_diff(source, chosen.read_text()))
    timings = {"variants": summary, "chosen": p, "report": report.to_dict(), "per_case": report.speedups(),
               **llm_record, **({"others": others} if others else {})}
    won = improvement(report, options)
    if won is not None:
        again = confirmed(judge, spec, parent, file, entry, options)
        if again is not None:
            report_again, (geomean_again, noise_again, why_again) = again
            timings["confirmation"] = {"geomean": geomean_again, "noise": noise_again, "why": why_again,
                                       "report": report_again.to_dict()}
            if report_again.failure:  # the timing job itself failed: no verdict on the kernel either way
                store.done(r.idx, "failed", f"{p}: {geomean:.3f}x among the variants; timing it again failed: "
                           f"{report_again.failure}", timings)
                say(f"round {r.idx}: failed (timing it again failed)")
                return
            won_again = improvement(report_again, options) if geomean_again is not None else None
            if won_again is None or geomean_again is None:
                figure = f"{geomean_again:.3f}x" if geomean_again is not None else why_again
                store.done(r.idx, "rejected", f"{p}: geomean speedup {geomean:.3f}x among the variants, {figure} "
                           f"timed again alone: not confirmed (noise {noise_again:.1%})", timings, geomean_again)
                say(f"round {r.idx}: rejected ({geomean:.3f}x not confirmed: {figure})")
                return
            first = f", {geomean:.3f}x among the variants"
            if POOLED_NOTE in report_again.notes:
                first += "; pooled over two timings alone (one read a case slower than the bar)"
            geomean, won = geomean_again, won_again
            # The round's figures are the confirmation's; "report" stays the checked one (L2 reads it).
            timings["per_case"] = report_again.speedups()
        else:
            first = ""
        store.done(r.idx, "accepted", f"{p}: {won}{first}", timings, geomean)
        store.update_run(best_round=r.idx, best_path=str(chosen))
        _write_best(store, r, hyp, geomean, timings.get("others", []))
        say(f"round {r.idx}: accepted ({geomean:.3f}x)")
    else:
        verdict = "slower than the parent" if geomean < 1 - noise else f"within noise {noise:.1%}"
        store.done(r.idx, "rejected", f"{p}: geomean speedup {geomean:.3f}x is {verdict}", timings, geomean)
        say(f"round {r.idx}: rejected ({geomean:.3f}x)")


def _checker(judge: Judge, spec: TaskSpec, parent: Path, entry: str) -> Callable[[Path], str | None]:
    """An LLM candidate's check: None when it passes every check against its parent, else why not."""
    check = getattr(judge, "check", None) or judge

    def verdict(candidate: Path) -> str | None:
        report = check(spec, str(parent), str(candidate), entry)
        run = report.run("candidate")
        return None if not report.failure and run is not None and run.correct else why_rejected(report, "candidate")

    return verdict


def _rewritten_by(hyp: Hypothesis) -> str:
    return {"llm": "a rewrite by the LLM", "host": "a rewrite by the agent host"}.get(
        hyp.rewriter, f"pattern {hyp.pattern} ({hyp.rewriter})")


def _write_best(store: RoundsStore, r: Round, hyp: Hypothesis, geomean: float,
                others: list[dict[str, str]]) -> None:
    chosen = Path(store.dir / f"round-{r.idx:03d}.py").read_text()
    info = store.run()
    stacked = [f"{o['pattern']} ({'for ' + o['finding'] if o['finding'] else 'no finding'})" for o in others
               if o["outcome"] == "composed"]
    header = (f'"""kernel-kb optimize: best kernel of run {info.id} (task {info.task}).\n\n'
              f"Round {r.idx} (parent round {r.parent or 0}): {hyp.finding or 'search'} -> {_rewritten_by(hyp)}; "
              f"diagnosed at {hyp.level}; evidence {', '.join(hyp.evidence) or '-'} "
              f"in round-{r.idx:03d}.diagnosis.md.\n"
              + (f"Stacked on it in the same round: {', '.join(stacked)}.\n" if stacked else "")
              + (f"The rewrite makes true: {hyp.unblock}\n" if hyp.unblock else "")
              + f"Geomean speedup over its parent: {geomean:.3f}x. "
              f'History: kb rounds show {store.dir}\n"""\n')
    body = re.sub(r'^"""kernel-kb optimize:.*?"""\n', "", chosen, flags=re.DOTALL)
    (store.dir / "best.py").write_text(header + body)
