"""The judge: checks and times kernels without ever sharing a process with one.

    caller (this module; kb run, the optimize loop)   verdicts, timing statistics, file integrity
      ├── reference worker (harness.reference)         the user's task: inputs, expected outputs, comparisons
      ├── task-kernel worker (trusted)                  the task's own kernel and PyTorch stand-ins
      └── one kernel worker per kernel source          a candidate, or a parent in the optimize loop

Kernel workers report raw observations (harness.host); every verdict is taken here (harness.verdicts)
or compared there (harness.reference). A worker hosts one kernel source for its life, so nothing one
candidate's import does can reach the next; workers start ahead of need (harness.pool).

Each `begin` draws the run's seed (os.urandom unless given, recorded in the report so a failure
replays): the input sets and the held-out cases generated from the task's ranges follow from it, so a
kernel cannot be right only for inputs it could read in the task file. Around every job the task's
files and every hosted kernel's file are hashed; a change is rejected and undone. After every job a
kernel worker's process tree is listed; a process still alive there outlived the call.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness import guards, verdicts
from harness.errors import UserFacingError
from harness.exchange import exchange_root
from harness.measurement import CaseCheck, CaseResult, KernelRun, Timing
from harness.pool import SparePool
from harness.reference import TaskInfo
from harness.sandbox import Worker
from harness.timing import REP_MS, WARMUP_MS, rotation_count, timing_of

__all__ = ["Checked", "Judge", "KernelSpec", "TimedCases", "interleaved_timings", "merge_pair"]

TUNER_SKIPS = {"OutOfResources", "CompileTimeAssertionFailure", "PTXASError"}
BURN_IN_S = 0.5
# A case whose two timings of some kernel disagree by more than this is timed again (ABAB again, after
# a burn-in), up to MAX_TIMING_PASSES passes, keeping the steadiest pass. On the H200 the end-of-run
# measurement of matmul once read 0.32x for a tile the round had timed at 1.11x on 512^3, its two
# timings 71% apart, while the other GPU's job ran on the same host.
RETIME_SPREAD = 0.10
MAX_TIMING_PASSES = 3
STAND_INS = ("eager", "compiled")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel to judge. `file` None: the task's own code (the user's, trusted), or with `stand_in`
    ("eager" | "compiled") its PyTorch version, timed only."""

    role: str
    file: str | None = None
    entry: str | None = None
    stand_in: str | None = None

    @property
    def trusted(self) -> bool:
        return self.file is None


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


@dataclass
class _Hosted:
    worker: Worker
    name: str
    load: dict[str, Any]
    spec: KernelSpec


class _Rejected(Exception):
    def __init__(self, role: str, reason: str) -> None:
        super().__init__(reason)
        self.role, self.reason = role, reason


