"""Divisibility hints: `pid * BLOCK + tl.arange(0, BLOCK)` wrapped in tl.multiple_of / tl.max_contiguous."""

from __future__ import annotations

from typing import Any

import libcst as cst

from diagnose.rewriters.base import InJit, Variant, register, start_plus_arange


class _OffsetHints(InJit):
    """`offs = pid * BLOCK + tl.arange(0, BLOCK)` -> the same wrapped in tl.multiple_of / tl.max_contiguous.

    Only this form is rewritten: its start is a multiple of BLOCK and its BLOCK values are
    contiguous by construction, so the hint is true for every launch. Hints on runtime strides or
    sizes could be false (a silent miscompile) and are left to a person or the LLM."""

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        split = start_plus_arange(updated.value) if self.depth else None
        if split is None:
            return updated
        start, block = split
        inner = start.with_changes(lpar=[], rpar=[]) if isinstance(start, cst.BinaryOperation) else start
        if not (isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Multiply)
                and (inner.right.deep_equals(block) or inner.left.deep_equals(block))):
            return updated
        tl_call = lambda name, *args: cst.Call(cst.Attribute(cst.Name("tl"), cst.Name(name)),  # noqa: E731
                                               [cst.Arg(a) for a in args])
        self.changed += 1
        return updated.with_changes(value=tl_call("max_contiguous", tl_call("multiple_of", updated.value, block), block))


def divisibility_hints(source: str, context: dict[str, Any]) -> list[Variant]:
    t = _OffsetHints()
    new = cst.parse_module(source).visit(t)
    return [Variant({"hints": t.changed}, new.code)] if t.changed else []


register("divisibility-hints")(divisibility_hints)
