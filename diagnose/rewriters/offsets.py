"""int32-offsets: a kernel's `.to(tl.int64)` casts made a choice each launch takes from its sizes.

A cast to int64 is how a kernel addresses past 2**31 elements (Liger's `tl.program_id(0).to(tl.int64)`
row bases), and 64-bit per-element index math costs registers and instructions everywhere else. Dropping
the casts outright passes any check at test sizes and silently wraps the offsets of a production-sized
tensor. So each cast `E.to(tl.int64)` in a launched kernel that reaches an address (and no stored or
accumulated value, whose range the sizes do not bound) becomes `(E.to(tl.int64) if _KB_INT64 else E.to(tl.int32))`
under a constexpr flag that defaults to 1 (the kernel as written); each launch sets it with the module's
`_kb_int64(...)` over the launch's arguments: 0 only where every tensor spans fewer than 2**30 elements
(its strides' reach, not its numel: a view can reach further) and every int is below 2**30. The margin
covers the block past the end a masked program computes offsets for. Launches whose arguments cannot be
evaluated twice (a tensor made in the call) or are unpacked keep the flag's default.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.base import (
    InJit,
    Variant,
    dotted,
    is_jit,
    jit_functions,
    launch_arguments,
    register,
    with_helper,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.hints import pure_argument, reaching

__all__ = ["address_cast_lines", "address_casts", "int32_offsets"]

_FLAG = "_KB_INT64"
_HELPER_NAME = "_kb_int64"
_HELPER = f'''

def {_HELPER_NAME}(*args):
    """1 where a launch argument reaches 2**30 elements or more (a tensor, through its strides) or is an
    int that large: the kernel keeps its int64 offsets there; else 0 (int32 offsets cannot wrap)."""
    limit = 2**30
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) >= limit:
            return 1
        if hasattr(a, "stride") and hasattr(a, "shape") and callable(a.stride):
            if a.numel() and 1 + sum((n - 1) * abs(s) for n, s in zip(a.shape, a.stride())) >= limit:
                return 1
    return 0
'''
_WIDE = ("tl.int64", "tl.uint64")
# Where an access's value sits among its positional arguments: tl.store(pointer, value, ...),
# tl.atomic_add(pointer, val, ...), tl.atomic_cas(pointer, cmp, val).
_VALUE_AT = {"tl.store": (1,), "tl.atomic_cas": (1, 2)} | {f"tl.atomic_{op}": (1,) for op in
                                                          ("add", "max", "min", "and", "or", "xor", "xchg")}


def _int64_cast(node: cst.BaseExpression) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "to"
            and len(node.args) >= 1 and node.args[0].keyword is None and dotted(node.args[0].value) in _WIDE)


def address_casts(fn: cst.FunctionDef) -> list[cst.Call]:
    """The int64 casts of `fn` that decide a load's, store's or atomic's address and no value it stores or
    accumulates: an index widened for its reach, not a sum or a count widened for its range, which the
    launch's sizes do not bound."""
    addresses: list[cst.BaseExpression] = []
    values: list[cst.BaseExpression] = []
    for call in m.findall(fn, m.Call()):
        assert isinstance(call, cst.Call)
        name = dotted(call.func)
        if not (name in ("tl.load", "tl.store") or name.startswith("tl.atomic_")) or not call.args:
            continue
        addresses.append(call.args[0].value)
        for i, arg in enumerate(call.args):
            if (arg.keyword is None and i in _VALUE_AT.get(name, ())
                    or arg.keyword is not None and arg.keyword.value in ("value", "val", "cmp")):
                values.append(arg.value)
    stored = {id(c) for c in _casts_in(reaching(fn, values, ranges_only=True))}
    return [c for c in dict.fromkeys(_casts_in(reaching(fn, addresses))) if id(c) not in stored]


def _casts_in(expressions: list[cst.BaseExpression]) -> list[cst.Call]:
    return [cst.ensure_type(c, cst.Call) for e in expressions for c in m.findall(e, m.Call())
            if _int64_cast(cst.ensure_type(c, cst.Call))]


def address_cast_lines(source: str) -> list[int]:
    """The lines of every kernel's `address_casts` in a module ([] where libcst cannot read it)."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return []
    positions = wrapper.resolve(PositionProvider)
    return sorted({positions[c].start.line for fn in jit_functions(wrapper.module).values() for c in address_casts(fn)})


class _GuardedCasts(InJit):
    """`E.to(tl.int64)` -> `(E.to(tl.int64) if _KB_INT64 else E.to(tl.int32))` at the given casts."""

    def __init__(self, casts: set[int]) -> None:
        super().__init__()
        self.casts = casts

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if id(original) not in self.casts:
            return updated
        assert isinstance(updated.func, cst.Attribute)
        self.changed += 1
        # the 32-bit branch casts too: E may be narrower (an int16 index times a row length wraps) or a float
        narrow = updated.with_changes(args=[updated.args[0].with_changes(value=cst.parse_expression("tl.int32"))])
        return cst.IfExp(test=cst.Name(_FLAG), body=updated, orelse=narrow,
                         lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class _FlaggedLaunches(cst.CSTTransformer):
    """Each launch of a guarded kernel outside kernels passes `_KB_INT64=_kb_int64(<its arguments>)`."""

    def __init__(self, kernels: dict[str, cst.FunctionDef]) -> None:
        self.kernels = kernels
        self.flagged: set[str] = set()

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        return original if is_jit(original) else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not isinstance(updated.func, cst.Subscript) or dotted(updated.func.value) not in self.kernels:
            return updated
        name = dotted(updated.func.value)
        args = list(launch_arguments(self.kernels[name], updated).values())
        if (any(a.star for a in updated.args) or any(a.keyword is not None and a.keyword.value == _FLAG
                                                     for a in updated.args)
                or not args or not all(pure_argument(a.value) for a in args)):
            return updated  # the flag's default: the kernel as written
        self.flagged.add(name)
        values = ", ".join(cst.Module([]).code_for_node(a.value) for a in args)
        return with_keywords(updated, {_FLAG: cst.parse_expression(f"{_HELPER_NAME}({values})")})


@register("int32-offsets")
def int32_offsets(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    kernels = jit_functions(module)
    defined = [n.name.value for n in module.body if isinstance(n, cst.FunctionDef)]
    casting = {name: fn for name, fn in kernels.items()
               if defined.count(name) == 1 and address_casts(fn)
               and _FLAG not in {p.name.value for p in fn.params.params}
               and not isinstance(fn.params.star_arg, cst.Param) and fn.params.star_kwarg is None}
    if not casting:
        return []
    launches = _FlaggedLaunches(casting)
    module = module.visit(launches)
    if not launches.flagged:
        return []
    # Launches are rewritten outside kernels only: the kernels' nodes, and so the casts found in them, stand.
    flagged = jit_functions(module)
    guard = _GuardedCasts({id(c) for name in launches.flagged for c in address_casts(flagged[name])})
    module = module.visit(guard)
    body = [with_parameters(n, [_FLAG], {_FLAG}, default="1") if isinstance(n, cst.FunctionDef)
            and n.name.value in launches.flagged and is_jit(n) else n for n in module.body]
    return [Variant({"int64": f"only where a launch reaches 2**30 elements ({_FLAG})", "sites": guard.changed},
                    with_helper(module.with_changes(body=body), _HELPER).code)]
