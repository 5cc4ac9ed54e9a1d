"""Fold the wrapper's PyTorch work into the kernel: a scaling or a clone of an input that the wrapper
makes before the launch and the kernel only reads (issue 27, host side; pattern fold-wrapper-work,
found by L1's `host.torch-work`).

`scaled = other * alpha` in the wrapper is a kernel launch and a pass over `other` of its own, timed
with the call: the first draft of torch.add on the H200 took 627.5 us where eager took 373.5. The kernel
can multiply the tile it loads instead. The rewrite applies where the change cannot alter the values
but by rounding:

- the wrapper assigns, once, `T = X * S`, `T = S * X` or `T = X / S`, where S is a number the wrapper
  takes (a numeric literal, or a parameter of the wrapper with a numeric default or an `int`/`float`
  annotation that it never reassigns), or `T = X.clone()`;
- T reaches exactly one argument of one launch `kernel[grid](...)` through layout steps only
  (`.contiguous()`, `.to(...)`, `.view/.reshape/.expand(...)`, an element of `torch.broadcast_tensors`),
  and is otherwise only asked for metadata (`.shape`, `.numel()`, `torch.result_type(...)`); it is not
  returned, written, or handed to anything else; X is not changed in place by the wrapper (`X.add_(1)`)
  nor handed to a parameter the kernel stores through (the copy was what kept reads and writes apart);
- that kernel reads the parameter only through `tl.load` (pointer arithmetic allowed), whose masked
  lanes are left undefined or filled with 0 (a scaled `-inf` would no longer be the max's identity).

The rewrite: `T = X.to(torch.result_type(X, S))` (the dtype the product would have had, free when it
is already X's; for `/` a float where that type is an integer's, as true division gives), the kernel takes `<param>_scale` and multiplies (divides) every tile loaded through that
parameter by it, and the launch passes S; a kernel that other launches call as well is copied
(`<kernel>_folded`) and only this launch calls the copy. A clone becomes `T = X`. A scale of 1 costs nothing in the
kernel: Triton specializes an integer argument equal to 1 as a constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.aliasing import accessed_parameters, host_root, mutated_in_place
from diagnose.rewriters.base import Variant, dotted, is_jit, jit_functions, launch_arguments, register, simple_assign
from diagnose.rewriters.blocks import assigned_names, number

__all__ = ["fold_wrapper_work", "metadata_use", "with_torch"]

# Methods whose result holds the same values as the tensor (a view, a copy, a cast).
_LAYOUT = frozenset({"contiguous", "to", "view", "reshape", "expand", "expand_as", "broadcast_to", "flatten",
                     "view_as", "type_as"})
_META_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
_META_METHODS = frozenset({"numel", "size", "stride", "dim", "element_size", "is_contiguous", "nelement"})
_META_FUNCTIONS = frozenset({"torch.result_type", "isinstance", "len", "torch.empty_like"})


@dataclass(frozen=True)
class _Work:
    """One foldable op of the wrapper: `target = tensor <op> scale` (op "*" or "/") or a clone (op "clone")."""
    statement: cst.SimpleStatementLine
    target: str
    tensor: str
    op: str
    scale: cst.BaseExpression | None


def _scalar_parameters(fn: cst.FunctionDef) -> set[str]:
    """The wrapper's parameters that are numbers: a numeric default, or annotated int / float."""
    params = [*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params]
    out = set()
    for p in params:
        annotation = dotted(p.annotation.annotation) if p.annotation else ""
        if (p.default is not None and number(p.default) is not None) or annotation in ("int", "float"):
            out.add(p.name.value)
    return out


