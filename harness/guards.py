"""Guards against the known ways to fool a benchmark (../shared/design/evaluation.md).

Each guard returns a reason string when it trips; the runner rejects the candidate with it.

- static: the launch wrapper (and the module functions it calls) computes with torch instead of
  the kernel, or switches to a side stream;
- runtime: no Triton launch happened during the call; a launch went to a stream other than the
  one the harness times;
- outputs: an output aliases an input, or is the very buffer an earlier call returned;
- inputs: the call mutated an input it does not declare as an output;
- unwritten outputs: outputs allocated by the wrapper are poisoned (`poisoned_allocations`), and an
  element still holding the poison after the call was never written.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LaunchLog", "aliasing", "count_launches", "mutated_inputs", "poisoned_allocations",
    "reused_output", "static_guards", "tensors_in", "unwritten",
]

# Torch calls a launch wrapper legitimately makes: allocation, metadata, dtypes, devices, streams of
# the caller. Anything else under `torch.` computes, and so is a fallback unless the task allows it.
_ALLOWED_TORCH = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "arange", "tensor", "as_tensor", "device", "dtype", "Size", "is_tensor",
    "get_default_dtype", "get_default_device", "finfo", "iinfo", "manual_seed", "randn", "rand",
    "randint", "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
    "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "promote_types", "result_type", "no_grad",
    "inference_mode", "is_floating_point", "numel", "broadcast_shapes", "library", "compile",
}
_ALLOWED_TORCH_NAMESPACES = {"cuda.current_device", "cuda.current_stream", "cuda.get_device_properties",
                             "cuda.device", "cuda.is_available", "cuda.get_device_capability",
                             "cuda.synchronize", "npu.current_device", "npu.current_stream"}
# Tensor methods that compute; metadata and movement (.view, .stride, .contiguous, .to) are fine.
_COMPUTE_METHODS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "softmax", "log_softmax", "sum", "mean", "prod",
    "cumsum", "cumprod", "sort", "argsort", "topk", "max", "min", "amax", "amin", "argmax", "argmin",
    "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "gelu", "norm", "var", "std", "logsumexp",
    "add", "sub", "mul", "div", "pow", "clamp", "where", "masked_fill", "index_select", "gather",
    "scatter", "scatter_add", "index_add", "einsum", "conv2d", "layer_norm", "abs", "neg",
}
_SIDE_STREAM = {"cuda.Stream", "cuda.stream", "cuda.set_stream", "npu.Stream", "npu.stream", "npu.set_stream"}


# --- static ----------------------------------------------------------------------------------

def static_guards(source_file: str, entry_name: str, allow_torch: tuple[str, ...] = ()) -> list[str]:
    """Reasons to reject found in the wrapper and the module functions it reaches (not @jit ones)."""
    path = Path(source_file)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []  # the runner already loaded the module; an unreadable source just has no static check
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and not _is_jit(n)}
    torch_aliases = _torch_aliases(tree)
    reasons: list[str] = []
    seen: set[str] = set()
    todo = [entry_name] if entry_name in functions else []
    allowed = set(allow_torch)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and "matmul" not in allowed:
                reasons.append(f"torch fallback: `@` matmul in {name} ({path.name}:{node.lineno})")
            if not isinstance(node, ast.Call):
                continue
            dotted = _dotted(node.func) or ""
            head, _, rest = dotted.partition(".")
            if dotted in functions:
                todo.append(dotted)
            elif head in torch_aliases and rest:
                api = torch_aliases[head] + rest
                if any(api == s or api.endswith("." + s) for s in _SIDE_STREAM):
                    reasons.append(f"side stream: {api} in {name} ({path.name}:{node.lineno})")
                elif _computes(api) and api.rsplit(".", 1)[-1] not in allowed:
                    reasons.append(f"torch fallback: torch.{api} in {name} ({path.name}:{node.lineno})")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in _COMPUTE_METHODS \
                    and node.func.attr not in allowed and head not in ("math", "tl", "triton", "np", "numpy"):
                reasons.append(f"torch fallback: .{node.func.attr}() in {name} ({path.name}:{node.lineno})")
    return reasons


def _computes(api: str) -> bool:
    if api in _ALLOWED_TORCH or api in _ALLOWED_TORCH_NAMESPACES:
        return False
    # Device, backend and tooling namespaces hold no math (side streams are caught before this).
    return api.split(".", 1)[0] not in ("cuda", "npu", "backends", "_dynamo", "testing", "utils", "version")


def _torch_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to torch namespaces: {"torch": "", "F": "nn.functional.", "nn": "nn."}."""
    aliases = {"torch": ""}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    local = a.asname or a.name.split(".")[0]
                    aliases[local] = (a.name.partition(".")[2] + ".") if a.asname and "." in a.name else ""
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            prefix = node.module.partition(".")[2]
            for a in node.names:
                aliases[a.asname or a.name] = f"{prefix}.{a.name}.".lstrip(".") if prefix else f"{a.name}."
    return aliases


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = _dotted(target) or ""
        if name.endswith(("jit", "autotune", "heuristics")):
            return True
    return False


