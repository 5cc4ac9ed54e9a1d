"""The judge: checks and times kernels without ever sharing a process with one.

    caller (this module; kb run, the optimize loop)   verdicts, timing statistics, file integrity
      ├── reference worker (harness.reference)         the user's task: inputs, expected outputs, comparisons
      ├── task-kernel worker (trusted)                  the task's own kernel and PyTorch stand-ins
      └── one kernel worker per kernel source          a candidate, or a parent in the optimize loop

Kernel workers report raw observations (harness.host); every verdict is taken here (harness.verdicts)
or compared there (harness.reference). How the workers are hosted and fed, the run's seed, the
protected files: harness.session.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness import guards, verdicts
from harness.errors import UserFacingError
from harness.measurement import CaseCheck, CaseResult, KernelRun, Timing
from harness.session import Hosted, KernelSpec, KernelUnusable, Session, WorkerFailed
from harness.timing import REP_MS, WARMUP_MS, interleaved_timings, rotation_count, timing_of

__all__ = ["Checked", "Judge", "KernelSpec", "TimedCases", "check_in_parallel"]

# What Triton's autotuner catches while benchmarking a config and then passes over (3.6 and 3.9): a
# config that does not fit the device or fails a compile-time assertion is never picked.
TUNER_SKIPS = {"OutOfResources", "CompileTimeAssertionFailure", "PTXASError"}
BURN_IN_S = 0.5
STAND_INS = ("eager", "compiled")


@dataclass
class Checked:
    run: KernelRun
    failure: str | None = None  # the worker itself failed (hang, crash, device fault)


@dataclass
class TimedCases:
    """What a timing job gave: per role, the timed cases; kernels rejected while timed; notes."""

    cases: dict[str, list[CaseResult]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ceilings: dict[str, Any] | None = None
    failure: str | None = None


class _Rejected(Exception):
    def __init__(self, role: str, reason: str) -> None:
        super().__init__(reason)
        self.role, self.reason = role, reason


class Judge(Session):
    """The verdicts: `check` (correctness, alone in the kernel's worker) and `time` (interleaved across
    workers, the timed calls probed), inside the runs a `Session` begins and ends."""

    # --- checks ----------------------------------------------------------------------------

    def check(self, kernel: KernelSpec, cases: list[int] | None = None, seeds: int = 3) -> Checked:
        """Correctness of one kernel, alone in its worker, over `cases` (indices of the timed cases;
        None: all) and every held-out case, each with `seeds` input sets."""
        assert self.info is not None, "begin() first"
        info = self.info
        own = kernel.trusted and kernel.stand_in is None
        compared = "the reference" if info.has_reference else (None if own else "the task's own kernel")
        run = KernelRun(role=kernel.role, source=kernel.file or info.source_file, compared_with=compared)
        try:
            hosted = self._host(kernel)
        except KernelUnusable as exc:
            run.rejected = f"the kernel cannot be loaded: {exc}"
            return Checked(run)
        with self._busy_lock(hosted.worker):
            return self._check_hosted(hosted, run, cases, seeds, own)

    def _check_hosted(self, hosted: Hosted, run: KernelRun, cases: list[int] | None, seeds: int,
                      own: bool) -> Checked:
        assert self.info is not None
        info, kernel = self.info, hosted.spec
        reason = self._load_reason(hosted)
        if reason:
            run.rejected = reason
            self._forget(hosted)  # what its import did is not to be trusted, nor seen only once
            return Checked(run)
        chosen = [i for i in range(info.timed) if cases is None or i in cases]
        if not chosen:
            raise UserFacingError(f"task {info.name} has no case among {cases}", f"pick indices 0..{info.timed - 1}")
        indices = chosen + list(range(info.timed, len(info.cases)))
        pins = self._pins(hosted)
        expected = info.has_reference or not own
        case = indices[0]
        try:
            for case in indices:
                if self._probed(case) and not own and not self._in_domain(case):
                    continue  # outside what the task's own kernel does: nobody is held to it
                try:
                    reason = self._check_case(hosted, run, case, seeds, pins, expected)
                except UserFacingError as exc:
                    if not (own and self._probed(case)):
                        raise
                    reason = str(exc)  # the reference or the inputs fail at this size: not the task's
                result = run.cases[-1]
                if own and self._probed(case):
                    self._domain[case] = reason or _failure(result)
                    if self._domain[case]:
                        run.cases.pop()
                        continue
                if reason:
                    run.rejected = reason
                    return Checked(run)
                if not result.correct:
                    return Checked(run)  # the first wrong case is reported; the rest would repeat it
        except WorkerFailed as exc:
            self._forget(hosted)
            if own and self._probed(case):
                # Its worker is gone: the generated cases after this one are probed afresh when a
                # candidate meets them (`_in_domain`).
                self._domain[case] = str(exc)
                run.cases.pop()
                return Checked(run)
            run.rejected = str(exc)
            return Checked(run, failure=f"{kernel.role}: {exc}")
        if self.backend == "npu":
            run.artifacts = self._ask(hosted.worker, {"op": "artifacts"}).get("artifacts", [])
        return Checked(run)

    def _pins(self, hosted: Hosted) -> list[int | None]:
        """The autotune configs a check pins one by one (None: the kernel as it runs)."""
        pins: list[int | None] = list(range(hosted.load.get("pins", 0))) or [None]
        if hosted.load.get("pins") and self.backend == "cuda":
            pins.append(None)  # and one call that tunes for real, on the caller's buffers
        return pins

    def _check_case(self, hosted: Hosted, run: KernelRun, case: int, seeds: int, pins: list[int | None],
                    expected: bool) -> str | None:
        """Check one case (appended to `run.cases`) over `seeds` input sets: a reason to reject, or None."""
        assert self.info is not None
        info = self.info
        result = CaseResult(case=info.cases[case], label=info.labels[case], heldout=case >= info.timed,
                            generated=case >= len(info.cases) - info.generated)
        run.cases.append(result)
        try:
            for seed in range(seeds):
                reason = self._check_seed(hosted, run, result, case, seed, max(seeds, 2), pins, expected=expected)
                if reason:
                    return f"case {result.label}, seed {seed}{reason}"
                if result.error:
                    break
                result.seeds = seed + 1
        finally:
            self._drop_large_case(hosted.worker, case)
        return None

    # --- the cases held only where the task's own kernel passes them ------------------------

    def _probed(self, case: int) -> bool:
        """A case held to only where the task's own kernel passes it (`TaskInfo.probed`)."""
        assert self.info is not None
        return case in self.info.probed

    def _in_domain(self, case: int) -> bool:
        """Whether the task's own kernel passes `case` (checked on first asking, once per run)."""
        with self._domain_lock:
            if case not in self._domain:
                self._domain[case] = self._own_failure(case)
            return self._domain[case] is None

    def _own_failure(self, case: int) -> str | None:
        """Why the task's own kernel fails `case`, on one seed (enough to tell whether it runs there); None
        where it passes."""
        assert self.info is not None
        run = KernelRun(role="task kernel", source=self.info.source_file)
        try:
            hosted = self._host(KernelSpec("task kernel"))
        except KernelUnusable as exc:
            return f"the task's own kernel cannot be loaded: {exc}"
        with self._busy_lock(hosted.worker):
            try:
                reason = self._check_case(hosted, run, case, 1, self._pins(hosted), self.info.has_reference)
            except WorkerFailed as exc:
                self._forget(hosted)
                return str(exc)
            except UserFacingError as exc:
                return str(exc)
        return reason or _failure(run.cases[-1])

    def outside_domain(self) -> dict[str, str]:
        """This run's probed cases the task's own kernel fails (label -> why): held against no one."""
        assert self.info is not None
        return {self.info.labels[case]: why for case, why in sorted(self._domain.items()) if why}

    def _load_reason(self, hosted: Hosted) -> str | None:
        """Static guards on the wrapper, and what importing the kernel did."""
        assert self.info is not None
        load = hosted.load
        entry_file = load.get("entry_file") or hosted.spec.file or self.info.source_file
        if hosted.spec.stand_in:
            return None
        reasons = guards.static_guards(entry_file, load.get("name") or self.info.entry, tuple(self.info.allow_torch))
        if not hosted.spec.trusted:
            own = dict.fromkeys([self.info.source_file, self.info.kernel_file or self.info.source_file])
            allowed = set().union(*(guards.escape_kinds(f) for f in own))
            for file in dict.fromkeys([str(hosted.spec.file), entry_file]):
                reasons += guards.escape_guards(file, allowed=allowed)
            reason = verdicts.import_reason(load, self._allowed_import_changes(load))
            if reason:
                reasons.append(reason)
            reasons += [f"{what} outlived the kernel's import" for what in self._leftovers(hosted)]
            changed = self._files_changed()
            if changed:
                reasons.insert(0, changed)
        return reasons[0] if reasons else None

    def _allowed_import_changes(self, load: dict[str, Any]) -> set[str]:
        """What importing the task's own kernel changes is allowed to a rewrite of it too."""
        if not load.get("import_changes"):
            return set()
        if self._trusted_import is None:
            self._host(KernelSpec("task kernel"))
        return self._trusted_import or set()

    def _check_seed(self, hosted: Hosted, run: KernelRun, result: CaseResult, case: int, seed: int, sets: int,
                    pins: list[int | None], expected: bool) -> str | None:
        """One seed of one case under every autotune pin: a reason to reject, or None."""
        assert self.info is not None
        key_a, _ = self._set(case, seed, expected=expected)
        key_b, _ = self._set(case, (seed + 1) % sets, expected=expected)
        self._stage(hosted.worker, [key_a, key_b])
        skipped: list[str] = []
        for pin in pins:
            answer = self._ask(hosted.worker, {"op": "check", "name": hosted.name, "a": key_a, "b": key_b,
                                               "pin": pin, "exempt": self.info.exempt,
                                               "inouts": self.info.inouts})
            config = answer.get("config", "")
            calls = answer["calls"]
            if calls and not run.kernels:
                log = calls[0].get("log") or {}
                run.launches, run.kernels = int(log.get("launches", 0)), sorted(log.get("kernels", []))
            seen = self._kernels_seen.setdefault((hosted.worker.token, case), set())
            for call in calls:
                seen.update((call.get("log") or {}).get("kernels", []))
            error = next((c["error"] for c in calls if c.get("error")), None)
            if any(c.get("fatal") for c in calls):
                raise WorkerFailed(f"case {result.label}, seed {seed}: {error}", False)
            reason = None
            contract = None
            if calls and not calls[0].get("error") and calls[0].get("outputs"):
                contract = self.contract(case, calls[0]["outputs"] if hosted.spec.trusted
                                         and not hosted.spec.stand_in else None)
            own = hosted.spec.trusted and not hosted.spec.stand_in
            if own:  # what the user's own wrapper does to make its outputs, a rewrite may do too
                self._own_copies.update(t["op"] for c in calls for t in c.get("torch_outputs", []))
                self._own_strided_copies |= any((c.get("log") or {}).get("strided_copies") for c in calls)
            for i, call in enumerate(calls):
                if call.get("error"):
                    break
                reason = (verdicts.call_reason(call, i, self._own_copies if not own else
                                               {t["op"] for t in call.get("torch_outputs", [])},
                                               strided_copies=own or self._own_strided_copies) or
                          verdicts.output_reason(call["outputs"], contract, bool(self.info.exempt)) or
                          verdicts.overlap_reason(call))
                if reason:
                    break
            if not reason and calls and not calls[0].get("error"):
                reason = self._compare(hosted, result, case, [key_a, key_a, key_b], calls, contract)
            if not reason and not hosted.spec.trusted:
                reason = next((f"{what} outlived the kernel's call" for what in self._leftovers(hosted)), None)
            reason = reason or self._files_changed()
            if reason:
                return f"{config}: {reason}"
            if error:
                if pin is not None and len(pins) > 1 and error.split(":")[0] in TUNER_SKIPS:
                    skipped.append(f"{config.removeprefix(', config ')}: {error}")
                    continue  # the tuner itself would pass over this config
                result.error = error
                if len(pins) > 1:
                    return f"{config}: {error}"
                return None
            if len(pins) > 1 and not result.correct:
                return f"{config}: its output differs from the reference"
        if len(pins) > 1 and skipped and len(skipped) == len([p for p in pins if p is not None]):
            return f": no config of the autotuned kernel can run ({skipped[0]})"
        return None

    def _compare(self, hosted: Hosted, result: CaseResult, case: int, keys: list[str], calls: list[dict[str, Any]],
                 expected: list[dict[str, Any]] | None) -> str | None:
        done = [c for c in calls if not c.get("error")]
        answer = self._ref("compare", keys=keys[:len(done)], case=case, dir=str(hosted.worker.directory),
                           calls=[{"outputs": c["outputs"], "inputs_after": c["inputs_after"]} for c in done])
        if answer.get("unreadable"):
            return answer["unreadable"]
        for i, one in enumerate(answer["calls"]):
            if one["mutated"]:
                where = f" {verdicts.CALLS[i]}" if verdicts.CALLS[i] else ""
                arg = one["mutated"][0]
                return (f"input {arg.replace('args[', 'argument ').rstrip(']')} was modified by the call{where}: "
                        "kernels must not write their inputs (declare `outputs = [i]` in the task if it is an "
                        "out= argument)")
        for i, one in enumerate(answer["calls"]):
            for j, stats in enumerate(one["checks"]):
                check = _check_for(result, j, done[i]["outputs"][j], expected)
                if stats is None:
                    continue
                if "shape_mismatch" in stats:
                    return f"output {j} has shape {tuple(stats['shape_mismatch'][0])}, the reference " \
                           f"{tuple(stats['shape_mismatch'][1])}"
                _merge_stats(check, stats)
        for j, count in enumerate(answer.get("unwritten", [])):
            if j < len(result.checks):
                result.checks[j].unwritten = max(result.checks[j].unwritten, count)
        return None

    # --- timing ----------------------------------------------------------------------------

    def time(self, kernels: list[KernelSpec], cases: list[int] | None = None, *, warmup_ms: int = WARMUP_MS,
             rep_ms: int = REP_MS, roofline: bool = True) -> TimedCases:
        """Every kernel on every timed case, interleaved A B A B across their workers (drift hits each
        alike), each timed call's output of one named set compared afterwards."""
        assert self.info is not None, "begin() first"
        info = self.info
        out = TimedCases()
        hosted: dict[str, Hosted] = {}
        for kernel in kernels:
            try:
                hosted[kernel.role] = self._host(kernel)
            except KernelUnusable as exc:
                out.rejected[kernel.role] = f"the kernel cannot be loaded: {exc}"
                continue
            reason = self._load_reason(hosted[kernel.role])
            if reason:
                out.rejected[kernel.role] = reason
                self._forget(hosted.pop(kernel.role))
        if roofline and self.backend == "cuda":
            # Measured (once per device, then cached) even without the task's bytes/flops: diagnosis places
            # a run by the kernel's own work against them (diagnose.bottleneck).
            self._ceilings = self._ceilings or self._ref("ceilings")["ceilings"]
            out.ceilings = self._ceilings
        chosen = [i for i in range(info.timed) if cases is None or i in cases]
        for n, case in enumerate(chosen):
            label = info.labels[case]
            live = {role: h for role, h in hosted.items() if role not in out.rejected}
            if not live:
                break
            _, made = self._set(case, 0, kind="t", expected=False)
            keys = [self._set(case, i, kind="t", expected=False)[0] for i in range(rotation_count(int(made["bytes"])))]
            probe, _ = self._set(case, 0, kind="q", expected=True)
            for role, h in list(live.items()):
                try:
                    self._stage(h.worker, [*keys, probe])
                except WorkerFailed as exc:
                    out.rejected[role] = f"case {label}: its worker failed: {exc}"
                    del live[role]
            if n == 0 or any(h.spec.stand_in == "compiled" for h in live.values()):
                self._burn_in(live, keys[0])
            for h in {id(h.worker): h for h in live.values()}.values():
                self._ask(h.worker, {"op": "forget_tunings"})
            while live:
                try:
                    timings = interleaved_timings(
                        list(live), lambda role: self._time_one(live[role], role, keys, probe, case,
                                                                warmup_ms, rep_ms),
                        again=lambda: self._burn_in(live, keys[0]))
                    break
                except _Rejected as exc:
                    if live[exc.role].spec.stand_in:
                        out.notes.append(f"{exc.role} reference not timed for {label}: {exc.reason}")
                    else:
                        out.rejected[exc.role] = f"case {label}: {exc.reason}"
                    del live[exc.role]
            else:
                timings = {}  # every kernel rejected on this case: nothing to record, its sets still to drop
            for role, timing in timings.items():
                result = CaseResult(case=info.cases[case], label=label, timing=timing, input_bytes=int(made["bytes"]))
                if out.ceilings is not None:
                    from harness.roofline import place

                    result.roofline = place(info.bytes[case], info.flops[case], timing.median_us * 1e-6,
                                            out.ceilings, made["compute_dtype"])
                out.cases.setdefault(role, []).append(result)
            for h in {id(h.worker): h for h in hosted.values()}.values():
                self._drop_large_case(h.worker, case)
        return out

    def _time_one(self, hosted: Hosted, role: str, keys: list[str], probe: str, case: int, warmup_ms: int,
                  rep_ms: int) -> Timing:
        """One timing of one kernel on one case, its verdicts taken, its probe's output compared."""
        assert self.info is not None
        made = self._made[probe]
        request = {"op": "time", "name": hosted.name, "keys": keys, "warmup_ms": warmup_ms, "rep_ms": rep_ms,
                   "probe": {"key": probe, "at": self._rng.uniform(0.2, 0.9)}, "warm_cache": self.info.warm_cache,
                   "exempt": self.info.exempt, "inouts": self.info.inouts, "allow_copies": sorted(self._own_copies),
                   "expect_kernels": sorted(self._kernels_seen.get((hosted.worker.token, case), ()))}
        started = time.monotonic()
        try:
            answer = self._ask(hosted.worker, request, self.timeout_s)
        except WorkerFailed as exc:
            raise _Rejected(role, f"its worker failed while timed: {exc}") from None
        wall = time.monotonic() - started
        if hosted.spec.stand_in:
            # A stand-in is PyTorch's own code, so only the one question: did it work where the clock looks?
            host = verdicts.host_outputs_reason(answer)
            if host:
                raise _Rejected(role, host)
            return _timing(answer, self.info.warm_cache, warmup_ms, rep_ms)
        reason = verdicts.timed_reason(answer, wall)
        contract = self.contract(case)
        if not reason:
            reason = verdicts.output_reason(answer["outputs"], contract, bool(self.info.exempt))
        if not reason and made.get("values"):
            result = CaseResult(case={}, label="timed")
            reason = self._compare(hosted, result, case, [probe], [{"outputs": answer["outputs"], "inputs_after": {}}],
                                   contract)
            if not reason and not result.correct:
                bad = next(c for c in result.checks if not c.ok)
                reason = (f"a timed call's output differs from the reference ({bad.mismatched} wrong, "
                          f"{bad.nan_mismatch} NaN mismatches): it computes differently once it has seen its inputs")
        if not reason and not hosted.spec.trusted:
            reason = next((f"{what} outlived the kernel's timed calls" for what in self._leftovers(hosted)), None)
        reason = reason or self._files_changed()
        if reason:
            raise _Rejected(role, reason)
        return _timing(answer, self.info.warm_cache, warmup_ms, rep_ms)

    def _burn_in(self, live: dict[str, Hosted], key: str) -> None:
        """The kernels run back to back before the first timing (an idle GPU starts at a low clock: on
        the H200 the first kernel timed after the worker had been compiling measured 2-3x its later
        times). Each worker burns in for its share of BURN_IN_S."""
        by_worker: dict[int, list[Hosted]] = {}
        for h in live.values():
            by_worker.setdefault(id(h.worker), []).append(h)
        share = max(0.1, BURN_IN_S / max(1, len(by_worker)))
        for group in by_worker.values():
            try:
                self._ask(group[0].worker, {"op": "burn_in", "names": [h.name for h in group], "key": key,
                                            "seconds": share})
            except WorkerFailed:
                pass  # the timing that follows reports it


