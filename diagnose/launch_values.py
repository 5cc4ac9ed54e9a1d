"""Integer expressions at a launch's values: what L1 and L2 read of a kernel's loops and index math
when the launch fixes its integers (`LaunchFacts.integers`)."""

from __future__ import annotations

import ast
import copy
from typing import Any

from diagnose.features import dotted_name

__all__ = ["address_definitions", "evaluate", "expand", "single_assignments", "trip_count"]


def trip_count(bounds: str, values: dict[str, int], definitions: dict[str, ast.expr] | None = None) -> int | None:
    """Iterations of `range(bounds)` with the launch's integers, names the kernel assigns once
    (`definitions`, e.g. `NT = tl.cdiv(T, BT)`) read through; None when they do not fix it."""
    try:
        tree = ast.parse(f"({bounds},)", mode="eval")
    except SyntaxError:
        return None
    args = [evaluate(expand(a, definitions, 8) if definitions else a, values) for a in getattr(tree.body, "elts", [])]
    if not args or any(a is None for a in args) or len(args) > 4:
        return None
    ints = [int(a) for a in args if a is not None]
    start, stop, step = (0, ints[0], 1) if len(ints) == 1 else (ints[0], ints[1], ints[2] if len(ints) >= 3 else 1)
    if step == 0:
        return None
    return max(0, -(-(stop - start) // step)) if step > 0 else max(0, -(-(start - stop) // -step))


def evaluate(node: ast.expr, values: dict[str, int]) -> int | None:
    """An integer expression of the launch's values: names, + - * // % and cdiv/min/max; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        return values.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = evaluate(node.operand, values)
        return -inner if inner is not None else None
    if isinstance(node, ast.BinOp):
        a, b = evaluate(node.left, values), evaluate(node.right, values)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.FloorDiv) and b:
            return a // b
        if isinstance(node.op, ast.Mod) and b:
            return a % b
        return None
    if isinstance(node, ast.Call):
        leaf = dotted_name(node.func).split(".")[-1]
        args = [evaluate(a, values) for a in node.args]
        if None in args:
            return None
        ints = [int(a) for a in args if a is not None]
        if leaf == "cdiv" and len(ints) == 2 and ints[1]:
            return -(-ints[0] // ints[1])
        if leaf in ("min", "minimum") and ints:
            return min(ints)
        if leaf in ("max", "maximum") and ints:
            return max(ints)
    return None


def single_assignments(fn: ast.FunctionDef) -> dict[str, ast.expr]:
    """Names assigned exactly once in the kernel, to what: the expressions an address is built from."""
    count: dict[str, int] = {}
    value: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            count[target] = count.get(target, 0) + 1
            value[target] = node.value
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            count[node.target.id] = count.get(node.target.id, 0) + 2  # rebinding: not a single definition
    return {k: v for k, v in value.items() if count[k] == 1}


def address_definitions(fn: ast.FunctionDef) -> tuple[dict[str, ast.expr], set[str]]:
    """What an address is built from, pointers moved in place included: `single_assignments`, plus each
    name rebound only by `+=` / `-=` as its first value (its one assignment, or itself for a parameter)
    plus the steps (`X += row * stride` is `X + row * stride`; attorch's `W += stride * cols[None, :]`
    before its loop adds the tile's unit-stride axis). Also the names whose value the source does not
    fix that way (assigned twice, or rebound by another operator): an address holding one is unknown."""
    plain: dict[str, list[ast.expr]] = {}
    steps: dict[str, list[ast.expr]] = {}
    other: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            plain.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            if isinstance(node.op, (ast.Add, ast.Sub)):
                steps.setdefault(node.target.id, []).append(
                    node.value if isinstance(node.op, ast.Add) else ast.UnaryOp(ast.USub(), node.value))
            else:
                other.add(node.target.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            other.add(node.target.id)
    definitions = {name: values[0] for name, values in plain.items() if len(values) == 1 and name not in other}
    for name, moves in steps.items():
        if name in other or len(plain.get(name, [])) > 1:
            continue
        value = plain[name][0] if name in plain else ast.Name(name, ast.Load())
        for step in moves:
            value = ast.BinOp(value, ast.Add(), step)
        definitions[name] = value
    unknown = other | {name for name, values in plain.items() if len(values) > 1}
    return definitions, unknown


def expand(node: ast.expr, definitions: dict[str, ast.expr], depth: int, _inside: frozenset[str] = frozenset()) -> ast.expr:
    """`node` with defined names replaced by their definitions, `depth` levels deep. A name inside its
    own definition (a moved parameter, `X + row * stride`) stays itself."""
    if depth <= 0:
        return node

    class Inline(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> Any:
            if name.id in definitions and name.id not in _inside:
                return expand(definitions[name.id], definitions, depth - 1, _inside | {name.id})
            return name

    return Inline().visit(copy.deepcopy(node))
