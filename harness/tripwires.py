"""What a kernel worker watches while it runs a kernel's calls: installed before the kernel's module is
imported, read by the judge as raw observations (the worker decides nothing).

- launches: every Triton launch through `JITFunction.run` / `InterpretedFunction.run` (so `kernel[grid]`,
  autotuners and heuristics), with the stream it went to;
- torch ops: a `TorchDispatchMode` sees every aten op the call runs, on the calling thread and on any
  thread the kernel's code starts; ops beyond allocation, views, copies and metadata are a fallback
  (the task's `allow_torch` extends the list). A copy of more than a few elements from the device to
  the host is one too: the work would be done outside the kernel;
- escapes: the Python-level ways to switch that mode off, each replaced by a tripwire that records its use;
- global state: torch's default dtype and device, TF32 and reduced-precision flags, determinism flags,
  random generators, Triton's hooks and the environment, snapshotted before the import and compared
  after it and after every call;
- integrity: the functions the timer, the launch counter and the guards rely on (torch's events and
  synchronize, `do_bench`, `JITFunction.run`, this package's own functions), by identity and code
  object, compared the same way. A kernel that replaces one is named, not trusted.

A kernel that edits the interpreter's memory (ctypes) can defeat any of this in its own process; see
the threat model in docs/harness.md for what the process split guarantees regardless.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallLog", "Watch", "ALLOWED_OPS"]

# aten ops a launch wrapper legitimately runs: allocation, views, copies, fills of fresh buffers,
# metadata and scalars. Everything else computes.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "arange", "tensor",
    "fill", "fill_", "zero_", "lift_fresh", "lift_fresh_copy",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "as_strided_", "permute", "transpose",
    "transpose_", "t", "t_", "expand", "expand_as", "squeeze", "squeeze_", "unsqueeze", "unsqueeze_", "slice",
    "select", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach", "detach_", "view_as",
    "view_as_real", "view_as_complex", "unflatten", "flatten", "movedim", "diagonal", "unfold", "real", "imag",
    "copy_", "clone", "_to_copy", "to", "contiguous", "_copy_from", "_copy_from_and_resize", "resize_", "set_",
    "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride",
    "is_same_size", "is_nonzero", "_has_compatible_shallow_copy_type", "record_stream", "is_pinned",
    "_pin_memory", "pin_memory", "_conj", "conj", "_neg_view", "resolve_conj", "resolve_neg",
})
# A device-to-host copy of more elements than this is work leaving the kernel (.item() and shapes are fine).
HOST_COPY_LIMIT = 64


# Copies whose result could be an output made by torch rather than by a kernel (a transpose as
# `x.t().contiguous()`, a remembered result `.clone()`d out).
_COPIES = frozenset({"clone", "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous"})


def op_base(func: Any) -> str:
    """`aten::_softmax` -> "_softmax" (the overload packet's name)."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", None)
    if name:
        return name
    text = str(func)  # "aten._softmax.default"
    return text.split(".")[1] if "." in text else text


def _package_dir(name: str) -> str:
    module = sys.modules.get(name) or __import__(name)
    return os.path.dirname(os.path.abspath(module.__file__ or "")) + os.sep


def _from_library(frame: Any) -> bool:
    """Whether a frame runs code of torch, Triton or the harness, by the file its code was compiled
    from (a module's `__name__` is the module's to set)."""
    if not _LIBRARY_DIRS:
        _LIBRARY_DIRS.extend(_package_dir(name) for name in ("torch", "triton", "harness"))
    return frame is not None and frame.f_code.co_filename.startswith(tuple(_LIBRARY_DIRS))


# The install directories of the packages whose own calls to a guard switch are not the kernel's.
_LIBRARY_DIRS: list[str] = []
# Op namespaces whose ops are torch's own: a custom op (`torch.library`) runs whatever its author wrote.
_NAMESPACES = frozenset({"aten", "prims", "profiler"})


def plain_tensor(value: Any) -> bool:
    """A tensor of torch's own classes: no subclass whose handlers (`__torch_dispatch__`,
    `__torch_function__`, overridden methods) run code of the kernel's when the harness touches it."""
    import torch

    return type(value) is torch.Tensor or type(value) is torch.nn.Parameter


def _subclass_in(args: Any, kwargs: dict[str, Any], out: Any) -> str | None:
    """The class name of a tensor subclass among an op's arguments (one level into lists) and results."""
    import torch

    values = [*args, *kwargs.values(), *(out if isinstance(out, (tuple, list)) else (out,))]
    for value in values:
        for one in (value if type(value) in (tuple, list) else (value,)):
            if isinstance(one, torch.Tensor) and not plain_tensor(one):
                return type(one).__name__
    return None


def _holders() -> tuple[type, ...]:
    """Triton's own argument types that hold a tensor, read in the launch: triton.reinterpret's view, a TMA
    descriptor (where this Triton has one)."""
    from triton.runtime.jit import TensorWrapper

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return (TensorWrapper,)
    return (TensorWrapper, TensorDescriptor)


_HOLDERS: tuple[type, ...] = ()  # set when the launch counter is installed (triton imported then)


def _torch_size() -> type:
    import torch

    return torch.Size


def _copy_ends(name: str, args: Any, out: Any) -> tuple[Any, Any]:
    """A copy op's source and destination: `dst.copy_(src)` writes its first argument; the others
    (`clone`, `_to_copy`, `contiguous`, `_copy_from`, ...) read their first and return the copy."""
    if name == "copy_":
        return (args[1] if len(args) > 1 else None), (args[0] if args else None)
    return (args[0] if args else None), out


def _launch_escape(kernel: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What a launch would run below the guard: Triton calls a kernel's pre-run hooks and reads its pointer
    arguments' `data_ptr()` inside its launch code, where the guard stands aside (the interpreter's
    copies are torch ops)."""
    if getattr(kernel, "pre_run_hooks", None):
        return f"a pre-run hook on {name}, which Triton runs inside the launch"
    grid = kwargs.get("grid")
    plain = (tuple, list, _torch_size())  # `kernel[x.shape[:1]]`: a torch.Size is a tuple of ints too
    if grid is not None and not callable(grid) and (type(grid) not in plain or any(
            type(g) not in (int, bool) and type(g).__module__ != "numpy" for g in grid)):
        return (f"the grid of {name} is a {type(grid).__name__} of {[type(g).__name__ for g in grid][:3]}, "
                "not a tuple of ints: Triton reads it inside the launch")
    values = [*args, *kwargs.values()]
    while any(type(v) in (tuple, list) for v in values):  # a tuple argument's elements are launch arguments too
        values = [e for v in values for e in (v if type(v) in (tuple, list) else (v,))]
    for value in values:
        inner = value.base if type(value) in _HOLDERS else value
        if hasattr(type(inner), "data_ptr") and not plain_tensor(inner):
            return f"an argument of {name} that is a {type(inner).__name__}, not a tensor: its data_ptr() runs in the launch"
        if isinstance(value, (int, float)) and type(value) not in (int, float, bool) \
                and type(value).__module__ != "numpy":
            return (f"an argument of {name} that is a {type(value).__name__}, a number with methods of its own: "
                    "Triton compares and hashes it in the launch")
    return None


def allowed_op(name: str, allow_torch: frozenset[str]) -> bool:
    if name in ALLOWED_OPS:
        return True
    bare = name.strip("_").removesuffix("_")
    return name in allow_torch or bare in allow_torch or any(bare in _ALIASES.get(a, ()) for a in allow_torch)


# `allow_torch` names torch's Python API; these are the aten ops behind a few of them.
_ALIASES = {
    "matmul": {"mm", "bmm", "addmm", "baddbmm", "matmul", "mv", "dot"},
    "softmax": {"softmax", "log_softmax"}, "max": {"max", "amax"}, "min": {"min", "amin"},
    "sum": {"sum"}, "mean": {"mean"}, "norm": {"norm", "linalg_vector_norm"}, "cat": {"cat", "stack"}, "random": {"normal", "uniform", "randn", "rand",
                                                                           "randint", "random", "bernoulli"},
}


@dataclass
class CallLog:
    """What one call of the entry did, as the worker saw it."""

    launches: int = 0
    kernels: list[str] = field(default_factory=list)
    foreign_streams: list[str] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)  # disallowed aten ops, in order of first use
    host_copies: list[str] = field(default_factory=list)
    escapes: list[str] = field(default_factory=list)  # guard switches used
    threads: int = 0  # threads started
    forks: int = 0
    copied: dict[int, str] = field(default_factory=dict)  # storage address -> the torch copy that wrote it
    # Torch copies that read or wrote a strided view (`x.t().contiguous()`, a broadcast materialised): for a
    # transpose or a permute that is the whole operation, whoever launches a kernel to copy it on.
    strided_copies: list[str] = field(default_factory=list)


class Watch:
    """The worker's instruments, installed once, before any kernel module is imported."""

    def __init__(self, allow_torch: tuple[str, ...] = (), device: str = "cpu") -> None:
        import torch

        self.allow = frozenset(allow_torch)
        self.device = device
        self.log: CallLog | None = None  # the call in progress
        # Per thread, how deep we are in each zone: "ours" (this module switching its own modes on or
        # off), "tuning" (an autotuner benchmarking its configs), "launching" (Triton's own launch code).
        self._zones = threading.local()
        self._guard_class = self._make_guard_class()
        self._main_guard = self._guard_class()  # the calling thread's; a thread the kernel starts gets its own
        self.stream = torch.cuda.current_stream() if device == "cuda" else None
        self._install_launch_counter()
        self._install_tuning_zone()
        self._install_escape_tripwires()
        self._install_thread_and_fork_watch()
        self._install_host_reads()
        _install_registration_watch({op.split("::")[0] for op in self.allow if "::" in op})
        self.state = global_state()
        self.integrity = integrity_snapshot()

    # --- one call --------------------------------------------------------------------------

    @contextlib.contextmanager
    def call(self) -> Iterator[CallLog]:
        """The block is one call of the entry: every launch, op, thread and fork is logged."""
        log = CallLog()
        guard = self._main_guard
        self.log = log
        with self.ours():
            guard.__enter__()
        try:
            yield log
        finally:
            with self.ours():
                try:
                    guard.__exit__(None, None, None)
                except Exception:  # noqa: BLE001 - the kernel popped our mode: its stack is not ours to fix
                    log.escapes.append("the dispatch mode stack was changed during the call")
            self.log = None

    @contextlib.contextmanager
    def zone(self, name: str) -> Iterator[None]:
        """The block, on this thread, is in zone `name` (see `_zones`)."""
        setattr(self._zones, name, self.in_zone(name) + 1)
        try:
            yield
        finally:
            setattr(self._zones, name, self.in_zone(name) - 1)

    def in_zone(self, name: str) -> int:
        return getattr(self._zones, name, 0)

    def outside_launch(self, function: Any) -> Any:
        """`function` (a launch's grid callable: the kernel's code) watched although Triton calls it
        from inside its launch."""
        watch = self

        def watched(*args: Any, **kwargs: Any) -> Any:
            depth = watch.in_zone("launching")
            watch._zones.launching = 0
            try:
                return function(*args, **kwargs)
            finally:
                watch._zones.launching = depth

        return watched

    def ours(self) -> Any:
        """The block is this module switching its own modes: no tripwire fires for it."""
        return self.zone("ours")

    def state_changes(self, baseline: dict[str, str] | None = None) -> list[str]:
        """Global state that differs from the snapshot (or from `baseline`)."""
        now = global_state()
        before = baseline if baseline is not None else self.state
        return [f"{k}: {before.get(k, '-')} -> {now.get(k, '-')}" for k in sorted(set(before) | set(now))
                if before.get(k) != now.get(k)]

    def tampering(self) -> list[str]:
        now = integrity_snapshot()
        return sorted(name for name, ident in self.integrity.items() if now.get(name) != ident)

    # --- instruments -----------------------------------------------------------------------

    def _guard(self) -> Any:
        return self._guard_class()

    def _make_guard_class(self) -> type:
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self

        class FallbackGuard(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                watch._saw(func, args, kwargs or {}, out)
                return out

        return FallbackGuard

    def _saw(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        log = self.log
        if log is None or self.in_zone("tuning") or self.in_zone("launching"):
            return  # the autotuner's benchmarking and Triton's own launch (the interpreter copies back)
        name = op_base(func)
        namespace = getattr(func, "namespace", "aten")
        if namespace not in _NAMESPACES:
            # A custom op (torch.library) runs whatever its body is, below the guard, whatever its name:
            # allowed only where the task names it (a kernel the task itself wraps as a custom op).
            label = f"{namespace}::{name}"
            if label not in self.allow and f"{namespace}::*" not in self.allow and label not in log.torch_ops:
                log.torch_ops.append(label)
            return
        odd = _subclass_in(args, kwargs, out)
        if odd is not None:
            # Below this handler the mode is off: a subclass's own __torch_dispatch__ runs its code unwatched.
            escape = f"a tensor subclass, {odd}, through aten::{name}"
            if escape not in log.escapes:
                log.escapes.append(escape)
        if not allowed_op(name, self.allow):
            label = f"aten::{name}"
            if label not in log.torch_ops:
                log.torch_ops.append(label)
            return
        if name in ("_to_copy", "copy_", "to", "_copy_from") and self.device != "cpu":
            self._host_copy(name, args, out, log)
        if name in _COPIES and "copy" not in self.allow:
            import torch

            source, target = _copy_ends(name, args, out)
            if isinstance(target, torch.Tensor) and target.numel() > HOST_COPY_LIMIT:
                log.copied[target.untyped_storage().data_ptr()] = f"aten::{name}"
            strided = [t for t in (source, target) if isinstance(t, torch.Tensor) and t.numel() > HOST_COPY_LIMIT
                       and not t.is_contiguous()]
            if strided:
                what = f"aten::{name} of a strided {tuple(strided[0].shape)} view"
                if what not in log.strided_copies:
                    log.strided_copies.append(what)

    def _host_copy(self, name: str, args: Any, out: Any, log: CallLog) -> None:
        import torch

        source, target = _copy_ends(name, args, out)
        if isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor) \
                and source.device.type != "cpu" and target.device.type == "cpu" and target.numel() > HOST_COPY_LIMIT:
            log.host_copies.append(f"{target.numel()} elements copied to the host ({name})")

    def _install_launch_counter(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        global _HOLDERS
        _HOLDERS = _holders()
        watch = self
        for cls in (JITFunction, InterpretedFunction):
            original = cls.run

            def run(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                log = watch.log
                if log is not None and not kwargs.get("warmup", False):
                    name = getattr(getattr(self, "fn", None), "__name__", "kernel")
                    odd = _launch_escape(self, name, args, kwargs)
                    if odd is not None and odd not in log.escapes:
                        log.escapes.append(odd)
                    log.launches += 1
                    if name not in log.kernels:
                        log.kernels.append(name)
                    if watch.stream is not None:
                        import torch

                        if torch.cuda.current_stream() != watch.stream and name not in log.foreign_streams:
                            log.foreign_streams.append(name)
                grid = kwargs.get("grid")
                if callable(grid):
                    kwargs["grid"] = watch.outside_launch(grid)  # Triton calls it inside its launch code
                with watch.zone("launching"):
                    return _original(self, *args, **kwargs)

            cls.run = run

    def _install_tuning_zone(self) -> None:
        """An autotuner benchmarking its configs runs Triton's do_bench, whose statistics may use torch
        (torch.quantile in some versions): not the kernel computing its output. The guard stands aside
        for `Autotuner._bench` only; the tuned config's real run, pre_hook included, is watched."""
        from triton.runtime.autotuner import Autotuner

        original = getattr(Autotuner, "_bench", None)
        if original is None:
            return
        watch = self

        run = Autotuner.run

        def bench(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not watch.in_zone("autotuner"):  # the kernel calling _bench itself: nothing to stand aside for
                return original(self, *args, **kwargs)
            with watch.zone("tuning"):
                return original(self, *args, **kwargs)

        def tuned_run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with watch.zone("autotuner"):
                return run(self, *args, **kwargs)

        Autotuner._bench = bench
        Autotuner.run = tuned_run

    def _install_escape_tripwires(self) -> None:
        """The Python switches that turn a dispatch mode off record their use during a call."""
        import torch
        import torch.utils._python_dispatch as python_dispatch

        watch = self

        def tripwire(owner: Any, name: str, label: str | None = None, library_uses: bool = False) -> None:
            """`library_uses`: torch's own code calls it too (its compiler, its subclasses): only a call from
            elsewhere is the kernel's."""
            original = getattr(owner, name, None)
            if original is None:
                return
            said = label or name

            def wrap(skip_library: bool) -> Any:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    log = watch.log
                    if log is not None and not watch.in_zone("ours") and said not in log.escapes and not (
                            skip_library and _from_library(sys._getframe(1))):
                        log.escapes.append(said)
                    return original(*args, **kwargs)

                return wrapper

            setattr(owner, name, wrap(library_uses))  # no __wrapped__: the original would be one attribute away
            # Other names torch bound to the same switch get a tripwire that lets torch's own calls through.
            installed.append((original, wrap(True)))
            _TRIPWIRED.append((f"{getattr(owner, '__name__', owner)}.{name}", owner, name))

        installed: list[tuple[Any, Any]] = []
        for name in ("_disable_current_modes", "_pop_mode_temporarily", "_pop_mode"):
            tripwire(python_dispatch, name)
        for name in ("_DisableTorchDispatch", "_pop_torch_dispatch_stack", "_unset_dispatch_mode",
                     "_set_dispatch_mode", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                     "_pop_torch_function_stack"):
            tripwire(torch._C, name)
        # Switches below the mode stack: the Python dispatch key excluded, a mode pushed back after a pop.
        for name in ("_ExcludeDispatchKeyGuard", "_ForceDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded",
                     "_dispatch_tls_set_dispatch_key_included", "_push_on_torch_dispatch_stack"):
            tripwire(torch._C, name, library_uses=True)
        # Asking whether a mode is on: a kernel honest only while judged.
        for owner, names in ((python_dispatch, ("_get_current_dispatch_mode", "_get_current_dispatch_mode_stack",
                                                "is_in_torch_dispatch_mode", "any_torch_dispatch_mode_on")),
                             (torch._C, ("_get_dispatch_mode", "_len_torch_dispatch_stack", "_get_dispatch_stack_at"))):
            for name in names:
                tripwire(owner, name, f"asked whether a dispatch mode is on ({name})", library_uses=True)
        _rebind_aliases(installed)

    def _install_host_reads(self) -> None:
        """`.numpy()` and `.tolist()` of a tensor larger than a few elements during a call: the data leaves for
        NumPy or Python, which compute below the dispatcher (on a GPU the device-to-host copy shows it; on the
        CPU interpreter these read the memory in place and no aten op runs)."""
        import torch

        watch = self
        for name in ("numpy", "tolist"):
            original = getattr(torch.Tensor, name)

            def read(tensor: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                log = watch.log
                if log is not None and not watch.in_zone("ours") and tensor.numel() > HOST_COPY_LIMIT \
                        and not _from_library(sys._getframe(1)):
                    said = f"{tensor.numel()} elements read on the host (.{_name}())"
                    if said not in log.host_copies:
                        log.host_copies.append(said)
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, read)
            _TRIPWIRED.append((f"torch.Tensor.{name}", torch.Tensor, name))

    def _install_thread_and_fork_watch(self) -> None:
        """A thread the kernel starts runs under the same fallback guard; a fork is counted."""
        watch = self
        for name in ("_start_new_thread", "_start_joinable_thread"):
            original = getattr(threading, name, None)
            if original is None:
                continue

            def start(function: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                log = watch.log
                if log is not None:
                    log.threads += 1
                guard = watch._guard()

                def guarded(*a: Any, **k: Any) -> Any:
                    with watch.ours():
                        guard.__enter__()
                    try:
                        return function(*a, **k)
                    finally:
                        with watch.ours():
                            guard.__exit__(None, None, None)

                return _original(guarded, *args, **kwargs)

            setattr(threading, name, start)

        def forked() -> None:
            log = watch.log
            if log is not None:
                log.forks += 1

        os.register_at_fork(before=forked)


# What the tripwires replaced, by label, owner and attribute: the integrity snapshot holds them too.
_TRIPWIRED: list[tuple[str, Any, str]] = []


def _rebind_aliases(installed: list[tuple[Any, Any]]) -> None:
    """Names torch's modules bound to a switch before its tripwire went in (`torch.utils._mode_utils.
    no_dispatch` is `torch._C._DisableTorchDispatch` itself) now name the tripwire too."""
    originals = {id(original): wrapper for original, wrapper in installed}
    owners = {id(owner) for _, owner, _ in _TRIPWIRED}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("torch") or module is None or id(module) in owners:
            continue
        for attr, value in list(vars(module).items()):
            wrapper = originals.get(id(value))
            if wrapper is not None:
                setattr(module, attr, wrapper)


# --- op registrations ------------------------------------------------------------------------

# Operator libraries the kernel's own code opened (torch.library): a kernel registered for an aten op
# (`Library("aten", "IMPL").impl("view", f, "CPU")`) runs f under an allowed op's name, below the guard.
_KERNEL_REGISTRATIONS: list[str] = []


def _install_registration_watch(allowed: set[str]) -> None:
    """`allowed`: the namespaces of the custom ops the task names in allow_torch (its own kernel's)."""
    import torch

    original = torch._C._dispatch_library

    library = tuple(os.path.join(_package_dir("torch"), sub) for sub in ("library.py", "_library"))

    def dispatch_library(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 and args[1] in allowed:
            return original(*args, **kwargs)
        frame: Any = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(library):
            frame = frame.f_back  # torch.library's helpers (impl, define, custom_op) open libraries for their caller
        if not _from_library(frame):
            _KERNEL_REGISTRATIONS.append(f"{frame.f_code.co_filename if frame else '?'}: {args[:2]}")
        return original(*args, **kwargs)

    torch._C._dispatch_library = dispatch_library


# --- snapshots -------------------------------------------------------------------------------

def global_state() -> dict[str, str]:
    """torch's and Triton's process-wide settings a kernel could change to be judged more kindly."""
    import torch

    state: dict[str, Any] = {
        "torch default dtype": torch.get_default_dtype(),
        "torch float32 matmul precision": torch.get_float32_matmul_precision(),
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.backends.cudnn.enabled": torch.backends.cudnn.enabled,
        "torch.backends.cudnn.benchmark": torch.backends.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": torch.backends.cudnn.deterministic,
        "torch deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch grad mode": torch.is_grad_enabled(),
        "torch cpu random state": hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:12],
        "torch operator libraries opened by the kernel (torch.library)": len(_KERNEL_REGISTRATIONS),
    }
    for flag in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        state[f"torch.backends.cuda.matmul.{flag}"] = getattr(torch.backends.cuda.matmul, flag, None)
    if hasattr(torch, "get_default_device"):
        state["torch default device"] = torch.get_default_device()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch cuda random state"] = hashlib.sha1(torch.cuda.get_rng_state().numpy().tobytes()).hexdigest()[:12]
        state["torch cuda device"] = torch.cuda.current_device()
    try:
        from triton import knobs

        for group, names in (("runtime", ("jit_cache_hook", "jit_post_compile_hook", "launch_enter_hook",
                                          "launch_exit_hook")), ("language", ("fp32_default",))):
            for name in names:
                state[f"triton.knobs.{group}.{name}"] = _identity(getattr(getattr(knobs, group), name, None))
    except ImportError:  # a triton without knobs
        pass
    for key, value in os.environ.items():
        if key.startswith(_WATCHED_ENVIRONMENT) and not key.startswith("TORCHINDUCTOR_"):
            state[f"environment {key}"] = value
    return {k: str(v) for k, v in state.items()}


# Environment that changes numerics or launches (NVIDIA_TF32_OVERRIDE, TRITON_F32_DEFAULT,
# CUDA_LAUNCH_BLOCKING, ...). Libraries set others lazily (torch's inductor cache directory, say).
_WATCHED_ENVIRONMENT = ("TRITON_", "CUDA_", "NVIDIA_", "CUBLAS", "PYTORCH_", "TORCH_", "MLIR_", "LLVM_")


def _identity(value: Any) -> str:
    return "None" if value is None else (repr(value) if isinstance(value, (str, int, float, bool))
                                         else f"{type(value).__name__}@{id(value):x}")


def _critical() -> list[tuple[str, Any, str]]:
    """(label, owner, attribute) of what the worker's measurements rely on."""
    import torch
    import triton.testing
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    spots = [("torch.cuda.synchronize", torch.cuda, "synchronize"), ("torch.cuda.Event", torch.cuda, "Event"),
             ("torch.cuda.current_stream", torch.cuda, "current_stream"), ("torch.cuda.Stream", torch.cuda, "Stream"),
             ("triton.testing.do_bench", triton.testing, "do_bench"), ("JITFunction.run", JITFunction, "run"),
             ("InterpretedFunction.run", InterpretedFunction, "run"), ("Autotuner.run", Autotuner, "run"),
             ("Autotuner._bench", Autotuner, "_bench"),
             ("torch.empty", torch, "empty"), ("torch.empty_like", torch, "empty_like"),
             ("torch.empty_strided", torch, "empty_strided"), ("torch.Tensor.new_empty", torch.Tensor, "new_empty"),
             ("torch.Tensor.data_ptr", torch.Tensor, "data_ptr"), ("torch.Tensor.clone", torch.Tensor, "clone"),
             ("torch.Tensor.copy_", torch.Tensor, "copy_"), ("torch.as_strided", torch, "as_strided"),
             ("time.perf_counter", sys.modules["time"], "perf_counter"), ("os.fork", os, "fork")]
    for name in ("record", "elapsed_time", "synchronize", "query"):
        spots.append((f"torch.cuda.Event.{name}", torch.cuda.Event, name))
    for label in ("_disable_current_modes", "_pop_mode_temporarily", "_pop_mode"):
        spots.append((f"torch.utils._python_dispatch.{label}", sys.modules["torch.utils._python_dispatch"], label))
    for name in ("__enter__", "__exit__"):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        spots.append((f"TorchDispatchMode.{name}", TorchDispatchMode, name))
        spots.append((f"TorchFunctionMode.{name}", TorchFunctionMode, name))
    for module_name, module in list(sys.modules.items()):
        if module_name == "harness" or module_name.startswith("harness."):
            for attr, value in list(vars(module).items()):
                if attr.lstrip("_")[:1].isupper() and attr.isupper() and isinstance(value, _CONSTANTS):
                    spots.append((f"{module_name}.{attr}", module, attr))  # ALLOWED_OPS, HOST_COPY_LIMIT, ...
                if callable(value) and getattr(value, "__module__", "") == module_name:
                    spots.append((f"{module_name}.{attr}", module, attr))
                    for inner, member in list(vars(value).items()) if isinstance(value, type) else []:
                        if callable(member):
                            spots.append((f"{module_name}.{attr}.{inner}", value, inner))
            spots.append((f"sys.modules[{module_name!r}]", sys.modules, module_name))
    return spots + _TRIPWIRED


# Module constants rebinding replaces (the guard's lists and limits); mutable ones may be caches.
_CONSTANTS = (frozenset, tuple, int, float, str, bytes)


def _namespace_digest(namespace: Any, callables: bool = False) -> str:
    """Which attributes a class or module holds, by identity: a method added or replaced on torch.Tensor
    (`detach`, which the hand-over calls on every output) changes it. `callables`: functions and classes
    only (a module's flags change as it runs: the dispatch module's is-in-a-mode flag)."""
    items = [(k, id(v)) for k, v in vars(namespace).items() if not callables or callable(v)]
    return hashlib.sha1(repr(sorted(items)).encode()).hexdigest()[:16]


def integrity_snapshot() -> dict[str, str]:
    """Identity (and code object, for Python functions) of every critical function and constant, and the
    attributes of torch's tensor classes."""
    import torch

    out: dict[str, str] = {"torch.Tensor": _namespace_digest(torch.Tensor),
                           "torch._C.TensorBase": _namespace_digest(torch._C.TensorBase)}
    # The modules the worker's own machinery calls into: its answers (json), its hand-overs (uuid), its
    # guard's mode stack (torch.utils._python_dispatch).
    for name in ("json", "json.encoder", "uuid", "torch.utils._python_dispatch", "torch.utils._mode_utils"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = _namespace_digest(module, callables=True)
    for label, owner, attr in _critical():
        value = owner.get(attr) if isinstance(owner, dict) else getattr(owner, attr, None)
        code = getattr(value, "__code__", None)
        out[label] = f"{id(value):x}:{id(code):x}" if code is not None else f"{id(value):x}"
    return out
