"""Coalesced accesses for lanes that walk a strided axis (issue 27, family 5; pattern
contiguous-innermost-axis, for L1's and L2's `memory.uncoalesced`).

The first-draft form: one program per column (`col = tl.program_id(0)`), its lanes down the rows
(`tl.load(X + rows * stride + col)`). Consecutive lanes sit a row apart, so each 4-byte element costs a
32-byte sector of its own, and no vector width helps; the unit-stride axis is the program axis, which
the lanes never cross. The rewrite makes that axis a lane axis too: the program takes R consecutive
columns as a [R, BLOCK] tile (the rows-per-program transformation of `rows.py`, whose "rows" are here
the program's unit-stride indices), and Triton's coalescing pass, which orders a tile's layout by the
contiguity AxisInfo proves, puts threads along the R columns: R x 4 bytes contiguous for each of the
BLOCK lanes (R = 8: one full sector; 16 and 32: half and whole 128-byte lines). Reductions along the
lanes reduce each column (axis 1), the stores of one value per column stay one per column, and the
accesses are masked by the column count.

It applies where, in the launched kernel read as one program per index of grid axis 0 (`rowread`), some
access's address has every term that varies along the lanes scaled by a factor that is not the literal
1 (a stride parameter, a constexpr, a number) and a term that varies along the program axis but not
along the lanes (the column). Whether that factor is 1 at a launch is the launch's to say: L1 raises
the finding from the launch's values, and the judge measures the variants; so a round no finding asked
for gets no variants (a stride-generic kernel's lanes are usually unit-stride at its launch). Everything the rows
rewrite declines (a second lane axis, a dot, a branch on the program index, ...) is declined here.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from diagnose.rewriters.base import Variant, register
from diagnose.rewriters.blocks import calls_in, single_assigns
from diagnose.rewriters.rowread import ACCESS, LANE, ROW, Dims, RowKernel, call_name, is_tl
from diagnose.rewriters.rows import row_kernel, several_rows

__all__ = ["coalesced_rows"]

# Program indices per program: 8 fp32 columns fill a 32-byte sector, 16 and 32 half and whole 128-byte lines.
_COLUMN_COUNTS = (8, 16, 32)
_DEPTH = 6  # how many named steps an address is followed through


def coalesced_rows(source: str, context: dict[str, Any]) -> list[Variant]:
    if context.get("finding") == "":
        # An untargeted round (no finding asked for it) has no launch saying the lanes are strided, and
        # more rows for a kernel whose lanes are not are rows-per-program's to try.
        return []
    kernel = row_kernel(cst.parse_module(source), context)
    if kernel is None or not _strided_lanes(kernel):
        return []
    return [Variant({"coalesce": "consecutive program indices across the lanes", **v.params}, v.source)
            for v in several_rows(source, context, _COLUMN_COUNTS)]


def _strided_lanes(kernel: RowKernel) -> bool:
    """Whether an access steps its lanes by a factor while the program index is its unit-stride candidate."""
    once = single_assigns(kernel.fn.body)
    for call in calls_in(kernel.fn.body):
        name, last = call_name(call)
        if not (is_tl(name) and last in ACCESS and call.args):
            continue
        terms = list(_terms(_inline(call.args[0].value, once, _DEPTH)))
        along = [(t, kernel.dims.of(t)) for t in terms]
        lanes = [t for t, dims in along if LANE in dims]
        if lanes and all(_scaled(t, kernel.dims) for t in lanes) and any(dims == {ROW} for _, dims in along):
            return True
    return False


def _scaled(term: cst.BaseExpression, dims: Dims) -> bool:
    """A product of the lanes with a factor that does not vary along them and is not the literal 1."""
    if not (isinstance(term, cst.BinaryOperation) and isinstance(term.operator, cst.Multiply)):
        return False
    for lanes, factor in ((term.left, term.right), (term.right, term.left)):
        if LANE in dims.of(lanes) and LANE not in dims.of(factor):
            return not (isinstance(factor, cst.Integer) and factor.evaluated_value == 1)
    return False


def _terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The additive terms of an address (`a + b - c` -> a, b, c)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _inline(node: cst.BaseExpression, once: dict[str, cst.BaseExpression], depth: int) -> cst.BaseExpression:
    """`node` with the names the kernel assigns once replaced by their values, `depth` steps deep."""
    if depth == 0:
        return node
    if isinstance(node, cst.Name) and node.value in once:
        return _inline(once[node.value], once, depth - 1)
    if isinstance(node, cst.BinaryOperation):
        return node.with_changes(left=_inline(node.left, once, depth), right=_inline(node.right, once, depth))
    return node


register("contiguous-innermost-axis")(coalesced_rows)
