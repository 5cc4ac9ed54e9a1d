"""Loop boundary peeling: a loop whose masks only its last iteration needs runs its full iterations
unmasked, and the last, partial one as written.

A loop over a dimension in blocks (`for k in range(0, K, BLOCK_K)` with `k + tl.arange(0, BLOCK_K)`,
or the tutorial's counter form `for k in range(0, tl.cdiv(K, BLOCK_K))` with `offs_k < K - k * BLOCK_K`)
evaluates its boundary mask in every iteration, although only the last can be partial: a compare per
element, a predicated load (whose vector width is the mask's constancy, failure mode N2, and which
cp.async takes only when that is at least 4 bytes), a select per element of an attention score tile.
The rewrite runs the loop twice over the same carried values:

    for k in range(0, K - K % BLOCK_K, BLOCK_K):   # full blocks: the boundary terms dropped
        ...
    for k in range(K - K % BLOCK_K, K, BLOCK_K):   # the last, partial block (0 or 1 iteration): as written
        ...

It drops only a term it can prove true in every full iteration: `E < B` with E the loop's own block of
indices (`k + arange`, `k * BLOCK + arange` or a name bound to one, subscripted with None/: only) and B
the loop's bound, written the same way; `arange < B - k * BLOCK` in the counter form; names bound in the
loop to such terms. Every other term (a row mask, a causal comparison) stays. It declines a loop whose
start is not 0, whose step is not the block's width, whose bound the body assigns, or that holds
another loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.base import Variant, dotted, is_jit, register

__all__ = ["BoundaryLoop", "boundary_loops", "peel_loop_boundary"]

_CODE = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _CODE.code_for_node(node)


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """`x` of `(x)`, `x[None, :]`, `x[:, None]`: broadcasting does not change which values a block takes."""
    while True:
        if isinstance(node, cst.Subscript) and all(
                isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None and e.slice.step is None
                or isinstance(e.slice, cst.Index) and m.matches(e.slice.value, m.Name("None")) for e in node.slice):
            node = node.value
        elif node.lpar:
            node = node.with_changes(lpar=[], rpar=[])
        else:
            return node


def _arange_width(node: cst.BaseExpression) -> str | None:
    """W of `tl.arange(0, W)`."""
    if (isinstance(node, cst.Call) and dotted(node.func) == "tl.arange" and len(node.args) == 2
            and m.matches(node.args[0].value, m.Integer("0"))):
        return _code(node.args[1].value)
    return None


def _assigned_names(body: cst.CSTNode) -> dict[str, int]:
    """Name -> how many times the block assigns it (augmented assignments and loop targets count)."""
    counts: dict[str, int] = {}

    class Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            for name in _names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            for name in _names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            for name in _names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

    body.visit(Visitor())
    return counts


def _names_in(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

    node.visit(Visitor())
    return found


def _single_assigns(block: cst.CSTNode) -> dict[str, cst.BaseExpression]:
    """Names the block assigns exactly once, with a plain `name = value`, and their values."""
    counts = _assigned_names(block)
    out: dict[str, cst.BaseExpression] = {}
    for node in m.findall(block, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        assert isinstance(node, cst.Assign)
        name = node.targets[0].target
        assert isinstance(name, cst.Name)
        if counts.get(name.value) == 1:
            out[name.value] = node.value
    return out


@dataclass
class _Loop:
    """What makes a loop's boundary terms decidable: its variable, its bound B, its block width W."""

    var: str
    bound: cst.BaseExpression
    width: str
    counter: bool  # range(0, cdiv(B, W)): the block starts at var * W
    aranges: set[str]  # names bound to tl.arange(0, W) in the kernel
    blocks: set[str] = field(default_factory=set)  # names the body binds to the loop's block of indices
    true_names: set[str] = field(default_factory=set)  # names the body binds to a mask true in full blocks
    masks: set[str] = field(default_factory=set)  # names the kernel binds once to comparisons joined by `&`

    def _is_arange(self, node: cst.BaseExpression) -> bool:
        node = _bare(node)
        return (isinstance(node, cst.Name) and node.value in self.aranges) or _arange_width(node) == self.width

    def _is_start(self, node: cst.BaseExpression) -> bool:
        node = _bare(node)
        if not self.counter:
            return m.matches(node, m.Name(self.var))
        return (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply)
                and {_code(_bare(node.left)), _code(_bare(node.right))} == {self.var, self.width})

    def is_block(self, node: cst.BaseExpression) -> bool:
        """Whether `node` is the loop's block of indices: start + arange(0, W), or a name bound to it."""
        node = _bare(node)
        if isinstance(node, cst.Name):
            return node.value in self.blocks
        return (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)
                and (self._is_start(node.left) and self._is_arange(node.right)
                     or self._is_arange(node.left) and self._is_start(node.right)))

    def is_true_term(self, node: cst.BaseExpression) -> bool:
        """Whether a mask term holds for every lane of every full iteration."""
        node = _bare(node)
        if isinstance(node, cst.Name):
            return node.value in self.true_names
        if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
            return False
        op, right = node.comparisons[0].operator, node.comparisons[0].comparator
        if isinstance(op, cst.LessThan):
            small, big = node.left, right
        elif isinstance(op, cst.GreaterThan):
            small, big = right, node.left
        else:
            return False
        bound = _code(_bare(self.bound))
        if self.is_block(small) and _code(_bare(big)) == bound:
            return True
        # counter form, the tutorial's spelling: offs_k < K - k * BLOCK_K
        big = _bare(big)
        return (self.counter and self._is_arange(small) and isinstance(big, cst.BinaryOperation)
                and isinstance(big.operator, cst.Subtract) and _code(_bare(big.left)) == bound
                and self._is_start(big.right))

    def reduced(self, mask: cst.BaseExpression) -> cst.BaseExpression | None:
        """`mask` without its terms that hold in full iterations; None when nothing is left."""
        bare = _bare(mask)
        if isinstance(bare, cst.BinaryOperation) and isinstance(bare.operator, cst.BitAnd):
            left, right = self.reduced(bare.left), self.reduced(bare.right)
            if left is None or right is None:
                return right if left is None else left
            if left is bare.left and right is bare.right:
                return mask
            return cst.BinaryOperation(left=left, operator=bare.operator, right=right, lpar=mask.lpar, rpar=mask.rpar)
        return None if self.is_true_term(mask) else mask


