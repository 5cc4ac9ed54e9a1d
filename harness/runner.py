"""Run a task's kernels inside a worker process: guards, correctness per case and seed, then timing.

`execute(job)` is what `harness.worker` calls for each job the parent sends (see `harness.sandbox`);
it returns a `RunReport` as a dict. Jobs:

    {"task": {"path": FILE} | {"kernel": FILE, "call": EXPR, "reference": EXPR | None},
     "kernels": [{"role": "baseline", ["path": FILE, "entry": NAME]} | {"role": "candidate", "path": FILE, "entry": NAME | None}],
     "backend": "cuda" | "interpreter" | "npu", "cases": [indices] | None, "seeds": 3,
     "check": true, "time": false, "roofline": true}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import guards
from harness.errors import UserFacingError, first_line
from harness.measurement import CaseCheck, CaseResult, KernelRun, RunReport, Timing
from harness.task import Task, defining_file, load_task, task_from_call, tolerance_for

__all__ = ["execute", "load_job_task"]

_POISON_A = float("nan")
_POISON_B = 1234.5


def load_job_task(spec: dict[str, Any]) -> Task:
    if "path" in spec:
        return load_task(spec["path"])
    return task_from_call(spec["kernel"], spec["call"], spec.get("reference"))


def execute(job: dict[str, Any]) -> dict[str, Any]:
    from harness.backends import select_backend

    backend = select_backend(job.get("backend", "cuda"))
    _DEVICE["name"] = backend.device
    task = load_job_task(job["task"])
    report = RunReport(task=task.name, backend=backend.name, device=backend.device_name())
    indices = job.get("cases")
    cases = [(i, c, False) for i, c in enumerate(task.cases) if indices is None or i in indices]
    if not cases:
        raise UserFacingError(f"task {task.name} has no case among {indices}", f"pick indices 0..{len(task.cases) - 1}")
    if job.get("check", True):
        cases += [(len(task.cases) + i, c, True) for i, c in enumerate(task.heldout)]
    kernels = [(k["role"], _entry_of(task, k), _source_of(task, k)) for k in job["kernels"]]
    if not backend.times and job.get("time"):
        report.notes.append(f"the {backend.name} backend is never timed: its seconds say nothing about a kernel")
    for role, entry, source in kernels:
        run = KernelRun(role=role, source=source)
        report.runs.append(run)
        if job.get("check", True):
            _check(task, entry, run, cases, int(job.get("seeds", 3)), baseline=entry is task.entry)
            if backend.name == "npu":
                run.artifacts = _npu_artifacts()
    if job.get("profile"):
        _profile_calls(task, kernels, [c for c in cases if not c[2]])
        return report.to_dict()
    for role, entry, _ in kernels:
        if entry is None:
            report.notes.append(f"the task has no reference: --vs {role} is not timed")
    if job.get("time") and backend.times:
        timed = [(role, entry) for (role, entry, _), run in zip(kernels, report.runs)
                 if entry is not None and (run.correct or not job.get("check", True))]
        _time(task, timed, report, [c for c in cases if not c[2]], backend, job.get("roofline", True),
              windows={k: int(job[k]) for k in ("warmup_ms", "rep_ms") if job.get(k)})
    return report.to_dict()


def _npu_artifacts() -> list[str]:
    import os

    import triton

    from harness.npu import collect_debug_dumps

    dump_dir = os.environ.get("TRITON_DUMP_DIR", "")
    records = collect_debug_dumps(dump_dir, triton_version=triton.__version__) if dump_dir else []
    return [str(Path(r.metadata["dump_dir"]) / "artifacts.json") for r in records]


# PyTorch stand-ins timed beside the kernels: the task's `eager` (else its reference) as written, and
# the same through torch.compile (inductor), for the speedup of a Triton kernel over what a user already has.
REFERENCE_ROLES = ("eager", "compiled")


def _source_of(task: Task, kernel: dict[str, Any]) -> str:
    if kernel.get("reference"):
        return f"{task.path}: reference" + (" through torch.compile" if kernel["reference"] == "compiled" else "")
    return kernel.get("path") or task.source_file


def _entry_of(task: Task, kernel: dict[str, Any]) -> Any:
    if kernel.get("reference"):
        stand_in = task.eager or task.reference
        if stand_in is None:
            return None
        if kernel["reference"] == "compiled":
            import torch

            return torch.compile(stand_in)
        return stand_in
    if not kernel.get("path"):  # the task's own kernel
        return task.entry
    from harness.capture import load_kernel_module

    module = load_kernel_module(kernel["path"])
    name = kernel.get("entry") or getattr(task.entry, "__name__", "")
    entry = getattr(module, name, None)
    if not callable(entry):
        raise UserFacingError(f"candidate {kernel['path']} defines no callable {name!r}",
                              "name the launch wrapper like the task's entry, or pass --candidate-entry NAME")
    return entry


# --- correctness -----------------------------------------------------------------------------

def _check(task: Task, entry: Any, run: KernelRun, cases: list[tuple[int, dict[str, Any], bool]], seeds: int,
           baseline: bool) -> None:
    import torch

    name = getattr(entry, "__name__", "entry")
    reasons = guards.static_guards(defining_file(entry, run.source), name, task.allow_torch)
    if reasons:
        run.rejected = reasons[0]
        return
    reference = task.reference if task.reference is not None else (None if baseline else task.entry)
    exempt = set(task.outputs)
    stream = torch.cuda.current_stream() if torch.cuda.is_available() else None
    tuners = _autotuners(entry)
    # Every config pinned in turn, then on a device one call that tunes for real: tuning reruns the
    # kernel on the caller's buffers, which an in-place kernel would corrupt.
    pins: list[int | None] = list(range(max((len(t.configs) for t in tuners), default=1)))
    if tuners and torch.cuda.is_available():
        pins.append(None)
    for index, case, heldout in cases:
        result = CaseResult(case=_plain(case), label=task.case_label(case), heldout=heldout)
        run.cases.append(result)
        for seed in range(seeds):
            skipped: list[str] = []
            for choice in pins:
                with _pinned(tuners, choice) as config:
                    torch.manual_seed(1_000 * index + seed)
                    args = _inputs(task, case)
                    reason = _check_once(task, entry, reference, args, exempt, stream, result, run)
                if tuners and not reason and (result.error or "").split(":")[0] in _TUNER_SKIPS:
                    skipped.append(f"{config.removeprefix(', config ')}: {result.error}")
                    result.error = None  # the tuner itself would pass over this config
                    continue
                if tuners and not reason and not result.correct:  # name the config that went wrong
                    reason = result.error or "its output differs from the reference"
                if reason:
                    run.rejected = f"case {result.label}, seed {seed}{config}: {reason}"
                    return
            if tuners and len(skipped) == len([c for c in pins if c is not None]):
                run.rejected = f"case {result.label}: no config of the autotuned kernel can run ({skipped[0]})"
                return
            result.seeds = seed + 1
        if not result.correct:
            return  # the first wrong case is reported; the rest would repeat it


# What Triton's autotuner catches while benchmarking a config and then passes over (3.6 and 3.9): a
# config that does not fit the device or fails a compile-time assertion is never picked.
_TUNER_SKIPS = {"OutOfResources", "CompileTimeAssertionFailure", "PTXASError"}


def _autotuners(entry: Any) -> list[Any]:
    """The @triton.autotune kernels of the entry's module that have a choice to make, also under
    @triton.heuristics or another wrapper that keeps the kernel in `.fn`."""
    from triton.runtime.autotuner import Autotuner

    found = []
    for value in getattr(entry, "__globals__", {}).values():
        for _ in range(4):
            if isinstance(value, Autotuner):
                if len(value.configs) > 1 and all(value is not f for f in found):
                    found.append(value)
                break
            value = getattr(value, "fn", None)
            if value is None:
                break
    return found


@contextmanager
def _pinned(tuners: list[Any], choice: int | None) -> Iterator[str]:
    """Each autotuned kernel held to one config (its `choice`-th, or its last): a tuner picks per shape
    and per device, so a candidate is correct only if every config it may pick is. One config is run
    without benchmarking, which also lets the CPU interpreter, which has no timer, check them.
    `choice` None: no pin, and the tuners' caches emptied so that the call tunes."""
    saved = [(t, t.configs, dict(t.cache)) for t in tuners]
    labels = []
    try:
        if choice is None:
            for tuner in tuners:
                tuner.cache.clear()
            yield ", tuned on this call" if tuners else ""
            return
        for tuner in tuners:
            config = tuner.configs[min(choice, len(tuner.configs) - 1)]
            tuner.configs = [config]
            tuner.cache.clear()
            knobs = [f"{k}={v}" for k, v in config.kwargs.items()]
            knobs += [f"{k}={getattr(config, k)}" for k in ("num_warps", "num_stages") if getattr(config, k, None)]
            name = getattr(getattr(tuner, "base_fn", None), "__name__", "kernel")
            labels.append(f"{name} {', '.join(knobs)}")
        yield f", config {'; '.join(labels)}" if labels else ""
    finally:
        for tuner, configs, cache in saved:
            tuner.configs = configs
            tuner.cache.clear()
            tuner.cache.update(cache)


