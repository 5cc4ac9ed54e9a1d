"""What an entry is: the function a launch wrapper runs (through partials, decorators, autograd
Functions, modules), the file that holds it, how a rewrite names it, and which file holds the Triton
kernels it launches, which is the file an optimize run rewrites.

That last one is usually the entry's own file. Libraries that keep launch wrappers and kernels apart
(attorch's `linear_layer.py` over `linear_kernels.py`, a `transformers/` folder over an `ops/` one) have
the wrapper's file define no kernel; the kernels' file is then the one the wrapper's code names."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import CodeType
from typing import Any

from harness.guards import defines_kernel
from harness.loading import package_of

__all__ = ["attribute_path", "defining_file", "entry_name", "kernel_file_of", "kernel_files_named_by",
           "launch_code", "launch_function"]

# How deep the search for launched kernels follows the package's own helper functions from the entry.
HELPER_DEPTH = 3


def defining_file(fn: Any, fallback: Any) -> str:
    """The file holding the code a callable runs (`launch_code`), else `fallback`."""
    code = launch_code(fn)
    return str(Path(code.co_filename).resolve()) if code is not None else str(Path(fallback).resolve())


def launch_code(fn: Any) -> Any:
    """The code object an entry runs (`launch_function`'s), None for a builtin."""
    function = launch_function(fn)
    return function.__code__ if function is not None else None


def launch_function(fn: Any) -> Any:
    """The Python function an entry runs, followed through what wraps it: `functools.partial`, decorators
    that keep `__wrapped__`, bound methods, a `torch.autograd.Function`'s `.apply` (its `forward`), an
    `nn.Module` (its `forward`) or any callable object (its `__call__`). None for a builtin.

    `.apply` is the one that matters most: its own code is torch's, so an entry of the form
    `MyFunction.apply` would otherwise name `torch/autograd/function.py` as the kernel's source."""
    import functools

    seen: set[int] = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        owner = _autograd_owner(fn)
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif owner is not None:
            fn = getattr(owner, "forward", None)
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        elif getattr(fn, "__func__", None) is not None:
            fn = fn.__func__
        elif getattr(fn, "__code__", None) is not None:
            return fn
        elif _is_module(fn):
            fn = type(fn).forward
        elif callable(fn) and not isinstance(fn, type) and hasattr(type(fn).__call__, "__code__"):
            fn = type(fn).__call__
        else:
            return None
    return None


def entry_name(fn: Any) -> str:
    """How a rewritten copy of the entry's file names the entry: `rms_norm`, or `RMSNorm.apply` for an
    autograd Function (a dotted path from the module; `attribute_path` follows it back)."""
    owner = _autograd_owner(fn)
    if owner is not None:
        return f"{owner.__qualname__}.apply"
    qualname = str(getattr(fn, "__qualname__", "") or getattr(fn, "__name__", "") or "entry")
    return getattr(fn, "__name__", "entry") if "<locals>" in qualname else qualname


def attribute_path(module: Any, path: str) -> Any:
    """`module.A.b` for the path "A.b"; None where a step is missing."""
    value = module
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _autograd_owner(fn: Any) -> type | None:
    """The torch.autograd.Function class whose `.apply` `fn` is, else None."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, type) or getattr(fn, "__name__", "") != "apply":
        return None
    try:
        import torch
    except ImportError:
        return None
    return owner if issubclass(owner, torch.autograd.Function) else None


def _is_module(obj: Any) -> bool:
    try:
        import torch

        return isinstance(obj, torch.nn.Module)
    except ImportError:
        return False


def kernel_file_of(entry: Any, entry_file: str) -> str:
    """The file an optimize run rewrites for `entry`: `entry_file` when it defines a Triton kernel, else
    the one file whose kernels the entry's code names; `entry_file` when it names none or several
    (`kernel_files_named_by` tells the caller which)."""
    if defines_kernel(entry_file):
        return entry_file
    files = kernel_files_named_by(entry)
    return files[0] if len(files) == 1 else entry_file


def kernel_files_named_by(entry: Any) -> list[str]:
    """The files defining the Triton kernels that the entry's code names, in the order first named: in its
    launch function, in the functions and lambdas nested there, and in the helpers of its own package it
    calls (a few calls deep). Names only, read from the code objects; nothing runs. A layer's `forward`
    naming `linear_forward_kernel` names `linear_kernels.py`, not the `act_kernels.py` its `backward` uses."""
    function = launch_function(entry)
    if function is None:
        return []
    _, home = package_of(Path(function.__code__.co_filename).resolve())  # the package's root folder
    files: dict[str, None] = {}
    seen: set[int] = set()
    todo: list[tuple[CodeType, dict[str, Any], int]] = [(function.__code__, getattr(function, "__globals__", {}), 0)]
    while todo:
        code, names, depth = todo.pop(0)
        if id(code) in seen:
            continue
        seen.add(id(code))
        todo += [(const, names, depth) for const in code.co_consts if isinstance(const, CodeType)]
        for name in code.co_names:
            value = names.get(name)
            for candidate in [value, *_module_members(value, code.co_names, home)]:
                kernel_file = _kernel_file(candidate)
                if kernel_file is not None:
                    files.setdefault(kernel_file, None)
                elif depth < HELPER_DEPTH and inspect.isfunction(candidate) and \
                        _under(Path(candidate.__code__.co_filename).resolve(), home):
                    todo.append((candidate.__code__, candidate.__globals__, depth + 1))
    return list(files)


def _module_members(value: Any, names: tuple[str, ...], home: Path) -> list[Any]:
    """`module.name` for each name the code uses, when `value` is a module of the entry's own package
    (`kernels.add_kernel[grid]` after `from . import kernels`)."""
    file = getattr(value, "__file__", None)
    if not inspect.ismodule(value) or not file or not _under(Path(file).resolve(), home):
        return []
    return [vars(value)[name] for name in names if name in vars(value)]


def _kernel_file(value: Any) -> str | None:
    """The file defining `value` when it is a Triton kernel (jit, autotuned, heuristics), else None."""
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        return None
    if not isinstance(value, KernelInterface):
        return None
    fn: Any = value
    while isinstance(fn, KernelInterface):  # Autotuner -> Heuristics -> JITFunction -> the Python function
        fn = getattr(fn, "fn", None)
    code = getattr(fn, "__code__", None)
    return str(Path(code.co_filename).resolve()) if code is not None else None


def _under(file: Path, folder: Path) -> bool:
    return file.is_relative_to(folder) and "site-packages" not in file.relative_to(folder).parts
