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

from diagnose.rewriters.aliasing import aliased_kernels
from diagnose.rewriters.base import InJit, Variant, dotted, is_jit, register
from diagnose.rewriters.blocks import plain_assignments, pointer_roots


class _Pipeline(InJit):
    def __init__(self, stages: int, aliased: set[str]) -> None:
        super().__init__()
        self.stages = stages
        self.aliased = aliased  # kernels a launch hands views of one tensor to load and to store through
        self.assigned: dict[str, list[cst.BaseExpression]] = {}  # the kernel's `name = value`s
        self.skip = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        if is_jit(node):
            self.assigned = plain_assignments(node)
            self.skip = node.name.value in self.aliased

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        if not self.depth or self.skip or not isinstance(updated.iter, cst.Call):
            return updated  # `shift[(1,)](h, h[1:])`: row t + 1 may be prefetched before step t stores it
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
    module = cst.parse_module(source)
    aliased = aliased_kernels(module)
    for stages in (3, 2, 4):
        t = _Pipeline(stages, aliased)
        new = module.visit(t)
        if t.changed:
            out.append(Variant({"num_stages": stages, "loops": t.changed}, new.code))
    return out


register("tl-range-pipelining")(tl_range_pipelining)