def _work_in(fn: cst.FunctionDef) -> list[_Work]:
    """The foldable ops at the top level of the wrapper's body (not conditional)."""
    scalars = _scalar_parameters(fn)
    counts = assigned_names(fn)

    def scalar(e: cst.BaseExpression) -> bool:
        return number(e) is not None or (isinstance(e, cst.Name) and e.value in scalars and counts.get(e.value, 0) == 0)

    found = []
    body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else []
    for stmt in body:
        assign = simple_assign(stmt)
        if assign is None or counts.get(assign[0], 0) != 1:
            continue
        target, value = assign
        assert isinstance(stmt, cst.SimpleStatementLine)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
            op = "*" if isinstance(value.operator, cst.Multiply) else "/"
            pairs = [(value.left, value.right)] + ([(value.right, value.left)] if op == "*" else [])
            for tensor, scale in pairs:
                if isinstance(tensor, cst.Name) and tensor.value not in scalars and scalar(scale):
                    found.append(_Work(stmt, target, tensor.value, op, scale))
                    break
    for line in m.findall(fn, m.SimpleStatementLine()):  # clones: conditional ones too
        assign = simple_assign(line)
        if assign is None:
            continue
        target, value = assign
        assert isinstance(line, cst.SimpleStatementLine)
        if (isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute)
                and value.func.attr.value == "clone" and isinstance(value.func.value, cst.Name)):
            found.append(_Work(line, target, value.func.value.value, "clone", None))
    return found


class _Flow:
    """Where the values of `work.target` go inside the wrapper, read on a MetadataWrapper's module."""

    def __init__(self, fn: cst.FunctionDef, parents: Any, work: _Work, kernels: set[str]) -> None:
        self.fn, self.parents, self.kernels = fn, parents, kernels
        self.names = {work.target}
        self.launches: list[tuple[cst.Call, cst.Arg]] = []
        self.ok = self._propagate() and self._uses_are_layout_metadata_or_launch()

    def _chain_root(self, node: cst.BaseExpression) -> str | None:
        """X of `X.contiguous().to(...)...`: the name a chain of layout methods starts from."""
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _LAYOUT:
            node = node.func.value
        return node.value if isinstance(node, cst.Name) else None

    def _propagate(self) -> bool:
        while True:
            before = set(self.names)
            for assign in m.findall(self.fn, m.Assign()):
                assert isinstance(assign, cst.Assign)
                if len(assign.targets) != 1:
                    continue
                target, value = assign.targets[0].target, assign.value
                if isinstance(target, cst.Name) and self._chain_root(value) in self.names:
                    self.names.add(target.value)
                elif (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, cst.Call)
                      and dotted(value.func) == "torch.broadcast_tensors" and len(target.elements) == len(value.args)):
                    for element, arg in zip(target.elements, value.args):
                        if self._chain_root(arg.value) in self.names and isinstance(element.value, cst.Name):
                            self.names.add(element.value.value)
            if self.names == before:
                return True

    def _uses_are_layout_metadata_or_launch(self) -> bool:
        for name in m.findall(self.fn, m.Name()):
            assert isinstance(name, cst.Name)
            if name.value in self.names and not self._accounted(name):
                return False
        return len(self.launches) == 1

    def _accounted(self, name: cst.Name) -> bool:
        node: cst.CSTNode = name
        parent = self.parents[node]
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Element)
                                                      and isinstance(self.parents[parent], (cst.Tuple, cst.List))
                                                      and isinstance(self.parents[self.parents[parent]], cst.AssignTarget)):
            return True  # a binding of a name in the flow (checked by _propagate's rules)
        while True:  # climb the layout chain the name starts
            parent = self.parents[node]
            if isinstance(parent, cst.Attribute) and parent.value is node:
                if parent.attr.value in _META_ATTRS:
                    return True
                call = self.parents[parent]
                if isinstance(call, cst.Call) and call.func is parent:
                    if parent.attr.value in _META_METHODS:
                        return True
                    if parent.attr.value in _LAYOUT:
                        node = call
                        continue
                return False
            break
        if isinstance(parent, cst.Assign) and parent.value is node:
            return all(isinstance(t.target, cst.Name) and t.target.value in self.names for t in parent.targets)
        if not isinstance(parent, cst.Arg) or parent.value is not node:
            return False
        call = self.parents[parent]
        assert isinstance(call, cst.Call)
        if dotted(call.func) in _META_FUNCTIONS:
            return True
        if dotted(call.func) == "torch.broadcast_tensors":
            assign = self.parents[call]
            return isinstance(assign, cst.Assign) and isinstance(assign.targets[0].target, (cst.Tuple, cst.List))
        if isinstance(call.func, cst.Subscript) and dotted(call.func.value) in self.kernels:
            self.launches.append((call, parent))
            return True
        return False