def _check_once(task: Task, entry: Any, reference: Any, args: tuple[Any, ...], exempt: set[int], stream: Any,
                result: CaseResult, run: KernelRun) -> str | None:
    snapshot = _clone(args)
    call_a = _poisoned_args(snapshot, exempt, _POISON_A)
    try:
        with guards.count_launches(stream) as log, guards.poisoned_allocations(_POISON_A):
            out_a = entry(*call_a)
        _sync()
    except UserFacingError:
        raise
    except Exception as exc:  # noqa: BLE001 - the kernel's failure is this candidate's result
        result.error = f"{type(exc).__name__}: {first_line(exc)}"
        _reraise_if_fatal(exc)
        return None
    run.launches = run.launches or len(log.kernels)
    run.kernels = run.kernels or sorted(set(log.kernels))
    if not log.kernels:
        return "no Triton kernel was launched: the result came from torch or a cache, not the kernel"
    if log.foreign_streams:
        return f"{log.foreign_streams[0]} was launched on a side stream the timer does not see"
    outs_a = _outputs(out_a, call_a, exempt)
    if not outs_a:
        return "the entry returned no tensor: return the output(s), or declare `outputs` in the task"
    problem = guards.aliasing(outs_a, list(call_a), exempt) or guards.mutated_inputs(snapshot, call_a, exempt)
    if problem:
        return problem
    call_b = _poisoned_args(snapshot, exempt, _POISON_B)
    with guards.poisoned_allocations(_POISON_B):
        out_b = entry(*call_b)
    _sync()
    outs_b = _outputs(out_b, call_b, exempt)
    problem = guards.reused_output(outs_a, outs_b)
    if problem:
        return problem
    expected = _reference_outputs(reference, snapshot, exempt, len(outs_a)) if reference is not None else None
    for i, out in enumerate(outs_a):
        check = _merge_check(result, i, out, task)
        check.unwritten = max(check.unwritten, guards.unwritten(out, outs_b[i], _POISON_A, _POISON_B)
                              if i < len(outs_b) else 0)
        if expected is not None:
            if i >= len(expected):
                return f"the kernel returned {len(outs_a)} outputs, the reference {len(expected)}"
            if tuple(expected[i].shape) != tuple(out.shape):
                return f"output {i} has shape {tuple(out.shape)}, the reference {tuple(expected[i].shape)}"
            _compare(out, expected[i], check)
        del out
    return None