class Judge:
    """One task's judging session. `begin` starts a run (a seed, the cases); `check` and `time` judge
    kernels in it; `end` frees its inputs. Workers outlive runs: the reference and the task's own
    kernel for the session, a kernel file's worker until `retire`."""

    def __init__(self, spec: dict[str, Any], backend: str, *, timeout_s: float = 300.0, spares: int = 0) -> None:
        self.spec = spec
        self.backend = backend
        self.timeout_s = timeout_s
        self.root = exchange_root()
        self._lock = threading.RLock()  # one request at a time to the reference worker
        self._hosting = threading.RLock()  # the maps of hosted kernels and protected files
        self._reference = self._new_worker("reference")
        self._trusted: Worker | None = None
        self._trusted_loaded: dict[str, _Hosted] = {}
        self._hosted: dict[tuple[str, str, str], _Hosted] = {}
        self._pool = SparePool(lambda: self._new_worker(None), spares)
        self._protected: dict[str, bytes] = {}
        self._made: dict[str, dict[str, Any]] = {}
        self._staged: dict[str, set[str]] = {}  # per worker token: the input sets it holds
        self._ceilings: dict[str, Any] | None = None
        self._trusted_import: set[str] | None = None
        self._kernels_seen: dict[tuple[str, int], set[str]] = {}  # (worker, case) -> kernels its checks launched
        self._loading: dict[tuple[str, str, str], threading.Lock] = {}
        self._busy: dict[str, threading.RLock] = {}  # per worker: one check at a time (its answers are live)
        self.info: TaskInfo | None = None
        self.device = "?"
        self._rng = random.Random()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- workers ---------------------------------------------------------------------------

    def _new_worker(self, name: str | None) -> Worker:
        directory = Path(os.path.join(self.root, name or f"w{os.urandom(4).hex()}"))
        return Worker(self.backend, directory=directory, restart=False)

    def _ask(self, worker: Worker, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """A request's answer; a worker failure raises `_WorkerFailed`, bad input `UserFacingError`."""
        answer = worker.submit(request, timeout or self.timeout_s)
        if answer.get("ok"):
            return answer["answer"]
        if "user_error" in answer:
            raise UserFacingError(answer["user_error"], answer.get("fix", ""))
        raise _WorkerFailed(answer.get("failure", "the worker failed"), bool(answer.get("forged")))

    def _ref(self, op: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            try:
                return self._ask(self._reference, {"op": op, **fields})
            except _WorkerFailed as exc:
                raise UserFacingError(f"the judge's reference worker failed ({op}): {exc}",
                                      "check the task's inputs and reference (kb run TASK shows them)") from None

    def _host(self, kernel: KernelSpec) -> _Hosted:
        """The worker hosting `kernel`, started and loaded on first use."""
        assert self.info is not None
        if kernel.trusted:
            name = kernel.stand_in or "entry"
            if name not in self._trusted_loaded:
                if self._trusted is None or not self._trusted.alive:
                    self._trusted, self._trusted_loaded = self._pool.take(), {}
                load = self._ask(self._trusted, {"op": "load", "name": name, "task": self.spec, "trusted": True,
                                                 "attr": "entry" if name == "entry" else "eager",
                                                 "compiled": name == "compiled", "allow_torch": self.info.allow_torch})
                self._trusted_loaded[name] = _Hosted(self._trusted, name, load, kernel)
                if name == "entry":
                    self._trusted_import = set(load.get("import_changes", []))
            return self._trusted_loaded[name]
        file = str(Path(kernel.file).resolve())  # type: ignore[arg-type]
        entry = kernel.entry or self.info.entry
        key = (hashlib.sha256(Path(file).read_bytes()).hexdigest(), entry, str(Path(file).parent))
        with self._hosting:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # one load per source, however many threads ask for it at once
            return self._host_file(kernel, file, entry, key)

    def _host_file(self, kernel: KernelSpec, file: str, entry: str, key: tuple[str, str, str]) -> _Hosted:
        assert self.info is not None
        with self._hosting:
            hosted = self._hosted.get(key)
        if hosted is not None and hosted.worker.alive:
            return replace(hosted, spec=kernel)
        self._protect([file])
        worker = self._pool.take()
        cache = _candidate_cache(key[0])
        try:
            load = self._ask(worker, {"op": "load", "name": "entry", "file": file, "entry": entry,
                                      "allow_torch": self.info.allow_torch, "cache_dir": str(cache)})
        except UserFacingError as exc:
            worker.close()
            raise _KernelUnusable(exc.problem) from None
        except _WorkerFailed as exc:
            worker.close()
            raise _KernelUnusable(str(exc)) from None
        hosted = _Hosted(worker, "entry", load, kernel)
        with self._hosting:
            self._hosted[key] = hosted
        return hosted

    def retire(self, keep: Sequence[str] = ()) -> None:
        """Close kernel workers, but those hosting one of the files in `keep` (by content)."""
        kept = {hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in keep if Path(f).is_file()}
        for key, hosted in list(self._hosted.items()):
            if key[0] not in kept:
                self._close_hosted(key, hosted)

    def _close_hosted(self, key: tuple[str, str, str], hosted: _Hosted) -> None:
        self._hosted.pop(key, None)
        self._staged.pop(hosted.worker.token, None)
        hosted.worker.close()  # first: its arena must not go back to the driver while it may map it
        with self._lock:
            try:
                self._ask(self._reference, {"op": "release", "worker": hosted.worker.token, "keys": []})
            except (_WorkerFailed, UserFacingError):
                pass

    def close(self) -> None:
        for key, hosted in list(self._hosted.items()):
            self._close_hosted(key, hosted)
        for worker in (self._trusted, self._reference):
            if worker is not None:
                worker.close()
        self._pool.close()
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    # --- runs ------------------------------------------------------------------------------

    def begin(self, seed: int | None = None, generated: int = 2) -> TaskInfo:
        """A new run: its seed, and the task's cases for it (listed, held out, generated)."""
        seed = seed if seed is not None else int.from_bytes(os.urandom(6), "big")
        answer = self._ref("task", spec=self.spec, seed=seed, generated=generated)
        self.device = answer.pop("device", self.device)
        self.info = TaskInfo(**answer)
        self._rng = random.Random(seed)
        self._made = {}
        self._protect(self.info.files)
        return self.info

    def end(self) -> None:
        """Free the run's input sets (in the reference and in every worker that staged them)."""
        if self.info is None:
            return
        with self._lock:
            try:
                self._ask(self._reference, {"op": "release"})
            except _WorkerFailed:
                pass
        for hosted in [*self._hosted.values(), *self._trusted_loaded.values()]:
            keys = self._staged.pop(hosted.worker.token, set())
            if keys and hosted.worker.alive:
                try:
                    self._ask(hosted.worker, {"op": "unstage", "keys": sorted(keys)})
                except (_WorkerFailed, UserFacingError):
                    pass
        self._made = {}

    # --- input sets ------------------------------------------------------------------------

    def _set(self, case: int, index: int, kind: str = "s", expected: bool = True) -> tuple[str, dict[str, Any]]:
        """Input set `index` of `case` in this run (made once), with its expected outputs when asked."""
        assert self.info is not None
        key = f"{self.info.seed}:{kind}{case}:{index}"
        with self._lock:
            made = self._made.get(key)
            seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")
            if made is None or (expected and "expected" not in made and self.info.has_reference):
                made = self._ref("make", key=key, case=case, seed=seed, expected=expected)
                self._made[key] = made
            if expected and "expected" not in made and not self.info.has_reference:
                made["expected"] = self._expect_from_task_kernel(key, case)
        return key, made

    def _expect_from_task_kernel(self, key: str, case: int) -> list[dict[str, Any]]:
        """A task without a reference: its own kernel's outputs for the set are the expected ones."""
        hosted = self._host(KernelSpec("task kernel"))
        with self._busy_lock(hosted.worker):
            self._stage(hosted, [key])
            try:
                answer = self._ask(hosted.worker, {"op": "check", "name": hosted.name, "a": key, "b": key, "pin": None,
                                                   "exempt": self.info.exempt})  # type: ignore[union-attr]
            except _WorkerFailed as exc:
                raise UserFacingError(f"the task's own kernel failed while making the expected outputs: {exc}",
                                      "run `kb run TASK` on the task alone to see why") from None
            first = answer["calls"][0]
            if first.get("error"):
                raise UserFacingError(f"the task's own kernel raised {first['error']} on case "
                                      f"{self.info.labels[case]}", "fix the task's kernel first")  # type: ignore[union-attr]
            return self._ref("expect", key=key, case=case, outputs=first["outputs"],
                             dir=str(hosted.worker.directory))["expected"]

    def _stage(self, hosted: _Hosted, keys: list[str]) -> None:
        staged = self._staged.setdefault(hosted.worker.token, set())
        missing = [k for k in keys if k not in staged]
        if not missing:
            return
        sets = self._ref("share", keys=missing, worker=hosted.worker.token, dir=str(hosted.worker.directory))["sets"]
        for key, one in zip(missing, sets):
            self._ask(hosted.worker, {"op": "stage", "key": key, "sets": [one]})
            staged.add(key)

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
        except _KernelUnusable as exc:
            run.rejected = f"the kernel cannot be loaded: {exc}"
            return Checked(run)
        with self._busy_lock(hosted.worker):
            return self._check_hosted(hosted, run, cases, seeds, own)

    def _busy_lock(self, worker: Worker) -> threading.RLock:
        with self._hosting:
            return self._busy.setdefault(worker.token, threading.RLock())

    def _check_hosted(self, hosted: _Hosted, run: KernelRun, cases: list[int] | None, seeds: int,
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
        pins: list[int | None] = list(range(hosted.load.get("pins", 0))) or [None]
        if hosted.load.get("pins") and self.backend == "cuda":
            pins.append(None)  # and one call that tunes for real, on the caller's buffers
        sets = max(seeds, 2)
        try:
            for case in indices:
                result = CaseResult(case=info.cases[case], label=info.labels[case], heldout=case >= info.timed,
                                    generated=case >= len(info.cases) - info.generated)
                run.cases.append(result)
                for seed in range(seeds):
                    reason = self._check_seed(hosted, run, result, case, seed, sets, pins,
                                              expected=info.has_reference or not own)
                    if reason:
                        run.rejected = f"case {result.label}, seed {seed}{reason}"
                        return Checked(run)
                    if result.error:
                        break
                    result.seeds = seed + 1
                if not result.correct:
                    return Checked(run)  # the first wrong case is reported; the rest would repeat it
        except _WorkerFailed as exc:
            run.rejected = str(exc)
            self._forget(hosted)
            return Checked(run, failure=f"{kernel.role}: {exc}")
        if self.backend == "npu":
            run.artifacts = self._ask(hosted.worker, {"op": "artifacts"}).get("artifacts", [])
        return Checked(run)

    def _load_reason(self, hosted: _Hosted) -> str | None:
        """Static guards on the wrapper, and what importing the kernel did."""
        assert self.info is not None
        load = hosted.load
        entry_file = load.get("entry_file") or hosted.spec.file or self.info.source_file
        if hosted.spec.stand_in:
            return None
        reasons = guards.static_guards(entry_file, load.get("name") or self.info.entry, tuple(self.info.allow_torch))
        if not hosted.spec.trusted:
            allowed = guards.escape_kinds(self.info.source_file)
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

    def _check_seed(self, hosted: _Hosted, run: KernelRun, result: CaseResult, case: int, seed: int, sets: int,
                    pins: list[int | None], expected: bool) -> str | None:
        """One seed of one case under every autotune pin: a reason to reject, or None."""
        assert self.info is not None
        key_a, made_a = self._set(case, seed, expected=expected)
        key_b, made_b = self._set(case, (seed + 1) % sets, expected=expected)
        self._stage(hosted, [key_a, key_b])
        skipped: list[str] = []
        for pin in pins:
            answer = self._ask(hosted.worker, {"op": "check", "name": hosted.name, "a": key_a, "b": key_b,
                                               "pin": pin, "exempt": self.info.exempt})
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
                raise _WorkerFailed(f"case {result.label}, seed {seed}: {error}", False)
            reason = None
            for i, call in enumerate(calls):
                if call.get("error"):
                    break
                made = made_b if i == 2 else made_a
                reason = (verdicts.call_reason(call, i, set()) or
                          verdicts.output_reason(call["outputs"], made.get("expected"), bool(self.info.exempt)) or
                          verdicts.overlap_reason(call))
                if reason:
                    break
            if not reason and calls and not calls[0].get("error"):
                reason = self._compare(hosted, result, case, [key_a, key_a, key_b], calls, made_a.get("expected"))
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

    def _compare(self, hosted: _Hosted, result: CaseResult, case: int, keys: list[str], calls: list[dict[str, Any]],
                 expected: list[dict[str, Any]] | None) -> str | None:
        done = [c for c in calls if not c.get("error")]
        answer = self._ref("compare", keys=keys[:len(done)], case=case, dir=str(hosted.worker.directory),
                           calls=[{"outputs": c["outputs"], "inputs_after": c["inputs_after"]} for c in done])
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

    def _leftovers(self, hosted: _Hosted) -> list[str]:
        from harness.processes import describe

        left = hosted.worker.leftovers()
        if left:
            from harness.processes import kill

            names = [describe(p) for p in left]
            kill(left)
            return names
        return []

    def _forget(self, hosted: _Hosted) -> None:
        for key, h in list(self._hosted.items()):
            if h.worker is hosted.worker:
                self._close_hosted(key, h)
        if hosted.worker is self._trusted:
            self._trusted_loaded = {}

    # --- profiling -------------------------------------------------------------------------

    def profile(self, kernel: KernelSpec, case: int, wrap: Callable[[list[str]], list[str]],
                repeat: int = 3) -> tuple[str | None, str]:
        """Run `kernel` on one input set of `case` in a worker a profiler wraps (`wrap`): (what failed
        or None, everything the wrapped process printed that is not protocol: the profiler's report)."""
        assert self.info is not None
        worker = Worker(self.backend, wrap=wrap, directory=Path(self.root) / f"p{os.urandom(4).hex()}", restart=False)
        try:
            request: dict[str, Any] = {"op": "load", "name": "entry", "allow_torch": self.info.allow_torch}
            if kernel.trusted:
                request.update(task=self.spec, trusted=True, attr="entry")
            else:
                request.update(file=str(kernel.file), entry=kernel.entry or self.info.entry)
            self._ask(worker, request)
            key, _ = self._set(case, 0, kind="p", expected=False)
            sets = self._ref("share", keys=[key], worker=worker.token, dir=str(worker.directory))["sets"]
            self._ask(worker, {"op": "stage", "key": key, "sets": sets})
            self._ask(worker, {"op": "profile", "name": "entry", "key": key, "repeat": repeat})
            return None, worker.finish(self.timeout_s)
        except (_WorkerFailed, UserFacingError) as exc:
            return str(exc), ""
        finally:
            worker.close()
            with self._lock:
                try:
                    self._ask(self._reference, {"op": "release", "worker": worker.token, "keys": []})
                except _WorkerFailed:
                    pass

    # --- files -----------------------------------------------------------------------------

    def _protect(self, files: list[str]) -> None:
        with self._hosting:
            for f in files:
                if f not in self._protected:
                    try:
                        self._protected[f] = Path(f).read_bytes()
                    except OSError:
                        pass

    def _files_changed(self) -> str | None:
        """A protected file whose bytes changed: restored, and named."""
        changed = []
        with self._hosting:
            protected = list(self._protected.items())
        for f, content in protected:
            try:
                now = Path(f).read_bytes()
            except OSError:
                now = None
            if now != content:
                Path(f).write_bytes(content)
                changed.append(Path(f).name)
        if changed:
            return f"{changed[0]} was rewritten while the kernel ran (restored): a kernel must not edit files"
        return None

    # --- timing ----------------------------------------------------------------------------

    def time(self, kernels: list[KernelSpec], cases: list[int] | None = None, *, warmup_ms: int = WARMUP_MS,
             rep_ms: int = REP_MS, roofline: bool = True) -> TimedCases:
        """Every kernel on every timed case, interleaved A B A B across their workers (drift hits each
        alike), each timed call's output of one named set compared afterwards."""
        assert self.info is not None, "begin() first"
        info = self.info
        out = TimedCases()
        hosted: dict[str, _Hosted] = {}
        for kernel in kernels:
            try:
                hosted[kernel.role] = self._host(kernel)
            except _KernelUnusable as exc:
                out.rejected[kernel.role] = f"the kernel cannot be loaded: {exc}"
                continue
            reason = self._load_reason(hosted[kernel.role])
            if reason:
                out.rejected[kernel.role] = reason
                self._forget(hosted.pop(kernel.role))
        if roofline and self.backend == "cuda" and any(info.bytes + info.flops):
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
                    self._stage(h, [*keys, probe])
                except _WorkerFailed as exc:
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
                continue
            for role, timing in timings.items():
                result = CaseResult(case=info.cases[case], label=label, timing=timing)
                if out.ceilings is not None:
                    from harness.roofline import place

                    result.roofline = place(info.bytes[case], info.flops[case], timing.median_us * 1e-6,
                                            out.ceilings, made["compute_dtype"])
                out.cases.setdefault(role, []).append(result)
        return out

    def _time_one(self, hosted: _Hosted, role: str, keys: list[str], probe: str, case: int, warmup_ms: int,
                  rep_ms: int) -> Timing:
        """One timing of one kernel on one case, its verdicts taken, its probe's output compared."""
        assert self.info is not None
        made = self._made[probe]
        request = {"op": "time", "name": hosted.name, "keys": keys, "warmup_ms": warmup_ms, "rep_ms": rep_ms,
                   "probe": {"key": probe, "at": self._rng.uniform(0.2, 0.9)}, "warm_cache": self.info.warm_cache,
                   "exempt": self.info.exempt,
                   "expect_kernels": sorted(self._kernels_seen.get((hosted.worker.token, case), ()))}
        started = time.monotonic()
        try:
            answer = self._ask(hosted.worker, request, self.timeout_s)
        except _WorkerFailed as exc:
            raise _Rejected(role, f"its worker failed while timed: {exc}") from None
        wall = time.monotonic() - started
        if hosted.spec.stand_in:
            return _timing(answer, self.info.warm_cache, warmup_ms, rep_ms)
        reason = verdicts.timed_reason(answer, wall, set())
        if not reason:
            reason = verdicts.output_reason(answer["outputs"], made.get("expected"), bool(self.info.exempt))
        if not reason and made.get("expected") is not None:
            result = CaseResult(case={}, label="timed")
            reason = self._compare(hosted, result, case, [probe], [{"outputs": answer["outputs"], "inputs_after": {}}],
                                   made.get("expected"))
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

    def _burn_in(self, live: dict[str, _Hosted], key: str) -> None:
        """The kernels run back to back before the first timing (an idle GPU starts at a low clock: on
        the H200 the first kernel timed after the worker had been compiling measured 2-3x its later
        times). Each worker burns in for its share of BURN_IN_S."""
        by_worker: dict[int, list[_Hosted]] = {}
        for h in live.values():
            by_worker.setdefault(id(h.worker), []).append(h)
        share = max(0.1, BURN_IN_S / max(1, len(by_worker)))
        for group in by_worker.values():
            try:
                self._ask(group[0].worker, {"op": "burn_in", "names": [h.name for h in group], "key": key,
                                            "seconds": share})
            except _WorkerFailed:
                pass  # the timing that follows reports it


class _WorkerFailed(RuntimeError):
    def __init__(self, failure: str, forged: bool) -> None:
        super().__init__(failure)
        self.forged = forged


class _KernelUnusable(RuntimeError):
    """A kernel file that does not import, or has no entry of the name asked for."""


def _timing(answer: dict[str, Any], warm_cache: bool, warmup_ms: int, rep_ms: int) -> Timing:
    return timing_of(answer["samples_ms"], warm_cache=warm_cache, rotating_buffers=int(answer.get("rotating_buffers", 1)),
                     warmup_ms=warmup_ms, rep_ms=rep_ms)


def _candidate_cache(sha: str) -> Path:
    """Triton's cache for one kernel source: compiled kernels are reused by that source alone."""
    from harness.roofline import cache_dir

    return cache_dir() / "triton-kernels" / sha[:16]


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


# --- timing statistics -----------------------------------------------------------------------

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
        merged = {role: merge_pair(*pair) for role, pair in pairs.items()}
        if best is None or _worst_spread(merged) < _worst_spread(best):
            best = merged
        if _worst_spread(merged) <= max_spread:
            break
    assert best is not None
    for timing in best.values():
        timing.timing_passes = taken
    return best


def merge_pair(first: Timing, second: Timing) -> Timing:
    merged = replace(first)
    merged.median_us = (first.median_us + second.median_us) / 2
    gap = abs(second.median_us - first.median_us)
    merged.repeat_spread = gap / first.median_us if first.median_us > 0 else (float("inf") if gap else 0.0)
    merged.reps = first.reps + second.reps
    return merged


def _worst_spread(timings: dict[str, Timing]) -> float:
    return max((t.repeat_spread or 0.0 for t in timings.values()), default=0.0)


def check_in_parallel(judge: Judge, kernels: list[KernelSpec], workers: int, **kwargs: Any) -> list[Checked]:
    """`judge.check` of every kernel, each in its own worker, up to `workers` at a time, in order.
    Ctrl-C closes every worker at once, so no check left running holds the device after the caller."""
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