def _loop_of(loop: cst.For, kernel: cst.FunctionDef, aranges: dict[str, str]) -> _Loop | None:
    """The loop's shape when its boundary terms are decidable (see the module's docstring), else None."""
    if not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Call):
        return None
    if dotted(loop.iter.func) not in ("range", "tl.range") or m.findall(loop.body, m.For() | m.While()):
        return None
    positional = [a.value for a in loop.iter.args if a.keyword is None]
    var = loop.target.value
    if len(positional) == 3 and m.matches(positional[0], m.Integer("0")):
        bound, width, counter = positional[1], _code(positional[2]), False
    elif len(positional) in (1, 2) and (len(positional) == 1 or m.matches(positional[0], m.Integer("0"))):
        trips = positional[-1]
        if not (isinstance(trips, cst.Call) and dotted(trips.func) in ("tl.cdiv", "triton.cdiv") and len(trips.args) == 2):
            return None
        bound, width, counter = trips.args[0].value, _code(trips.args[1].value), True
    else:
        return None
    assigned = _assigned_names(loop.body)
    if var in assigned or _names_in(bound) & set(assigned) or width in assigned:
        return None
    shape = _Loop(var, bound, width, counter, {name for name, w in aranges.items() if w == width})
    for name, value in _single_assigns(kernel.body).items():
        if _mask_like(value, shape.masks):
            shape.masks.add(name)
    singles = _single_assigns(loop.body)
    in_kernel = _assigned_names(kernel.body)
    for name, value in singles.items():  # in source order, so a mask may name a block bound before it
        if name in aranges or in_kernel.get(name) != 1:
            continue  # bound before the loop too: its first iteration would read that value
        if shape.is_block(value):
            shape.blocks.add(name)
        elif shape.reduced(value) is None:
            shape.true_names.add(name)
    return shape


def _kernel_aranges(kernel: cst.FunctionDef) -> dict[str, str]:
    """Names the kernel binds once to tl.arange(0, W), with W as written."""
    out: dict[str, str] = {}
    for name, value in _single_assigns(kernel.body).items():
        width = _arange_width(value)
        if width is not None:
            out[name] = width
    return out