def _merge_check(result: CaseResult, i: int, out: Any, task: Task) -> CaseCheck:
    if i < len(result.checks):
        return result.checks[i]
    dtype = str(out.dtype).removeprefix("torch.")
    tol = tolerance_for(task, dtype)
    check = CaseCheck(output=i, dtype=dtype, shape=list(out.shape), atol=tol["atol"], rtol=tol["rtol"])
    result.checks.append(check)
    return check


def _compare(out: Any, ref: Any, check: CaseCheck) -> None:
    """Worst-case error over seeds, in float64; NaN and Inf must match in position."""
    import torch

    a = out.detach().to(torch.float64) if not out.dtype.is_complex else out.detach()
    r = ref.detach().to(device=a.device, dtype=a.dtype)
    nan_a, nan_r = torch.isnan(a), torch.isnan(r)
    inf_a, inf_r = torch.isinf(a), torch.isinf(r)
    nan_bad = nan_a ^ nan_r
    inf_bad = (inf_a | inf_r) & ~(nan_a | nan_r) & (a != r)
    finite = ~(nan_a | nan_r | inf_a | inf_r)
    diff = torch.where(finite, (a - r).abs(), torch.zeros_like(a))
    limit = check.atol + check.rtol * r.abs()
    bad = finite & (diff > limit)
    rel = torch.where(finite & (r != 0), diff / r.abs().clamp_min(1e-30), torch.zeros_like(a))
    check.max_abs_err = max(check.max_abs_err, float(diff.max().item()) if diff.numel() else 0.0)
    check.max_rel_err = max(check.max_rel_err, float(rel.max().item()) if rel.numel() else 0.0)
    check.mismatched = max(check.mismatched, int(bad.sum().item()))
    check.nan_mismatch = max(check.nan_mismatch, int(nan_bad.sum().item()))
    check.inf_mismatch = max(check.inf_mismatch, int(inf_bad.sum().item()))
    if check.first_bad is None:
        any_bad = bad | nan_bad | inf_bad
        if bool(any_bad.any().item()):
            check.first_bad = [int(v) for v in torch.nonzero(any_bad)[0].tolist()]