def _zero_or_absent(load: cst.Call) -> bool:
    other = [a.value for a in load.args[1:] if (a.keyword and a.keyword.value == "other")] + \
        [a.value for a in load.args[2:3] if a.keyword is None]
    return not other or (isinstance(other[0], (cst.Integer, cst.Float)) and float(other[0].value) == 0.0)


def _names_outside_loads(node: cst.CSTNode) -> set[str]:
    """Names an expression reads, except inside `tl.load(...)`: a loaded value is data, not a pointer."""
    if isinstance(node, cst.Call) and dotted(node.func) == "tl.load":
        return set()
    if isinstance(node, cst.Name):
        return {node.value}
    return set().union(*(_names_outside_loads(child) for child in node.children))


def _accesses(kernel: cst.FunctionDef, parents: Any, param: str, access: str) -> list[cst.Call] | None:
    """The `access` calls ("tl.load" or "tl.store") whose pointer is `param` (or a name computed from
    it), or None when the kernel does anything else with it (the other access, atomics, hands it on,
    loads with a non-zero `other`)."""
    pointers = {param}
    while True:
        before = set(pointers)
        for assign in m.findall(kernel.body, m.Assign()):
            assert isinstance(assign, cst.Assign)
            if _names_outside_loads(assign.value) & pointers:
                pointers |= {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}
        if pointers == before:
            break
    loads: list[cst.Call] = []
    for name in m.findall(kernel.body, m.Name()):
        assert isinstance(name, cst.Name)
        if name.value not in pointers or isinstance(parents[name], cst.AssignTarget):
            continue
        node: cst.CSTNode = name
        while True:
            parent = parents[node]
            if isinstance(parent, cst.Arg) and isinstance(parents[parent], cst.Call):
                call = parents[parent]
                if dotted(call.func) != access or call.args[0] is not parent:
                    return None
                if access == "tl.load" and not _zero_or_absent(call):
                    return None
                if call not in loads:
                    loads.append(call)
                break
            if isinstance(parent, cst.Assign):
                if not all(isinstance(t.target, cst.Name) for t in parent.targets):
                    return None
                break
            if isinstance(parent, (cst.BaseSmallStatement, cst.BaseCompoundStatement, cst.IndentedBlock,
                                   cst.FunctionDef, cst.Call)):
                return None  # a use that is not pointer arithmetic towards a load
            node = parent
    return loads or None


def _appended(items: list[Any], new: Any) -> list[Any]:
    """`items` (parameters or arguments) with `new` last, laid out as the list was: one per line stays one
    per line, and a trailing comma stays trailing."""
    if not items:
        return [new]
    last = items[-1]
    between = items[-2].comma if len(items) > 1 and isinstance(items[-2].comma, cst.Comma) \
        else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]


