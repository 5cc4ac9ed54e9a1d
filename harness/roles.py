"""Which arguments of a launch wrapper a kernel writes: out= buffers and in/out buffers.

A wrapper that accumulates into an argument (`add_inputs=True`, `out += ...`) reads it and writes it.
Judged as a plain input, its change is "an input was modified"; declared as an out= buffer, it is
poisoned before the call and the kernel's own baseline fails. So roles are inferred from the kernel
itself: one call of the entry with its launches intercepted (nothing compiles or runs) maps each
tensor argument to the kernel parameters it is passed as, and the kernel's source says which
parameters it loads through and which it stores or does atomics through.
"""

from __future__ import annotations

import ast
import contextlib
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ArgumentRoles", "argument_roles", "kernel_access"]

_READS = {"load"}
_WRITES = {"store"}
_READ_WRITES = {"atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg",
                "atomic_cas"}


@dataclass(frozen=True)
class ArgumentRoles:
    """Indices of the entry's positional arguments: written only (`outputs`), read and written (`inouts`)."""

    outputs: tuple[int, ...] = ()
    inouts: tuple[int, ...] = ()


def kernel_access(source: str, params: list[str], constants: dict[str, Any] | None = None) -> tuple[set[str], set[str]]:
    """The parameters a kernel reads memory through and those it writes through, from its source.

    A name assigned from an expression that mentions a parameter stands for that parameter (pointer
    arithmetic, block pointers); the first argument of tl.load / tl.store / tl.atomic_* is the access.
    `if FLAG:` on a launch constant (`constants`, e.g. ADD_INPUTS=False) visits only the branch taken."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return set(), set()
    derived: dict[str, set[str]] = {p: {p} for p in params}

    def origins(node: ast.AST) -> set[str]:
        return set().union(*(derived.get(n.id, set()) for n in ast.walk(node) if isinstance(n, ast.Name)))

    changed = True
    while changed:  # to a fixpoint: `p = base + off` may come before or after `base = X + row * stride`
        changed = False
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets, value = [node.target], node.value
            if value is None:
                continue
            found = origins(value)
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    before = derived.setdefault(name, set())
                    if not found <= before:
                        before |= found
                        changed = True
    reads: set[str] = set()
    writes: set[str] = set()
    for node in _reachable(tree, constants or {}):
        if not isinstance(node, ast.Call) or not (node.args or node.keywords):
            continue
        leaf = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        pointer = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "pointer"), None)
        if pointer is None:
            continue
        touched = origins(pointer) & set(params)
        if leaf in _READS or leaf in _READ_WRITES:
            reads |= touched
        if leaf in _WRITES or leaf in _READ_WRITES:
            writes |= touched
    return reads, writes


def _reachable(tree: ast.AST, constants: dict[str, Any]) -> Iterator[ast.AST]:
    """The nodes of `tree`, leaving out the branches of `if NAME:` / `if not NAME:` that a constant rules out."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If):
            test, negate = node.test, False
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, negate = test.operand, True
            if isinstance(test, ast.Name) and isinstance(constants.get(test.id), (bool, int)):
                taken = bool(constants[test.id]) != negate
                todo.append(test)
                todo.extend(node.body if taken else node.orelse)
                continue
        todo.extend(ast.iter_child_nodes(node))


def argument_roles(entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ArgumentRoles:
    """The roles of `entry`'s tensor arguments in one call on `args` whose launches are recorded, not run
    (best effort: a call that fails gives none; the judge runs the entry for real and says why)."""
    try:
        with _recorded_launches() as launches:
            entry(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the judge reports the failure itself
        return ArgumentRoles()
    read_storages: set[int] = set()
    written_storages: set[int] = set()
    for fn, bound in launches:
        constants = {k: v for k, v in bound.items() if isinstance(v, (bool, int))}
        reads, writes = kernel_access(_source(fn), list(bound), constants)
        for name, value in bound.items():
            if not hasattr(value, "untyped_storage"):
                continue
            address = int(value.untyped_storage().data_ptr())
            if name in reads:
                read_storages.add(address)
            if name in writes:
                written_storages.add(address)
    outputs: list[int] = []
    inouts: list[int] = []
    for i, arg in enumerate(args):
        if not hasattr(arg, "untyped_storage"):
            continue
        address = int(arg.untyped_storage().data_ptr())
        if address in written_storages:
            (inouts if address in read_storages else outputs).append(i)
    return ArgumentRoles(tuple(outputs), tuple(inouts))


@contextlib.contextmanager
def _recorded_launches() -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """Within the block, `kernel[grid](...)` records the kernel and its bound arguments and returns:
    compiled (JITFunction) and interpreted (TRITON_INTERPRET=1) kernels alike; an autotuned kernel
    records its first config instead of benchmarking them all."""
    import inspect

    from triton.runtime import autotuner
    from triton.runtime.jit import JITFunction

    launches: list[tuple[Any, dict[str, Any]]] = []
    classes: list[Any] = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)

    def record(self: Any, *args: Any, grid: Any = None, warmup: Any = None, **kwargs: Any) -> None:
        signature = inspect.signature(self.fn)
        known = {k: v for k, v in kwargs.items() if k in signature.parameters}
        with contextlib.suppress(TypeError):
            launches.append((self, dict(signature.bind_partial(*args, **known).arguments)))

    def first_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.fn.run(*args, **{**kwargs, **self.configs[0].all_kwargs()})

    saved = [(cls, cls.run) for cls in classes] + [(autotuner.Autotuner, autotuner.Autotuner.run)]
    for cls in classes:
        cls.run = record
    autotuner.Autotuner.run = first_config
    try:
        yield launches
    finally:
        for cls, run in saved:
            cls.run = run


def _source(fn: Any) -> str:
    import inspect

    src = getattr(fn, "src", None)
    if isinstance(src, str):
        return src
    try:
        return inspect.getsource(fn.fn)
    except (OSError, TypeError):
        return ""