def _timing(answer: dict[str, Any], warm_cache: bool, warmup_ms: int, rep_ms: int) -> Timing:
    return timing_of(answer["samples_ms"], warm_cache=warm_cache, rotating_buffers=int(answer.get("rotating_buffers", 1)),
                     warmup_ms=warmup_ms, rep_ms=rep_ms)


def _failure(result: CaseResult) -> str | None:
    """What went wrong in a checked case, None if nothing did."""
    if result.correct:
        return None
    wrong = next((c for c in result.checks if not c.ok), None)
    return result.error or f"output {result.checks.index(wrong) if wrong else 0} differs from the reference"


def _check_for(result: CaseResult, i: int, ref: dict[str, Any], expected: list[dict[str, Any]] | None) -> CaseCheck:
    if i < len(result.checks):
        return result.checks[i]
    exp = expected[i] if expected is not None and i < len(expected) else None
    check = CaseCheck(output=i, dtype=(exp or ref)["dtype"], shape=list((exp or ref)["shape"]),
                      atol=float(exp["atol"]) if exp else 0.0, rtol=float(exp["rtol"]) if exp else 0.0)
    result.checks.append(check)
    return check


def _merge_stats(check: CaseCheck, stats: dict[str, Any]) -> None:
    check.max_abs_err = max(check.max_abs_err, stats["max_abs_err"])
    check.max_rel_err = max(check.max_rel_err, stats["max_rel_err"])
    check.mismatched = max(check.mismatched, stats["mismatched"])
    check.nan_mismatch = max(check.nan_mismatch, stats["nan_mismatch"])
    check.inf_mismatch = max(check.inf_mismatch, stats["inf_mismatch"])
    if check.first_bad is None and stats.get("first_bad") is not None:
        check.first_bad = stats["first_bad"]