class _Fold(cst.CSTTransformer):
    def __init__(self, work: _Work, kernel: cst.FunctionDef, scale_param: str, loads: list[cst.Call],
                 launch: cst.Call, copy_as: str | None) -> None:
        self.work, self.kernel, self.scale_param, self.loads, self.launch = work, kernel, scale_param, loads, launch
        self.copy_as = copy_as  # the folded kernel's name when the original stays for other launches

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine:
        if original is not self.work.statement:
            return updated
        x = self.work.tensor
        assert self.work.scale is not None
        scale = cst.Module([]).code_for_node(self.work.scale)
        kind = f"torch.result_type({x}, {scale})"
        if self.work.op == "/":  # true division: an integer tensor over an int is a float (the default dtype)
            kind = f"({kind} if {kind}.is_floating_point or {kind}.is_complex else torch.get_default_dtype())"
        value = cst.parse_expression(f"{x}.to({kind})")
        assign = updated.body[0]
        assert isinstance(assign, cst.Assign)
        return updated.with_changes(body=[assign.with_changes(value=value)])

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if original is self.launch and self.work.scale is not None:
            arg = cst.Arg(self.work.scale, keyword=cst.Name(self.scale_param),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            func = updated.func
            if self.copy_as and isinstance(func, cst.Subscript):
                func = func.with_changes(value=cst.Name(self.copy_as))
            return updated.with_changes(func=func, args=_appended(list(updated.args), arg))
        if any(original is load for load in self.loads):
            operator = cst.Multiply() if self.work.op == "*" else cst.Divide()
            return cst.BinaryOperation(updated, operator, cst.Name(self.scale_param),
                                       lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef
                          ) -> cst.FunctionDef | cst.FlattenSentinel[cst.BaseStatement]:
        if original is not self.kernel or self.work.scale is None:
            return updated
        params = _appended(list(updated.params.params), cst.Param(cst.Name(self.scale_param)))
        folded = updated.with_changes(params=updated.params.with_changes(params=params))
        if self.copy_as is None:
            return folded
        return cst.FlattenSentinel([original, folded.with_changes(name=cst.Name(self.copy_as),
                                                                   leading_lines=[cst.EmptyLine(), cst.EmptyLine()])])


def _launch_of_output(fn: cst.FunctionDef, parents: Any, work: _Work, kernels: set[str]
                      ) -> tuple[cst.Call, cst.Arg] | None:
    """The one launch argument that is the clone's name itself, where nothing before that launch reads
    the clone but for its metadata (after it, the tensor holds what the kernel wrote: anything goes)."""
    names = [n for n in m.findall(fn, m.Name()) if isinstance(n, cst.Name) and n.value == work.target]
    sites = [(i, parents[n]) for i, n in enumerate(names)
             if isinstance(parents[n], cst.Arg) and parents[n].value is n and isinstance(parents[parents[n]], cst.Call)
             and isinstance(parents[parents[n]].func, cst.Subscript) and dotted(parents[parents[n]].func.value) in kernels]
    if len(sites) != 1:
        return None
    at, arg = sites[0]
    if not all(metadata_use(name, parents) for name in names[:at]):
        return None
    return parents[arg], arg


def metadata_use(name: cst.Name, parents: Any) -> bool:
    """A binding of the name, or a use that reads no element: `.shape`, `.numel()`, `x is None`,
    `isinstance(x, ...)`, `torch.result_type(x, ...)`."""
    parent = parents[name]
    if isinstance(parent, (cst.AssignTarget, cst.Param)):
        return True
    if isinstance(parent, cst.Attribute) and parent.value is name:
        return parent.attr.value in _META_ATTRS or parent.attr.value in _META_METHODS
    if isinstance(parent, cst.Arg) and isinstance(parents[parent], cst.Call):
        return dotted(parents[parent].func) in _META_FUNCTIONS
    comparison = parents[parent] if isinstance(parent, cst.ComparisonTarget) else parent
    return isinstance(comparison, cst.Comparison) and all(
        isinstance(t.operator, (cst.Is, cst.IsNot)) for t in comparison.comparisons)


def _value(work: _Work) -> cst.BaseExpression:
    """The value the work's statement assigns (the clone or the product)."""
    return cst.ensure_type(work.statement.body[0], cst.Assign).value


def with_torch(module: cst.Module) -> cst.Module:
    """The module with `import torch` first where it has no top-level import of it (a draft that only
    calls methods of the tensors it is given may never import torch; the rewrite's torch calls need it)."""
    for stmt in module.body:
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"), asname=None)])])):
            return module
    body = list(module.body)
    at = next((i for i, stmt in enumerate(body) if m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
               and not m.matches(stmt, m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))]))), len(body))
    return module.with_changes(body=[*body[:at], cst.parse_statement("import torch\n"), *body[at:]])


