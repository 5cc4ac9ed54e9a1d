"""Tensor descriptors (TMA): a dot loop's tile loads through `tl.make_tensor_descriptor(...).load`, dispatched
where TMA's rules hold."""

from __future__ import annotations

import textwrap
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.affine import TileLoad, tile_loads
from diagnose.rewriters.base import Variant, docstring_lines, is_jit, register
from diagnose.rewriters.blocks import assigned_names, fresh_name, names_in


class _TmaLoads(cst.CSTTransformer):
    """Inside the kernel's loops, each tile load the affine reader placed (`affine.tile_loads`) becomes
    `<base>_desc.load([row start, column start])` on a descriptor of the array's shape, strides and the
    tile's block shape, created once per program. Out-of-bounds rows and columns read as zero, as the
    masked load's `other=0.0` did (or as its unspecified `other`, or as a wrapped row that only a masked
    output row reads)."""

    def __init__(self, fn: cst.FunctionDef) -> None:
        self.reads = tile_loads(fn)
        params = {p.name.value for p in fn.params.params}
        counts = assigned_names(fn.body)
        # Names a descriptor may use at the kernel's top: launch values of parameters it never reassigns,
        # and globals. The base may be moved in place later (attorch's `input_pointer += ...`).
        self.at_top = {n for n in params if not counts.get(n)}
        self.locals = set(counts) | params  # loop targets are among the assigned names
        self.descriptors: dict[str, tuple[str, cst.BaseStatement]] = {}  # key -> (name, statement)
        self.strides: dict[str, tuple[str, str]] = {}  # base -> (row stride, column stride)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        read = self.reads.get(original)
        if read is None or not self._fits(read):
            return updated
        rows, cols = read.axes
        make = (f"tl.make_tensor_descriptor({read.base}, shape=[{rows.bound}, {cols.bound}], "
                f"strides=[{rows.stride}, {cols.stride}], block_shape=[{rows.block}, {cols.block}])")
        if make not in self.descriptors:
            stem = read.base[:-4] if read.base.endswith("_ptr") else read.base
            taken = {name for name, _ in self.descriptors.values()}
            name = fresh_name(f"{stem}_desc", taken | self.locals)
            self.descriptors[make] = (name, cst.parse_statement(f"{name} = {make}"))
            self.strides[read.base] = (rows.stride, cols.stride)
        name = self.descriptors[make][0]
        return cst.parse_expression(f"{name}.load([{rows.start}, {cols.start}])")

    def _fits(self, read: TileLoad) -> bool:
        """The descriptor can be made at the kernel's top, and the launch can check TMA's rules on it: row
        stride a parameter or a literal, column stride 1 or a parameter; one stride pair per base."""
        rows, cols = read.axes
        used = {n for part in (rows.bound, cols.bound, rows.stride, cols.stride, rows.block, cols.block)
                for n in names_in(cst.parse_expression(part))}
        if used - self.at_top & self.locals:
            return False
        if not (rows.stride in self.at_top or rows.stride.isdigit()) or not (cols.stride == "1" or cols.stride in self.at_top):
            return False
        return self.strides.get(read.base, (rows.stride, cols.stride)) == (rows.stride, cols.stride)


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
        loads = _TmaLoads(fn)
        rewritten = [st for st in (stmt.visit(loads) for stmt in fn.body.body) if isinstance(st, cst.BaseStatement)]
        if not loads.descriptors:
            continue
        doc = docstring_lines(rewritten)
        made = [statement for _, statement in loads.descriptors.values()]
        new_body = [*rewritten[:doc], *made, *rewritten[doc:]]
        name = fn.name.value
        tma = fn.with_changes(name=cst.Name(f"{name}_tma"), body=fn.body.with_changes(body=new_body),
                              leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        params = [p.name.value for p in fn.params.params]
        dispatch = _TmaDispatch(name, params, loads.strides)
        rest = [stmt.visit(dispatch) for stmt in body[i + 1:]]
        if not dispatch.changed:
            continue
        new = module.with_changes(body=[*body[:i + 1], tma, *rest])
        return [Variant({"tma": sorted(loads.strides)}, new.code)]
    return []


class _TmaDispatch(cst.CSTTransformer):
    def __init__(self, kernel: str, params: list[str], strides: dict[str, tuple[str, str]]) -> None:
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
            if not (s0.isdigit() or s0 in bound) or not (s1 == "1" or s1 in bound):
                return updated  # a stride the launch does not pass: TMA's rules cannot be checked
            row = s0 if s0.isdigit() else code(bound[s0])
            check = [f"{t}.data_ptr() % 16 == 0", f"({row} * {t}.element_size()) % 16 == 0"]
            if s1 != "1":
                check.append(f"{code(bound[s1])} == 1")
            checks.append(" and ".join(check))
        # The launch's own comment lines go above the branch, not into it (its code would start dedented).
        launch = updated.with_changes(leading_lines=[])
        tma_call = launch.deep_replace(call, call.with_changes(func=call.func.with_changes(  # type: ignore[attr-defined]
            value=cst.Name(f"{self.kernel}_tma"))))
        self.changed += 1
        condition = "(\n    " + "\n    and ".join(checks) + "\n)"
        # One statement for the caller: the flag and the branch go out as a small block.
        branch = cst.parse_statement(
            f"if {condition}:\n"
            f"    # TMA descriptors need scratch memory for device-side creation\n"
            f"    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, "
            f"device={tensors[0]}.device))\n"
            f"{_in_block(code(tma_call))}\n"
            f"else:\n"
            f"{_in_block(code(launch))}\n")
        return branch.with_changes(leading_lines=updated.leading_lines)


def _in_block(statement: str) -> str:
    """A statement's text one level into the dispatch's branch, its continuation lines shifted with it so
    the call reads as it did; a statement holding a multi-line string keeps its lines as they are (shifting
    them would change the string)."""
    text = statement.strip()
    if any("\n" in cst.ensure_type(s, cst.SimpleString).value for s in m.findall(cst.parse_statement(text), m.SimpleString())):
        return "    " + text
    return textwrap.indent(text, "    ")


register("tensor-descriptors-tma")(tensor_descriptors)
