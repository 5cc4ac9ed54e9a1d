"""Keyword rewrites: one argument changed at every site (dot input precision)."""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import InJit, Variant, dotted, register


class _DotPrecision(InJit):
    def __init__(self, precision: str) -> None:
        super().__init__()
        self.precision = precision

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.depth or dotted(updated.func) != "tl.dot":
            return updated
        args = []
        for arg in updated.args:
            if arg.keyword is not None and arg.keyword.value == "input_precision" and m.matches(
                    arg.value, m.SimpleString('"ieee"') | m.SimpleString("'ieee'")):
                arg = arg.with_changes(value=cst.SimpleString(f'"{self.precision}"'))
                self.changed += 1
            elif arg.keyword is not None and arg.keyword.value == "allow_tf32" and m.matches(arg.value, m.Name("False")):
                arg = arg.with_changes(keyword=cst.Name("input_precision"),
                                       value=cst.SimpleString(f'"{self.precision}"'))
                self.changed += 1
            args.append(arg)
        return updated.with_changes(args=args)


def dot_input_precision(source: str, context: dict[str, Any]) -> list[Variant]:
    # tf32 keeps 10 mantissa bits (about 1e-3 relative); tf32x3 recovers about fp32 accuracy.
    rtol = float(context.get("fp32_rtol", 1e-4))
    out = []
    for precision in (("tf32", "tf32x3") if rtol >= 1e-3 else ("tf32x3",)):
        t = _DotPrecision(precision)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"input_precision": precision}, new.code))
    return out


register("dot-input-precision-tf32")(dot_input_precision)
