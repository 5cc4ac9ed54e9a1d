"""Tasks: what to run, as a small Python module.

A task file defines (only the first three are required):

    entry       the launch wrapper: a callable that launches the Triton kernel and returns its
                output tensor(s). Import it from the kernel file beside the task, or define it here.
    inputs      inputs(**case) -> tuple of positional arguments for `entry`, or `Call(args, kwargs)`
                when the call needs keyword arguments (`out=`, `dim=`). Tensors are created on
                the device under test (the harness sets torch's default device), so write
                `torch.randn(n)`, not `torch.randn(n, device="cuda")`. Use random values, never
                zeros: the harness seeds torch before each call and checks several seeds.
    cases       list of dicts, one per case (shapes, dtypes, ...). Benchmark operators carry at
                least 5.
    heldout     more cases, checked for correctness only and never timed, so that a rewrite
                specialised to the benchmark shapes is caught.
    reference   a PyTorch callable with entry's signature. Without one the task's own initial
                entry is the reference (candidates are then checked against it).
    eager       PyTorch as an engineer would write the operation for speed, at the kernel's own
                dtypes: the stand-in that kernels are timed against (`--vs eager`, and through
                torch.compile for `--vs compiled`). Default: `reference`. Give it when the reference
                computes in a wider type for accuracy (float64 sums, float32 matmuls): timing against
                that would flatter the kernel.
    tolerances  {"atol": .., "rtol": ..} for every output, or per dtype name:
                {"float16": {"atol": .., "rtol": ..}}. Defaults: `DEFAULT_TOLERANCES`.
    outputs     indices of arguments the kernel writes in place (an `out=` style wrapper). They
                are poisoned before each call and excluded from the mutated-input check.
    inouts      indices of arguments the kernel reads and writes (it accumulates into them). They
                are compared as outputs, never poisoned. Without `outputs` and `inouts`, both are
                inferred from the task's own kernel (`harness.roles`).
    bytes, flops  bytes(**case) / flops(**case): the minimum traffic and work of one call, for the
                roofline position. Give what the operation needs, not what the kernel does.
    allow_torch names of torch calls the wrapper may make beyond allocation (e.g. ["sum"] for a
                two-stage reduction finished by torch); anything else is a torch fallback.
    warm_cache  True when the workload is meant to run with a warm L2 (no flush between reps).
    heldout_ranges  where held-out cases may be drawn from, per case key: (lo, hi) for an integer
                (drawn log-uniformly, often an odd size), or a list of values. Each run draws new
                cases in these ranges from its seed (keys not named keep a listed case's value), so a
                kernel specialised to the shapes it can read in this file is caught. Only ranges the
                task's own kernel supports belong here.
    family      the operator's family ("elementwise", "reduction", "matmul", ...): benchmark reports
                group by it and pattern statistics record it.

A kernel file from the wild needs no task file: `task_from_call(FILE, "add(torch.randn(4096), torch.randn(4096))")`
makes one case out of the example call (fresh random values per seed come from re-evaluating its
arguments and keywords), and held-out cases out of its sizes (`harness.call_sizes`).
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.call_sizes import call_sizes, resized, size_ranges
from harness.capture import Interception, device_for, intercept_entry
from harness.entries import defining_file, entry_name, kernel_file_of, launch_code
from harness.errors import UserFacingError
from harness.ir.artifacts import Artifacts
from harness.loading import load_kernel_module

__all__ = ["DEFAULT_TOLERANCES", "INPUT_SCALE", "SCALE_KEY", "Call", "Task", "TaskSpec", "capture_task",
           "intercept_task", "load_job_task", "load_task", "task_files",
           "task_from_call", "task_name", "tolerance_for"]

# evaluation.md: fp32 ~1e-4 relative (tf32 dots need the task to loosen it), fp16 1e-2, bf16 2e-2;
# integers and data movement exact.
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"atol": 1e-8, "rtol": 1e-7},
    "float32": {"atol": 1e-5, "rtol": 1e-4},
    "float16": {"atol": 1e-3, "rtol": 1e-2},
    "bfloat16": {"atol": 1e-2, "rtol": 2e-2},
}
_EXACT = {"atol": 0.0, "rtol": 0.0}
# Every run also checks one held-out case with the floating-point inputs scaled: randn's values stay within
# |x| < 6, and a kernel right only there (a polynomial for exp, a clamp, an fp16 intermediate) would pass
# every other check. The judge holds candidates to it only where the task's own kernel passes it.
INPUT_SCALE = 16.0
SCALE_KEY = "input scale"


@dataclass(frozen=True)
class Call:
    """What `inputs(**case)` returns when the entry takes keyword arguments too."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    name: str
    entry: Callable[..., Any]
    inputs: Callable[..., tuple[Any, ...] | Call]
    cases: list[dict[str, Any]]
    reference: Callable[..., Any] | None = None
    eager: Callable[..., Any] | None = None  # the speed stand-in; None: the reference
    tolerances: dict[str, Any] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)
    heldout: list[dict[str, Any]] = field(default_factory=list)
    outputs: tuple[int, ...] = ()
    inouts: tuple[int, ...] = ()
    bytes: Callable[..., float] | None = None
    flops: Callable[..., float] | None = None
    allow_torch: tuple[str, ...] = ()
    warm_cache: bool = False
    family: str = ""
    path: str = ""  # the file it came from; workers load tasks by path
    source_file: str = ""  # the file defining the entry (for the static guards)
    # The file defining the kernels the entry launches, which an optimize run rewrites: `source_file`,
    # unless that defines none and the entry's code names kernels of one other file (`kernel_file_of`).
    kernel_file: str = ""
    heldout_ranges: dict[str, Any] = field(default_factory=dict)
    # The ranges were inferred (a call's sizes, `harness.call_sizes`), not declared by someone who knows
    # the kernel: each drawn case varies one size, and holds candidates only where the task's own kernel
    # passes it.
    inferred_ranges: bool = False
    smaller: dict[str, Any] = field(default_factory=dict)  # a call's sizes cut down, for its scaled-input case

    def case_label(self, case: dict[str, Any]) -> str:
        return ",".join(f"{k}={_short(v)}" for k, v in case.items()) or "default"

    def case_bytes(self, case: dict[str, Any]) -> float | None:
        return _figure(self.bytes, case)

    def case_flops(self, case: dict[str, Any]) -> float | None:
        return _figure(self.flops, case)

    def arguments(self, case: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """One call's positional and keyword arguments for `case`, freshly made."""
        case = dict(case)
        scale = case.pop(SCALE_KEY, None)
        made = self.inputs(**case)
        args, kwargs = (tuple(made.args), dict(made.kwargs)) if isinstance(made, Call) else (tuple(made), {})
        if scale is None:
            return args, kwargs
        return _scaled(args, scale), {k: _scaled(v, scale) for k, v in kwargs.items()}

    def scaled_case(self) -> dict[str, Any]:
        """The case checked with its inputs scaled (`INPUT_SCALE`): the held-out case whose sizes multiply
        to the most (held-out cases are small, and one of a single element would say little); without
        one, the first listed, with sizes inferred from a call cut to an eighth (the check of a call's own
        size on the interpreter is what a run of a wild kernel spends its time on)."""
        base = max(self.heldout, key=_extent) if self.heldout else {**self.cases[0], **self.smaller}
        return {**base, SCALE_KEY: INPUT_SCALE}

    def generated_cases(self, rng: Any, count: int) -> list[dict[str, Any]]:
        """`count` held-out cases drawn from `heldout_ranges` with `rng` (none without ranges)."""
        if not self.heldout_ranges or count <= 0 or not self.cases:
            return []
        out = []
        keys = list(self.heldout_ranges)
        first = rng.randrange(len(keys))
        for i in range(count):
            case = dict(rng.choice(self.cases))
            # Inferred ranges change one size a case: a kernel that needs one dimension as written (a
            # power-of-two head) still meets held-out cases in the others.
            for key in [keys[(first + i) % len(keys)]] if self.inferred_ranges else keys:
                case[key] = _draw(self.heldout_ranges[key], rng)
            out.append(case)
        return out


def tolerance_for(task: Task, dtype_name: str) -> dict[str, float]:
    """atol/rtol for an output of this dtype: the task's, else the default for the dtype."""
    tol = task.tolerances
    if "atol" in tol or "rtol" in tol:
        return {"atol": float(tol.get("atol", 0.0)), "rtol": float(tol.get("rtol", 0.0))}
    if dtype_name in tol:
        return {"atol": 0.0, "rtol": 0.0, **{k: float(v) for k, v in tol[dtype_name].items()}}
    return dict(DEFAULT_TOLERANCES.get(dtype_name, _EXACT))


def load_task(path: str | os.PathLike[str]) -> Task:
    module = load_kernel_module(path)
    ns = vars(module)
    missing = [name for name in ("entry", "inputs", "cases") if name not in ns]
    if missing:
        raise UserFacingError(f"task file {path} lacks {', '.join(missing)}",
                              "define entry (launch wrapper), inputs(**case) and cases (list of dicts)")
    if not callable(ns["entry"]) or not callable(ns["inputs"]):
        raise UserFacingError(f"task file {path}: entry and inputs must be callables", "see harness/task.py")
    cases = _case_list(ns["cases"], path, "cases")
    if not cases:
        raise UserFacingError(f"task file {path}: cases is empty", "e.g. cases = [dict(n=4096)]")
    for name in ("reference", "eager", "bytes", "flops"):
        if ns.get(name) is not None and not callable(ns[name]):
            raise UserFacingError(f"task file {path}: {name} must be a callable", "see harness/task.py")
    source = defining_file(ns["entry"], path)
    return Task(
        name=task_name(path),
        entry=ns["entry"],
        inputs=ns["inputs"],
        cases=cases,
        reference=ns.get("reference"),
        eager=ns.get("eager"),
        tolerances=dict(ns.get("tolerances", {})),
        namespace=ns,
        heldout=_case_list(ns.get("heldout", []), path, "heldout"),
        outputs=tuple(int(i) for i in ns.get("outputs", ())),
        inouts=tuple(int(i) for i in ns.get("inouts", ())),
        bytes=ns.get("bytes"),
        flops=ns.get("flops"),
        allow_torch=tuple(ns.get("allow_torch", ())),
        warm_cache=bool(ns.get("warm_cache", False)),
        family=str(ns.get("family", "")),
        path=str(Path(path).resolve()),
        source_file=source,
        kernel_file=kernel_file_of(ns["entry"], source),
        heldout_ranges=_ranges(ns.get("heldout_ranges", {}), path),
    )


@dataclass(frozen=True)
class TaskSpec:
    """How a task is named wherever it travels (to a worker, into a run's record): a task file, or a
    kernel file from the wild with an example call (and what it must equal). As JSON it is the fields
    that are set, which is what runs recorded before this class existed hold too.

    Attributes:
        path: a task module (entry, inputs, cases, reference).
        kernel, call, reference: a kernel file, an expression that launches it, and (optionally) a
            PyTorch expression its outputs must equal; `tolerances` overrides the task's.
        family: the task's family (softmax, matmul, ...), recorded with a run so that synthesis files
            its rounds without loading the task; None on runs recorded before it was.
    """

    path: str | None = None
    kernel: str | None = None
    call: str | None = None
    reference: str | None = None
    tolerances: dict[str, Any] | None = None  # Task.tolerances' forms: atol/rtol, or per dtype name
    family: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.kernel is None):
            raise UserFacingError("a task is a task file, or a kernel file with a call; not both, not neither",
                                  "give a TASK file, or --kernel FILE --call EXPR")

    @classmethod
    def of_file(cls, path: str | os.PathLike[str]) -> TaskSpec:
        return cls(path=str(Path(path).resolve()))

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("path", self.path), ("kernel", self.kernel), ("call", self.call),
                                  ("reference", self.reference), ("tolerances", self.tolerances),
                                  ("family", self.family)) if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskSpec:
        known = ("path", "kernel", "call", "reference", "tolerances", "family")
        return cls(**{k: data[k] for k in known if k in data})


