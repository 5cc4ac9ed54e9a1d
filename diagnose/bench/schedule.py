"""`kb bench`: the optimize loop over a suite of operators, one worker per GPU, resumable across invocations.

A bench directory holds `bench.json` (the suite, operators, conditions and budget; written once) and
`runs/<condition>/<operator>/`, one optimize run each with its own rounds store. Nothing else holds
state: a job whose run is finished is skipped, one whose run exists is resumed, any other is started.
So a bench killed at any point, or cut by a GPU machine's 10-minute limit (`stop_after`), goes on
with `kb bench --resume DIR` and repeats no finished round.

A condition is one way of running the suite: a diagnosis strategy and the KB home whose patterns and
statistics the loop reads. The strategy comparison is three conditions over one home; the synthesis
split-half is two conditions (learned statistics, a fresh home) over one strategy. Jobs interleave
the conditions operator by operator, so with two or more workers an operator's conditions run side
by side on the same kind of device.

Each job is the optimize loop in a subprocess of its own (diagnose/bench/job.py), pinned to one device through CUDA_VISIBLE_DEVICES (one worker
per GPU on a host); its output goes to `logs/<condition>.<operator>.log`. Across hosts, `ray_address`
hands the same jobs to a Ray cluster as tasks of one GPU each (Ray sets CUDA_VISIBLE_DEVICES); every
node then needs this checkout at the same path and the bench directory on a shared filesystem.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.backends import BackendName
from harness.errors import UserFacingError

__all__ = ["BenchSpec", "Condition", "Job", "bench_runs", "create_bench", "jobs", "load_bench", "load_suite",
           "optimize_command", "replace_stale", "rejudge", "rerun", "retime", "run_bench", "set_timing_windows", "task_digest"]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = REPO / "corpora" / "operators"
# After the deadline a running job is asked to stop (SIGINT: its round is left resumable), then killed.
_GRACE_S = 60.0


@dataclass
class Condition:
    name: str
    strategy: str = "progressive"
    home: str | None = None  # the KB home the runs read patterns and statistics from (None: the caller's)


@dataclass
class BenchSpec:
    suite: str
    operators: list[str]
    conditions: list[Condition]
    rounds: int = 5
    time_budget_s: float | None = None  # per operator run; a resumed run's budget restarts
    llm: str = "none"
    backend: BackendName = "cuda"
    created: str = ""
    note: str = ""
    references: list[str] = field(default_factory=lambda: ["eager"])  # PyTorch stand-ins timed at the end
    # The stand-ins and the initial kernel are the same in every condition, so they are timed in the
    # first condition's runs only; the report takes the other conditions' figures over eager through
    # their own initial kernel (best/initial x initial/eager, each ratio from one process).
    references_once: bool = True
    warmup_ms: int | None = None  # do_bench windows of each timing (None: the harness defaults)
    rep_ms: int | None = None
    # The LLM rewriter's settings for every run (OptimizeOptions fields: candidates, repairs, ...).
    llm_options: dict[str, Any] = field(default_factory=dict)
    breadth: int = 1  # hypotheses a round judges side by side (OptimizeOptions.breadth)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchSpec:
        # A bench written before `references_once` timed the stand-ins in every condition: it goes on so.
        return cls(**{"references_once": False, **d, "conditions": [Condition(**c) for c in d["conditions"]]})


@dataclass
class Job:
    condition: Condition
    operator: str
    task: Path
    run_dir: Path
    state: str = "new"  # new | partial | finished | failed | stale (its task changed since the run began)
    returncode: int | None = None
    seconds: float = 0.0
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_suite(suite: Path, only: list[str] | None = None) -> dict[str, Path]:
    """Operator name -> task file: every `<suite>/<name>/task.py`, or the named ones."""
    if not suite.is_dir():
        raise UserFacingError(f"suite {suite} is not a directory", "pass --suite DIR holding <operator>/task.py folders")
    found = {p.parent.name: p for p in sorted(suite.glob("*/task.py"))}
    if not found:
        raise UserFacingError(f"suite {suite} holds no <operator>/task.py", "see corpora/operators/README.md")
    if only:
        missing = [name for name in only if name not in found]
        if missing:
            raise UserFacingError(f"no operator {', '.join(missing)} in {suite}",
                                  f"pick among: {', '.join(found)}")
        return {name: found[name] for name in only}
    return found


def create_bench(bench_dir: Path, spec: BenchSpec) -> BenchSpec:
    manifest = bench_dir / "bench.json"
    if manifest.exists():
        raise UserFacingError(f"{bench_dir} already holds a bench", f"continue it with `kb bench --resume {bench_dir}`")
    spec.operators = list(dict.fromkeys(spec.operators))  # a name given twice would share one run directory
    names = [c.name for c in spec.conditions]
    if len(set(names)) != len(names) or not names:
        raise UserFacingError(f"condition names must be unique and non-empty: {names}", "name each condition once")
    load_suite(Path(spec.suite), spec.operators)  # fail now, not in the middle of the bench
    spec.created = spec.created or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    bench_dir.mkdir(parents=True, exist_ok=True)
    _write_spec(bench_dir, spec)
    return spec


def set_timing_windows(bench_dir: Path, warmup_ms: int | None, rep_ms: int | None) -> BenchSpec:
    """Change the timing windows of a bench's jobs still to run, and say so in its note (each timing
    record keeps the windows it was measured with, so a report can tell them apart)."""
    spec = load_bench(bench_dir)
    changed = {k: v for k, v in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)) if v and getattr(spec, k) != v}
    if not changed:
        return spec
    finished = sum(1 for j in jobs(bench_dir, spec) if j.state == "finished")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    for key, value in changed.items():
        setattr(spec, key, value)
    said = ", ".join(f"{k} {v}" for k, v in changed.items())
    spec.note = (spec.note + " " if spec.note else "") + f"Timing windows set to {said} on {stamp}, {finished} runs finished."
    _write_spec(bench_dir, spec)
    return spec


def add_operators(bench_dir: Path, operators: list[str]) -> list[str]:
    """Widen a bench to more operators of its suite (a bench run session by session, the operators a
    session could not reach given to a later one): each condition gets a new job per added operator, the
    finished runs stay, and the note says when the operators came. Returns those added (names it
    already has are skipped)."""
    spec = load_bench(bench_dir)
    load_suite(Path(spec.suite), operators)  # an unknown operator stops it before anything is changed
    added = [op for op in dict.fromkeys(operators) if op not in spec.operators]
    if not added:
        return []
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    spec.operators += added
    spec.note = (spec.note + " " if spec.note else "") + f"Operators added on {stamp}: {', '.join(added)}."
    _write_spec(bench_dir, spec)
    return added


def retime(bench_dir: Path, operators: list[str]) -> list[Job]:
    """Make the finished runs of `operators` measure their end again (their stand-ins or initial kernel
    changed): each forgets its end-of-run record and takes the status `to-retime` (resumable, and unlike
    a pause its note stays), with its round budget set to the rounds it ran, so the next `--resume`
    re-times it and plans no new round (a run cut by its time budget would otherwise get a second
    budget). Returns the jobs reset."""
    from diagnose.rounds import RoundsStore

    spec = load_bench(bench_dir)
    unknown = [op for op in operators if op not in spec.operators]
    if unknown:
        raise UserFacingError(f"no operator {', '.join(unknown)} in the bench {bench_dir}",
                              f"pick among: {', '.join(spec.operators)}")
    reset = [j for j in jobs(bench_dir, spec) if j.operator in operators and j.state == "finished"]
    for job in reset:
        store = RoundsStore(job.run_dir)
        try:
            options = {**store.run().options, "rounds": len(store.rounds())}
            store.update_run(status="to-retime", final=None, options=options)
        finally:
            store.close()
        job.state = "partial"
    return reset


def rejudge(bench_dir: Path) -> dict[str, str]:
    """Judge every finished run's end-of-run timing again by the rules as they are (`rejudge_end`; nothing is
    timed, so it runs anywhere): a run whose best kernel they now reject hands the initial one back, and
    the bench's note says which and why. Returns {condition/operator: why} of those."""
    from diagnose.end_of_run import rejudge_end
    from diagnose.loop_options import OptimizeOptions
    from diagnose.rounds import RoundsStore

    spec = load_bench(bench_dir)
    known = set(OptimizeOptions.__dataclass_fields__)
    changed: dict[str, str] = {}
    for job in jobs(bench_dir, spec):
        if job.state != "finished":
            continue
        store = RoundsStore(job.run_dir)
        try:
            stored = store.run().options
            why = rejudge_end(store, OptimizeOptions(**{k: v for k, v in stored.items() if k in known}))
        finally:
            store.close()
        if why is not None:
            changed[f"{job.condition.name}/{job.operator}"] = why
    if changed:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        spec.note = (spec.note + " " if spec.note else "") + (
            f"On {when} the end-of-run timings were judged again by the rules as they then were, and the "
            f"initial kernel stands for {', '.join(sorted(changed))}.")
        _write_spec(bench_dir, spec)
    return changed


