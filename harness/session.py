"""Where the judge's kernels live and what they are fed: the plumbing under harness.judge.

A `Session` holds one task's workers: the reference worker (harness.reference: the task, its inputs, its
expected outputs, the comparisons), the worker of the task's own code (the user's: its kernel and its
PyTorch stand-ins), and one worker per kernel source under judgement, started from a pool ahead of
need (harness.pool) and loaded on first use. A worker hosts one kernel source for its life, so nothing
one candidate's import does can reach another's verdict.

Each `begin` draws the run's seed (os.urandom unless given; reports record it, so a failure replays):
the input sets and the held-out cases drawn from the task's ranges follow from it. Input sets are made
once per run in the reference worker and handed to each kernel worker as its own copy. The task's files
and every hosted kernel's file are protected: hashed around every job, restored when changed. A kernel
worker's process tree is listed after every job; what is still alive there outlived the call.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.backends import BackendName
from harness.errors import UserFacingError
from harness.exchange import exchange_root
from harness.pool import SparePool
from harness.reference import TaskInfo
from harness.sandbox import Worker
from harness.task import TaskSpec

__all__ = ["LARGE_CASE_BYTES", "Hosted", "KernelSpec", "KernelUnusable", "Session", "WorkerFailed", "candidate_cache"]

# A case whose input sets reach this many bytes is held one case at a time: its sets leave a kernel
# worker once the case is checked or timed, and the reference frees a worker's hand-over buffer once the
# worker has copied from it. Held for the whole run instead, TritonBench-T's fused_mv_sigmoid_sub (a 4 GiB
# matrix) filled the H200 (the reference 43 GiB with a hand-over buffer per worker, a worker 30 GiB with
# every set ever staged in it), and a round's variants failed even one at a time. Smaller cases stay staged: re-copying them
# would cost more than they hold.
LARGE_CASE_BYTES = 1 << 30


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
class Hosted:
    """A kernel loaded in a worker: what its import reported (`load`), and under which name it runs there."""

    worker: Worker
    name: str
    load: dict[str, Any]
    spec: KernelSpec


class Session:
    """One task's workers and input sets. `begin` starts a run (a seed, the cases), `end` frees its
    inputs; workers outlive runs: the reference and the task's own code for the session, a kernel
    file's worker until `retire`."""

    def __init__(self, spec: TaskSpec, backend: BackendName, *, timeout_s: float = 300.0, spares: int = 0) -> None:
        self.spec = spec
        self.backend = backend
        self.timeout_s = timeout_s
        self.root = exchange_root()
        self._lock = threading.RLock()  # one request at a time to the reference worker
        self._hosting = threading.RLock()  # the maps of hosted kernels and protected files
        self._trusted_loading = threading.RLock()  # one load of each trusted stand-in, one trusted worker
        self._reference = self._new_worker("reference")
        self._trusted: Worker | None = None
        self._trusted_loaded: dict[str, Hosted] = {}
        self._hosted: dict[tuple[str, str, str], Hosted] = {}
        self._pool = SparePool(lambda: self._new_worker(None), spares, warm=backend in ("cuda", "npu"))
        # The reference worker starts now, in the background (it forks from the zygote, which starts
        # first): a caller that loads its task or plans meanwhile does not wait for it later.
        threading.Thread(target=self._start_quietly, args=(self._reference,), daemon=True).start()
        self._protected: dict[str, bytes] = {}
        self._made: dict[str, dict[str, Any]] = {}
        self._staged: dict[str, set[str]] = {}  # per worker token: the input sets it holds
        self._case_of: dict[str, int] = {}  # input set key -> its case
        self._ceilings: dict[str, Any] | None = None
        self._trusted_import: set[str] | None = None
        self._contracts: dict[str, list[dict[str, Any]]] = {}  # case label -> the task kernel's outputs
        self._own_copies: set[str] = set()  # torch copies the task's own wrapper makes its outputs with
        self._own_strided_copies = False  # whether it copies strided views with torch (harness.tripwires)
        self._contract_meta: dict[int, list[dict[str, Any]]] = {}  # this run's, with tolerances
        self._kernels_seen: dict[tuple[str, int], set[str]] = {}  # (worker, case) -> kernels its checks launched
        # This run's probed cases (`TaskInfo.probed`: the wide-input case, cases drawn from a call's sizes),
        # checked on the task's own kernel: why it fails each (None where it passes). Candidates are held
        # only to those it passes.
        self._domain: dict[int, str | None] = {}
        self._domain_lock = threading.Lock()
        self._loading: dict[tuple[str, str, str], threading.Lock] = {}
        self._busy: dict[str, threading.RLock] = {}  # per worker: one check at a time (its answers are live)
        self.info: TaskInfo | None = None
        self.device = "?"
        self._rng = random.Random()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- workers ---------------------------------------------------------------------------

    def _new_worker(self, name: str | None) -> Worker:
        directory = Path(os.path.join(self.root, name or f"w{os.urandom(4).hex()}"))
        return Worker(self.backend, directory=directory, restart=False)

    @staticmethod
    def _start_quietly(worker: Worker) -> None:
        try:
            worker.start()
        except UserFacingError:
            pass  # the first request starts it again, and reports why it cannot

    def _ask(self, worker: Worker, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """A request's answer; a worker failure raises `WorkerFailed`, bad input `UserFacingError`."""
        answer = worker.submit(request, timeout or self.timeout_s)
        if answer.get("ok"):
            return answer["answer"]
        if "user_error" in answer:
            raise UserFacingError(answer["user_error"], answer.get("fix", ""))
        raise WorkerFailed(answer.get("failure", "the worker failed"), bool(answer.get("forged")))

    def _ref(self, op: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            try:
                return self._ask(self._reference, {"op": op, **fields})
            except WorkerFailed as exc:
                raise UserFacingError(f"the judge's reference worker failed ({op}): {exc}",
                                      "check the task's inputs and reference (kb run TASK shows them)") from None

    def device_memory(self) -> dict[str, int]:
        """The device's free and total bytes, as the reference worker (on the device) sees them; empty off CUDA."""
        return dict(self._ref("memory"))

    def _host(self, kernel: KernelSpec) -> Hosted:
        """The worker hosting `kernel`, started and loaded on first use."""
        assert self.info is not None
        if kernel.trusted:
            with self._trusted_loading:
                return self._host_trusted(kernel, kernel.stand_in or "entry")
        file = str(Path(kernel.file).resolve())  # type: ignore[arg-type]
        entry = kernel.entry or self.info.entry
        key = (hashlib.sha256(Path(file).read_bytes()).hexdigest(), entry, str(Path(file).parent))
        with self._hosting:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # one load per source, however many threads ask for it at once
            return self._host_file(kernel, file, key)

    def _host_trusted(self, kernel: KernelSpec, name: str) -> Hosted:
        """The trusted worker (the task's own code) with stand-in `name` loaded."""
        if name not in self._trusted_loaded:
            if self._trusted is None or not self._trusted.alive:
                self._trusted, self._trusted_loaded = self._pool.take(), {}
            load = self._ask(self._trusted, self._load_request(kernel, name))
            self._trusted_loaded[name] = Hosted(self._trusted, name, load, kernel)
            if name == "entry":
                self._trusted_import = set(load.get("import_changes", []))
        return self._trusted_loaded[name]

    def _host_file(self, kernel: KernelSpec, file: str, key: tuple[str, str, str]) -> Hosted:
        assert self.info is not None
        with self._hosting:
            hosted = self._hosted.get(key)
        if hosted is not None and hosted.worker.alive:
            return replace(hosted, spec=kernel)
        self._protect([file])
        worker = self._pool.take()
        try:
            load = self._ask(worker, {**self._load_request(kernel, "entry"), "cache_dir": str(candidate_cache(key[0]))})
        except UserFacingError as exc:
            worker.close()
            raise KernelUnusable(exc.problem) from None
        except WorkerFailed as exc:
            worker.close()
            raise KernelUnusable(str(exc)) from None
        hosted = Hosted(worker, "entry", load, kernel)
        with self._hosting:
            self._hosted[key] = hosted
        return hosted

    def _load_request(self, kernel: KernelSpec, name: str) -> dict[str, Any]:
        """What a worker is asked to import for `kernel`, under `name`."""
        assert self.info is not None
        request: dict[str, Any] = {"op": "load", "name": name, "allow_torch": self.info.allow_torch}
        if kernel.trusted:
            request.update(task=self.spec.to_json(), trusted=True, attr="entry" if name == "entry" else "eager",
                           compiled=name == "compiled")
        else:
            # a rewrite imports as if it sat where the task's kernel file does (its package, its siblings),
            # and the entry is looked up in it, or in the layer file that imports its kernels
            request.update(file=str(Path(kernel.file).resolve()), entry=kernel.entry or self.info.entry,  # type: ignore[arg-type]
                           stands_in_for=self.info.kernel_file or self.info.source_file,
                           entry_file=self.info.source_file)
        return request

    def retire(self, keep: Sequence[str] = ()) -> None:
        """Close kernel workers, but those hosting one of the files in `keep` (by content)."""
        kept = {hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in keep if Path(f).is_file()}
        for key, hosted in list(self._hosted.items()):
            if key[0] not in kept:
                self._close_hosted(key, hosted)

    def _close_hosted(self, key: tuple[str, str, str], hosted: Hosted) -> None:
        self._hosted.pop(key, None)
        self._staged.pop(hosted.worker.token, None)
        hosted.worker.close()  # first: its arena must not go back to the driver while it may map it
        with self._lock:
            try:
                self._ask(self._reference, {"op": "release", "worker": hosted.worker.token, "keys": []})
            except (WorkerFailed, UserFacingError):
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
        answer = self._ref("task", spec=self.spec.to_json(), seed=seed, generated=generated)
        self.device = answer.pop("device", self.device)
        self.info = TaskInfo(**answer)
        self._rng = random.Random(seed)
        self._made = {}
        self._case_of = {}
        self._contract_meta = {}
        self._domain = {}
        self._protect(self.info.files)
        return self.info

    def end(self) -> None:
        """Free the run's input sets (in the reference and in every worker that staged them)."""
        if self.info is None:
            return
        with self._lock:
            try:
                self._ask(self._reference, {"op": "release"})
            except WorkerFailed:
                pass
        for hosted in [*self._hosted.values(), *self._trusted_loaded.values()]:
            keys = self._staged.pop(hosted.worker.token, set())
            if keys and hosted.worker.alive:
                try:
                    self._ask(hosted.worker, {"op": "unstage", "keys": sorted(keys)})
                except (WorkerFailed, UserFacingError):
                    pass
        self._made = {}
        self._case_of = {}

    # --- input sets ------------------------------------------------------------------------

    def _set(self, case: int, index: int, kind: str = "s", expected: bool = True) -> tuple[str, dict[str, Any]]:
        """Input set `index` of `case` in this run (made once), with its expected values when asked: the
        reference's, or without one the task's own kernel's."""
        assert self.info is not None
        key = f"{self.info.seed}:{kind}{case}:{index}"
        with self._lock:
            made = self._made.get(key)
            seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")
            if made is None or (expected and not made.get("values") and self.info.has_reference):
                made = self._ref("make", key=key, case=case, seed=seed, expected=expected)
                self._made[key] = made
                self._case_of[key] = case
        if expected and not made.get("values") and not self.info.has_reference:
            # Not under the reference's lock: the task's kernel runs in a worker of its own meanwhile.
            first = self._run_task_kernel(key, case)
            self._ref("expect", key=key, outputs=first["outputs"], dir=str(self._trusted_dir()))
            made["values"] = True
        return key, made

    def contract(self, case: int, own_outputs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """What `case`'s outputs must be (count, dtype, shape, device, tolerances): the task's own kernel's.
        Taken from `own_outputs` (its first call's, when it is the kernel being checked) or from a run of
        it; kept by case label for the session, and registered with the reference for each run."""
        assert self.info is not None
        label = self.info.labels[case]
        if label not in self._contracts:
            outputs = own_outputs if own_outputs is not None else \
                self._run_task_kernel(self._set(case, 0, kind="c", expected=False)[0], case)["outputs"]
            self._contracts.setdefault(label, [{k: out[k] for k in ("dtype", "shape", "device")} for out in outputs])
        with self._lock:
            if case not in self._contract_meta:
                self._contract_meta[case] = self._ref("contract", case=case, outputs=self._contracts[label])["expected"]
            return self._contract_meta[case]

    def _run_task_kernel(self, key: str, case: int) -> dict[str, Any]:
        """The task's own kernel's first call on input set `key` (what it returned, handed over)."""
        assert self.info is not None
        hosted = self._host(KernelSpec("task kernel"))
        with self._busy_lock(hosted.worker):
            self._stage(hosted.worker, [key])
            try:
                answer = self._ask(hosted.worker, {"op": "check", "name": hosted.name, "a": key, "b": key, "pin": None,
                                                   "exempt": self.info.exempt, "inouts": self.info.inouts})
            except WorkerFailed as exc:
                raise UserFacingError(f"the task's own kernel failed on case {self.info.labels[case]}: {exc}",
                                      "run `kb run TASK` on the task alone to see why") from None
            finally:
                self._drop_large_case(hosted.worker, case)
        first = answer["calls"][0]
        if first.get("error"):
            raise UserFacingError(f"the task's own kernel raised {first['error']} on case {self.info.labels[case]}",
                                  "fix the task's kernel first (kb run TASK shows the cases)")
        self._own_copies.update(t["op"] for c in answer["calls"] for t in c.get("torch_outputs", []))
        self._own_strided_copies |= any((c.get("log") or {}).get("strided_copies") for c in answer["calls"])
        return first

    def _trusted_dir(self) -> Path:
        assert self._trusted is not None
        return self._trusted.directory

    def _stage(self, worker: Worker, keys: list[str]) -> None:
        """The input sets `keys` handed to `worker` (a copy of its own), those it does not hold yet."""
        staged = self._staged.setdefault(worker.token, set())
        missing = [k for k in keys if k not in staged]
        if not missing:
            return
        sets = self._ref("share", keys=missing, worker=worker.token, dir=str(worker.directory))["sets"]
        for key, one in zip(missing, sets):
            self._ask(worker, {"op": "stage", "key": key, "set": one})
            staged.add(key)
        if self._bytes(missing) >= LARGE_CASE_BYTES:
            # The worker has copied the hand-over and closed its mapping (exchange.open_cuda): the
            # reference's buffer for it may go back to the driver.
            self._ref("release", keys=[], worker=worker.token)

    def _bytes(self, keys: list[str]) -> int:
        return sum(int(self._made.get(k, {}).get("bytes", 0)) for k in keys)

    def _drop_large_case(self, worker: Worker, case: int) -> None:
        """`case`'s input sets out of `worker` when together they reach LARGE_CASE_BYTES: the next case's
        sets, or the next kernel's worker, need the room more than a later job would need the copy."""
        keys = sorted(k for k in self._staged.get(worker.token, set()) if self._case_of.get(k) == case)
        if not keys or self._bytes(keys) < LARGE_CASE_BYTES or not worker.alive:
            return
        try:
            self._ask(worker, {"op": "unstage", "keys": keys})
        except (WorkerFailed, UserFacingError):
            return  # a worker that cannot answer holds nothing for long: the next request replaces it
        self._staged[worker.token].difference_update(keys)

    def _busy_lock(self, worker: Worker) -> threading.RLock:
        with self._hosting:
            return self._busy.setdefault(worker.token, threading.RLock())

    def _leftovers(self, hosted: Hosted) -> list[str]:
        from harness.processes import describe

        left = hosted.worker.leftovers()
        if left:
            from harness.processes import kill

            names = [describe(p) for p in left]
            kill(left)
            return names
        return []

    def _forget(self, hosted: Hosted) -> None:
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
            self._ask(worker, self._load_request(kernel, "entry"))
            key, _ = self._set(case, 0, kind="p", expected=False)
            self._stage(worker, [key])
            self._ask(worker, {"op": "profile", "name": "entry", "key": key, "repeat": repeat})
            return None, worker.finish(self.timeout_s)
        except (WorkerFailed, UserFacingError) as exc:
            return str(exc), ""
        finally:
            worker.close()
            self._staged.pop(worker.token, None)
            with self._lock:
                try:
                    self._ask(self._reference, {"op": "release", "worker": worker.token, "keys": []})
                except WorkerFailed:
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

class WorkerFailed(RuntimeError):
    def __init__(self, failure: str, forged: bool) -> None:
        super().__init__(failure)
        self.forged = forged


class KernelUnusable(RuntimeError):
    """A kernel file that does not import, or has no entry of the name asked for."""


def candidate_cache(sha: str) -> Path:
    """Triton's cache for one kernel source: compiled kernels are reused by that source alone."""
    from harness.roofline import cache_dir

    return cache_dir() / "triton-kernels" / sha[:16]
