"""Compile a user's kernel exactly as a real launch would specialize it, and capture what the compiler says.

How: evaluate the user's call expression with the kernel module loaded. Every Triton launch passes
through `JITFunction.run`, whose binder applies Triton's own launch specialization (16-divisibility
of pointers and integers, integers equal to 1 as constants, large integers as i64) to the actual
arguments. `knobs.runtime.jit_cache_hook` receives that specialization and tells the JIT to skip
compiling and launching; we then compile it ourselves for the requested target with remarks,
per-pass dumps and the ptxas log switched on. Without a GPU, a small driver object reports the
chosen target so the binder runs on CPU tensors; with a GPU, the real driver and device tensors
are used, so the specialization is the one the device launch gets.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ir
from harness.compile_errors import compile_failure
from harness.errors import UserFacingError, first_line
from harness.ir.artifacts import SCHEMA_VERSION, Artifacts
from harness.launches import LaunchFacts
from harness.loading import load_kernel_module
from harness.wrapper_work import TorchWork, WorkLog, recording

__all__ = ["Interception", "Launch", "capture_call", "compile_launch", "intercept_call", "intercept_callable",
           "intercept_entry", "intercept_launches", "parse_target"]

# Environment that makes the compiler explain itself. Read by Triton's C++ at pass-manager setup
# and by knobs at access time, so setting it around one compile is enough.
_CAPTURE_ENV = {
    "MLIR_ENABLE_DIAGNOSTICS": "remarks,warnings",
    "MLIR_ENABLE_DUMP": "1",
    "TRITON_ALWAYS_COMPILE": "1",
    "TRITON_DUMP_PTXAS_LOG": "1",
}


def parse_target(spec: str) -> Any:
    """"cuda:90" -> GPUTarget("cuda", 90, 32); "hip:gfx942" -> GPUTarget("hip", "gfx942", 64)."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = spec.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise UserFacingError(
        f"unknown target {spec!r}", "use cuda:<capability> (e.g. cuda:90 for Hopper) or hip:<gfx arch>"
    )


def target_name(target: Any) -> str:
    return f"{target.backend}:{target.arch}"


# How a launch of an autotuned kernel says which of its configs was compiled.
FIRST_CONFIG = "autotuned kernel: compiled config"
TUNER_PICK = "autotuned kernel: compiled the config its tuner picked on this device"


@dataclass
class Launch:
    """One intercepted kernel launch: the JIT function and the specialization Triton computed for it."""

    fn: Any  # triton.runtime.jit.JITFunction
    compile: dict[str, Any]  # what JITFunction._call_hook passes as `compile`
    config_note: str = ""
    grid: list[int] | None = None  # the launch grid, resolved against the call's arguments
    arguments: dict[str, Any] | None = None  # the launch's values by parameter (`launch_arguments`)

    @property
    def key(self) -> str:
        return f"{self.fn.fn.__qualname__}:{self.compile['key']}"


class _DriverUtils:
    """`driver.active.utils` of the stand-in driver: device properties; anything else is named as missing."""

    def __init__(self, props: dict[str, Any]) -> None:
        self._props = props

    def get_device_properties(self, _device: int = 0) -> dict[str, Any]:
        return dict(self._props)

    def __getattr__(self, name: str) -> Any:
        raise UserFacingError(f"the wrapper calls triton's driver.active.utils.{name}, which needs a GPU driver "
                              "(kernel-kb stands in for one on this CPU-only machine with device properties only)",
                              "run it on the GPU machine, where the real driver answers")