def _reference_outputs(reference: Any, snapshot: tuple[Any, ...], exempt: set[int], n: int) -> list[Any]:
    """The reference's outputs, computed in float64 where the inputs are lower-precision floats."""
    import torch

    def run(upcast: bool) -> list[Any]:
        args = tuple(a.to(torch.float64) if upcast and isinstance(a, torch.Tensor) and a.dtype.is_floating_point
                     else (a.clone() if isinstance(a, torch.Tensor) else a) for a in snapshot)
        value = reference(*args)
        return _outputs(value, args, exempt)

    try:
        return run(upcast=True)
    except Exception:  # noqa: BLE001 - references with dtype-specific code run as written
        return run(upcast=False)


def _outputs(value: Any, args: tuple[Any, ...], exempt: set[int]) -> list[Any]:
    outs = guards.tensors_in(value)
    if exempt:  # out= style: the declared arguments hold the results
        outs = [args[i] for i in sorted(exempt) if i < len(args)] + [o for o in outs if not
                                                                   any(o is args[i] for i in exempt if i < len(args))]
    return outs


def _poisoned_args(snapshot: tuple[Any, ...], exempt: set[int], poison: float) -> tuple[Any, ...]:
    args = _clone(snapshot)
    for i in exempt:
        if i < len(args):
            guards.fill_poison(args[i], poison)
    return args


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    import torch

    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


_FATAL = ("illegal memory access", "unspecified launch failure", "CUDA error", "device-side assert",
          "misaligned address", "an illegal instruction")


def _reraise_if_fatal(exc: BaseException) -> None:
    """A CUDA context that saw a device fault is unusable: end this worker so the next job gets a fresh one."""
    if any(marker in str(exc) for marker in _FATAL):
        raise WorkerPoisoned(f"{type(exc).__name__}: {first_line(exc)}") from exc


class WorkerPoisoned(RuntimeError):
    """The device context is broken; the worker must exit after reporting."""


def _profile_calls(task: Task, kernels: list[tuple[str, Any, str]], cases: list[tuple[int, dict[str, Any], bool]]) -> None:
    """Launch each kernel on each case a few times for a profiler wrapping this worker."""
    import torch

    for index, case, _ in cases:
        torch.manual_seed(7_000 + index)
        args = _inputs(task, case)
        for _, entry, _ in kernels:
            for _ in range(3):  # the first compiles and warms up; the profiler keeps the longest
                entry(*args)
            _sync()