class _DropBoundaryTerms(cst.CSTTransformer):
    """In a full iteration's body: masks without their always-true terms (tl.load/tl.store/tl.where)."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop
        self.dropped = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted(updated.func)
        if name == "tl.where" and len(updated.args) == 3 and updated.args[0].keyword is None:
            condition = self.loop.reduced(updated.args[0].value)
            if condition is updated.args[0].value:
                return updated
            self.dropped += 1
            if condition is None:
                kept = updated.args[1].value
                return kept.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
                    if isinstance(kept, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp)) else kept
            return updated.with_changes(args=[updated.args[0].with_changes(value=condition), *updated.args[1:]])
        if name not in ("tl.load", "tl.store"):
            return updated
        position = 2 if name == "tl.store" else 1
        args = list(updated.args)
        index = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "mask"), None)
        if index is None and len(args) > position and all(a.keyword is None for a in args[:position + 1]):
            index = position
        if index is None:
            return updated
        mask = self.loop.reduced(args[index].value)
        if mask is args[index].value:
            return updated
        if mask is not None:
            self.dropped += 1
            args[index] = args[index].with_changes(value=mask)
            return updated.with_changes(args=args)
        if index == position and name == "tl.load" and len(args) > position + 1 and args[position + 1].keyword is None:
            return updated  # `other` given by position after the mask: left as written rather than re-spelled
        self.dropped += 1
        gone = {index} | {i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "other"}
        kept_args = [a for i, a in enumerate(args) if i not in gone]
        kept_args[-1] = kept_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=kept_args)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        # `mask = (rm < M) & (rn < N)` bound in the loop: in a full iteration `mask = rm < M`. A binding
        # that becomes wholly true is left as written: its uses are dropped, the compiler removes it.
        value = updated.value
        if not _mask_like(value, self.loop.masks):
            return updated
        reduced = self.loop.reduced(value)
        if reduced is None or reduced is value:
            return updated
        self.dropped += 1
        return updated.with_changes(value=reduced)


    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        # `s = tl.where(rn < n, s, -inf)` became `s = s`: nothing left to say
        if (len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign) and len(updated.body[0].targets) == 1
                and m.matches(updated.body[0].value, m.Name()) and m.matches(updated.body[0].targets[0].target, m.Name())
                and updated.body[0].value.value == updated.body[0].targets[0].target.value):  # type: ignore[attr-defined]
            return cst.RemoveFromParent()
        return updated


def _mask_like(node: cst.BaseExpression, masks: set[str]) -> bool:
    """Comparisons (or names bound to them) joined by `&`: booleans, so that dropping a true term cannot
    change the value (`x & True` is `x` only for a boolean x)."""
    bare = _bare(node)
    if isinstance(bare, cst.BinaryOperation) and isinstance(bare.operator, cst.BitAnd):
        return _mask_like(bare.left, masks) and _mask_like(bare.right, masks)
    return isinstance(bare, cst.Comparison) or isinstance(bare, cst.Name) and bare.value in masks


@dataclass(frozen=True)
class BoundaryLoop:
    """A loop the rewrite peels: its line and the boundary terms its full iterations drop."""

    line: int
    terms: int


def _split_bound(loop: _Loop) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(the end of the full iterations, the end of all of them) as range arguments."""
    bound = _code(loop.bound)
    bound = bound if isinstance(loop.bound, (cst.Name, cst.Attribute, cst.Integer)) else f"({bound})"
    if loop.counter:
        return cst.parse_expression(f"{bound} // {loop.width}"), cst.parse_expression(f"tl.cdiv({bound}, {loop.width})")
    return cst.parse_expression(f"{bound} - {bound} % {loop.width}"), cst.parse_expression(bound)


def _with_range(loop: cst.For, start: cst.BaseExpression, end: cst.BaseExpression, step: cst.BaseExpression | None,
                comment: str) -> cst.For:
    call = loop.iter
    assert isinstance(call, cst.Call)
    positional = [cst.Arg(start), cst.Arg(end)] + ([cst.Arg(step)] if step is not None else [])
    keywords = [a for a in call.args if a.keyword is not None]
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in positional + keywords]
    return loop.with_changes(iter=call.with_changes(args=args),
                             leading_lines=[*loop.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))])


class _Peel(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.kernels: list[tuple[cst.FunctionDef, dict[str, str]]] = []
        self.peeled: list[BoundaryLoop] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.kernels.append((node, _kernel_aranges(node) if is_jit(node) else {}))

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.kernels.pop()
        return updated

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if not self.kernels or not is_jit(self.kernels[-1][0]) or original.orelse is not None:
            return updated
        kernel, aranges = self.kernels[-1]
        loop = _loop_of(original, kernel, aranges)
        if loop is None:
            return updated
        dropper = _DropBoundaryTerms(loop)
        full_body = original.body.visit(dropper)
        if not dropper.dropped:
            return updated
        self.peeled.append(BoundaryLoop(self.get_metadata(PositionProvider, original).start.line, dropper.dropped))
        assert isinstance(full_body, cst.BaseSuite)
        full_end, end = _split_bound(loop)
        call = original.iter
        assert isinstance(call, cst.Call)
        step = None if loop.counter else [a.value for a in call.args if a.keyword is None][2]
        full = _with_range(original.with_changes(body=full_body), cst.Integer("0"), full_end, step,
                           "# full blocks: the boundary masks are true in every lane, so they are dropped")
        tail = _with_range(original.with_changes(leading_lines=[]), full_end, end, step,
                           "# the last, partial block (none when the bound is a multiple of the block): as written")
        return cst.FlattenSentinel([full, tail])


def _peel(source: str) -> tuple[str, list[BoundaryLoop]]:
    peel = _Peel()
    new = MetadataWrapper(cst.parse_module(source)).visit(peel)
    return new.code, peel.peeled


def boundary_loops(source: str) -> list[BoundaryLoop]:
    """The loops of the module's kernels whose full iterations evaluate boundary masks they do not need
    (what L1 reports; the rewrite below peels exactly these)."""
    try:
        return _peel(source)[1]
    except cst.ParserSyntaxError:
        return []


def peel_loop_boundary(source: str, context: dict[str, Any]) -> list[Variant]:
    new, peeled = _peel(source)
    return [Variant({"peeled_loops": len(peeled), "dropped_terms": sum(p.terms for p in peeled)}, new)] if peeled else []


register("peel-loop-boundary")(peel_loop_boundary)
