"""Masked tail split: a 1-D masked block runs unmasked where the whole block is in bounds."""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import Variant, dotted, is_jit, register, simple_assign, start_plus_arange
from diagnose.rewriters.blocks import assigned_names, names_in


class _DropMask(cst.CSTTransformer):
    """Removes `mask=M` (and the `other=` that only matters under it) from tl.load / tl.store."""

    def __init__(self, mask: str) -> None:
        self.mask = mask
        self.changed = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if dotted(updated.func) not in ("tl.load", "tl.store"):
            return updated
        if not any(a.keyword is not None and a.keyword.value == "mask" and m.matches(a.value, m.Name(self.mask))
                   for a in updated.args):
            return updated
        args = [a for a in updated.args if a.keyword is None or a.keyword.value not in ("mask", "other")]
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        self.changed += 1
        return updated.with_changes(args=args)


class _TailSplit(cst.CSTTransformer):
    """In a 1-D kernel written as `offs = START + tl.arange(0, BLOCK)`, `mask = offs < N`, the statements
    after the mask run twice: unmasked when the whole block is in bounds (`START + BLOCK <= N`, a
    scalar branch), as written otherwise.

    The branch's test stands for the mask only while both mean the same lanes: the offsets, the mask
    and every name in START, BLOCK and N are assigned at most once in the kernel (parameters: never), so no
    later statement narrows the mask or moves the offsets past what the test checked."""

    def __init__(self) -> None:
        self.changed = 0

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if not is_jit(original) or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        counts = assigned_names(updated.body)
        params = {p.name.value for p in updated.params.params}
        once = lambda name: counts.get(name, 0) <= (0 if name in params else 1)  # noqa: E731 - globals: 0
        starts: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        for i, stmt in enumerate(body):
            assign = simple_assign(stmt)
            if assign is None:
                continue
            target, value = assign
            split = start_plus_arange(value)
            if split is not None:
                starts[target] = split
                continue
            if (isinstance(value, cst.Comparison) and isinstance(value.left, cst.Name) and value.left.value in starts
                    and len(value.comparisons) == 1 and isinstance(value.comparisons[0].operator, cst.LessThan)):
                start, block = starts[value.left.value]
                bound = value.comparisons[0].comparator
                if not all(once(n) for n in {target, value.left.value}
                           | names_in(start) | names_in(block) | names_in(bound)):
                    return updated
                rest = body[i + 1:]
                dropper = _DropMask(target)
                fast = [st.visit(dropper) for st in rest]
                if not dropper.changed:
                    return updated
                cond = cst.Comparison(
                    left=cst.BinaryOperation(left=start, operator=cst.Add(), right=block),
                    comparisons=[cst.ComparisonTarget(cst.LessThanEqual(), bound)])
                branch = cst.If(test=cond, body=cst.IndentedBlock(body=fast),  # type: ignore[arg-type]
                                orelse=cst.Else(body=cst.IndentedBlock(body=rest)),
                                leading_lines=[cst.EmptyLine(comment=cst.Comment(
                                    "# full blocks: no mask, so loads and stores keep their vector width"))])
                self.changed += 1
                return updated.with_changes(body=updated.body.with_changes(body=[*body[:i + 1], branch]))
        return updated


def masked_tail_split(source: str, context: dict[str, Any]) -> list[Variant]:
    t = _TailSplit()
    new = cst.parse_module(source).visit(t)
    return [Variant({"tail_split": t.changed}, new.code)] if t.changed else []


register("masked-tail-split")(masked_tail_split)