# --- timing ----------------------------------------------------------------------------------

def _time(task: Task, kernels: list[tuple[str, Any]], report: RunReport, cases: list[tuple[int, dict[str, Any], bool]],
          backend: Any, roofline: bool, windows: dict[str, int] | None = None) -> None:
    """Time every correct kernel on every case, baseline and candidate interleaved in one process:
    A then B then A then B, so drift hits both, and each kernel's two timings give its repeat spread
    (`interleaved_timings`: a case too noisy is timed again).
    `windows`: warmup_ms / rep_ms of each timing (default: harness.timing's)."""
    import torch

    from harness.timing import rotation_count, time_calls

    ceiling = None
    if roofline and (task.bytes or task.flops) and backend.name == "cuda":
        from harness.roofline import ceilings

        ceiling = ceilings()
        report.ceilings = ceiling
    results = {run.role: run for run in report.runs}
    for index, case, _ in cases:
        torch.manual_seed(7_000 + index)
        first = _inputs(task, case)
        nbytes = sum(a.numel() * a.element_size() for a in first if isinstance(a, torch.Tensor))
        arg_sets = [first] + [_inputs(task, case) for _ in range(rotation_count(nbytes) - 1)]
        here = [(role, entry) for role, entry in kernels
                if role not in REFERENCE_ROLES or _reference_runs(entry, first, role, task.case_label(case), report)]
        # The first case of a job, and every case after a torch.compile stand-in (its trial call may
        # have recompiled for the new shape, leaving the GPU idle for seconds).
        if index == cases[0][0] or any(role == "compiled" for role, _ in here):
            _burn_in(here, first)
            _forget_tunings(here)
        entries = dict(here)

        def time_one(role: str, entries: dict[str, Any] = entries, arg_sets: list[Any] = arg_sets) -> Timing:
            return time_calls(lambda a: entries[role](*a), arg_sets, warm_cache=task.warm_cache, **(windows or {}))

        merged_by_role = interleaved_timings(list(entries), time_one,
                                             again=lambda here=here, first=first: _burn_in(here, first))
        for role, merged in merged_by_role.items():
            result = _case_result(results[role], task.case_label(case), case)
            result.timing = merged
            if ceiling is not None:
                from harness.roofline import place

                moved = float(task.bytes(**case)) if task.bytes else None
                work = float(task.flops(**case)) if task.flops else None
                result.roofline = place(moved, work, merged.median_us * 1e-6, ceiling, _compute_dtype(first))
        del arg_sets, first, time_one  # time_one holds the inputs too: free them before the next case's


# A case whose two timings of some kernel disagree by more than this is timed again (ABAB again, after
# a burn-in), up to MAX_TIMING_PASSES passes, keeping the steadiest pass. On the H200 the end-of-run
# measurement of matmul once read 0.32x for a tile the round had timed at 1.11x on 512^3, its two
# timings 71% apart, while the other GPU's job ran on the same host.
RETIME_SPREAD = 0.10
MAX_TIMING_PASSES = 3


def interleaved_timings(roles: list[str], time_one: Callable[[str], Timing], again: Callable[[], object],
                        max_spread: float = RETIME_SPREAD, passes: int = MAX_TIMING_PASSES) -> dict[str, Timing]:
    """Each role timed twice, interleaved (A B A B: drift hits every kernel alike), merged into one
    Timing per role: the mean of the two medians, `repeat_spread` = how far apart they were. A pass
    whose largest spread is above `max_spread` is repeated (`again` first: a burn-in) up to `passes`
    passes in all; the pass with the smallest largest spread is kept, and `timing_passes` says how
    many were taken, so a figure that stayed noisy shows it."""
    best: dict[str, Timing] | None = None
    taken = 0
    for taken in range(1, passes + 1):
        if taken > 1:
            again()
        pairs: dict[str, list[Timing]] = {role: [] for role in roles}
        for _ in range(2):
            for role in roles:
                pairs[role].append(time_one(role))
        merged = {role: _merge_pair(*pair) for role, pair in pairs.items()}
        if best is None or _worst_spread(merged) < _worst_spread(best):
            best = merged
        if _worst_spread(merged) <= max_spread:
            break
    assert best is not None
    for timing in best.values():
        timing.timing_passes = taken
    return best


