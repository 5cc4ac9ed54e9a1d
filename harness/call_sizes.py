"""The sizes an example call makes its tensors with, so that a task made from one call has held-out shapes.

A kernel from the wild comes with one call (`col_sum(torch.randn(8192, 4096))`) and so one shape: a rewrite
that is right at that shape only (a mask dropped because 4096 divides the block, a grid hard-coded to it)
would pass every check. The integer literals that size the call's tensors are its shape; each distinct value
is one size, and every literal of that value in the call moves with it (`torch.randint(0, 5000, (20000,))`
beside `torch.randn(5000, 64)`: the index range follows the table). A held-out case is the call with one size
made smaller, often odd. Which of those the kernel as written supports is not known from the call (a head
dim of 64 may be a power of two on purpose): the judge holds candidates only to the drawn cases the task's
own kernel passes (`harness.judge`).
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["SIZE_FLOOR", "call_sizes", "resized", "size_key", "size_ranges"]

# Factories whose size arguments are tensor shapes: every positional int (or a tuple of them) unless the
# name maps to the positions that are sizes (full's fill value, randint's bounds are values, not sizes).
_FACTORIES: dict[str, slice | None] = {
    "randn": None, "rand": None, "empty": None, "zeros": None, "ones": None, "randperm": None, "eye": None,
    "arange": None, "full": slice(0, 1), "randint": slice(-1, None), "linspace": slice(2, 3),
}
SIZE_FLOOR = 4  # smaller literals (batch 2, dim=1, a stride) are left as written


def size_key(value: int) -> str:
    """A size's case key: the case label reads `size4096=1735`."""
    return f"size{value}"


def call_sizes(call: ast.Call) -> dict[str, int]:
    """The call's sizes, key -> the literal's value, in the order they first appear."""
    found: dict[str, int] = {}
    for node in ast.walk(call):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in _FACTORIES:
            continue
        span = _FACTORIES[name]
        keyword = [k.value for k in node.keywords if k.arg == "size"]
        positional = [] if keyword and span is not None else node.args if span is None else node.args[span]
        sized = [*positional, *keyword]
        for value in _ints(sized):
            if value >= SIZE_FLOOR:
                found.setdefault(size_key(value), value)
    return found


def size_ranges(sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Where each size's held-out values are drawn from: from half the call's own down to a sixteenth of it.
    A kernel specialised to the call's shape fails at any other; the call itself covers the largest size,
    and on the interpreter a check costs what its size does."""
    return {key: (max(2, value // 16), max(2, value // 2)) for key, value in sizes.items()}


def resized(call: ast.Call, sizes: dict[int, int]) -> ast.Call:
    """`call` with every int literal of a changed size replaced, except in keywords that name a launch knob
    (`BLOCK=1024`, `num_warps=8`: a constexpr, not the problem's size)."""
    class _Resize(ast.NodeTransformer):
        def visit_keyword(self, node: ast.keyword) -> Any:
            return node if node.arg and _is_knob(node.arg) else self.generic_visit(node)

        def visit_Constant(self, node: ast.Constant) -> Any:
            if type(node.value) is int and node.value in sizes:
                return ast.copy_location(ast.Constant(sizes[node.value]), node)
            return node

    copy = _Resize().visit(ast.parse(ast.unparse(call), mode="eval").body)
    assert isinstance(copy, ast.Call)
    return copy


def _ints(nodes: list[ast.expr]) -> list[int]:
    out: list[int] = []
    for node in nodes:
        if isinstance(node, (ast.Tuple, ast.List)):
            out += _ints(list(node.elts))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(node.value)
    return out


def _is_knob(name: str) -> bool:
    upper = name.upper()
    return "BLOCK" in upper or "TILE" in upper or upper.startswith("GROUP") or \
        name in ("num_warps", "num_stages", "num_ctas", "maxnreg")
