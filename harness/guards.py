"""Static guards: what a kernel's source says before it runs (../shared/design/evaluation.md).

Each returns reason strings; the judge rejects a kernel with the first. They are the early, friendly
message; the runtime guards (harness.tripwires, harness.verdicts) catch what the source hides.

- fallback: the launch wrapper (and the module functions it calls) computes with torch instead of
  the kernel, or switches to a side stream;
- escapes (candidates only): the module reaches for what a kernel has no use for and a cheat needs:
  ctypes, the garbage collector, call frames, processes, signals, writing files, patching other
  modules. What the task's own kernel file already does is allowed to its rewrites.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_DECORATORS", "binds_name", "defines_kernel", "escape_guards", "escape_kinds", "is_kernel", "static_guards",
           "tensors_in", "torch_calls"]

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

def defines_kernel(source_file: str) -> bool:
    """Whether the file defines a Triton kernel (a @triton.jit or @triton.autotune'd function)."""
    try:
        tree = ast.parse(Path(source_file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    return any(isinstance(n, ast.FunctionDef) and is_kernel(n) for n in ast.walk(tree))


def binds_name(tree: ast.Module, name: str, imports: bool = False) -> bool:
    """Whether the module binds `name` at its top level: a def, a class, an assignment, and with
    `imports` an import too."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if imports and isinstance(node, ast.Import | ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def static_guards(source_file: str, entry_name: str, allow_torch: tuple[str, ...] = ()) -> list[str]:
    """Reasons to reject found in the wrapper and the module functions it reaches (not @jit ones)."""
    allowed = set(allow_torch)
    return [reason for name, reason in _torch_uses(source_file, entry_name) if not name or name not in allowed]


def torch_calls(source_file: str, entry_name: str) -> tuple[str, ...]:
    """The torch computations the entry makes (as `allow_torch` names them): what a task built from a
    kernel and a call allows its own wrapper, and so a rewrite of it may keep but not add to."""
    return tuple(sorted({name for name, _ in _torch_uses(source_file, entry_name) if name}))


def _torch_uses(source_file: str, entry_name: str) -> list[tuple[str, str]]:
    """(allow_torch name, reason) for each torch computation or side stream ("" name: never allowed) in
    the wrapper and the module functions it reaches."""
    path = Path(source_file)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []  # the runner already loaded the module; an unreadable source just has no static check
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {
        n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not is_kernel(n)}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for method in cls.body:  # an autograd Function's entry is `Cls.apply`, which runs `Cls.forward`
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name == "forward":
                functions[f"{cls.name}.apply"] = method
    torch_aliases = _torch_aliases(tree)
    uses: list[tuple[str, str]] = []
    seen: set[str] = set()
    todo = [entry_name] if entry_name in functions else []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                uses.append(("matmul", f"torch fallback: `@` matmul in {name} ({path.name}:{node.lineno})"))
            if not isinstance(node, ast.Call):
                continue
            dotted = _dotted(node.func) or ""
            head, _, rest = dotted.partition(".")
            if dotted in functions:
                todo.append(dotted)
            elif head in torch_aliases and rest:
                api = torch_aliases[head] + rest
                if any(api == s or api.endswith("." + s) for s in _SIDE_STREAM):
                    uses.append(("", f"side stream: {api} in {name} ({path.name}:{node.lineno})"))
                elif _computes(api):
                    uses.append((api.rsplit(".", 1)[-1], f"torch fallback: torch.{api} in {name} ({path.name}:{node.lineno})"))
            elif isinstance(node.func, ast.Attribute) and node.func.attr in _COMPUTE_METHODS \
                    and head not in ("math", "tl", "triton", "np", "numpy"):
                uses.append((node.func.attr, f"torch fallback: .{node.func.attr}() in {name} ({path.name}:{node.lineno})"))
    return uses


def _computes(api: str) -> bool:
    if api in _ALLOWED_TORCH or api in _ALLOWED_TORCH_NAMESPACES:
        return False
    # Device, backend and tooling namespaces hold no math (side streams are caught before this).
    return api.split(".", 1)[0] not in ("cuda", "npu", "backends", "_dynamo", "testing", "utils", "version",
                                        "distributed", "compiler", "overrides", "library")


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


# A Triton kernel is a function decorated (by name or call) with one of these, however imported:
# `@triton.jit`, `@jit`, `@triton.autotune(...)`, `@triton.heuristics(...)`. The one rule for it: the
# guards, L1's features and the rewriters all ask it.
KERNEL_DECORATORS = ("jit", "autotune", "heuristics")


def is_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether `fn` is a Triton kernel (KERNEL_DECORATORS)."""
    return any(decorator_name(dec).rsplit(".", 1)[-1] in KERNEL_DECORATORS for dec in fn.decorator_list)


def decorator_name(dec: ast.expr) -> str:
    """`triton.autotune` of `@triton.autotune(configs=...)`; "" for a decorator that is no dotted name."""
    return _dotted(dec.func if isinstance(dec, ast.Call) else dec) or ""


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


# What the harness takes back from a call, said wherever an output is refused for its type.
PLAIN_OUTPUTS = "outputs are plain tensors, or tuples, lists and dicts of them"


def foreign_output(value: Any) -> str | None:
    """Why a call's return value is not plain data, or None. The harness reads outputs after the call
    (iterates containers, hands tensors over with detach and copies): a container class with its own
    iteration, or a tensor subclass whose handlers run on those reads, would be the kernel's code
    computing after the call, where no guard or timer looks."""
    import torch

    from harness.tripwires import plain_tensor

    def refused(what: str) -> str:
        return (f"the entry returned a {type(value).__name__}, {what}: {PLAIN_OUTPUTS} (what the harness reads "
                "after the call must not run the kernel's code)")

    if isinstance(value, torch.Tensor):
        return None if plain_tensor(value) else refused("a tensor subclass")
    if isinstance(value, (tuple, list)):
        own = tuple.__iter__ if isinstance(value, tuple) else list.__iter__
        if type(value).__iter__ is not own:
            return refused(f"a {type(value).__mro__[1].__name__} with its own iteration")
        return next((r for r in map(foreign_output, value) if r), None)
    if isinstance(value, dict):
        if type(value).values is not dict.values:
            return refused("a dict with its own values()")
        return next((r for r in map(foreign_output, dict.values(value)) if r), None)
    return None


# --- escapes ---------------------------------------------------------------------------------

_ESCAPE_MODULES = {
    "ctypes": ("ctypes", "it can edit the harness's guards in this process's memory"),
    "gc": ("gc", "it can find the harness's objects and change them"),
    "inspect": ("frames", "it can read the caller's frames (the harness, a reference)"),
    "subprocess": ("processes", "a kernel starts no process"), "multiprocessing": ("processes", "a kernel starts no process"),
    "signal": ("signals", "a kernel handles no signal"), "builtins": ("module patching", "it can replace builtins"),
    "importlib": ("module patching", "it can reload or replace modules"),
}
_ESCAPE_CALLS = {
    "sys._getframe": ("frames", "it reads the caller's frames"), "sys.settrace": ("frames", "it traces the caller"),
    "sys.setprofile": ("frames", "it traces the caller"), "sys._current_frames": ("frames", "it reads every thread's frames"),
    "os.fork": ("processes", "a kernel starts no process"),
    "os.forkpty": ("processes", "a kernel starts no process"), "os.system": ("processes", "a kernel starts no process"),
    "os.popen": ("processes", "a kernel starts no process"), "os.setsid": ("processes", "a kernel starts no session"),
    "os.kill": ("signals", "a kernel signals no process"), "os.remove": ("file writes", "a kernel edits no file"),
    "os.unlink": ("file writes", "a kernel edits no file"), "os.rename": ("file writes", "a kernel edits no file"),
    "os.replace": ("file writes", "a kernel edits no file"), "os.write": ("file writes", "a kernel writes no file"),
    "os.truncate": ("file writes", "a kernel edits no file"), "os.ftruncate": ("file writes", "a kernel edits no file"),
    "os.putenv": ("module patching", "it changes the process's environment"),
    "__import__": ("module patching", "it can reach any module, the harness's included"),
    "vars": ("module patching", "it reaches a module's or object's namespace"),
    "globals": ("module patching", "it reaches this module's namespace (its name, its spec)"),
    "exec": ("dynamic code", "code the guards cannot read"), "eval": ("dynamic code", "code the guards cannot read"),
    "compile": ("dynamic code", "code the guards cannot read"),
    "operator.setitem": ("module patching", "it can write into a module's namespace"),
    "setattr": ("module patching", "it can replace another module's functions"),
}
# Attributes that reach another function's or module's internals: its closure cells (a tripwire's
# original), its globals, its namespace, its setter.
_INTERNALS = frozenset({"__closure__", "cell_contents", "__globals__", "__code__", "__dict__", "__builtins__",
                        "__setattr__", "__delattr__", "__setitem__",
                        # frames, reached from a traceback or a generator as well as from sys._getframe
                        "tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame"})
# What only code that asks whether it is being judged reads: the interpreter's switch, the interpreter's
# classes, the private functions the harness's tripwires stand in for, a function's qualified name.
_JUDGE_PROBES = ("triton.runtime.interpreter", "torch.utils._python_dispatch", "threading._", "torch._C._dispatch")
_NATIVE = ("torch.utils.cpp_extension", "cffi", "numba", "cupy")
# Module attributes whose value tells the guards where code comes from.
_IDENTITY = frozenset({"__name__", "__spec__", "__file__", "__loader__", "__package__", "__module__"})
_PATCHABLE_ROOTS = {"torch", "triton", "tl", "harness", "os", "sys", "time", "threading", "builtins", "math", "np",
                    "numpy"}


def escape_guards(source_file: str, allowed: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Reasons to reject a candidate whose module reaches for what only a cheat needs (module
    docstring); kinds in `allowed` (those the task's own kernel file uses) pass."""
    return [f"the kernel {what} ({Path(source_file).name}:{line}): {why}"
            for kind, what, why, line in _escapes(source_file) if kind not in allowed]


def escape_kinds(source_file: str) -> set[str]:
    """The escape kinds a (trusted) file uses."""
    return {kind for kind, _, _, _ in _escapes(source_file)}


def _escapes(source_file: str) -> list[tuple[str, str, str, int]]:
    try:
        tree = ast.parse(Path(source_file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found: list[tuple[str, str, str, int]] = []
    imported: set[str] = set()  # module names bound by `import` in this module
    bound = _bindings(tree)  # names that stand for a module's object: `_T = torch.Tensor`, `from harness import x`
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                root = name.split(".")[0]
                imported.add(root)
                if root in _ESCAPE_MODULES:
                    kind, why = _ESCAPE_MODULES[root]
                    found.append((kind, f"imports {root}", why, node.lineno))
                elif name.startswith("torch.library"):
                    found.append(("module patching", f"imports {name}", "it can register kernels under torch's own "
                                  "op names", node.lineno))
                elif root == "harness":
                    found.append(("module patching", "imports harness", "a kernel has no use for the harness that "
                                  "judges it", node.lineno))
                if name.startswith(_NATIVE) or any(f"{name}.{a.name}".startswith(_NATIVE) for a in node.names):
                    found.append(("native code", f"imports {name}", "native code runs below the guards that see "
                                  "PyTorch work", node.lineno))
                if name.startswith(_JUDGE_PROBES):
                    found.append(("judge detection", f"imports {name}", "it can tell the judge's process from a "
                                  "user's", node.lineno))
        elif isinstance(node, ast.Call):
            dotted = _dotted(node.func) or ""
            if dotted in _ESCAPE_CALLS or dotted.startswith(("os.exec", "os.spawn", "shutil.")):
                kind, why = _ESCAPE_CALLS.get(dotted, ("file writes" if dotted.startswith("shutil.") else "processes",
                                                      "a kernel edits no file and starts no process"))
                found.append((kind, f"calls {dotted}", why, node.lineno))
            elif dotted in ("open", "io.open") and _writes(node):
                found.append(("file writes", "opens a file for writing", "a kernel edits no file", node.lineno))
            elif isinstance(node.func, ast.Attribute) and node.func.attr in ("write_text", "write_bytes", "unlink",
                                                                               "rename", "replace", "rmdir"):
                if _dotted(node.func.value) not in ("str",):
                    found.append(("file writes", f"calls .{node.func.attr}()", "a kernel edits no file", node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in _INTERNALS:
            found.append(("module patching", f"reads .{node.attr}", "it reaches into another function's or "
                          "module's internals (a guard's original, a namespace)", node.lineno))
        elif isinstance(node, ast.Attribute) and (_dotted(node) or "").startswith("torch.library."):
            found.append(("module patching", f"uses {_dotted(node)}", "it can register kernels under torch's own "
                          "op names", node.lineno))
        elif isinstance(node, ast.Attribute) and _resolved(_dotted(node), bound) == "sys.modules":
            found.append(("module patching", "reaches into sys.modules", "it can replace the harness's modules",
                          node.lineno))
        elif isinstance(node, ast.Attribute) and (_resolved(_dotted(node), bound).startswith(_NATIVE)):
            found.append(("native code", f"uses {_dotted(node)}", "native code runs below the guards that see "
                          "PyTorch work", node.lineno))
        elif isinstance(node, ast.Attribute) and (node.attr == "__qualname__"
                                                  or _resolved(_dotted(node), bound).startswith(_JUDGE_PROBES)):
            found.append(("judge detection", f"reads {_dotted(node) or node.attr}", "it can tell the judge's "
                          "process from a user's and behave differently there", node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "TRITON_INTERPRET" in node.value:
            found.append(("judge detection", "names TRITON_INTERPRET", "it can run one way on the interpreter that "
                          "judges it and another on the GPU", node.lineno))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in _IDENTITY:
                    found.append(("module patching", f"assigns to {target.id}", "it changes where the guards "
                                  "see its code come from", node.lineno))
                assigned = _dotted(target) if isinstance(target, ast.Attribute) else None
                if assigned:
                    assigned = _resolved(assigned, bound)
                    root = assigned.split(".")[0]
                    # Any module's attribute: the worker's own machinery (json, uuid, torch's dispatch) is
                    # only as safe as every module it calls.
                    if root in _PATCHABLE_ROOTS or root in imported | set(bound) | {"torch"}:
                        found.append(("module patching", f"assigns to {assigned}", "it changes another module for "
                                      "every caller, the harness included", node.lineno))
    found += _host_calls_in_kernels(tree)
    return sorted(found, key=lambda f: f[3])


def _resolved(dotted: str | None, bound: dict[str, str]) -> str:
    """`_s.modules` as `sys.modules` where `import sys as _s` bound `_s`."""
    if not dotted:
        return ""
    root, _, rest = dotted.partition(".")
    return f"{bound[root]}.{rest}".rstrip(".") if root in bound else dotted


def _host_calls_in_kernels(tree: ast.Module) -> list[tuple[str, str, str, int]]:
    """Calls, inside a kernel, of the module's own functions that are not kernels: compiled, Triton refuses
    them; the interpreter runs them as Python, torch and all, inside the launch where the guards stand aside."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    host = {name for name, fn in functions.items() if not is_kernel(fn)}
    found = []
    for fn in functions.values():
        if not is_kernel(fn):
            continue
        # the body only: decorators and defaults run on the host, where `@triton.autotune(configs=configs())`
        # and `@triton.heuristics({"BLOCK": lambda a: volume(a)})` call the module's own functions by design
        for node in (n for statement in fn.body for n in ast.walk(statement)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in host:
                found.append(("host code in a kernel", f"calls {node.func.id}() from kernel {fn.name}",
                              "a kernel runs only @triton.jit functions", node.lineno))
    return found


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Names bound to another module's objects, by what they stand for: `from harness import tripwires as
    _tw` -> harness.tripwires, `_T = torch.Tensor` -> torch.Tensor (through earlier such names)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _dotted(node.value)
            if value:
                out[node.targets[0].id] = _resolved(value, out)
    return out


def _writes(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax+")
