"""The kernel side of a judgement: what a kernel worker does with the one kernel source it hosts.

A `KernelHost` imports the kernel (after `tripwires.Watch` is in place), holds the input sets the
judge hands it, runs the calls the judge asks for, and reports what it saw: outputs and the call's
arguments afterwards (handed over through `harness.exchange`), memory spans, launches, torch ops,
state changes and replaced functions. It never sees a reference, a tolerance or a verdict.

One check of a case and seed is three calls of the entry:

1. on a fresh copy of input set A, every buffer the wrapper allocates (and every out= argument)
   filled with poison A (NaN);
2. on another fresh copy of A, poisoned with B (1234.5): an element holding A after call 1 and B after
   call 2 was never written;
3. on call 2's very argument tensors with set B's values written into them in place, nothing
   poisoned: a result cached by input address, or computed only when a buffer comes back poisoned,
   is wrong here.

Timing runs the entry over staged input sets under the same watch, counts the calls that launched no
kernel, and keeps the output of the last call on one set the judge named, for the judge to compare.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import exchange
from harness.compile_errors import one_line
from harness.errors import UserFacingError, first_line
from harness.guards import foreign_output
from harness.tripwires import CallLog, Watch, global_state

__all__ = ["KernelHost", "POISON_A", "POISON_B", "WorkerPoisoned", "autotuners", "fill_poison", "pinned"]

POISON_A = float("nan")
POISON_B = 1234.5
_FATAL = ("illegal memory access", "unspecified launch failure", "CUDA error", "device-side assert",
          "misaligned address", "an illegal instruction")


class WorkerPoisoned(RuntimeError):
    """The device context is broken; the worker must exit after reporting."""


Staged = tuple[tuple[Any, ...], dict[str, Any]]


class KernelHost:
    """One kernel source in one worker process, for that process's life."""

    def __init__(self, device: str, directory: Path) -> None:
        self.device = device
        self.directory = directory
        self.entries: dict[str, Any] = {}
        self.watch: Watch | None = None
        self.staged: dict[str, Staged] = {}
        self.held: list[Any] = []  # what the last answer handed over by reference: alive until the next request

    # --- loading ---------------------------------------------------------------------------

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        """Import a kernel file (`file`, `entry`) or, for the user's own code, a task's callable (`task`,
        `attr`: entry | eager | reference, `compiled`). The watch goes in first, so whatever the import
        changes is seen."""
        if self.watch is None:
            if request.get("cache_dir"):  # a Triton cache of this source's own; read when it first compiles
                import os

                os.environ["TRITON_CACHE_DIR"] = str(request["cache_dir"])
            self.watch = Watch(tuple(request.get("allow_torch", ())), exchange.device_kind(self.device))
        name = str(request["name"])
        before = self.watch.state
        if request.get("file"):
            entry = _entry_from_file(str(request["file"]), str(request.get("entry") or ""), request.get("stands_in_for"),
                                     request.get("entry_file"))
        else:
            entry = _entry_from_task(request["task"], str(request.get("attr", "entry")), bool(request.get("compiled")))
        self.entries[name] = entry
        changes = self.watch.state_changes(before)
        tampered = self.watch.tampering()
        if request.get("trusted"):
            # The user's own code: what its import set is the state its calls are judged against.
            self.watch.state = global_state()
        from harness.entries import defining_file, entry_name

        tuners = autotuners(entry)
        return {"entry_file": defining_file(entry, request.get("file") or ""), "name": entry_name(entry),
                "pins": max((len(t.configs) for t in tuners), default=0), "import_changes": changes,
                "import_tampering": tampered}

    # --- inputs ----------------------------------------------------------------------------

    def stage(self, key: str, encoded: dict[str, Any]) -> dict[str, Any]:
        """Hold an input set (`{"args": .., "kwargs": ..}` encoded) under `key` as tensors of our own."""
        args = exchange.decode(encoded["args"], self._load)
        kwargs = exchange.decode(encoded["kwargs"], self._load)
        self.staged[key] = (tuple(args), dict(kwargs))
        return {}

    def unstage(self, keys: list[str]) -> dict[str, Any]:
        dropped = [self.staged.pop(key, None) for key in keys]
        if any(dropped) and exchange.device_kind(self.device) == "cuda":
            import torch

            del dropped
            torch.cuda.empty_cache()  # the room goes back to the device for the other workers, not to our cache
        return {}

    def _load(self, ref: Any) -> Any:
        return exchange.load_tensor(ref, self.directory, self.device)

    # --- checks ----------------------------------------------------------------------------

    def check(self, name: str, a: str, b: str, pin: int | None, exempt: list[int],
              inouts: list[int] | None = None) -> dict[str, Any]:
        """The three calls of one check (module docstring), under autotune pin `pin`. `exempt` arguments
        are outputs: poisoned, except the `inouts` among them, which the kernel reads too."""
        import torch

        self.held = []
        entry = self.entries[name]
        args_a, kwargs_a = self.staged[a]
        args_b, kwargs_b = self.staged[b]
        out_spans: list[list[list[int]]] = []
        calls: list[dict[str, Any]] = []
        tuners = autotuners(entry)
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        write_only = [i for i in exempt if i not in (inouts or [])]
        with pinned(tuners, pin) as label:
            for step, poison in enumerate((POISON_A, POISON_B, None)):
                if step < 2:
                    args, kwargs = _clone(args_a), _clone_kwargs(kwargs_a)
                    for i in write_only:
                        if i < len(args) and isinstance(args[i], torch.Tensor):
                            fill_poison(args[i], poison)  # type: ignore[arg-type]
                else:  # call 2's own tensors (still in args, kwargs), set B's values written in place
                    _write_in_place(args, args_b, write_only)
                    _write_in_place(tuple(kwargs.values()), tuple(kwargs_b.values()), [])
                record = self._call(entry, args, kwargs, poison, exempt, out_spans)
                calls.append(record)
                if record["error"]:
                    break
        return {"calls": calls, "config": label}

    def _call(self, entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any], poison: float | None, exempt: list[int],
              earlier: list[list[list[int]]]) -> dict[str, Any]:
        import torch

        assert self.watch is not None
        record: dict[str, Any] = {"error": None, "fatal": False}
        try:
            with self.watch.call() as log:
                with _poisoned_allocations(poison):
                    value = entry(*args, **kwargs)
                # Read while watched: iterating what the call returned may run code of the kernel's.
                foreign = foreign_output(value)
                outputs = [] if foreign else outputs_of(value, args, exempt)
            _sync()
        except UserFacingError:
            raise
        except Exception as exc:  # noqa: BLE001 - the kernel's failure is its result
            record["error"] = one_line(exc) or f"{type(exc).__name__}: {first_line(exc)}"
            record["fatal"] = any(marker in str(exc) for marker in _FATAL)
            record["log"] = asdict(log) if "log" in locals() else asdict(CallLog())
            return record
        self.held += [value, args, kwargs]

        def refused(why: str) -> dict[str, Any]:
            """The call's record, its outputs refused for `why` (nothing of them handed over)."""
            assert self.watch is not None
            record.update(foreign_output=why, log=asdict(log), outputs=[], state=self.watch.state_changes(),
                          tampered=self.watch.tampering())
            return record

        if foreign:
            return refused(foreign)
        share = exchange.sender_for(self.device, self.directory)

        def send(t: Any) -> dict[str, Any]:
            # As the call left it: the next call may write into these very buffers (call 3 does) before
            # the judge reads them. A file is a copy already; a buffer shared in place is not.
            if t.device.type == "cuda":
                t = t.detach().clone()
                self.held.append(t)
            return share(t)

        try:
            # Watched too: the hand-over is the harness's code, and any torch work that happens during it
            # (a module the kernel patched at import running when the harness calls it) is the kernel's.
            with self.watch.call() as handover:
                inputs_after = {f"args[{i}]": send(a) for i, a in enumerate(args)
                                if isinstance(a, torch.Tensor) and i not in exempt}
                inputs_after.update({f"kwargs[{k!r}]": send(v) for k, v in kwargs.items()
                                     if isinstance(v, torch.Tensor)})
                sent = [send(o) for o in outputs]
        except Exception as exc:  # noqa: BLE001 - an output no hand-over can carry (meta, sparse) is the kernel's
            return refused(f"an output could not be handed over ({type(exc).__name__}: {first_line(exc)})")
        if handover.torch_ops or handover.escapes or handover.launches:
            seen = [*handover.torch_ops, *handover.escapes] or [f"{handover.launches} launch(es)"]
            return refused(f"the kernel's code ran while its outputs were handed over ({seen[0]})")
        spans = [_span(o) for o in outputs]
        record.update(
            torch_outputs=[{"output": i, "op": log.copied[span[0]]} for i, span in enumerate(spans)
                           if span[0] in log.copied],
            log=asdict(log), returned=type(value).__name__,
            outputs=sent,
            output_spans=spans,
            input_spans=[_span(a) if isinstance(a, torch.Tensor) and i not in exempt else None
                         for i, a in enumerate(args)],
            exempt_outputs=sum(1 for i in exempt if i < len(args)),
            earlier_spans=[s for group in earlier for s in group],
            inputs_after=inputs_after,
            state=self.watch.state_changes(), tampered=self.watch.tampering(),
        )
        earlier.append(spans[record["exempt_outputs"]:])
        return record

    # --- timing ----------------------------------------------------------------------------

    def time(self, name: str, keys: list[str], probe: dict[str, Any], warmup_ms: int, rep_ms: int, warm_cache: bool,
             exempt: list[int], expect_kernels: list[str], allow_copies: list[str],
             inouts: list[int] | None = None) -> dict[str, Any]:
        """Raw timing samples of the entry cycling through the staged sets `keys`, under the same watch
        as its checks. At one repetition (`probe["at"]`, a fraction of the run) the values of the staged
        set `probe["key"]` are first written into that repetition's argument tensors, and that call's
        output is handed back: a kernel that stops computing once it has seen its buffers, or keys a
        cache on their addresses, returns a stale result there."""
        from harness.timing import sample_calls

        assert self.watch is not None
        self.held = []
        entry = self.entries[name]
        sets = [self.staged[key] for key in keys]
        probe_args, probe_kwargs = self.staged[probe["key"]]
        expected = set(expect_kernels)
        merged = CallLog()
        counts = {"calls": 0, "no_launch": 0, "other_kernels": 0, "torch_outputs": 0, "host_outputs": 0,
                  "foreign_outputs": 0}
        pending: list[Any] = []
        kept: list[Any] = []
        saved: list[Any] = []

        def before(index: int) -> None:
            args, kwargs = sets[index]
            saved.append((index, _clone(args), _clone_kwargs(kwargs)))
            _write_in_place(args, probe_args, [i for i in exempt if i not in (inouts or [])])
            _write_in_place(tuple(kwargs.values()), tuple(probe_kwargs.values()), [])
            pending.append(index)

        def call(index: int, start: Any, stop: Any) -> None:
            args, kwargs = sets[index]
            with self.watch.call() as log:  # type: ignore[union-attr]
                start()  # the device events around the entry alone, as do_bench times its fn
                value = entry(*args, **kwargs)
                stop()
                foreign = foreign_output(value)  # read while watched, outside the timed window
                outs = [] if foreign else outputs_of(value, args, exempt)
            counts["calls"] += 1
            counts["foreign_outputs"] += bool(foreign)
            counts["no_launch"] += log.launches == 0
            counts["other_kernels"] += bool(expected and log.launches and not expected & set(log.kernels))
            counts["host_outputs"] += on_host(outs, self.device)
            if log.copied:
                made = [log.copied.get(o.untyped_storage().data_ptr()) for o in outs]
                counts["torch_outputs"] += any(op and op not in allow_copies for op in made)
            _merge_log(merged, log)
            if pending:
                pending.clear()
                # Copied now, outside the timed window: an output that is an argument is the set's live
                # buffer, and an input updated in place (y += a * x) changes again each time the set
                # comes round; at the end of the run it would no longer be this call's result.
                kept.append([o.clone() for o in outs])

        with self._untuned(entry):
            samples = sample_calls(call, len(sets), warm_cache=warm_cache, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                   probe=(float(probe["at"]), before))
        _sync()
        outputs = kept[0] if kept else []
        for index, args, kwargs in saved:  # the set's own values back, for the next timing of this case
            _write_in_place(sets[index][0], args, [])
            _write_in_place(tuple(sets[index][1].values()), tuple(kwargs.values()), [])
        _sync()
        send = exchange.sender_for(self.device, self.directory)
        self.held = outputs
        return {"samples_ms": samples, **counts, "log": asdict(merged), "outputs": [send(o) for o in outputs],
                "probed": bool(kept), "state": self.watch.state_changes(), "tampered": self.watch.tampering(),
                "rotating_buffers": len(sets)}

    def burn_in(self, names: list[str], key: str, seconds: float) -> dict[str, Any]:
        """The entries run back to back for `seconds` (clocks up before the first timing)."""
        rounds = 0
        end = time.perf_counter() + seconds
        args, kwargs = self.staged[key]
        while time.perf_counter() < end:
            for name in names:
                with self.watch.call(), self._untuned(self.entries[name]):  # type: ignore[union-attr]
                    self.entries[name](*args, **kwargs)
            _sync()
            rounds += 1
        return {"rounds": rounds}

    def _untuned(self, entry: Any) -> Any:
        """On the interpreter an autotuner has no timer to tune with: its first config is held."""
        return pinned(autotuners(entry), 0) if self.device == "cpu" else contextlib.nullcontext()

    def forget_tunings(self) -> dict[str, Any]:
        """Empty the autotuners' caches so the next call tunes again on a GPU at speed (only the in-memory
        choice: with TRITON_CACHE_AUTOTUNING=1 Triton reloads the first tuning from disk)."""
        for entry in self.entries.values():
            for tuner in autotuners(entry):
                tuner.cache.clear()
        return {}

    def profile(self, name: str, key: str, repeat: int) -> dict[str, Any]:
        """Launch the entry a few times on the staged set for a profiler wrapping this worker."""
        args, kwargs = self.staged[key]
        for _ in range(repeat):  # the first compiles and warms up; the profiler keeps the last
            self.entries[name](*args, **kwargs)
        _sync()
        return {}

    def artifacts(self) -> dict[str, Any]:
        """npu: the TRITON_DEBUG dumps this worker's compiles left, as Artifacts files."""
        import os

        import triton

        from harness.npu import collect_debug_dumps

        dump_dir = os.environ.get("TRITON_DUMP_DIR", "")
        records = collect_debug_dumps(dump_dir, triton_version=triton.__version__) if dump_dir else []
        return {"artifacts": [str(Path(r.metadata["dump_dir"]) / "artifacts.json") for r in records]}


