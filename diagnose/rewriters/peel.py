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

from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper

from diagnose.rewriters.base import Variant, register
from diagnose.rewriters.blocks import BlockLoop, DropTrueTerms, KernelLoops, block_loop, code, with_range

__all__ = ["BoundaryLoop", "boundary_loops", "peel_loop_boundary"]


@dataclass(frozen=True)
class BoundaryLoop:
    """A loop the rewrite peels: its line and the boundary terms its full iterations drop."""

    line: int
    terms: int


def _split_bound(loop: BlockLoop) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(the end of the full iterations, the end of all of them) as range arguments."""
    bound = code(loop.bound)
    bound = bound if isinstance(loop.bound, (cst.Name, cst.Attribute, cst.Integer)) else f"({bound})"
    if loop.counter:
        return cst.parse_expression(f"{bound} // {loop.width}"), cst.parse_expression(f"tl.cdiv({bound}, {loop.width})")
    return cst.parse_expression(f"{bound} - {bound} % {loop.width}"), cst.parse_expression(bound)


class _Peel(KernelLoops):
    def __init__(self) -> None:
        super().__init__()
        self.peeled: list[BoundaryLoop] = []

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        kernel = self.kernel()
        if kernel is None or original.orelse is not None:
            return updated
        loop = block_loop(original, *kernel)
        if loop is None:
            return updated
        dropper = DropTrueTerms(loop.is_true_term, loop.masks)
        full_body = original.body.visit(dropper)
        if not dropper.dropped:
            return updated
        self.peeled.append(BoundaryLoop(self.line(original), dropper.dropped))
        assert isinstance(full_body, cst.BaseSuite)
        full_end, end = _split_bound(loop)
        call = original.iter
        assert isinstance(call, cst.Call)
        step = None if loop.counter else [a.value for a in call.args if a.keyword is None][2]
        full = with_range(original.with_changes(body=full_body), cst.Integer("0"), full_end, step,
                          "# full blocks: the boundary masks are true in every lane, so they are dropped")
        tail = with_range(original.with_changes(leading_lines=[]), full_end, end, step,
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