def _write_spec(bench_dir: Path, spec: BenchSpec) -> None:
    manifest = bench_dir / "bench.json"
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(spec), indent=1))
    os.replace(tmp, manifest)  # all or nothing: a half-written manifest would strand the bench


def load_bench(bench_dir: Path) -> BenchSpec:
    try:
        return BenchSpec.from_dict(json.loads((bench_dir / "bench.json").read_text()))
    except FileNotFoundError:
        raise UserFacingError(f"{bench_dir} is not a bench directory (no bench.json)",
                              "start one with `kb bench --bench-dir DIR`") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise UserFacingError(f"{bench_dir}/bench.json is damaged ({exc})", "restore it or start a new bench") from None


def jobs(bench_dir: Path, spec: BenchSpec) -> list[Job]:
    """Every (operator, condition) job in run order, with the state its run directory says."""
    tasks = load_suite(Path(spec.suite), spec.operators)
    out = []
    for operator in spec.operators:
        for condition in spec.conditions:
            run_dir = bench_dir / "runs" / condition.name / operator
            job = Job(condition, operator, tasks[operator], run_dir, log=bench_dir / "logs" / f"{condition.name}.{operator}.log")
            job.state = _state_of(run_dir)
            if job.state != "new" and _stamped(run_dir) not in (None, task_digest(job.task)):
                job.state = "stale"
            out.append(job)
    return out


