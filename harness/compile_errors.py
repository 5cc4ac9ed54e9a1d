"""A kernel that does not compile, said the way its author can act on it.

Triton's `CompilationError` prints `at 6:8:`, an excerpt and (sometimes) the cause, with the line
counted from the kernel's `def`. Users from the wild mostly hit one class of failure: the kernel was
written for another Triton, whose `tl` had an API this one lacks (libdevice math under `tl.math` before
3.0, `tl.libdevice` in 2.0). The one line names the file and line, the cause, and for a known move the
version that has the API and the command to compile against it; Triton's whole text is kept as the
error's detail.
"""

from __future__ import annotations

import re
from typing import Any

from harness.errors import UserFacingError

__all__ = ["CompileFailed", "compile_failure", "one_line"]


class CompileFailed(UserFacingError):
    """The kernel does not compile with the installed Triton. What needs no compile (the source, the
    launch, measurements) still stands: diagnosis goes on without L3 and says why."""

_MISSING_ATTR = re.compile(r"module '(triton\.language(?:\.[\w.]+)?)' has no attribute '(\w+)'")
# APIs a newer Triton removed while keeping the name, so that it raises at compile time: what Triton
# says, what was removed, what replaces it, and the last version known to compile it (checked there).
_REMOVED = (
    (re.compile(r"Block pointers have been removed"), "block pointers (tl.make_block_ptr, tl.advance)",
     "tensor descriptors (tl.make_tensor_descriptor)", "3.6"),
)


def compile_failure(exc: BaseException, fn: Any, target: str) -> CompileFailed:
    """The CompileFailed for `exc`, raised compiling JIT function `fn` for `target`."""
    import triton

    name = getattr(getattr(fn, "fn", None), "__qualname__", "kernel")
    where = _location(exc, fn)
    cause = _cause(exc)
    problem = f"kernel {name} does not compile for {target}{' at ' + where if where else ''}: {cause}"
    fix = "fix the kernel (run it under TRITON_INTERPRET=1 to debug) or pick another --target"
    removed = next((r for r in _REMOVED if r[0].search(cause)), None)
    if removed is not None:
        _, api, replacement, last = removed
        problem = (f"kernel {name} uses {api}{' at ' + where if where else ''}, which Triton {triton.__version__} "
                   f"removed; Triton {last} still compiles them: the kernel was written for an older Triton")
        fix = (f"rewrite it with {replacement}, or compile it against Triton {last} in its own environment: "
               f"python -m venv .venv-old && .venv-old/bin/pip install 'triton=={last}.*' -e . && .venv-old/bin/kb why ...")
        return CompileFailed(problem, fix, detail=str(exc))
    missing = _MISSING_ATTR.search(cause)
    if missing:
        moved = _moved_api(missing.group(1), missing.group(2))
        installed = triton.__version__
        if moved is not None:
            new_home, version = moved
            problem = (f"kernel {name} uses {missing.group(1).replace('triton.language', 'tl')}.{missing.group(2)}"
                       f"{' at ' + where if where else ''}, which Triton {installed} does not have: it is "
                       f"{new_home} since Triton {version}; the kernel was written for an older Triton")
            fix = (f"call {new_home} instead, or compile it against the Triton it was written for in its own "
                   f"environment: python -m venv .venv-old && .venv-old/bin/pip install 'triton<{version}' -e . "
                   "&& .venv-old/bin/kb why ...")
        else:
            problem = (f"kernel {name} uses {missing.group(1).replace('triton.language', 'tl')}.{missing.group(2)}"
                       f"{' at ' + where if where else ''}, which Triton {installed} does not have: the kernel was "
                       "written for another Triton")
            fix = ("compile it against the Triton it was written for (see its requirements) in its own environment: "
                   "python -m venv .venv-old && .venv-old/bin/pip install 'triton==<its version>' -e . "
                   "&& .venv-old/bin/kb why ...")
    return CompileFailed(problem, fix, detail=str(exc))


def one_line(exc: BaseException) -> str | None:
    """`CompilationError at 19:8: <cause>` for an exception raised by a kernel that does not compile, else
    None. Triton's own first line is only `at 19:8:`, which is all a one-line report would keep."""
    error = _compilation_error(exc)
    if error is None:
        return None
    line, column = getattr(getattr(error, "node", None), "lineno", None), getattr(getattr(error, "node", None), "col_offset", 0)
    where = f" at {line}:{column}" if line is not None else ""
    return f"CompilationError{where}: {_cause(exc)}"


def _location(exc: BaseException, fn: Any) -> str:
    """file:line of the failing node, counted in the file (Triton counts from the kernel's def)."""
    node = getattr(_compilation_error(exc), "node", None)
    line = getattr(node, "lineno", None)
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    if line is None or code is None:
        return ""
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{_def_line(code) + line - 1}"


def _def_line(code: Any) -> int:
    """The line of the `def` itself: JITFunction parses the source from there (decorators dropped), while
    the code object starts at the first decorator."""
    import linecache

    line = code.co_firstlineno
    for offset in range(50):
        text = linecache.getline(code.co_filename, line + offset).lstrip()
        if text.startswith(("def ", "async def ")):
            return line + offset
    return line


def _compilation_error(exc: BaseException) -> BaseException | None:
    seen = exc
    while seen is not None:
        if type(seen).__name__ == "CompilationError":
            inner = seen.__cause__ or seen.__context__
            if inner is not None and type(inner).__name__ == "CompilationError":  # the innermost says where
                seen = inner
                continue
            return seen
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    return None


def _cause(exc: BaseException) -> str:
    """The decisive message: the compilation error's own message, else its root cause's."""
    error = _compilation_error(exc)
    if error is not None:
        message = getattr(error, "error_message", None)
        if message:
            return str(message).strip().splitlines()[-1][:400]
        root = error.__cause__ or error.__context__
        if root is not None:
            return f"{type(root).__name__}: {str(root).strip().splitlines()[-1] if str(root).strip() else ''}"[:400]
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400]


def _moved_api(module: str, name: str) -> tuple[str, str] | None:
    """Where an API absent from the installed `tl` lives now, and the Triton version it moved in."""
    if module == "triton.language" and name == "libdevice":  # Triton 2.0's home of libdevice math
        return "triton.language.extra.libdevice", "3.0"
    if module in ("triton.language.math", "triton.language.libdevice") and _in_libdevice(name):
        # Triton 3.0 moved libdevice math out of tl.math (2.1-2.3) and tl.libdevice (2.0).
        return f"tl.extra.libdevice.{name} (from triton.language.extra import libdevice)", "3.0"
    return None


def _in_libdevice(name: str) -> bool:
    try:
        from triton.language.extra import libdevice
    except ImportError:
        return False
    return hasattr(libdevice, name)
