"""Divisibility hints, two kinds.

- Offsets: `pid * BLOCK + tl.arange(0, BLOCK)` wrapped in tl.multiple_of / tl.max_contiguous. True by
  construction, and mostly what the compiler's axis analysis already knows.
- Launch-true hints on runtime integers: Triton specializes an integer argument only when it is a
  multiple of 16. A row stride of 5000 fp16 elements (10,000 bytes, 16-byte aligned rows) or a size of
  4100 fp32 elements is not, so every access through it is planned at one element per instruction
  (`vectorization fails vec = 1 origin vec = 1`). Each such parameter P gets a constexpr flag
  `_kb_P_multiple` (default 1), and the kernel starts with `if _kb_P_multiple > 1: P = P // d * d` (not
  `tl.multiple_of(P, d)`, which Triton drops on a kernel argument). Each launch sets the flag with the
  module's `_kb_multiple(value)`: 8 or 4 where the value really is such a multiple and Triton's own
  specialization does not say it, else 1, which compiles the kernel as written. The hint is true for
  every launch that reaches it, never a false 16 (a false hint is a silent miscompile).

Which integers: the kernel's non-constexpr parameters that a load's or store's address multiplies
(strides) or that its mask compares against (sizes), directly or through the locals the kernel computes
them into.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    InJit,
    Variant,
    docstring_lines,
    dotted,
    is_jit,
    launch_arguments,
    register,
    start_plus_arange,
    with_helper,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import code, local_definitions, names_in

_ACCESS = {"tl.load", "tl.store"}
_ORDER = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)


class _OffsetHints(InJit):
    """`offs = pid * BLOCK + tl.arange(0, BLOCK)` -> the same wrapped in tl.multiple_of / tl.max_contiguous.

    Only this form is rewritten: its start is a multiple of BLOCK and its BLOCK values are
    contiguous by construction, so the hint is true for every launch."""

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


def _offset_hints(source: str) -> list[Variant]:
    t = _OffsetHints()
    new = cst.parse_module(source).visit(t)
    return [Variant({"hints": t.changed}, new.code)] if t.changed else []


def expanded(roots: list[cst.BaseExpression], definitions: dict[str, list[cst.BaseExpression]],
             ranges_only: bool = False) -> list[cst.BaseExpression]:
    """`roots` and every value of the locals they read (`blocks.local_definitions`), transitively; with
    `ranges_only`, as `reaching` says."""
    read = _range_names if ranges_only else names_in
    out, seen, todo = list(roots), set(), [n for r in roots for n in read(r)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for value in definitions.get(name, []):
            out.append(value)
            todo.extend(read(value))
    return out


def _range_names(node: cst.BaseExpression) -> set[str]:
    """The names `node` reads, those only inside a `tl.load(...)` or a comparison aside."""
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> bool:
            return dotted(call.func) != "tl.load"

        def visit_Comparison(self, comparison: cst.Comparison) -> bool:
            return False

        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

    node.visit(Visitor())
    return found


def reaching(fn: cst.FunctionDef, roots: list[cst.BaseExpression], ranges_only: bool = False
             ) -> list[cst.BaseExpression]:
    """`roots` (expressions of `fn`) and every value the locals they read are given, transitively: what
    decides their values. With `ranges_only`, what decides their range: the walk does not go into a
    `tl.load(...)` (the address a value is loaded from) or a comparison (a mask is true or false, however
    wide its operands)."""
    return expanded(roots, local_definitions(fn), ranges_only)


def _bare_names(nodes: list[cst.BaseExpression]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, cst.Name)}


def aligned_parameters(fn: cst.FunctionDef) -> list[str]:
    """The kernel's runtime integer parameters that decide its accesses' alignment: multiplied into a load's
    or store's address (strides), or compared against in its mask (sizes), in parameter order."""
    params = [p.name.value for p in fn.params.params
              if p.default is None and not (p.annotation is not None and "constexpr" in code(p.annotation.annotation))]
    definitions = local_definitions(fn)
    addresses: list[cst.BaseExpression] = []
    masks: list[cst.BaseExpression] = []
    for call in m.findall(fn, m.Call()):
        assert isinstance(call, cst.Call)
        if dotted(call.func) not in _ACCESS or not call.args:
            continue
        addresses.append(call.args[0].value)
        masks += [a.value for a in call.args if a.keyword is not None and a.keyword.value == "mask"]
    found: set[str] = set()
    for expr in expanded(addresses, definitions):
        for product in m.findall(expr, m.BinaryOperation(operator=m.Multiply())):
            assert isinstance(product, cst.BinaryOperation)
            found |= _bare_names([product.left.with_changes(lpar=[], rpar=[]),
                                  product.right.with_changes(lpar=[], rpar=[])])
    for expr in expanded(masks, definitions):
        for comparison in m.findall(expr, m.Comparison()):
            assert isinstance(comparison, cst.Comparison)
            if all(isinstance(c.operator, _ORDER) for c in comparison.comparisons):
                found |= _bare_names([comparison.left] + [c.comparator for c in comparison.comparisons])
    return [p for p in params if p in found]