# --- loading ---------------------------------------------------------------------------------

def _entry_from_file(file: str, name: str, stands_in_for: str | None = None, entry_file: str | None = None) -> Any:
    """The entry `name` of the rewrite `file` of the task's `stands_in_for` (looked up in `entry_file`,
    the task's layer file, where the two differ: `load_rewrite`)."""
    from harness.entries import attribute_path
    from harness.loading import load_kernel_module, load_rewrite

    module = load_rewrite(file, stands_in_for, entry_file, name) if stands_in_for else load_kernel_module(file)
    entry = attribute_path(module, name) if name else None
    if not callable(entry):
        raise UserFacingError(f"{file} defines no callable {name!r}",
                              "name the launch wrapper like the task's entry, or pass --candidate-entry NAME")
    return entry


def _entry_from_task(spec: dict[str, Any], attr: str, compiled: bool) -> Any:
    """The task's entry or stand-in; `spec` is a TaskSpec as JSON, as it crossed from the caller."""
    from harness.task import TaskSpec, load_job_task

    task = load_job_task(TaskSpec.from_json(spec))
    if attr == "entry":
        return task.entry
    stand_in = task.eager or task.reference if attr == "eager" else task.reference
    if stand_in is None:
        raise UserFacingError(f"task {task.name} has no reference to time", "add `reference` to the task")
    if compiled:
        import torch

        return torch.compile(stand_in)
    return stand_in