# What a run records of its task when it starts: a run whose task's files changed since (an import that
# judged an earlier draft again and took it) measured a kernel the suite no longer holds.
TASK_STAMP = "task.sha"


def task_digest(task: Path) -> str:
    """A digest of the Python files beside the task file (its kernel, reference and cases), by name. Not the
    task file: a stand-in changed there is what `retime` measures again, without running the rounds again."""
    digest = hashlib.sha256()
    for path in sorted(p for p in task.parent.glob("*.py") if p != task):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _stamped(run_dir: Path) -> str | None:
    stamp = run_dir / TASK_STAMP
    return stamp.read_text().strip() if stamp.is_file() else None  # None: a run from before stamps


def _stamp(job: Job) -> None:
    """The task's digest beside a run that starts now (kept by a run that resumes)."""
    if _stamped(job.run_dir) is None:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / TASK_STAMP).write_text(task_digest(job.task) + "\n")


def replace_stale(bench_dir: Path) -> list[Job]:
    """Runs whose task changed since they began are set aside, whole, under `replaced/<condition>/`
    (with their logs), so that their jobs start afresh on the task as it is; the note says which and when.
    Returns those jobs, now new."""
    spec = load_bench(bench_dir)
    stale = [j for j in jobs(bench_dir, spec) if j.state == "stale"]
    return _set_aside(bench_dir, spec, stale, "their task changed since they began")


def rerun(bench_dir: Path, operators: list[str], why: str) -> list[Job]:
    """Set the runs of `operators` aside, whole, under `replaced/<condition>/` (as `replace_stale` does) so that
    their jobs start afresh: after a change to what chooses or makes their rounds (a new rewrite, a mended
    diagnosis), which no digest of the task sees. `why` goes into the bench's note with the date. Returns
    the jobs set aside (operators not yet run have nothing to set aside)."""
    spec = load_bench(bench_dir)
    unknown = [op for op in operators if op not in spec.operators]
    if unknown:
        raise UserFacingError(f"no operator {', '.join(unknown)} in the bench {bench_dir}",
                              f"pick among: {', '.join(spec.operators)}")
    if not why.strip():
        raise UserFacingError("--rerun needs a reason for the bench's note", 'add --why "what changed (commits)"')
    ran = [j for j in jobs(bench_dir, spec) if j.operator in operators and j.state != "new"]
    return _set_aside(bench_dir, spec, ran, why.strip())


def _set_aside(bench_dir: Path, spec: BenchSpec, runs: list[Job], why: str) -> list[Job]:
    if not runs:
        return []
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    for job in runs:
        aside = bench_dir / "replaced" / job.condition.name / f"{job.operator}-{stamp}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(job.run_dir), str(aside))
        if job.log is not None and job.log.is_file():
            shutil.move(str(job.log), str(aside / job.log.name))
        job.state = "new"
    said = ", ".join(sorted({j.operator for j in runs}))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    spec.note = (spec.note + " " if spec.note else "") + f"Runs of {said} set aside on {when} ({why}) and run again."
    _write_spec(bench_dir, spec)
    return runs


