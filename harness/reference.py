"""The judge's hands: a worker that loads only the user's task, makes the inputs, computes the expected
outputs and compares what kernel workers hand back. No kernel under judgement is ever imported here.

Inputs are made here from seeds the judge chose, so a kernel can neither predict them nor change how
they are made (torch's default dtype, say); a copy of each set is handed to each kernel worker, never
the set itself. Expected values come from the task's reference, in float64 where the inputs are
lower-precision floats. What the outputs must be (their count, dtype, shape and device, and so the
tolerance) is the task's own kernel's, registered per case by the judge (`contract`): references often
widen for accuracy (`torch.cumsum(x.to(torch.float64))`), so their dtype says nothing of the operator's,
and a candidate's own dtype must not choose its tolerance. Without a reference, the expected values
are the task's own kernel's too (`expect`).
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import exchange
from harness.host import POISON_A, POISON_B, fill_poison, outputs_of

__all__ = ["Expected", "ReferenceHost", "TaskInfo", "magnitude_growth"]


@dataclass
class TaskInfo:
    """What the judge needs to know of a task, as plain data."""

    name: str
    path: str
    entry: str  # the launch wrapper's name (candidates define one of the same name)
    source_file: str  # the file defining the entry
    cases: list[dict[str, Any]]  # listed cases, then held-out ones, then those generated for this seed
    labels: list[str]
    timed: int  # cases[:timed] are timed; the rest are checked only
    generated: int  # the last `generated` cases were generated for this seed
    exempt: list[int]  # outputs, then in/out arguments: compared as outputs, not as inputs
    allow_torch: list[str]
    has_reference: bool
    warm_cache: bool
    family: str
    files: list[str]  # the task's own files: hashed by the judge around every job
    bytes: list[float | None] = field(default_factory=list)  # per timed case
    flops: list[float | None] = field(default_factory=list)
    seed: int = 0
    inouts: list[int] = field(default_factory=list)  # of `exempt`, those read too: never poisoned
    kernel_file: str = ""  # the file defining the kernels the entry launches (what candidates rewrite)
    # Cases a candidate is held to only where the task's own kernel passes them: the scaled-input case
    # (`Task.scaled_case`), and cases drawn from ranges inferred from a call (`Task.inferred_ranges`).
    probed: list[int] = field(default_factory=list)


@dataclass
class Expected:
    """One output the reference (or the task's own kernel) produced for an input set."""

    dtype: str
    shape: list[int]
    device: str
    atol: float
    rtol: float


class ReferenceHost:
    def __init__(self, device: str, directory: Path) -> None:
        self.device = device
        self.directory = directory
        self.task: Any = None  # the Task, loaded on the first request (the worker imports nothing before)
        self.info: TaskInfo | None = None
        self.sets: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.expected: dict[str, list[Any]] = {}
        self.meta: dict[int, list[Expected]] = {}  # per case
        self.arenas: dict[str, exchange.Arena] = {}

    # --- the task --------------------------------------------------------------------------

    def load(self, spec: dict[str, Any], seed: int, generated: int) -> dict[str, Any]:
        """`spec`: a TaskSpec as JSON, as it crossed from the caller."""
        from harness.entries import entry_name
        from harness.task import TaskSpec, load_job_task, task_files

        if self.task is None:
            self.task = load_job_task(TaskSpec.from_json(spec))
        task = self.task
        generated_cases = task.generated_cases(random.Random(seed), generated) + [task.scaled_case()]
        cases = list(task.cases) + list(task.heldout) + generated_cases
        probed = list(range(len(cases) - (len(generated_cases) if task.inferred_ranges else 1), len(cases)))
        self.sets.clear()
        self.expected.clear()
        self.meta.clear()
        outputs, inouts = list(task.outputs), list(task.inouts)
        if not outputs and not inouts and cases:
            roles = self._roles(cases[0], seed)
            outputs, inouts = list(roles.outputs), list(roles.inouts)
        self.info = TaskInfo(
            name=task.name, path=task.path, entry=entry_name(task.entry),
            source_file=task.source_file, kernel_file=task.kernel_file, cases=[_plain(c) for c in cases],
            labels=[task.case_label(c) for c in cases], timed=len(task.cases), generated=len(generated_cases),
            exempt=outputs + inouts, inouts=inouts, allow_torch=list(task.allow_torch), has_reference=task.reference is not None,
            warm_cache=task.warm_cache, family=task.family, files=task_files(task),
            bytes=[task.case_bytes(c) for c in task.cases], flops=[task.case_flops(c) for c in task.cases],
            seed=seed, probed=probed)
        self._cases = cases
        return asdict(self.info)

    def _roles(self, case: dict[str, Any], seed: int) -> Any:
        """Which arguments the task's own kernel writes, from one intercepted call (nothing launches)."""
        import torch

        from harness.roles import argument_roles

        torch.manual_seed(seed)
        with torch.device(self.device):
            args, kwargs = self.task.arguments(case)
            return argument_roles(self.task.entry, args, kwargs)

    # --- inputs ----------------------------------------------------------------------------

    def make(self, key: str, case: int, seed: int, expected: bool) -> dict[str, Any]:
        """Input set `key` for case `case` from `seed`, with the expected values when asked and the
        task has a reference. Returns its size and whether expected values were made."""
        import torch

        if key in self.sets:  # made before without its expected outputs: the same set, now with them
            args, kwargs = self.sets[key]
        else:
            torch.manual_seed(seed)
            with torch.device(self.device):
                args, kwargs = self.task.arguments(self._cases[case])
            self.sets[key] = (tuple(args), dict(kwargs))
        nbytes = sum(t.numel() * t.element_size() for t in _tensors((args, kwargs)))
        answer: dict[str, Any] = {"bytes": nbytes, "compute_dtype": _compute_dtype(args)}
        if expected and self.task.reference is not None:
            if key not in self.expected:
                self.expected[key] = self._reference(args, kwargs)
                if exchange.device_kind(self.device) == "cuda":
                    # The float64 copies the reference ran on are free now but stay reserved by torch's
                    # caching allocator, invisible to the kernel workers beside this one: give them back.
                    torch.cuda.empty_cache()
            answer["values"] = True
        return answer

    def share(self, keys: list[str], worker: str, directory: str) -> dict[str, Any]:
        """Copies of input sets for one kernel worker: in its own device arena, or files in its directory."""
        put = lambda t: exchange.write_file(t, Path(directory))  # noqa: E731
        if exchange.device_kind(self.device) == "cuda" and exchange.ipc_available():
            arena = self.arenas.setdefault(worker, exchange.Arena(self.device))
            try:
                arena.rewind(sum(exchange.handover_bytes(_tensors(self.sets[key])) for key in keys))
                put = arena.put
            except exchange.ExchangeError as exc:
                # Device memory short for the arena: the sets go through host files instead, and the worker
                # copying them in is what may fail (one candidate rejected, not the whole run).
                print(f"note: {exc}: input sets for worker {worker} go through files", file=sys.stderr)
        out = []
        for key in keys:
            args, kwargs = self.sets[key]
            out.append({"args": exchange.encode(args, put, "input"), "kwargs": exchange.encode(kwargs, put, "keyword")})
        if exchange.device_kind(self.device) == "cuda":
            import torch

            torch.cuda.synchronize()  # the copies are in the arena before the worker opens it
        return {"sets": out}

    def memory(self) -> dict[str, Any]:
        """The device's free and total memory in bytes (empty off CUDA): how many checks fit side by side."""
        import torch

        if exchange.device_kind(self.device) != "cuda":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        return {"free": int(free), "total": int(total)}

    def release(self, keys: list[str] | None = None, worker: str | None = None) -> dict[str, Any]:
        for key in keys if keys is not None else list(self.sets):
            self.sets.pop(key, None)
            self.expected.pop(key, None)
        if worker is not None:
            exchange.release_arenas(self.arenas, worker)
        return {}

    # --- expected outputs ------------------------------------------------------------------

    def _reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The reference's outputs, in float64 where the inputs are lower-precision floats."""
        import torch

        def run(upcast: bool) -> list[Any]:
            def widen(a: Any) -> Any:
                if isinstance(a, torch.Tensor):
                    return a.to(torch.float64) if upcast and a.dtype.is_floating_point else a.clone()
                return a
            call_args = tuple(widen(a) for a in args)
            value = self.task.reference(*call_args, **{k: widen(v) for k, v in kwargs.items()})
            return [o.detach().clone() for o in outputs_of(value, call_args, self.info.exempt)]  # type: ignore[union-attr]

        try:
            return run(upcast=True)
        except Exception:  # noqa: BLE001 - references with dtype-specific code run as written
            return run(upcast=False)

    def contract(self, case: int, outputs: list[dict[str, Any]]) -> dict[str, Any]:
        """What `case`'s outputs must be: the task's own kernel's (count, dtype, shape, device), with the
        tolerance of each dtype. The comparisons of this case use it."""
        from harness.task import tolerance_for

        growth = self._growth(case)
        meta = []
        for i, out in enumerate(outputs):
            dtype = str(out["dtype"]).removeprefix("torch.")
            tolerance = tolerance_for(self.task, dtype)
            tolerance["atol"] *= growth[i] if i < len(growth) else 1.0
            meta.append(Expected(dtype, list(out["shape"]), str(out["device"]), **tolerance))
        self.meta[case] = meta
        return {"expected": [asdict(m) for m in meta]}

    def _growth(self, case: int) -> list[float]:
        """How much larger each output of the scaled-input case is than that of the same inputs unscaled
        (one per output; empty for any other case, or without a reference).

        A task's atol is set for its inputs as made, and the error a kernel commits in float arithmetic
        grows with its operands: an fp16 P @ V sums products sixteen times larger once V is. The scaled case
        holds that atol grown as the reference's outputs grow, so it still asks the precision the task asks
        (the same digits), and a kernel right only on the inputs' usual range still fails it by far more."""
        import torch

        from harness.task import INPUT_SCALE, SCALE_KEY

        scaled = self._cases[case]
        if SCALE_KEY not in scaled or self.task.reference is None or self.info is None:
            return []
        outputs = []
        for made in ({k: v for k, v in scaled.items() if k != SCALE_KEY}, scaled):
            torch.manual_seed(self.info.seed)
            with torch.device(self.device):
                args, kwargs = self.task.arguments(made)
            outputs.append(self._reference(args, kwargs))
        if exchange.device_kind(self.device) == "cuda":
            torch.cuda.empty_cache()
        return [magnitude_growth(a, b, limit=INPUT_SCALE ** 2) for a, b in zip(*outputs)]

    def expect(self, key: str, outputs: list[Any], directory: str) -> dict[str, Any]:
        """Register the task's own kernel's outputs as the expected values for `key` (a task without a
        reference)."""
        self.expected[key] = exchange.load_all(outputs, Path(directory), self.device)
        return {}

    # --- comparisons -----------------------------------------------------------------------

    def compare(self, keys: list[str], calls: list[dict[str, Any]], directory: str, case: int) -> dict[str, Any]:
        """Each call's outputs against the expected outputs of its input set (`keys[i]` for call i), and
        its arguments afterwards against that set as it was made; the first two calls together give the
        elements never written (poison A after call 1 and poison B after call 2)."""
        meta = self.meta.get(case, [])
        results = []
        loaded: list[list[Any]] = []
        for number, (key, call) in enumerate(zip(keys, calls), start=1):
            try:
                outs = exchange.load_all(call.get("outputs", []), Path(directory), self.device)
                mutated = self._mutated(key, call.get("inputs_after", {}), Path(directory))
            except exchange.ExchangeError as exc:
                # What the kernel's worker handed over no longer reads as what it said (a file cut or
                # rewritten after its answer): the kernel's doing, not the reference's.
                return {"unreadable": f"call {number}'s hand-over could not be read back: {exc}"}
            loaded.append(outs)
            expected = self.expected.get(key)
            checks = [_compare(o, expected[i], meta[i]) if expected is not None and i < len(expected) else None
                      for i, o in enumerate(outs)]
            results.append({"checks": checks, "mutated": mutated})
        unwritten = []
        if len(loaded) >= 2:
            unwritten = [_unwritten(a, b) for a, b in zip(loaded[0], loaded[1])]
        return {"calls": results, "unwritten": unwritten}

    def _mutated(self, key: str, after: dict[str, Any], directory: Path) -> list[str]:
        import torch

        args, kwargs = self.sets[key]
        labels = list(after)
        tensors = exchange.load_all([after[k] for k in labels], directory, self.device)
        before = {f"args[{i}]": a for i, a in enumerate(args)} | {f"kwargs[{k!r}]": v for k, v in kwargs.items()}
        changed = []
        for label, now in zip(labels, tensors):
            was = before.get(label)
            if not isinstance(was, torch.Tensor):
                continue
            if was.shape != now.shape or was.dtype != now.dtype or not _same(was, now):
                changed.append(label)
        return changed


# --- comparison helpers ----------------------------------------------------------------------

def _compare(out: Any, ref: Any, meta: Expected) -> dict[str, Any]:
    """Errors of one output in float64; NaN and Inf must match in position."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return {"shape_mismatch": [list(out.shape), list(ref.shape)]}
    exact_ints = not (out.dtype.is_floating_point or out.dtype.is_complex or ref.dtype.is_floating_point
                      or ref.dtype.is_complex) and meta.atol == 0 and meta.rtol == 0
    if exact_ints:
        # in int64, not float64: past 2**53 float64 cannot tell neighbouring integers apart
        ai, ri = out.detach().to(torch.int64), ref.detach().to(device=out.device, dtype=torch.int64)
        wrong = ai != ri
        first_wrong = [int(v) for v in torch.nonzero(wrong)[0].tolist()] if bool(wrong.any().item()) else None
        gap = (ai - ri).abs().to(torch.float64)
        return {"max_abs_err": float(gap.max().item()) if gap.numel() else 0.0,
                "max_rel_err": float((gap / ri.abs().to(torch.float64).clamp_min(1)).max().item()) if gap.numel() else 0.0,
                "mismatched": int(wrong.sum().item()), "nan_mismatch": 0, "inf_mismatch": 0, "first_bad": first_wrong}
    a = out.detach().to(torch.float64) if not out.dtype.is_complex else out.detach()
    r = ref.detach().to(device=a.device, dtype=a.dtype)
    nan_a, nan_r = torch.isnan(a), torch.isnan(r)
    inf_a, inf_r = torch.isinf(a), torch.isinf(r)
    nan_bad = nan_a ^ nan_r
    inf_bad = (inf_a | inf_r) & ~(nan_a | nan_r) & (a != r)
    finite = ~(nan_a | nan_r | inf_a | inf_r)
    diff = torch.where(finite, (a - r).abs(), torch.zeros_like(a))
    bad = finite & (diff > meta.atol + meta.rtol * r.abs())
    rel = torch.where(finite & (r != 0), diff / r.abs().clamp_min(1e-30), torch.zeros_like(a))
    any_bad = bad | nan_bad | inf_bad
    first = [int(v) for v in torch.nonzero(any_bad)[0].tolist()] if bool(any_bad.any().item()) else None
    return {"max_abs_err": float(diff.max().item()) if diff.numel() else 0.0,
            "max_rel_err": float(rel.max().item()) if rel.numel() else 0.0,
            "mismatched": int(bad.sum().item()), "nan_mismatch": int(nan_bad.sum().item()),
            "inf_mismatch": int(inf_bad.sum().item()), "first_bad": first}


def magnitude_growth(plain: Any, scaled: Any, limit: float) -> float:
    """The root-mean-square of `scaled`'s finite values over `plain`'s, within [1, limit]: 1 where either is
    not a float tensor or `plain` is all zero (nothing to compare the growth with)."""
    import torch

    def rms(t: Any) -> float | None:
        if not isinstance(t, torch.Tensor) or not (t.dtype.is_floating_point or t.dtype.is_complex):
            return None
        values = t.detach().to(torch.complex128 if t.dtype.is_complex else torch.float64).abs()
        values = values[torch.isfinite(values)]
        return float(values.square().mean().sqrt().item()) if values.numel() else None

    before, after = rms(plain), rms(scaled)
    if before is None or after is None or before == 0.0:
        return 1.0
    return min(max(after / before, 1.0), limit)


def _unwritten(first: Any, second: Any) -> int:
    """Elements that hold poison A after the call poisoned with A and poison B after the one with B."""
    import torch

    if first.shape != second.shape or first.dtype != second.dtype:
        return 0
    if first.dtype.is_floating_point:
        return int((torch.isnan(first) & (second == POISON_B)).sum().item())
    pa = torch.empty((), dtype=first.dtype, device=first.device)
    pb = torch.empty((), dtype=second.dtype, device=second.device)
    fill_poison(pa, POISON_A)
    fill_poison(pb, POISON_B)
    return int(((first == pa) & (second == pb)).sum().item())


def _same(a: Any, b: Any) -> bool:
    import torch

    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all().item())
    return bool(torch.equal(a, b))


def _tensors(value: Any) -> list[Any]:
    """Every tensor in a value, each object once (an input set's size is theirs)."""
    import torch

    found: list[Any] = []
    seen: set[int] = set()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            if id(v) not in seen:
                seen.add(id(v))
                found.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(value)
    return found


def _compute_dtype(args: tuple[Any, ...]) -> str:
    """The input dtype that sets the compute ceiling: the largest tensor's (int8 GEMMs included)."""
    import torch

    from harness.roofline import compute_dtype_of

    tensors = [a for a in args if isinstance(a, torch.Tensor) and (a.dtype.is_floating_point or a.dtype == torch.int8)]
    if not tensors:
        return "bf16"
    return compute_dtype_of(str(max(tensors, key=lambda a: a.numel()).dtype))


def _plain(case: dict[str, Any]) -> dict[str, Any]:
    """A case as JSON: dtypes and other objects by their printed name."""
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v).replace("torch.", "")
            for k, v in case.items()}