def load_job_task(spec: TaskSpec) -> Task:
    """The task `spec` names: its file loaded, or the kernel and call made into one."""
    if spec.path is not None:
        return load_task(spec.path)
    task = task_from_call(str(spec.kernel), str(spec.call), spec.reference)
    if spec.tolerances:
        task.tolerances = dict(spec.tolerances)
    return task


def task_files(task: Task) -> list[str]:
    """The task's own files, whose change during a run would change the verdicts: the task file, the
    file defining its entry, the one defining its kernels, and the files its reference and stand-in are
    defined in."""
    files = {task.path, task.source_file, task.kernel_file}
    for fn in (task.reference, task.eager, task.entry):
        code = launch_code(fn)
        if code is not None and Path(code.co_filename).is_file():
            files.add(str(Path(code.co_filename).resolve()))
    return sorted(f for f in files if f and Path(f).is_file())


def task_from_call(kernel_file: str | os.PathLike[str], call: str, reference: str | None = None) -> Task:
    """A task from a kernel file and an example call such as `add(torch.randn(4096), y)`.

    The call's function is the entry; its arguments, re-evaluated for each seed, are the inputs of its one
    timed case. `reference` is an expression for a PyTorch callable (`torch.add`, `lambda x, y: x + y`).
    The integer literals that size the call's tensors give held-out cases: the call with one of them
    smaller (`harness.call_sizes`).
    """
    import torch
    import triton
    import triton.language as tl

    module = load_kernel_module(kernel_file)
    ns = {"torch": torch, "triton": triton, "tl": tl, **vars(module)}
    try:
        tree = ast.parse(call, mode="eval")
    except SyntaxError as exc:
        raise UserFacingError(f"the call expression {call!r} is not a Python expression ({exc.msg})",
                              'pass one call, e.g. --call "add(torch.randn(4096), torch.randn(4096))"') from exc
    if not isinstance(tree.body, ast.Call) or any(isinstance(a, ast.Starred) for a in tree.body.args):
        raise UserFacingError(f"--call {call!r} is not a single call of the launch wrapper",
                              'pass e.g. --call "add(torch.randn(4096), torch.randn(4096))"')
    entry = _eval(ast.unparse(tree.body.func), ns, "--call")
    example = tree.body
    sizes = call_sizes(example)
    codes: dict[tuple[tuple[int, int], ...], Any] = {}

    def inputs(**case: int) -> Call:
        changed = tuple((sizes[key], value) for key, value in sorted(case.items()) if sizes.get(key, value) != value)
        if changed not in codes:
            body = resized(example, dict(changed))
            source = "(" + "".join(ast.unparse(a) + ", " for a in body.args) + "), {" + \
                ", ".join(f"{k.arg!r}: {ast.unparse(k.value)}" for k in body.keywords if k.arg) + "}"
            codes[changed] = compile(source, "<call>", "eval")
        args, kwargs = eval(codes[changed], ns)  # noqa: S307 - the user's own expression
        return Call(args, kwargs)

    ref = _eval(reference, ns, "--reference") if reference else None
    if ref is not None and not callable(ref):
        raise UserFacingError(f"--reference {reference!r} is not callable", "pass e.g. --reference torch.add")
    from harness.guards import torch_calls

    source = defining_file(entry, kernel_file)
    # The wrapper is the user's own: the torch calls it makes are its design (a rewrite may keep them,
    # not add to them), not a fallback to catch.
    return Task(name=Path(kernel_file).stem, entry=entry, inputs=inputs, cases=[{}], reference=ref,
                namespace=ns, path=str(Path(kernel_file).resolve()), source_file=source,
                kernel_file=kernel_file_of(entry, source),
                allow_torch=torch_calls(source, entry_name(entry)),
                heldout_ranges=size_ranges(sizes), inferred_ranges=True,
                # a size under 256 stays: a head of 64 or a dot's K of 128 may be what the kernel needs
                smaller={key: value // 8 for key, value in sizes.items() if value >= 256})


def capture_task(path: str | os.PathLike[str], case: int = 0, target: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> list[Artifacts]:
    """Compile the launches of one case of a task (the first by default)."""
    return intercept_task(path, case, target).compile(cache_dir)


def _figure(formula: Callable[..., float] | None, case: dict[str, Any]) -> float | None:
    """The task's bytes or flops figure for a case; None where it has none (no formula, or the formula
    returns None for this case: an imported perf script may count only some of its input sets)."""
    if formula is None:
        return None
    try:
        value = formula(**case)
        return None if value is None else float(value)
    except Exception as exc:  # noqa: BLE001 - the task's own formula
        raise UserFacingError(f"the task's bytes/flops formula fails on {case}: {type(exc).__name__}: {exc}",
                              "fix bytes(**case) / flops(**case) in the task file") from exc


def intercept_task(path: str | os.PathLike[str], case: int = 0, target: str | None = None) -> Interception:
    """The launches of one case of a task, intercepted (nothing compiles yet)."""
    with device_for(target), contextlib.redirect_stdout(sys.stderr):  # a module may ask the device at import
        task = load_task(path)
    if not 0 <= case < len(task.cases):
        raise UserFacingError(f"task {task.name} has {len(task.cases)} cases, not {case + 1}", "pick a valid case")
    params = task.cases[case]
    return intercept_entry(task.entry, lambda: task.arguments(params), task.namespace, target,
                           what=f"task {task.name} case {params}")


def task_name(path: str | os.PathLike[str]) -> str:
    """A task's name: its file's stem, or its folder's name for `<operator>/task.py`."""
    p = Path(path)
    return p.parent.name if p.stem == "task" and p.parent.name else p.stem


def _case_list(value: Any, path: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise UserFacingError(f"task file {path}: {name} must be a list of dicts", f"e.g. {name} = [dict(n=4096)]")
    return value


def _eval(expr: str, ns: dict[str, Any], flag: str) -> Any:
    try:
        return eval(compile(expr, "<expr>", "eval"), ns)  # noqa: S307 - the user's own expression
    except SyntaxError as exc:
        raise UserFacingError(f"{flag} {expr!r} is not a Python expression ({exc.msg})", "quote it as one expression") from exc
    except Exception as exc:  # noqa: BLE001 - user code
        raise UserFacingError(f"{flag} {expr!r} raised {type(exc).__name__}: {exc}",
                              "name something the kernel file defines or imports") from exc


def _ranges(value: Any, path: Any) -> dict[str, Any]:
    problem = UserFacingError(f"task file {path}: heldout_ranges must map case keys to (lo, hi) or a list of values",
                              "e.g. heldout_ranges = {\"n\": (1, 1 << 20)}")
    if not isinstance(value, dict):
        raise problem
    for span in value.values():
        pair = isinstance(span, tuple) and len(span) == 2 and all(isinstance(v, int) for v in span) and 0 < span[0] <= span[1]
        if not pair and not (isinstance(span, list) and span):
            raise problem
    return dict(value)


def _draw(span: Any, rng: Any) -> Any:
    """A value from a declared range: integers log-uniformly, half the time made odd (sizes that are
    not a multiple of anything are where specialised kernels break)."""
    if isinstance(span, list):
        return rng.choice(span)
    lo, hi = span
    import math

    value = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    if rng.random() < 0.5:
        value |= 1
    return max(lo, min(hi, value))


def _extent(case: dict[str, Any]) -> int:
    """The product of a case's integer values: its size, as far as the case says (the first of equals wins)."""
    product = 1
    for value in case.values():
        if type(value) is int and value > 0:
            product *= value
    return product


def _scaled(value: Any, scale: float) -> Any:
    """`value` with every floating-point tensor in it multiplied by `scale` (integers, flags and Python
    scalars are the call's parameters, not its data)."""
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * scale
    if isinstance(value, (tuple, list)):
        return type(value)(_scaled(v, scale) for v in value)
    return value


def _short(value: Any) -> str:
    text = str(value).replace("torch.", "")
    return text if len(text) <= 24 else text[:21] + "..."