def _merge_pair(first: Timing, second: Timing) -> Timing:
    merged = replace(first)
    merged.median_us = (first.median_us + second.median_us) / 2
    gap = abs(second.median_us - first.median_us)
    merged.repeat_spread = gap / first.median_us if first.median_us > 0 else (float("inf") if gap else 0.0)
    merged.reps = first.reps + second.reps
    return merged


def _worst_spread(timings: dict[str, Timing]) -> float:
    return max((t.repeat_spread or 0.0 for t in timings.values()), default=0.0)


BURN_IN_S = 0.5


def _burn_in(kernels: list[tuple[str, Any]], args: tuple[Any, ...], seconds: float = BURN_IN_S) -> int:
    """Run the kernels back to back for `seconds` before the first timing of a job. On the H200 the
    first kernel timed after the worker had been compiling (GPU idle) measured 2-3x its later times
    (bmm's first case 30.1 µs, then 10.7 µs; repeat spreads of 41-65%) despite do_bench's own warm-up:
    the clocks had not ramped yet. Returns the rounds run."""
    import time

    rounds = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _, entry in kernels:
            entry(*args)
        _sync()
        rounds += 1
    return rounds


def _forget_tunings(kernels: list[tuple[str, Any]]) -> None:
    """Empty the caches of the kernels' autotuners after a burn-in, so the next call tunes again on a
    GPU at speed: the burn-in's first call tuned right after the checks, with the GPU idle until then.
    On the H200 (two jobs sharing the host), matmul's tuner kept for 1024^3 a tile 2.9x slower in one
    run's end-of-run measurement than in another's. Only the in-memory choice is forgotten: with
    TRITON_CACHE_AUTOTUNING=1 Triton reloads the first tuning from its disk cache."""
    for _, entry in kernels:
        for tuner in _autotuners(entry):
            tuner.cache.clear()


def _reference_runs(entry: Any, args: tuple[Any, ...], role: str, label: str, report: RunReport) -> bool:
    """One trial call of a PyTorch stand-in (torch.compile may fail on an op): a failure drops it from
    this case's timing with a note instead of sinking the kernels' timings."""
    try:
        entry(*args)
        _sync()
        return True
    except Exception as exc:  # noqa: BLE001 - any failure of the stand-in is reported, not raised
        report.notes.append(f"{role} reference not timed for {label}: {type(exc).__name__}: {first_line(exc)}")
        return False


def _case_result(run: KernelRun, label: str, case: dict[str, Any]) -> CaseResult:
    for result in run.cases:
        if result.label == label and not result.heldout:
            return result
    result = CaseResult(case=_plain(case), label=label)
    run.cases.append(result)
    return result


def _inputs(task: Task, case: dict[str, Any]) -> tuple[Any, ...]:
    """The task's inputs for a case, created on the device under test. Only `inputs` runs under
    the default-device mode: kernels and references run as their authors wrote them."""
    import torch

    with torch.device(_DEVICE["name"]):
        return tuple(task.inputs(**case))


_DEVICE = {"name": "cpu"}


def _plain(case: dict[str, Any]) -> dict[str, Any]:
    """A case as JSON: dtypes and other objects by their printed name."""
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v).replace("torch.", "")
            for k, v in case.items()}


def _compute_dtype(args: tuple[Any, ...]) -> str:
    import torch

    floats = [a for a in args if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    if not floats:
        return "bf16"
    biggest = max(floats, key=lambda a: a.numel())
    return "fp32" if biggest.dtype in (torch.float32, torch.float64) else "bf16"

