"""Loop pipelining: a loop over loads without a dot becomes `tl.range(..., num_stages=3)`.

A loop that stores through a pointer it also loads from is left as written: the pipeliner issues the
loads of later iterations before this iteration's stores (a recurrence through memory, `prev =
tl.load(H + (t - 1) * D)` after `tl.store(H + t * D, ...)`, read stale rows on sm90), and the interpreter,
which ignores num_stages, cannot show it. Pointers are told apart by the roots of their address (`H` of
`H + t * D + cols`, through the kernel's assignments: `p_cur = H + D + cols` is H's too)."""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import InJit, Variant, dotted, is_jit, register
from diagnose.rewriters.blocks import plain_assignments, pointer_roots


class _Pipeline(InJit):
    def __init__(self, stages: int) -> None:
        super().__init__()
        self.stages = stages
        self.assigned: dict[str, list[cst.BaseExpression]] = {}  # the kernel's `name = value`s

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        if is_jit(node):
            self.assigned = plain_assignments(node)

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        if not self.depth or not isinstance(updated.iter, cst.Call):
            return updated
        name = dotted(updated.iter.func)
        calls = {dotted(c.func).split(".")[-1] for c in m.findall(original.body, m.Call())}  # type: ignore[attr-defined]
        if "load" not in calls or "dot" in calls or name not in ("range", "tl.range") \
                or _stores_what_it_loads(original, self.assigned):
            return updated
        args = list(updated.iter.args)
        if any(a.keyword is not None and a.keyword.value == "num_stages" for a in args):
            return updated
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = args[-1].with_changes(comma=comma)
        args.append(cst.Arg(keyword=cst.Name("num_stages"), value=cst.Integer(str(self.stages)),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.changed += 1
        func = cst.Attribute(value=cst.Name("tl"), attr=cst.Name("range"))
        return updated.with_changes(iter=updated.iter.with_changes(func=func, args=args))


def _stores_what_it_loads(loop: cst.For, assigned: dict[str, list[cst.BaseExpression]]) -> bool:
    roots: dict[str, set[str]] = {"load": set(), "store": set()}
    for call in m.findall(loop.body, m.Call()):
        assert isinstance(call, cst.Call)
        kind = dotted(call.func).split(".")[-1]
        kind = "store" if kind.startswith("atomic_") else kind  # an atomic writes what it reads
        if kind in roots and call.args:
            roots[kind] |= pointer_roots(call.args[0].value, assigned)
    return bool(roots["load"] & roots["store"])


def tl_range_pipelining(source: str, context: dict[str, Any]) -> list[Variant]:
    out = []
    for stages in (3, 2, 4):
        t = _Pipeline(stages)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"num_stages": stages, "loops": t.changed}, new.code))
    return out


register("tl-range-pipelining")(tl_range_pipelining)