def _state_of(run_dir: Path) -> str:
    """new (no run yet, or killed before its record was written: starts afresh), partial, finished
    or failed."""
    from diagnose.rounds import RoundsStore

    status = RoundsStore.status_of(run_dir)
    if status is None:
        return "new"
    return {"finished": "finished", "failed": "failed"}.get(status, "partial")


def bench_runs(bench_dir: Path) -> list[Path]:
    """The optimize run directories of a bench (`runs/<condition>/<operator>`)."""
    return sorted(p.parent for p in (bench_dir / "runs").glob("*/*/rounds.sqlite"))


def optimize_command(job: Job, spec: BenchSpec, stop_after: float | None) -> list[str]:
    """The command that starts or resumes `job`: the optimize loop in a process of its own
    (diagnose/bench/job.py), given the same options record `kb optimize` builds."""
    from diagnose.bench.job import JobRequest
    from diagnose.optimize import OptimizeOptions

    # The stand-ins are timed in the first condition only (references_once): the others reuse them.
    timed = not spec.references_once or job.condition.name == spec.conditions[0].name
    options = OptimizeOptions(rounds=spec.rounds, time_budget_s=spec.time_budget_s, llm=spec.llm,
                              strategy=job.condition.strategy, backend=spec.backend,
                              references=tuple(spec.references) if timed else (), warmup_ms=spec.warmup_ms,
                              rep_ms=spec.rep_ms, breadth=spec.breadth, **spec.llm_options)
    request = JobRequest(task=str(job.task), run_dir=str(job.run_dir), resume=job.state == "partial",
                         options=options, home=job.condition.home,
                         stop_after=max(stop_after, 0.0) if stop_after is not None else None)
    return request.argv()


Command = Callable[[Job, BenchSpec, "float | None"], list[str]]


def run_bench(bench_dir: Path, workers: int = 1, stop_after: float | None = None,
              on_event: Callable[[str, Job], None] | None = None, devices: list[str] | None = None,
              command: Command = optimize_command, ray_address: str | None = None) -> list[Job]:
    """Run every job not finished, `workers` at a time, each worker on its own device.

    `stop_after`: seconds from now after which no job or round starts; running jobs are asked to
    stop (their run is left paused or with a resumable round) and killed if they do not within a
    minute. `devices`: what each worker's CUDA_VISIBLE_DEVICES is (default: the first `workers` of
    the caller's CUDA_VISIBLE_DEVICES, else 0..workers-1, when there is more than one worker; one
    worker keeps the caller's environment). `command` builds a job's command line (tests run the
    loop with a deterministic judge through it). Ctrl-C interrupts the running jobs (their rounds
    stay resumable) before it returns to the caller.
    """
    for job in replace_stale(bench_dir):
        (on_event or (lambda _what, _job: None))("replaced", job)
    spec = load_bench(bench_dir)
    todo = [j for j in jobs(bench_dir, spec) if j.state not in ("finished", "failed")]
    (bench_dir / "logs").mkdir(parents=True, exist_ok=True)
    _note_unsearchable(bench_dir, spec, todo)
    deadline = time.time() + stop_after if stop_after is not None else None
    if ray_address is not None:
        return _run_on_ray(bench_dir, spec, todo, ray_address, deadline, on_event, command)
    if workers < 1:
        raise UserFacingError(f"--workers must be at least 1 (got {workers})", "pass --workers N, one per GPU")
    if devices is None:
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        devices = (visible if len(visible) >= workers else [str(i) for i in range(workers)]) if workers > 1 \
            else [None]  # type: ignore[list-item]
    elif len(devices) < workers:
        raise UserFacingError(f"{workers} workers need {workers} devices, got {devices}", "name one device per worker")
    pending: queue.Queue[Job] = queue.Queue()
    for job in todo:
        pending.put(job)
    say = on_event or (lambda _what, _job: None)
    live: set[subprocess.Popen[bytes]] = set()
    stop = threading.Event()

    def worker(device: str | None) -> None:
        env = _job_env(device)
        while not stop.is_set():
            if deadline is not None and time.time() >= deadline:
                return
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            say("start", job)
            _stamp(job)
            left = deadline - time.time() if deadline is not None else None
            started = time.monotonic()
            job.returncode = _run_job(command(job, spec, left), env, job.log, deadline, live)  # type: ignore[arg-type]
            job.seconds = time.monotonic() - started
            job.state = _state_of(job.run_dir)
            say("done", job)

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices[:workers]]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # a timed join, so Ctrl-C reaches this thread
    except KeyboardInterrupt:
        stop.set()
        _interrupt(live)
        raise
    return jobs(bench_dir, spec)


