"""Launch the output tiles of a dot kernel in groups, so that the programs resident at once share their
operand tiles in L2 (issue 27; pattern grouped-program-order, for L2's `dot.tile-underused`, ranked after the tile search).

A GEMM on a 2-D grid `(tiles along axis 0, tiles along axis 1)` is launched with axis 0 fastest: the
programs resident at one time walk one whole column of output tiles, each reading its own row band of the
first operand and all of them the same band of the second. Across the device that is a stream through one
operand whose reuse L2 cannot hold on large products. Grouping the order (Triton's matmul tutorial,
"L2 cache optimizations") makes consecutive programs cover a band of G tiles along axis 1 before they move
along axis 0, so the resident programs read G bands of one operand and a short run of the other.

The rewrite is a renumbering: every `tl.program_id(0)` and `tl.program_id(1)` of the kernel is replaced by
the program's coordinates in the grouped order, computed from its launch position by the tutorial's map,
which is a bijection of the grid for any group size and any grid (the last group narrower; a 1-D launch
maps to itself). Programs of a Triton launch run in no guaranteed order, so a kernel whose result depended
on it was already racy: the renumbering changes no value a race-free kernel computes. It applies to a
kernel with `tl.dot` that reads both axes' program ids at literal axes, calls no other jit function that
reads program ids (nor is one itself), and is not grouped already (`tl.swizzle2d`, or `tl.num_programs` in use: a persistent or
already-renumbered kernel). Variants: groups of 8, 4 and 16 tiles.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    ReplaceNodes,
    Variant,
    docstring_lines,
    dotted,
    jit_functions,
    program_axis,
    register,
    top_level_imports,
)

__all__ = ["GROUPS", "grouped_program_order"]

GROUPS = (8, 4, 16)

_PROLOGUE = """\
_kb_i, _kb_j = tl.program_id(0), tl.program_id(1)  # the launch position (axis 0 fastest)
_kb_ni, _kb_nj = tl.num_programs(0), tl.num_programs(1)
_kb_lin = _kb_j * _kb_ni + _kb_i
_kb_in_group = {group} * _kb_ni
_kb_first = (_kb_lin // _kb_in_group) * {group}
_kb_group = min(_kb_nj - _kb_first, {group})
_kb_pid1 = _kb_first + (_kb_lin % _kb_in_group) % _kb_group  # grouped-program-order: {group} tiles along axis 1
_kb_pid0 = (_kb_lin % _kb_in_group) // _kb_group
"""


_INTRODUCED = frozenset({"_kb_i", "_kb_j", "_kb_ni", "_kb_nj", "_kb_lin", "_kb_in_group", "_kb_first", "_kb_group",
                         "_kb_pid0", "_kb_pid1"})


def _program_ids(node: cst.CSTNode) -> list[cst.Call]:
    return [cst.ensure_type(c, cst.Call) for c in m.findall(node, m.Call()) if dotted(cst.ensure_type(c, cst.Call).func)
            in ("tl.program_id", "triton.language.program_id")]


def _axis(call: cst.Call) -> int | None:
    """The literal axis of a program-id call, positional or `axis=`."""
    if call.args and call.args[0].keyword is not None and call.args[0].keyword.value == "axis":
        call = call.with_changes(args=[call.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)])
    return program_axis(call.with_changes(func=cst.parse_expression("tl.program_id")))


def _called(fn: cst.FunctionDef, functions: dict[str, cst.FunctionDef]) -> set[str]:
    """The jit functions `fn` calls, directly or through one another."""
    seen: set[str] = set()
    todo = [fn]
    while todo:
        for call in m.findall(todo.pop(), m.Call()):
            name = dotted(cst.ensure_type(call, cst.Call).func)
            if name in functions and name not in seen:
                seen.add(name)
                todo.append(functions[name])
    return seen


def _groupable(module: cst.Module, kernel: cst.FunctionDef) -> list[cst.Call] | None:
    """The kernel's program-id calls of axes 0 and 1 where the rewrite applies, else None."""
    if not m.findall(kernel, m.Call(func=m.Attribute(attr=m.Name("dot")))):
        return None
    functions = jit_functions(module)
    name = kernel.name.value
    if not m.findall(module, m.Call(func=m.Subscript(value=m.Name(name)))) \
            or any(name in _called(fn, functions) for fn in functions.values()):
        return None  # not launched, or called as a helper: its program ids are its caller's
    if any(_program_ids(functions[helper]) for helper in _called(kernel, functions)):
        return None  # a helper reads program ids the renumbering would not reach
    if any(dotted(cst.ensure_type(c, cst.Call).func).endswith(("swizzle2d", "num_programs"))
           for c in m.findall(kernel, m.Call())):
        return None
    calls = _program_ids(kernel)
    axes = [_axis(c) for c in calls]
    if None in axes or not {0, 1} <= set(axes):
        return None
    return [c for c, axis in zip(calls, axes, strict=True) if axis in (0, 1)]


def _grouped(kernel: cst.FunctionDef, calls: list[cst.Call], group: int) -> cst.FunctionDef:
    names: dict[int, cst.BaseExpression] = {id(c): cst.Name("_kb_pid0" if _axis(c) == 0 else "_kb_pid1")
                                            for c in calls}
    body = list(cst.ensure_type(kernel.visit(ReplaceNodes(names)), cst.FunctionDef).body.body)
    at = docstring_lines(body)
    prologue = list(cst.parse_module(_PROLOGUE.format(group=group)).body)
    return kernel.with_changes(body=kernel.body.with_changes(body=[*body[:at], *prologue, *body[at:]]))


@register("grouped-program-order")
def grouped_program_order(source: str, context: dict[str, Any]) -> list[Variant]:
    """Each dot kernel on a 2-D grid renumbered to launch its tiles in groups (the module's docstring); []
    where none applies. The diagnosis's launched kernels, where known, limit it to those."""
    if "tl.dot" not in source and ".dot(" not in source:
        return []
    module = cst.parse_module(source)
    if ("triton.language", "tl") not in top_level_imports(module) or any(
            isinstance(n, cst.Name) and n.value in _INTRODUCED for n in m.findall(module, m.Name())):
        return []  # the renumbering is spelled with `tl`, and its names must be free
    launched = set(context.get("launched") or {})
    targets = {name: calls for name, fn in jit_functions(module).items()
               if (not launched or name in launched) and (calls := _groupable(module, fn)) is not None}
    if not targets:
        return []
    variants = []
    for group in GROUPS:
        new = module.with_changes(body=[
            _grouped(stmt, targets[stmt.name.value], group)
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value in targets else stmt
            for stmt in module.body])
        variants.append(Variant({"group": group, "kernels": sorted(targets)}, new.code))
    return variants