# Module-level helper the rewritten launches call: what Triton's specialization leaves unsaid about an int.
_MULTIPLE_HELPER = '''

def _kb_multiple(value):
    """The multiple of 8 or 4 an int argument is, where Triton's launch specialization does not say it
    (it marks multiples of 16, and 1); else 1 (no hint)."""
    if not isinstance(value, int) or value % 16 == 0 or value == 1:
        return 1
    return 8 if value % 8 == 0 else 4 if value % 4 == 0 else 1
'''
# Calls an argument expression may make and still be evaluated twice (once for the hint): reads of a
# tensor's layout and plain conversions, nothing that allocates or moves data.
_PURE_METHODS = {"stride", "size", "numel", "element_size", "dim"}
_PURE_FUNCTIONS = {"int", "len", "min", "max"}


def _flag(param: str) -> str:
    return f"_kb_{param}_multiple"


def pure_argument(expr: cst.BaseExpression) -> bool:
    """Whether a launch argument may be evaluated a second time (for a flag): it reads layouts and converts,
    it makes nothing."""
    for call in m.findall(expr, m.Call()):
        func = cst.ensure_type(call, cst.Call).func
        if not ((isinstance(func, cst.Attribute) and func.attr.value in _PURE_METHODS)
                or (isinstance(func, cst.Name) and func.value in _PURE_FUNCTIONS)):
            return False
    return True


class _HintedLaunches(cst.CSTTransformer):
    """Each launch `kernel[grid](...)` outside kernels passes, for every hinted parameter it binds, the
    multiple `_kb_multiple` finds in its value."""

    def __init__(self, kernel: cst.FunctionDef, hinted: list[str]) -> None:
        self.kernel, self.hinted = kernel, hinted
        self.changed = 0

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        return original if is_jit(original) else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not m.matches(updated.func, m.Subscript(value=m.Name(self.kernel.name.value))):
            return updated
        bound = launch_arguments(self.kernel, updated)
        flags = {_flag(p): cst.parse_expression(f"_kb_multiple({code(bound[p].value)})")
                 for p in self.hinted if p in bound and pure_argument(bound[p].value)}
        if not flags:
            return updated
        self.changed += 1
        return with_keywords(updated, flags)


def _with_hints(fn: cst.FunctionDef, hinted: list[str]) -> cst.FunctionDef:
    """`if _kb_P_multiple > 1: P = P // _kb_P_multiple * _kb_P_multiple` at the top, resolved at compile time
    (the flag is a constexpr, 1 by default: launches that do not pass it compile the kernel as written)."""
    # `P // d * d`, not tl.multiple_of(P, d): Triton drops a hint on a kernel argument (it has no defining op
    # to carry the attribute), while the axis analysis reads d off the product. Exact where the flag is set.
    hints = [cst.parse_statement(f"if {_flag(p)} > 1:\n    {p} = {p} // {_flag(p)} * {_flag(p)}\n") for p in hinted]
    docstring = list(fn.body.body[:docstring_lines(list(fn.body.body))])
    body = [*docstring, *hints, *fn.body.body[len(docstring):]]
    flags = [_flag(p) for p in hinted]
    return with_parameters(fn, flags, set(flags), default="1").with_changes(body=fn.body.with_changes(body=body))


def launch_true_hints(source: str) -> list[Variant]:
    """Every launched kernel with strides or mask bounds among its runtime integers, hinted where each
    launch's values are multiples of 8 or 4 that Triton's specialization does not mark."""
    module = cst.parse_module(source)
    hinted_kernels: dict[str, list[str]] = {}
    defined = [n.name.value for n in module.body if isinstance(n, cst.FunctionDef)]
    for fn in [n for n in module.body if isinstance(n, cst.FunctionDef) and is_jit(n)]:
        if defined.count(fn.name.value) > 1:
            continue  # defined twice (LLM answers repeat a kernel): which one a launch reaches is not ours to guess
        if isinstance(fn.params.star_arg, cst.Param) or fn.params.star_kwarg is not None or fn.params.kwonly_params:
            continue  # flags appended after *args or keyword-only parameters would change what binds where
        hinted = [p for p in aligned_parameters(fn) if _flag(p) not in {q.name.value for q in fn.params.params}]
        if not hinted:
            continue
        launches = _HintedLaunches(fn, hinted)
        changed = module.visit(launches)
        if not launches.changed:
            continue
        module = changed.with_changes(body=[_with_hints(n, hinted) if isinstance(n, cst.FunctionDef)
                                            and n.name.value == fn.name.value and is_jit(n) else n
                                            for n in changed.body])
        hinted_kernels[fn.name.value] = hinted
    if not hinted_kernels:
        return []
    # hinted before (an earlier round): one helper serves
    return [Variant({"hinted": hinted_kernels}, with_helper(module, _MULTIPLE_HELPER).code)]


def divisibility_hints(source: str, context: dict[str, Any]) -> list[Variant]:
    return launch_true_hints(source) + _offset_hints(source)


register("divisibility-hints")(divisibility_hints)