def _note_unsearchable(bench_dir: Path, spec: BenchSpec, todo: list[Job]) -> None:
    """Where a condition whose strategy reads the knowledge base (L1 retrieval, L4 compiler source) will
    run jobs without it here, say so: on stderr, and once in the bench's note, so the report shows that
    its runs from then on stop at L3 (a GPU image without the KB stack: own-d's 20 runs did, unsaid)."""
    from diagnose.engine import kb_unsearchable
    from kb.home import KBHome

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    for condition in spec.conditions:
        if condition.strategy == "profile-only" or not any(j.condition.name == condition.name for j in todo):
            continue
        why = kb_unsearchable(KBHome.if_present(condition.home))
        if why is None:
            continue
        which = f"{why}: the {condition.name} runs"
        print(f"warning: {which} resumed now have no L1 retrieval and no L4", file=sys.stderr)
        which = which[0].upper() + which[1:]
        if which not in spec.note:  # said once, from the first invocation it was so
            spec.note = (spec.note + " " if spec.note else "") + f"{which} resumed from {stamp} have no L1 retrieval and no L4."
            _write_spec(bench_dir, spec)


def _interrupt(children: set[subprocess.Popen[bytes]]) -> None:
    """SIGINT to each job's process group (kb optimize marks its run interrupted), then SIGKILL."""
    for child in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGINT)
    for child in list(children):
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _job_env(device: str | None = None) -> dict[str, str]:
    """A job's environment; `device`: its GPU when jobs share a host. Then each job's torch.compile
    stand-in compiles in its own process, not in Inductor's pool of one process per core, which took
    the host's CPU while the other GPU's job was timing (and its autotuned kernel was tuning)."""
    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _ray_job(command: Command, job: Job, spec: BenchSpec, deadline: float | None) -> tuple[int | None, float, str]:
    """One job as a Ray task on whichever node has a free GPU (Ray has set CUDA_VISIBLE_DEVICES).
    The command is built when the task starts, so its own deadline is what is left then."""
    if deadline is not None and time.time() >= deadline:
        return None, 0.0, job.state  # queued past the deadline: left for the next invocation
    _stamp(job)
    started = time.monotonic()
    code = _run_job(command(job, spec, deadline - time.time() if deadline is not None else None), _job_env(),
                    Path(job.log or os.devnull), deadline)
    return code, time.monotonic() - started, _state_of(job.run_dir)


def _run_on_ray(bench_dir: Path, spec: BenchSpec, todo: list[Job], address: str, deadline: float | None,
                on_event: Callable[[str, Job], None] | None, command: Command) -> list[Job]:
    try:
        import ray
    except ImportError:
        raise UserFacingError("--ray needs the ray package", "pip install 'kernel-kb[ray]' on every node") from None
    say = on_event or (lambda _what, _job: None)
    # Workers import this module, so they need the checkout on their path (the same path on every node).
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, include_dashboard=False, log_to_driver=False)
    if ray.cluster_resources().get("GPU", 0) < 1:
        raise UserFacingError(f"the Ray cluster at {address} has no GPU", "start its nodes with GPUs (ray start --num-gpus N)")
    remote = ray.remote(num_gpus=1)(_ray_job)
    pending = {remote.remote(command, job, spec, deadline): job for job in todo}
    for job in todo:
        say("queued", job)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                job.returncode, job.seconds, job.state = ray.get(done[0])
            except ray.exceptions.RayError as exc:  # a lost node or a task that died: the run stays resumable
                job.returncode, job.state = None, "partial"
                job.extra["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            say("done", job)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)  # raises KeyboardInterrupt in the task, which interrupts its job (_run_job)
        raise
    return jobs(bench_dir, spec)


def _run_job(cmd: list[str], env: dict[str, str], log: Path, deadline: float | None,
             live: set[subprocess.Popen[bytes]] | None = None) -> int:
    """One job; past the deadline plus a grace period it is interrupted, then killed. The rounds
    store is written before and after every step, so either leaves a resumable run. The child runs
    in its own session (a terminal's Ctrl-C is passed on by the caller, see `_interrupt`)."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if live is not None:
            live.add(child)
        try:
            while True:
                try:
                    return child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                if deadline is not None and time.time() > deadline + _GRACE_S:
                    _interrupt({child})
                    return child.wait()
        except KeyboardInterrupt:  # a cancelled Ray task
            _interrupt({child})
            raise
        finally:
            if live is not None:
                live.discard(child)