def _fold(source: str, index: int) -> tuple[str, dict[str, Any]] | None:
    """The module with the `index`-th foldable op (in source order) folded, or None when it does not apply."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    module = wrapper.module
    parents = wrapper.resolve(ParentNodeProvider)
    kernels = jit_functions(module)
    candidates = [(fn, w) for fn in m.findall(module, m.FunctionDef())
                  if isinstance(fn, cst.FunctionDef) and not is_jit(fn) for w in _work_in(fn)]
    if index >= len(candidates):
        return None
    fn, work = candidates[index]
    assert isinstance(fn, cst.FunctionDef)
    flow = _Flow(fn, parents, work, set(kernels))
    output = _launch_of_output(fn, parents, work, set(kernels)) if work.op == "clone" else None
    launch_arg = flow.launches[0] if flow.ok and assigned_names(fn).get(work.target) == 1 else output
    if launch_arg is None:
        return None
    launch, arg = launch_arg
    assert isinstance(launch.func, cst.Subscript)
    kernel = kernels[dotted(launch.func.value)]
    params = {p.name.value for p in kernel.params.params}
    param = next((name for name, bound in launch_arguments(kernel, launch).items() if bound is arg and name in params), None)
    if any(a.star for a in launch.args):
        return None  # a launch that unpacks arguments may pass the scale's parameter name already
    if param is None or kernel.params.star_arg is not cst.MaybeSentinel.DEFAULT \
            or any(p.default is not None for p in kernel.params.params):
        return None
    _, stored = accessed_parameters(kernel)
    if any(host_root(a.value) == work.tensor for name, a in launch_arguments(kernel, launch).items()
           if name in stored and name != param) or mutated_in_place(fn, work.tensor):
        return None  # the kernel writes X, or the wrapper changes it after the copy: the copy was needed
    loads = _accesses(kernel, parents, param, "tl.load") if launch_arg is not output else None
    if loads is None and not (work.op == "clone" and output and _accesses(kernel, parents, param, "tl.store")):
        return None
    if loads is None:  # a clone the kernel only writes over: its copy of the input is never read
        replacement = cst.parse_expression(f"torch.empty_like({work.tensor})")
        new = with_torch(cst.ensure_type(module.deep_replace(_value(work), replacement), cst.Module))
        return new.code, {"folded": "clone", "into": f"{kernel.name.value}.{param}", "as": "empty_like (written over)"}
    if work.op == "clone":
        new = cst.ensure_type(module.deep_replace(_value(work), cst.Name(work.tensor)), cst.Module)
        return new.code, {"folded": "clone", "into": f"{kernel.name.value}.{param}", "as": "the input (read only)"}
    launch_count = sum(1 for c in m.findall(module, m.Call(func=m.Subscript()))
                       if isinstance(c, cst.Call) and isinstance(c.func, cst.Subscript)
                       and dotted(c.func.value) == kernel.name.value)
    taken = {n.value for n in m.findall(module, m.Name())}  # type: ignore[attr-defined]
    scale_param, copy_as = f"{param}_scale", f"{kernel.name.value}_folded"
    while scale_param in taken:
        scale_param += "_"
    while copy_as in taken:
        copy_as += "_"
    new = with_torch(module.visit(_Fold(work, kernel, scale_param, loads, launch, copy_as if launch_count > 1 else None)))
    return new.code, {"folded": f"{work.tensor} {work.op} scale", "into": f"{kernel.name.value}.{param}", "loads": len(loads)}


def fold_wrapper_work(source: str, context: dict[str, Any]) -> list[Variant]:
    """One variant per foldable op of the wrapper, each op on its own; then, where more than one
    applies, all of them together."""
    variants = []
    for index in range(_count(source)):
        one = _fold(source, index)
        if one is not None:
            variants.append(Variant(one[1], one[0]))
    if len(variants) > 1:
        # A folded op is no longer foldable, so folding the first that applies until none does ends.
        folded, applied = source, 0
        while (step := next((r for i in range(_count(folded)) if (r := _fold(folded, i)) is not None), None)):
            folded, applied = step[0], applied + 1
        variants.append(Variant({"folded": f"{applied} ops"}, folded))
    return variants


def _count(source: str) -> int:
    return sum(len(_work_in(fn)) for fn in m.findall(cst.parse_module(source), m.FunctionDef())
               if isinstance(fn, cst.FunctionDef) and not is_jit(fn))


register("fold-wrapper-work")(fold_wrapper_work)
