"""fp32-accumulation: the sums the IR shows adding in bf16/fp16 get their operand widened to fp32 first.

Which sums those are comes from the L3 finding (`precision.low-precision-accumulation`): the source lines
of the `tt.reduce` / `tt.scan` ops whose combine region adds in a 16-bit float, passed as
`context["lines"]`. The source alone cannot tell a bf16 operand from an integer one, and widening an
integer sum to fp32 would change its value, so without lines the rewriter declines; and on those lines
the operand goes through `_kb_float32_if_16_bit`, which widens only fp16 and bf16 at compile time, since
the same kernel may be called on ints.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.base import Variant, dotted, is_jit, register, with_helper

__all__ = ["fp32_accumulation"]

_SUMS = {"sum", "cumsum"}


# The lines come from one launch's IR, where the operand was a 16-bit float; a generic kernel may be
# called with ints as well (a cumsum of lengths), whose sums fp32 would round (a second audit: an int32
# cumsum of values near 1e5 off by 66). The helper widens 16-bit floats only, decided at compile time.
_HELPER = "_kb_float32_if_16_bit"
_HELPER_SOURCE = f"""@triton.jit
def {_HELPER}(x):
    return x.to(tl.float32) if x.dtype.is_fp16() else (x.to(tl.float32) if x.dtype.is_bf16() else x)
"""


def _widened(value: cst.BaseExpression) -> cst.BaseExpression:
    """`_kb_float32_if_16_bit(value)`."""
    return cst.Call(cst.Name(_HELPER), [cst.Arg(value)])


def _already_wide(value: cst.BaseExpression) -> bool:
    return (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to"
            and bool(value.args) and dotted(value.args[0].value) in ("tl.float32", "tl.float64")) \
        or (isinstance(value, cst.Call) and dotted(value.func) == _HELPER)


class _Widen(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, lines: set[int]) -> None:
        super().__init__()
        self.lines = lines
        self.depth = 0
        self.changed: list[int] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += is_jit(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.depth -= is_jit(original)
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.depth or not updated.args:
            return updated
        line = self.get_metadata(PositionProvider, original).start.line
        if line not in self.lines or any(a.keyword is not None and a.keyword.value == "dtype" for a in updated.args):
            return updated
        name = dotted(updated.func)
        if name in {f"tl.{s}" for s in _SUMS} and updated.args[0].keyword is None:
            operand = updated.args[0].value
            if _already_wide(operand):
                return updated
            self.changed.append(line)
            return updated.with_changes(args=[updated.args[0].with_changes(value=_widened(operand)), *updated.args[1:]])
        func = updated.func
        if isinstance(func, cst.Attribute) and func.attr.value in _SUMS and not name.startswith("tl."):
            if _already_wide(func.value):
                return updated
            self.changed.append(line)  # x.sum(axis): a tensor's own member
            return updated.with_changes(func=func.with_changes(value=_widened(func.value)))
        return updated


@register("fp32-accumulation")
def fp32_accumulation(source: str, context: dict[str, Any]) -> list[Variant]:
    lines = {int(n) for n in context.get("lines") or []}
    if not lines:
        return []
    widen = _Widen(lines)
    new = MetadataWrapper(cst.parse_module(source)).visit(widen)
    if not widen.changed:
        return []
    return [Variant({"widened": len(widen.changed), "lines": sorted(set(widen.changed))},
                    with_helper(new, _HELPER_SOURCE).code)]