# --- calls -----------------------------------------------------------------------------------

def outputs_of(value: Any, args: tuple[Any, ...], exempt: list[int]) -> list[Any]:
    """A call's outputs: the out= arguments (`exempt`), then the returned tensors that are not one of them."""
    from harness.guards import tensors_in

    outs = tensors_in(value)
    if exempt:
        declared = [args[i] for i in sorted(exempt) if i < len(args)]
        # A returned view of a declared buffer (an in-place rotation returning q.transpose(...)) is that
        # buffer's output, not another one.
        storages = {d.untyped_storage().data_ptr() for d in declared if hasattr(d, "untyped_storage")}
        outs = declared + [o for o in outs if not any(o is d for d in declared)
                           and o.untyped_storage().data_ptr() not in storages]
    return outs


def on_host(outputs: list[Any], device: str) -> bool:
    """Whether a call on `device` returned any output in host memory. Device events time device work only:
    such an output was made where they do not look (a reference written `torch.ones(x.size())` timed at
    1.3 us on the H200, no kernel at all). Never on the CPU itself, where host memory is the device's."""
    return device != "cpu" and any(o.device.type == "cpu" for o in outputs)


def _span(t: Any) -> list[int]:
    """[first byte, bytes] of the storage a tensor lives in (views of one buffer share it)."""
    storage = t.untyped_storage()
    return [int(storage.data_ptr()), int(storage.nbytes())]


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    import torch

    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _clone_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _write_in_place(targets: tuple[Any, ...], values: tuple[Any, ...], exempt: list[int]) -> None:
    import torch

    with torch.no_grad():
        for i, (t, v) in enumerate(zip(targets, values)):
            if i not in exempt and isinstance(t, torch.Tensor) and isinstance(v, torch.Tensor) and t.shape == v.shape:
                t.copy_(v)


