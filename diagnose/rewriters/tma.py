"""Tensor descriptors (TMA): a dot loop's tile loads through `tl.make_tensor_descriptor(...).load`, dispatched
where TMA's rules hold."""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import Variant, dotted, is_jit, register, simple_assign, start_plus_arange


def _terms(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of a chain of `+`."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add) and not expr.lpar:
        return _terms(expr.left) + _terms(expr.right)
    return [expr]


def _axis(sub: cst.Subscript) -> int | None:
    """0 for `v[:, None]`, 1 for `v[None, :]`."""
    if len(sub.slice) != 2:
        return None
    first, second = (e.slice for e in sub.slice)
    if isinstance(first, cst.Slice) and isinstance(second, cst.Index) and m.matches(second.value, m.Name("None")):
        return 0
    if isinstance(second, cst.Slice) and isinstance(first, cst.Index) and m.matches(first.value, m.Name("None")):
        return 1
    return None


class _TmaLoads(cst.CSTTransformer):
    """Inside the kernel's loops, `tl.load(P + R[:, None] * S0 + C[None, :] * S1, mask=(R[:, None] < M) &
    (C[None, :] < N), other=0.0)` becomes `P_desc.load([R0, C0])` on a descriptor of shape [M, N],
    strides [S0, S1] and the tile's block shape, created once before the loop. Out-of-bounds rows and
    columns read as zero, as `other=0.0` did."""

    def __init__(self, module: cst.Module, ranges: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]]) -> None:
        self.module, self.ranges = module, ranges
        self.descriptors: dict[str, cst.BaseStatement] = {}  # base param -> `base_desc = tl.make_tensor_descriptor(...)`
        self.strides: dict[str, tuple[str | None, str | None]] = {}
        self.loop = 0

    def visit_For(self, node: cst.For) -> None:
        self.loop += 1

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        self.loop -= 1
        return updated

    def _range(self, v: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        v = v.with_changes(lpar=[], rpar=[])
        if isinstance(v, cst.Name) and v.value in self.ranges:
            return self.ranges[v.value]
        if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add):
            for var, off in ((v.right, v.left), (v.left, v.right)):
                if isinstance(var, cst.Name) and var.value in self.ranges:
                    start, block = self.ranges[var.value]
                    return (off if m.matches(start, m.Integer("0")) else
                            cst.BinaryOperation(off, cst.Add(), start)), block
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self.loop or dotted(updated.func) != "tl.load" or not updated.args or updated.args[0].keyword:
            return updated
        kw = {a.keyword.value: a.value for a in updated.args[1:] if a.keyword is not None}
        if len(updated.args) - 1 != len(kw) or set(kw) - {"mask", "other"}:
            return updated
        if "other" in kw and not m.matches(kw["other"], m.Float("0.0") | m.Integer("0")):
            return updated
        base, axes = None, {}
        for term in _terms(updated.args[0].value):
            stride = None
            if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, cst.Multiply) \
                    and isinstance(term.left, cst.Subscript):
                stride = term.right
                term = term.left
            if isinstance(term, cst.Name) and base is None:
                base = term.value
            elif isinstance(term, cst.Subscript) and (axis := _axis(term)) is not None and axis not in axes:
                rng = self._range(term.value)
                if rng is None:
                    return updated
                axes[axis] = (self.module.code_for_node(term.value), rng, stride)
            else:
                return updated
        if base is None or set(axes) != {0, 1} or "mask" not in kw:
            return updated
        bounds = self._bounds(kw["mask"])
        if bounds is None or set(bounds) != {axes[0][0], axes[1][0]}:
            return updated
        strides = [axes[i][2] if axes[i][2] is not None else cst.Integer("1") for i in (0, 1)]
        name = f"{base[:-4] if base.endswith('_ptr') else base}_desc"
        make = cst.parse_expression("tl.make_tensor_descriptor(x, shape=[], strides=[], block_shape=[])").with_changes(
            args=[cst.Arg(cst.Name(base)),
                  *[cst.Arg(cst.List([cst.Element(e) for e in vals]), keyword=cst.Name(k),  # type: ignore[arg-type]
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
                    for k, vals in (("shape", [bounds[axes[0][0]], bounds[axes[1][0]]]), ("strides", strides),
                                    ("block_shape", [axes[0][1][1], axes[1][1][1]]))]])
        self.descriptors.setdefault(base, cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], make)]))
        self.strides[base] = tuple(self.module.code_for_node(x) if isinstance(x, cst.Name) else None for x in strides)  # type: ignore[assignment]
        starts = cst.List([cst.Element(axes[i][1][0].with_changes(lpar=[], rpar=[])) for i in (0, 1)])
        return cst.Call(cst.Attribute(cst.Name(name), cst.Name("load")), [cst.Arg(starts)])

    def _bounds(self, mask: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
        """{range code: bound} of a mask `(A[:, None] < M) & (B[None, :] < N)`."""
        mask = mask.with_changes(lpar=[], rpar=[])
        if isinstance(mask, cst.BinaryOperation) and isinstance(mask.operator, cst.BitAnd):
            left, right = self._bounds(mask.left), self._bounds(mask.right)
            return None if left is None or right is None else {**left, **right}
        if (isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1
                and isinstance(mask.comparisons[0].operator, cst.LessThan) and isinstance(mask.left, cst.Subscript)):
            return {self.module.code_for_node(mask.left.value): mask.comparisons[0].comparator}
        return None


def _kernel_ranges(fn: cst.FunctionDef) -> dict[str, tuple[cst.BaseExpression, cst.BaseExpression]]:
    out: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
    for stmt in fn.body.body:
        assign = simple_assign(stmt)
        if assign is None:
            continue
        name, value = assign
        if isinstance(value, cst.Call) and dotted(value.func) == "tl.arange" and len(value.args) == 2 \
                and m.matches(value.args[0].value, m.Integer("0")):
            out[name] = (cst.Integer("0"), value.args[1].value)
        elif (split := start_plus_arange(value)) is not None:
            out[name] = split
    return out


def tensor_descriptors(source: str, context: dict[str, Any]) -> list[Variant]:
    """A `<kernel>_tma` copy of the kernel whose loop loads go through descriptors, and a wrapper that
    takes it only where TMA's rules hold (16-byte aligned bases and row strides, unit last stride, sm90+)
    and keeps the original kernel for every other launch."""
    module = cst.parse_module(source)
    body = list(module.body)
    for i, fn in enumerate(body):
        if not (isinstance(fn, cst.FunctionDef) and is_jit(fn) and m.findall(fn, m.Call(func=m.Attribute(
                value=m.Name("tl"), attr=m.Name("dot"))))):
            continue
        loads = _TmaLoads(module, _kernel_ranges(fn))
        new_body = []
        for stmt in fn.body.body:
            rewritten = stmt.visit(loads)
            if isinstance(stmt, cst.For) and loads.descriptors:
                new_body += [d for d in loads.descriptors.values() if d not in new_body]
            new_body.append(rewritten)  # type: ignore[arg-type]
        if not loads.descriptors:
            continue
        name = fn.name.value
        tma = fn.with_changes(name=cst.Name(f"{name}_tma"), body=fn.body.with_changes(body=new_body),
                              leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        params = [p.name.value for p in fn.params.params]
        dispatch = _TmaDispatch(name, params, loads.strides)
        rest = [stmt.visit(dispatch) for stmt in body[i + 1:]]
        if not dispatch.changed:
            continue
        new = module.with_changes(body=[*body[:i + 1], tma, *rest])
        return [Variant({"tma": sorted(loads.descriptors)}, new.code)]
    return []


class _TmaDispatch(cst.CSTTransformer):
    def __init__(self, kernel: str, params: list[str], strides: dict[str, tuple[str | None, str | None]]) -> None:
        self.kernel, self.params, self.strides = kernel, params, strides
        self.changed = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement:
        calls = m.findall(updated, m.Call(func=m.Subscript(value=m.Name(self.kernel))))
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.Expr) or not calls:
            return updated
        call = calls[0]
        bound = {p: a.value for p, a in zip(self.params, [a for a in call.args if a.keyword is None])}  # type: ignore[attr-defined]
        bound.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})  # type: ignore[attr-defined]
        code = cst.Module([]).code_for_node
        checks = ["(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] >= 9)"]
        tensors = []
        for base, (s0, s1) in self.strides.items():
            if base not in bound:
                return updated
            t = code(bound[base])
            tensors.append(t)
            check = [f"{t}.data_ptr() % 16 == 0"]
            if s0 and s0 in bound:
                check.append(f"({code(bound[s0])} * {t}.element_size()) % 16 == 0")
            if s1 and s1 in bound:
                check.append(f"{code(bound[s1])} == 1")
            checks.append(" and ".join(check))
        tma_call = updated.deep_replace(call, call.with_changes(func=call.func.with_changes(  # type: ignore[attr-defined]
            value=cst.Name(f"{self.kernel}_tma"))))
        self.changed += 1
        condition = "(\n    " + "\n    and ".join(checks) + "\n)"
        # One statement for the caller: the flag and the branch go out as a small block.
        return cst.parse_statement(
            f"if {condition}:\n"
            f"    # TMA descriptors need scratch memory for device-side creation\n"
            f"    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, "
            f"device={tensors[0]}.device))\n"
            f"    {code(tma_call).strip()}\n"
            f"else:\n"
            f"    {code(updated).strip()}\n")


register("tensor-descriptors-tma")(tensor_descriptors)