# --- runtime ---------------------------------------------------------------------------------

@dataclass
class LaunchLog:
    kernels: list[str] = field(default_factory=list)
    foreign_streams: list[str] = field(default_factory=list)


@contextlib.contextmanager
def count_launches(expected_stream: Any = None) -> Iterator[LaunchLog]:
    """Record every Triton launch (compiled or interpreted) made inside the block.

    `expected_stream`: a torch stream; launches made while another stream is current are logged
    as foreign (work the timer would not see).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    log = LaunchLog()
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def wrap(original: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                name = getattr(getattr(self, "fn", None), "__name__", "kernel")
                log.kernels.append(name)
                if expected_stream is not None:
                    import torch

                    current = torch.cuda.current_stream()
                    if current != expected_stream:
                        log.foreign_streams.append(name)
            return original(self, *args, **kwargs)
        return run

    for cls, original in originals.items():
        cls.run = wrap(original)
    try:
        yield log
    finally:
        for cls, original in originals.items():
            cls.run = original


@contextlib.contextmanager
def poisoned_allocations(poison: float) -> Iterator[None]:
    """Fill every tensor torch.empty* allocates in the block with `poison` (NaN for floats works)."""
    import torch
    from torch.overrides import TorchFunctionMode

    factories = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}

    class Poison(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in factories and isinstance(out, torch.Tensor):
                fill_poison(out, poison)
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


def unwritten(first: Any, second: Any, poison_a: float, poison_b: float) -> int:
    """Elements that hold poison A after the run poisoned with A and poison B after the run with B."""
    import torch

    if first.shape != second.shape:
        return 0
    a, b = first.detach(), second.detach()
    if a.dtype.is_floating_point:
        hit_a = torch.isnan(a) if poison_a != poison_a else a == poison_a
        hit_b = torch.isnan(b) if poison_b != poison_b else b == poison_b
    else:
        pa = torch.empty((), dtype=a.dtype, device=a.device)
        pb = torch.empty((), dtype=b.dtype, device=b.device)
        fill_poison(pa, poison_a)
        fill_poison(pb, poison_b)
        hit_a, hit_b = a == pa, b == pb
    return int((hit_a & hit_b).sum().item())


def tensors_in(value: Any) -> list[Any]:
    """The tensors of an output: a tensor, or a tuple/list/dict of them, flattened in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _shares_memory(a: Any, b: Any) -> bool:
    """Whether two tensors' storages overlap (views of one buffer included)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def aliasing(outputs: list[Any], inputs: list[Any], exempt: set[int]) -> str | None:
    for i, out in enumerate(outputs):
        for j, arg in enumerate(inputs):
            if j in exempt or not hasattr(arg, "untyped_storage") or arg.numel() == 0:
                continue
            if _shares_memory(out, arg):
                return f"output {i} aliases input argument {j} (shares its memory): write results to a new tensor"
    return None


def reused_output(earlier: list[Any], later: list[Any]) -> str | None:
    """The later call returned a buffer an earlier, still-alive output owns: a cached result."""
    for i, out in enumerate(later):
        for prev in earlier:
            if out.numel() and _shares_memory(out, prev):
                return (f"output {i} is the buffer an earlier call returned (a cached result): "
                        "allocate each call's output afresh")
    return None


def mutated_inputs(before: list[Any], after: list[Any], exempt: set[int]) -> str | None:
    import torch

    for j, (b, a) in enumerate(zip(before, after)):
        if j in exempt or not isinstance(a, torch.Tensor):
            continue
        same = torch.equal(b, a) if not a.dtype.is_floating_point else bool(
            ((b == a) | (torch.isnan(b) & torch.isnan(a))).all().item())
        if not same:
            return (f"input argument {j} was modified by the call: kernels must not write their inputs "
                    "(declare `outputs = [{j}]` in the task if it is an out= argument)").replace("{j}", str(j))
    return None