class _SpecializingDriver:
    """Stands in for a GPU driver so the JIT binder can run on CPU tensors for a chosen target.

    Only what `JITFunction.run` asks of a driver before it consults `jit_cache_hook` is provided;
    the hook stops the run before anything would launch.
    """

    def __init__(self, target: Any) -> None:
        self._target = target

    def get_current_target(self) -> Any:
        return self._target

    @property
    def utils(self) -> Any:
        """`driver.active.utils.get_device_properties(dev)`: what wrappers size their grids by."""
        from harness.cuda_shim import device_model_for

        model = device_model_for(target_name(self._target))
        props = {"multiprocessor_count": model.sm_count, "max_shared_mem": model.shared_memory_per_block,
                 "max_num_regs": model.registers_per_sm, "warpSize": 32, "sm_clock_rate": 1980000,
                 "mem_clock_rate": 2619000, "mem_bus_width": 6144}
        return _DriverUtils(props)

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_benchmarker(self) -> Any:
        raise UserFacingError(
            "the call tried to benchmark (autotuning) on a machine without a GPU",
            "kernel-kb compiles the first autotune config; report this kernel if you see this",
        )


class _NotLaunched:
    """What `kernel[grid](...)` returns under interception in place of the compiled kernel: zeros and
    empty texts for what wrappers read of it (registers, spills, assembly), since nothing compiled."""

    n_regs = 0
    n_spills = 0
    n_max_threads = 0
    shared = 0

    def __init__(self, fn: Any) -> None:
        from collections import defaultdict

        self.name = getattr(getattr(fn, "fn", None), "__name__", "kernel")
        self.asm: dict[str, str] = defaultdict(str)
        self.metadata = type("Metadata", (), {"shared": 0, "num_warps": 0, "name": self.name})()


@contextlib.contextmanager
def intercept_launches(target: Any | None) -> Iterator[list[Launch]]:
    """Within the block, Triton launches are recorded instead of compiled and run.

    Args:
        target: GPUTarget to specialize for without a device; None uses the real active driver.
    """
    from triton import knobs
    from triton.runtime import autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    note: dict[str, Any] = {"text": "", "grid": None, "args": None}

    def hook(**kwargs: Any) -> bool:
        launches.append(Launch(kwargs["fn"].jit_function, kwargs["compile"], note["text"], note["grid"], note["args"]))
        return True  # tells JITFunction.run to neither compile nor launch

    original_jit_run = JITFunction.run

    def run_noting_grid(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        # The cache hook does not see the grid; JITFunction.run does, before it calls the hook.
        note["grid"] = _resolve_grid(self, grid, args, kwargs)
        note["args"] = launch_arguments(self, args, kwargs)
        original_jit_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return _NotLaunched(self)  # wrappers that read the launch's result (k.n_regs, k.asm) go on

    original_autotune_run = autotuner.Autotuner.run

    def picked_config_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Autotuning benchmarks every config on a device, which an intercepted launch cannot: capture the
        # config the tuner picked in a real call before (`best_config`, on a GPU), else the first one.
        config = getattr(self, "best_config", None)
        if config is not None:
            note["text"] = f"{TUNER_PICK}: {config}"
        else:
            config = self.configs[0]
            note["text"] = f"{FIRST_CONFIG} 1 of {len(self.configs)} ({config})"
        merged = {**kwargs, **config.all_kwargs()}
        return self.fn.run(*args, **merged)

    previous_hook = knobs.runtime.jit_cache_hook
    # DriverConfig creates its default lazily; keeping the raw slot (None on a CPU-only machine)
    # restores exactly the state we found, without touching a GPU driver that may not exist.
    previous_driver = driver._active
    knobs.runtime.jit_cache_hook = hook
    autotuner.Autotuner.run = picked_config_run
    JITFunction.run = run_noting_grid
    if target is not None:
        driver.set_active(_SpecializingDriver(target))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
            yield launches
    finally:
        knobs.runtime.jit_cache_hook = previous_hook
        autotuner.Autotuner.run = original_autotune_run
        JITFunction.run = original_jit_run
        if target is not None:
            driver.set_active(previous_driver)


def _resolve_grid(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int] | None:
    """The grid as numbers: a callable grid gets the launch's named arguments, as Triton passes them."""
    try:
        if callable(grid):
            import inspect

            bound = inspect.signature(fn.fn).bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                                   if k in getattr(fn, "arg_names", [])})
            bound.apply_defaults()
            grid = grid({**kwargs, **bound.arguments})
        return [int(g) for g in grid]
    except Exception:  # noqa: BLE001 - an unusual grid leaves the record without one, nothing else
        return None


