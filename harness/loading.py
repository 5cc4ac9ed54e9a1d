"""Importing a kernel file from the wild: under a private module name, inside its package when it sits in
one (relative imports resolve), with Triton's older leniency for autotune keys, and failing in one line
that says what to do (install a module, use the GPU machine, or the Triton the file was written for).
A rewrite of a kernels file that another file's launch wrapper imports from is seen by that wrapper."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.errors import UserFacingError, first_line
from harness.guards import binds_name

__all__ = ["load_kernel_module", "load_rewrite", "package_of"]


def load_kernel_module(path: str | os.PathLike[str], stands_in_for: str | os.PathLike[str] | None = None) -> ModuleType:
    """Import a kernel file from the wild under a private module name. A rewrite written elsewhere (an
    optimize run's folder) `stands_in_for` the file it was made from: it imports as if it sat there, in
    that file's package and beside its siblings (`from liger_kernel.ops.utils import ...`, `from .utils
    import ...`), which its own folder does not hold."""
    file = Path(path).resolve()
    home = Path(stands_in_for).resolve() if stands_in_for else file
    if not file.is_file():
        raise UserFacingError(f"kernel file {path} does not exist", "pass the path of a .py file with a @triton.jit kernel")
    name = f"kb_kernel_{file.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UserFacingError(f"kernel file {path} is not a Python module", "pass a .py file")
    module = importlib.util.module_from_spec(spec)
    package, root = package_of(home)
    if package:
        # A file inside a package (`from .utils import ...`, `from liger_kernel.ops import ...`): its
        # relative imports resolve against the package, imported from the folder above it, which stays
        # on the path for the imports its functions make when called.
        module.__package__ = package
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    sys.modules[name] = module  # triton's JIT looks the module up by name for globals
    folders = list(dict.fromkeys([str(file.parent), str(home.parent)]))
    sys.path[:0] = folders  # kernels often import their siblings
    try:
        with _autotune_keys_as_before():
            spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - any failure of user code is the user's to fix
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        needs_gpu = "CUDA" in str(exc) or "NVIDIA driver" in str(exc)
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if needs_gpu:
            fix = "it needs a GPU at import: run it on the GPU machine (`kb why` and `kb diagnose` compile it here)"
        elif missing:
            fix = f"install what it imports in this environment (pip install {missing.split('.')[0]})"
        elif _raised_by_triton(exc):
            import triton

            fix = (f"Triton {triton.__version__} itself refused it: the file may be written for another Triton; "
                   "compile it against that one in its own environment (pip install 'triton==<its version>')")
        else:
            fix = "fix the error so that `python " + str(path) + "` runs"
        raise UserFacingError(f"kernel file {path} does not import: {type(exc).__name__}: {first_line(exc)}", fix) from exc
    finally:
        for folder in folders:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
    return module


def load_rewrite(file: str | os.PathLike[str], kernel_file: str | os.PathLike[str],
                 entry_file: str | os.PathLike[str] | None = None, entry: str = "") -> ModuleType:
    """The module to look a rewrite's entry up in. `file` rewrites `kernel_file` (an optimize round, a
    `--candidate`). Where the entry lives in that same file, it is the rewrite itself, imported as if it
    sat there. Where the entry lives in `entry_file`, a layer that imports its kernels from `kernel_file`
    (`from .linear_kernels import linear_forward_kernel`), the rewrite is installed under the kernel
    file's module name and a fresh copy of `entry_file` is imported, so the wrapper launches the rewritten
    kernels. The installed name stays for the process's life (modules that import the kernel file later
    get the rewrite too), which is why each rewrite is hosted in a worker of its own. A rewrite that
    defines the `entry` itself (a user's whole new layer) stands in for `entry_file` instead."""
    kernel = Path(kernel_file).resolve()
    if entry_file is None or Path(entry_file).resolve() == kernel:
        return load_kernel_module(file, kernel)
    if entry and _binds(file, entry.split(".")[0]):
        return load_kernel_module(file, entry_file)
    rewritten = load_kernel_module(file, kernel)
    package, _ = package_of(kernel)
    sys.modules[f"{package}.{kernel.stem}" if package else kernel.stem] = rewritten
    parent = sys.modules.get(package) if package else None
    if parent is not None:  # `from . import kernels` reads the package's attribute first
        setattr(parent, kernel.stem, rewritten)
    return load_kernel_module(entry_file)


def _binds(file: str | os.PathLike[str], name: str) -> bool:
    """Whether the file binds `name` at module level (a def, a class, an assignment or an import)."""
    try:
        return binds_name(ast.parse(Path(file).read_text(encoding="utf-8")), name, imports=True)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def _autotune_keys_as_before() -> Iterator[None]:
    """Triton up to 3.x dropped `key` (and `reset_to_zero`, `restore_value`) names that are not kernel
    arguments without a word; newer Triton refuses the decoration, so whole libraries written against the
    older behaviour (flash-linear-attention) no longer import. While a kernel file imports, such names
    are dropped as they used to be, with a note on stderr."""
    from triton.runtime import autotuner

    original = autotuner.Autotuner.__init__

    def lenient(self: Any, fn: Any, arg_names: Any, configs: Any, key: Any, reset_to_zero: Any, restore_value: Any,
                *args: Any, **kwargs: Any) -> None:
        names = set(arg_names)
        dropped = sorted({n for group in (key or [], reset_to_zero or [], restore_value or []) for n in group
                          if n not in names})
        if dropped:
            print(f"note: {getattr(fn, '__name__', 'kernel')}: autotune names {', '.join(dropped)} are not kernel "
                  "arguments; dropped, as Triton before the check did", file=sys.stderr)
        keep = [n for n in (key or []) if n in names]
        original(self, fn, arg_names, configs, keep,
                 [n for n in reset_to_zero if n in names] if reset_to_zero is not None else None,
                 [n for n in restore_value if n in names] if restore_value is not None else None, *args, **kwargs)

    autotuner.Autotuner.__init__ = lenient
    try:
        yield
    finally:
        autotuner.Autotuner.__init__ = original


def _raised_by_triton(exc: BaseException) -> bool:
    """Whether the innermost frame of the traceback is Triton's own code (a check at decoration time)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}triton{os.sep}" in tb.tb_frame.f_code.co_filename


def package_of(file: Path) -> tuple[str, Path]:
    """The dotted package a file sits in (folders with __init__.py above it) and the folder holding the
    top package; ("", file's folder) outside a package."""
    parts: list[str] = []
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), folder