def _merge_log(total: CallLog, one: CallLog) -> None:
    total.launches += one.launches
    total.threads += one.threads
    total.forks += one.forks
    for name in ("kernels", "foreign_streams", "torch_ops", "host_copies", "escapes", "strided_copies"):
        have = getattr(total, name)
        have += [x for x in getattr(one, name) if x not in have]
    total.copied = {}  # addresses mean nothing once the call is over


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def _poisoned_allocations(poison: float | None) -> Iterator[None]:
    """Fill every tensor torch.empty* allocates in the block with `poison` (None: leave them as they come)."""
    if poison is None:
        yield
        return
    value: float = poison
    import torch
    from torch.overrides import TorchFunctionMode

    factories = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}

    class Poison(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in factories and isinstance(out, torch.Tensor):
                fill_poison(out, value)
            return out

    with Poison():
        yield


def fill_poison(t: Any, poison: float) -> None:
    import torch

    with torch.no_grad():
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.fill_(poison)
        elif t.dtype == torch.bool:
            t.fill_(bool(poison == poison and poison))
        else:
            info = torch.iinfo(t.dtype)
            t.fill_(info.min if poison != poison else min(int(poison), info.max))


# --- autotuners ------------------------------------------------------------------------------

def autotuners(entry: Any) -> list[Any]:
    """The @triton.autotune kernels of the entry's module that have a choice to make, also under
    @triton.heuristics or another wrapper that keeps the kernel in `.fn`."""
    from triton.runtime.autotuner import Autotuner

    found: list[Any] = []
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


@contextlib.contextmanager
def pinned(tuners: list[Any], choice: int | None) -> Iterator[str]:
    """Each autotuned kernel held to one config (its `choice`-th, or its last): a tuner picks per shape
    and per device, so a kernel is correct only if every config it may pick is. One config runs
    without benchmarking, which also lets the CPU interpreter, which has no timer, check them.
    `choice` None with tuners: no pin, and the tuners' caches emptied so that the call tunes."""
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

