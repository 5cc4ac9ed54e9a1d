"""Whether a kernel's block size may grow or shrink without changing what it computes.

A launch search, a tile table or a widened autotune list changes block sizes, and the judge checks the
result only at the task's sizes. A block may grow where every access that steps through its lanes is
masked along them, by a comparison capping them from above (and where a max or min reduces the lanes,
the masked loads fill them with its identity, an infinity): the lanes past the extent then read and
write nothing (a matmul whose K loop loads unmasked is right for any K that is a multiple of the written
BLOCK_K, and wrong at K = 96 once BLOCK_K is 64). A block may shrink where it steps a loop or sizes a program axis: smaller blocks are then walked
by more iterations or more programs, while a block that only spans a tile (one row a program, its
width the row's) would leave the rest of the row undone. More programs only where the grid follows the
block (`axis`: the caller checks the launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted, mask_argument
from diagnose.rewriters.blocks import arange_width, infinity_sign, local_definitions, names_in
from diagnose.rewriters.hints import expanded

__all__ = ["Resizing", "block_resizing", "kernels_resizing"]

_ACCESSES = ("tl.load", "tl.store")


@dataclass(frozen=True)
class Resizing:
    grow: bool
    shrink: bool
    axis: bool = False  # the block sizes a program axis: a smaller one needs a grid that follows it


def _spans(expr: cst.CSTNode, block: str, lanes: set[str]) -> bool:
    """Whether `expr` reads a `tl.arange(0, block)` or a name computed from one."""
    return bool(names_in(expr) & lanes) or any(
        arange_width(c) == block for c in m.findall(expr, m.Call()))  # type: ignore[arg-type]


def _lanes(fn: cst.FunctionDef, block: str, definitions: dict[str, list[cst.BaseExpression]]) -> set[str]:
    """The names computed from the block's `tl.arange(0, block)`, at any depth of the kernel."""
    lanes: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, values in definitions.items():
            if name not in lanes and any(_spans(v, block, lanes) for v in values):
                lanes.add(name)
                changed = True
    return lanes


def _bounds(expr: cst.BaseExpression, block: str, lanes: set[str]) -> bool:
    """Whether `expr` holds a comparison that caps the block's lanes: `lanes < X`, `lanes <= X`, `X > lanes`
    or `X >= lanes`, X not itself sized by the block (`cols < BLOCK` caps nothing once BLOCK grows)."""
    def fixed(side: cst.BaseExpression) -> bool:
        return block not in names_in(side) and not _spans(side, block, lanes)

    for node in m.findall(expr, m.Comparison()):
        comparison = cst.ensure_type(node, cst.Comparison)
        left: cst.BaseExpression = comparison.left
        for target in comparison.comparisons:
            below = isinstance(target.operator, (cst.LessThan, cst.LessThanEqual)) and _spans(left, block, lanes) \
                and fixed(target.comparator)
            above = isinstance(target.operator, (cst.GreaterThan, cst.GreaterThanEqual)) \
                and _spans(target.comparator, block, lanes) and fixed(left)
            if below or above:
                return True
            left = target.comparator
    return False


# Reductions whose identity is an infinity: a masked lane's `other` takes part unless it is that infinity.
_EXTREMA = {"max": -1, "argmax": -1, "min": 1, "argmin": 1}


def _masked_lanes_neutral(fn: cst.FunctionDef, block: str, lanes: set[str],
                          definitions: dict[str, list[cst.BaseExpression]]) -> bool:
    """Whether lanes a grown block adds, masked off, leave its max / min reductions alone: every masked load
    along the lanes fills them with the reduction's identity (`other=-inf` for a max), or the reduced value
    is selected by a capping mask (`tl.where(cols < n, x, -inf)`). A row max loading `other=0.0` is right
    where BLOCK fits the row exactly and wrong for negative rows once BLOCK grows past it. Read on 1-D
    tiles only (one `tl.arange` in the kernel): in a 2-D tile a max along the other axis (attention's
    row max over its keys) never combines this block's lanes, and which axis is which is not read here."""
    if len(m.findall(fn, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange"))))) != 1:
        return True
    signs = set()
    for node in m.findall(fn, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        last = dotted(call.func).rsplit(".", 1)[-1]
        if last not in _EXTREMA or not call.args or not _spans(call.args[0].value, block, lanes):
            continue
        operand = call.args[0].value
        chain = expanded([operand], definitions)
        if any(isinstance(e, cst.Call) and dotted(e.func) == "tl.where" and e.args
               and _bounds(e.args[0].value, block, lanes) for e in chain):
            continue
        signs.add(_EXTREMA[last])
    if not signs:
        return True
    for node in m.findall(fn, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        if dotted(call.func) != "tl.load" or not call.args or not _spans(call.args[0].value, block, lanes) \
                or mask_argument(call) is None:
            continue
        other = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "other"), None)
        if other is None or len(signs) > 1 or infinity_sign(other) != next(iter(signs)):
            return False
    return True


def block_resizing(fn: cst.FunctionDef, block: str) -> Resizing:
    """May the constexpr `block` of kernel `fn` grow, may it shrink (the module's docstring says when)."""
    definitions = local_definitions(fn)
    lanes = _lanes(fn, block, definitions)
    grow = True
    for call in m.findall(fn, m.Call()):
        assert isinstance(call, cst.Call)
        name = dotted(call.func)
        if not (name in _ACCESSES or name.startswith("tl.atomic_")) or not call.args:
            continue
        if not _spans(call.args[0].value, block, lanes):
            continue
        at = mask_argument(call)
        # the mask, or what its names are computed from, bounds the lanes from above (`mask` defined as
        # `cols < n`; `cols >= 0` reads them and bounds nothing)
        if at is None or not any(_bounds(e, block, lanes) for e in expanded([call.args[at].value], definitions)):
            grow = False
            break
    if grow and not _masked_lanes_neutral(fn, block, lanes, definitions):
        grow = False
    loops = any(block in names_in(cst.ensure_type(f, cst.For).iter) for f in m.findall(fn, m.For()))
    programs = {name for name, values in definitions.items()
                if any(m.findall(v, m.Call(func=m.Attribute(attr=m.Name("program_id")))) for v in values)}
    axis = False
    for product in m.findall(fn, m.BinaryOperation(operator=m.Multiply())):
        assert isinstance(product, cst.BinaryOperation)
        sides = (product.left, product.right)
        if any(m.matches(s, m.Name(block)) for s in sides) and any(
                names_in(s) & programs or m.findall(s, m.Call(func=m.Attribute(attr=m.Name("program_id"))))
                for s in sides):
            axis = True
    return Resizing(grow=grow, shrink=loops or axis, axis=axis)


def kernels_resizing(kernels: dict[str, cst.FunctionDef], names: set[str], key: str) -> Resizing:
    """How the kernels among `names` that take constexpr `key` let it change: every one of them must."""
    found = [block_resizing(fn, key) for name, fn in kernels.items()
             if name in names and key in {p.name.value for p in fn.params.params}]
    return Resizing(grow=all(r.grow for r in found), shrink=all(r.shrink for r in found), axis=any(r.axis for r in found))