# A check holds about this many copies of a case's input bytes per seed in its worker: the staged set,
# the copy its arguments are compared with afterwards, the outputs poisoned twice. Four check workers of
# TritonBench-T's fused_mv_sigmoid_sub (a 4 GiB matrix at its largest case) held 30 GiB each and ran the
# H200 out of memory.
_CHECK_COPIES = 4


def checks_that_fit(free_bytes: int | None, case_bytes: list[float | None], seeds: int) -> int | None:
    """How many checks fit on the device side by side, from its free memory and the largest case's
    bytes (the task's own figure); None where either is unknown. Never below one: one check at a time
    is what a single worker would do anyway."""
    known = [b for b in case_bytes if b]
    if not free_bytes or not known:
        return None
    per_check = _CHECK_COPIES * max(1, seeds) * max(known)
    return max(1, int(0.6 * free_bytes // per_check))


def check_in_parallel(judge: Judge, kernels: list[KernelSpec], workers: int, **kwargs: Any) -> list[Checked]:
    """`judge.check` of every kernel, each in its own worker, up to `workers` at a time, in order, and no
    more at a time than the device's free memory holds (`checks_that_fit`). Ctrl-C closes every worker
    at once, so no check left running holds the device after the caller."""
    if workers > 1 and len(kernels) > 1 and judge.backend == "cuda" and judge.info is not None:
        fit = checks_that_fit(judge.device_memory().get("free"), list(judge.info.bytes), int(kwargs.get("seeds", 3)))
        workers = min(workers, fit or workers)
    if workers <= 1 or len(kernels) <= 1:
        return [judge.check(k, **kwargs) for k in kernels]
    pool = ThreadPoolExecutor(max_workers=min(workers, len(kernels)))
    try:
        return list(pool.map(lambda k: judge.check(k, **kwargs), kernels))
    except BaseException as exc:
        if not isinstance(exc, Exception):
            pool.shutdown(wait=False, cancel_futures=True)
            judge.close()
        raise
    finally:
        pool.shutdown(wait=True)