def launch_arguments(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The launch's values by kernel parameter, as JSON: numbers as they are; a tensor as its dtype,
    shape, strides (elements) and the byte alignment of its address. What L1 reads the launch's facts
    from (trip counts, divisibility, which buffers a kernel writes)."""
    try:
        import inspect

        names = set(getattr(fn, "arg_names", []))
        bound = inspect.signature(fn.fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in names})
    except (TypeError, ValueError):
        return None
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if isinstance(value, (bool, int, float)):
            out[name] = value
        elif hasattr(value, "data_ptr") and hasattr(value, "dtype"):
            address = int(value.data_ptr())
            out[name] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(getattr(value, "shape", [])),
                         "strides": list(value.stride()) if hasattr(value, "stride") else [],
                         "align": address & -address if address else 0}
    return out


def _gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def capture_call(
    kernel_file: str | os.PathLike[str],
    call: str,
    target: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Artifacts]:
    """Run `call` against the kernel file and compile every distinct launch it makes.

    Args:
        kernel_file: Python file with a @triton.jit kernel and (usually) its launch wrapper.
        call: expression evaluated in the module's namespace, e.g. "scale(torch.randn(1000003), 2.0)".
        target: "cuda:90"-style target; None means the GPU present, else cuda:90.
        cache_dir: where compiled artifacts are cached by content; None disables caching.
    """
    return intercept_call(kernel_file, call, target).compile(cache_dir)


def intercept_call(kernel_file: str | os.PathLike[str], call: str, target: str | None = None) -> Interception:
    """The launches `call` makes against the kernel file, intercepted (nothing compiles yet)."""
    # A module may ask the device at import (its capability, its SM count); what it prints is not ours
    # to put on stdout, where `--json` answers go.
    with device_for(target), contextlib.redirect_stdout(sys.stderr):
        module = load_kernel_module(kernel_file)
    work = WorkLog()
    return intercept_callable(lambda ns: _eval_call(call, ns, work), vars(module), target, what=f"`{call}`",
                              work=work)


@dataclass
class Interception:
    """The distinct launches of one call, intercepted for `target`: their facts (cheap) and, on
    demand, their compiled artifacts."""

    launches: list[Launch]
    target: Any  # GPUTarget
    on_device: bool
    wrapper_work: list[TorchWork] = field(default_factory=list)  # the call's own PyTorch ops

    def facts(self) -> list[LaunchFacts]:
        from dataclasses import replace

        facts = [LaunchFacts.of_launch(launch, target_name(self.target)) for launch in self.launches]
        if facts and self.wrapper_work:
            work = tuple((w.op, w.calls, w.bytes) for w in self.wrapper_work)
            facts[0] = replace(facts[0], wrapper_work=work)
        return facts

    def compile(self, cache_dir: str | os.PathLike[str] | None = None) -> list[Artifacts]:
        return [compile_launch(launch, self.target, cache_dir, launched_on="device" if self.on_device else "cpu")
                for launch in self.launches]


def capture_target(target: str | None) -> tuple[Any, bool]:
    """The GPUTarget a capture specializes for, and whether the device present is that target."""
    on_device = _gpu_present()
    tgt = (_active_target() if on_device else parse_target("cuda:90")) if target is None else parse_target(target)
    return tgt, on_device and target_name(tgt) == target_name(_active_target())


@contextlib.contextmanager
def device_for(target: str | None) -> Iterator[None]:
    """Where a capture runs user code: as it is with the target's GPU present; on a CPU-only machine
    (or for another target), under `cuda_on_cpu`, so that wrappers written for a GPU (`assert x.is_cuda`,
    `device="cuda"`, `torch.cuda.device(...)`) reach their launch."""
    tgt, on_device = capture_target(target)
    if on_device or tgt.backend != "cuda":
        yield
        return
    from triton.runtime.driver import driver

    from harness.cuda_shim import cuda_on_cpu, device_model_for

    previous = driver._active  # the raw slot: None on a CPU-only machine, restored as found
    driver.set_active(_SpecializingDriver(tgt))  # libraries ask `driver.active` at import for the target
    try:
        with cuda_on_cpu(device_model_for(target_name(tgt))):
            yield
    finally:
        driver.set_active(previous)


def intercept_callable(run: Any, namespace: dict[str, Any], target: str | None, what: str,
                       work: WorkLog | None = None) -> Interception:
    """Run user code with its Triton launches intercepted; one line when it launches none. `work`: where
    `run` recorded the PyTorch work of the entry's call (harness.wrapper_work.recording)."""
    import torch
    import triton
    import triton.language as tl

    tgt, on_device = capture_target(target)
    ns = {"torch": torch, "triton": triton, "tl": tl, **namespace}
    launches = _intercepted(run, ns, tgt, on_device, target, what)
    if on_device and any(launch.config_note.startswith(FIRST_CONFIG) for launch in launches):
        # The IR of config 1 (often the smallest tile, 2 warps: mma.sync where the pick runs wgmma) is not
        # what runs. One real call lets each tuner time its configs here and keep its pick; then again.
        failure = _tune(run, ns)
        if failure is None:
            if work is not None:
                work.ops.clear()  # the wrapper's own work, counted once
            _forget_compiled(launches)
            launches = _intercepted(run, ns, tgt, on_device, target, what)
        else:
            for launch in launches:
                launch.config_note += f"; the tuning call failed ({failure})"
    if not launches:
        raise UserFacingError(
            f"{what} made no Triton launch",
            "call the launch wrapper that runs kernel[grid](...) (for an autograd Function, its .apply), "
            "not a plain PyTorch function",
        )
    unique: dict[str, Launch] = {}
    for launch in launches:
        unique.setdefault(launch.key, launch)
    return Interception(list(unique.values()), tgt, on_device, work.items() if work else [])


def _intercepted(run: Any, ns: dict[str, Any], tgt: Any, on_device: bool, target: str | None, what: str) -> list[Launch]:
    """One pass of `run` with its launches recorded, not run."""
    import torch

    torch.manual_seed(0)
    with intercept_launches(None if on_device else tgt) as launches, device_for(target):
        with _default_device("cuda" if on_device else None), contextlib.redirect_stdout(sys.stderr):
            try:
                run(ns)
            except UserFacingError:
                raise
            except BaseException as exc:  # noqa: BLE001 - user code
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise UserFacingError(f"{what} raised {type(exc).__name__}: {first_line(exc)}",
                                      "fix the expression so that it runs against the kernel file") from exc
    return launches


def _tune(run: Any, ns: dict[str, Any]) -> str | None:
    """`run` called for real on the GPU, so that its autotuners time their configs and keep their picks;
    why it could not, else None."""
    import torch

    torch.manual_seed(0)
    try:
        with _default_device("cuda"), contextlib.redirect_stdout(sys.stderr):
            run(ns)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - user code on the device: the first config stands, said so
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


def _forget_compiled(launches: list[Launch]) -> None:
    """Drop what the real call compiled into these kernels' in-memory caches: Triton asks the cache
    hook (the interception) only on a miss, so a cached kernel would launch for real, unseen."""
    for launch in launches:
        caches = getattr(launch.fn, "device_caches", None)  # Triton 3.x: device -> (kernels, keys, ...)
        if caches is not None:
            caches.clear()


def intercept_entry(entry: Callable[..., Any], arguments: Callable[[], tuple[Any, dict[str, Any]]],
                    namespace: dict[str, Any], target: str | None, what: str) -> Interception:
    """`entry(*args, **kwargs)` intercepted, with `arguments()` -> (args, kwargs) made first, on the
    capture's device, and only the entry's own call recorded as the wrapper's PyTorch work (making the
    inputs is not the wrapper's work)."""
    work = WorkLog()

    def call(_ns: dict[str, Any]) -> Any:
        args, kwargs = arguments()
        with recording(work):
            return entry(*args, **kwargs)

    return intercept_callable(call, namespace, target, what, work=work)


def _active_target() -> Any:
    from triton.runtime.driver import driver

    return driver.active.get_current_target()


def _eval_call(call: str, ns: dict[str, Any], work: WorkLog | None = None) -> Any:
    """The user's call expression, evaluated. `f(args)`: its arguments first, then the call alone with
    its PyTorch work recorded into `work` (making the inputs is not the wrapper's work)."""
    import ast

    try:
        code = compile(call, "<call>", "eval")
    except SyntaxError as exc:
        raise UserFacingError(
            f"the call expression {call!r} is not a Python expression ({exc.msg})",
            'pass one expression, e.g. --call "scale(torch.randn(1000003), 2.0)"',
        ) from exc
    tree = ast.parse(call, mode="eval").body
    if work is None or not isinstance(tree, ast.Call) or any(isinstance(a, ast.Starred) for a in tree.args) \
            or any(k.arg is None for k in tree.keywords):
        return eval(code, ns)  # noqa: S307 - the user's own expression, run on the user's machine

    def value(node: ast.expr) -> Any:
        return eval(compile(ast.Expression(node), "<call>", "eval"), ns)  # noqa: S307 - as above

    fn, args = value(tree.func), [value(a) for a in tree.args]
    kwargs = {k.arg: value(k.value) for k in tree.keywords if k.arg}
    with recording(work):
        return fn(*args, **kwargs)


@contextlib.contextmanager
def _default_device(device: str | None) -> Iterator[None]:
    if device is None:
        yield
        return
    import torch

    previous = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(previous)


def _cache_key(launch: Launch, target: Any) -> str:
    import triton

    spec = json.loads(launch.compile["specialization_data"])
    material = json.dumps(
        {
            "schema": SCHEMA_VERSION,
            "triton": triton.__version__,
            "target": target_name(target),
            "source": launch.fn.cache_key,  # hash of the kernel source and the functions it calls
            "key": spec["key"],
            "options": spec["options"],
            "attrs": [spec["attrs_keys"], spec["attrs_vals"]],
            "constants": [spec["constant_keys"], repr(spec["constant_vals"])],
            "stages": _STAGES_RULE,
        },
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def compile_launch(
    launch: Launch, target: Any, cache_dir: str | os.PathLike[str] | None = None, launched_on: str = "cpu"
) -> Artifacts:
    """Compile one intercepted launch for `target` with diagnostics on; cached by content."""
    key = _cache_key(launch, target)
    cache_file = Path(cache_dir) / f"{key}.json" if cache_dir else None
    if cache_file is not None and cache_file.is_file():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            cached = Artifacts.from_json(cache_file.read_text())
            # The grid is not part of the specialization: the same compile serves every grid.
            cached.metadata["grid"] = launch.grid
            cached.metadata["launch_args"] = launch.arguments
            return cached
        # An unreadable cache entry (older schema, torn write) is recompiled and replaced.

    import triton
    from triton.compiler import ASTSource

    c = launch.compile
    spec = json.loads(c["specialization_data"])
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    options["extern_libs"] = tuple(tuple(x) for x in spec["options"].get("extern_libs") or ()) or None
    attrs = c["configs"][0]
    src = ASTSource(launch.fn, c["signature"], c["constants"], attrs)
    with _compiler_output() as out:
        try:
            kernel = triton.compile(src, target=target, options=options)
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile is the user's to fix
            raise compile_failure(exc, launch.fn, target_name(target)) from exc
    stderr, stdout = out["stderr"], out["stdout"]
    params = [p.name for p in launch.fn.params]
    metadata = {k: v for k, v in kernel.metadata._asdict().items() if _jsonable(v) and not k.startswith("MLIR_")}
    artifacts = Artifacts(
        kernel=launch.fn.fn.__qualname__,
        source_file=str(Path(launch.fn.fn.__code__.co_filename).resolve()),
        target=target_name(target),
        triton_version=triton.__version__,
        signature=dict(c["signature"]),
        constants={params[k[0]] if len(k) == 1 else str(k): _plain(v) for k, v in c["constants"].items()},
        arg_attrs={params[k[0]] if len(k) == 1 else str(k): [list(a) for a in v] for k, v in attrs.items()},
        options={k: _plain(v) for k, v in spec["options"].items() if k != "extern_libs"},
        stages=_stages(kernel, target),
        pass_dumps=stderr,
        remarks=ir.parse_remarks(stderr),
        ptxas=ir.parse_ptxas_log(stdout + "\n" + stderr),
        metadata=metadata,
        specialization=c["specialization_data"],
        launched_on=launched_on,
        cache_key=key,
    )
    if launch.config_note:
        artifacts.metadata["note"] = launch.config_note
    artifacts.metadata["grid"] = launch.grid
    artifacts.metadata["launch_args"] = launch.arguments
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(artifacts.to_json())
        os.replace(tmp, cache_file)  # readers see the old entry or the whole new one, never half
    return artifacts


# Which stages an entry holds: part of the cache key, so entries made before SASS was kept are redone.
_STAGES_RULE = "asm strings; sass where the ptx orders memory"


def _stages(kernel: Any, target: Any) -> dict[str, str]:
    """The compile's text stages, and its SASS where the PTX orders memory: an ordered atomic or a fence
    lowers to barriers and cache invalidations that only the machine code shows. Disassembly runs
    cuobjdump (about 0.3 s), so other kernels go without; a Triton without the tool goes without too."""
    stages = {k: v for k, v in kernel.asm.items() if isinstance(v, str) and k != "source"}
    if target_name(target).startswith("cuda") and ir.has_memory_ordering(stages.get("ptx", "")):
        try:
            from triton.tools.disasm import get_sass

            stages["sass"] = get_sass(kernel.asm["cubin"])
        except Exception:  # noqa: BLE001 - no cuobjdump, or a format it cannot read: the other stages stand
            pass
    return stages


@contextlib.contextmanager
def _compiler_output() -> Iterator[dict[str, str]]:
    """Capture what the compiler prints: C++ diagnostics and dumps on fd 2, Python prints on stdout.

    Also isolates Triton's on-disk cache so a capture never reads a cached (silent) compile.
    """
    out: dict[str, str] = {"stdout": "", "stderr": ""}
    saved_env = {k: os.environ.get(k) for k in (*_CAPTURE_ENV, "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="kb-compile-") as tmp, open(
        Path(tmp) / "stderr", "w+b"
    ) as err_file, open(Path(tmp) / "stdout", "w+b") as out_file:
        os.environ.update(_CAPTURE_ENV)
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton-cache")
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = os.dup(1), os.dup(2)
        py_stdout = io.StringIO()
        try:
            os.dup2(out_file.fileno(), 1)
            os.dup2(err_file.fileno(), 2)
            with contextlib.redirect_stdout(py_stdout), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
                yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            err_file.seek(0)
            out_file.seek(0)
            out["stderr"] = err_file.read().decode("utf-8", "replace")
            out["stdout"] = out_file.read().decode("utf-8", "replace") + py_stdout.getvalue()


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    return value if _jsonable(value) else repr(value)
