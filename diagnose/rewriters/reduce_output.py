"""Fold a whole-tensor reduction the wrapper runs on the kernel's output into the kernel (issue 27, host side;
pattern fold-output-reduction, found by L1's `host.torch-work`).

First drafts of fused operators often write the elementwise part in Triton and leave the reduction to
PyTorch: `exp_kernel[grid](x, out, n)` then `out.mean()`, or `y += alpha * x` in the kernel then
`torch.norm(y)`. The reduction reads the whole output back from memory: a third (or half) of the call's
traffic. Each program can reduce the tile it stores while it holds it; the wrapper then reduces a few
hundred partials instead of the tensor. The same PyTorch call on the partials gives the result, with
each partial chosen so that it does:

- `T.sum()` / `torch.sum(T)`: each program's sum;
- `T.mean()` / `torch.mean(T)`: each program's sum times programs / T.numel() (a number the wrapper
  computes), so that the mean of the partials is the mean of T;
- `torch.norm(T)` / `T.norm()` (the 2-norm: no `p`, or `p=2`) / `torch.linalg.vector_norm(T)`: each program's
  sqrt(sum of squares), so that the norm of the partials is the norm of T;

with the `dtype=` the call gives, the result cast to the dtype the call on T returns. The partials are
fp32, whatever T's dtype: an fp16 sum of a thousand exponentials would overflow.

It applies where the sum over the stored lanes is provably T's:
- the kernel is launched once, on a 1-D grid (`base.launch_grid`), stores T's parameter once, outside any
  loop, at `pid * BLOCK + tl.arange(0, BLOCK)` (through names) under `offsets < N`;
- the launch passes N as `T.numel()` (or a name bound to it, or to `X.numel()` where T is
  `torch.empty_like(X)` / `zeros_like(X)`), and the grid is `triton.cdiv(N, BLOCK)` programs;
- the launch is a statement of the wrapper's body (not in a branch or loop), the reductions come after it,
  and nothing between writes T (no other launch, no in-place op, no reassignment).

The kernel still stores T (other uses of it stay as they were).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.aliasing import host_aliases, mutated_in_place
from diagnose.rewriters.base import (
    SubstituteNames,
    Variant,
    dotted,
    jit_functions,
    launch_arguments,
    launch_grid,
    launch_statement,
    mask_argument,
    register,
    target_launch,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import assigned_names, code, flat_access, numel_of, pointer_roots

__all__ = ["fold_output_reduction"]

_PARTIALS, _SCALE, _PROGRAMS = "_kb_partials", "_kb_scale", "_kb_programs"


@dataclass(frozen=True)
class _Reduction:
    """One call of the wrapper that reduces the whole of T: its node, its kind (sum, mean, norm), and the
    dtype argument it passes (None: T's)."""

    call: cst.Call
    kind: str
    dtype: cst.BaseExpression | None


def _reduction(call: cst.Call, tensor: str) -> _Reduction | None:
    """`call` as a whole-tensor reduction of `tensor`, else None."""
    func = dotted(call.func)
    method = isinstance(call.func, cst.Attribute) and m.matches(call.func.value, m.Name(tensor))
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if any(a.star for a in call.args):
        return None
    if method:
        kind = cst.ensure_type(call.func, cst.Attribute).attr.value
        args = positional
    elif func in ("torch.sum", "torch.mean", "torch.norm", "torch.linalg.vector_norm") and positional \
            and m.matches(positional[0].value, m.Name(tensor)):
        kind, args = func.rsplit(".", 1)[-1], positional[1:]
    else:
        return None
    kind = {"vector_norm": "norm"}.get(kind, kind)
    if kind not in ("sum", "mean", "norm") or args:
        return None
    if kind == "norm":
        p = keywords.pop("p", None) if "p" in keywords else keywords.pop("ord", None)
        if p is not None and not m.matches(p, m.Integer("2") | m.Float("2.0")):
            return None
    dtype = keywords.pop("dtype", None)
    if dtype is not None and m.matches(dtype, m.Name("None")):
        dtype = None  # `dtype=None` is T's
    if keywords:  # dim, keepdim, out: not a whole-tensor reduction into a new value
        return None
    return _Reduction(call, kind, dtype)


@dataclass
class _Plan:
    kernel: cst.FunctionDef
    launch: cst.Call
    statement: cst.SimpleStatementLine  # the wrapper's statement holding the launch
    wrapper: cst.FunctionDef
    pointer: str  # the kernel's parameter T binds
    tensor: str
    store: cst.Call
    reductions: list[_Reduction]
    programs: cst.BaseExpression  # the launch's grid, as the wrapper can evaluate it before the launch


def _plan(module: cst.Module, context: dict[str, Any]) -> _Plan | None:
    target = target_launch(module, context)
    if target is None:
        return None
    name, launch = target
    kernel = jit_functions(module)[name]
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    found = launch_statement(launch, parents)
    if found is None:
        return None  # a launch in a branch, a loop or an expression
    statement, wrapper = found
    bound = launch_arguments(kernel, launch)
    stores = [c for c in m.findall(kernel, m.Call()) if dotted(cst.ensure_type(c, cst.Call).func) == "tl.store"]
    for pointer, arg in bound.items():
        tensor = arg.value.value if isinstance(arg.value, cst.Name) else None
        mine = [cst.ensure_type(s, cst.Call) for s in stores if _stores_through(cst.ensure_type(s, cst.Call), pointer)]
        if tensor is None or len(mine) != 1:
            continue
        lines = cst.ensure_type(wrapper.body, cst.IndentedBlock).body
        after = list(lines[lines.index(statement) + 1:])
        reductions = [r for stmt in after for c in m.findall(stmt, m.Call())
                      if (r := _reduction(cst.ensure_type(c, cst.Call), tensor)) is not None]
        if not reductions or not _untouched_after(after, tensor, wrapper):
            continue
        programs = launch_grid(module, launch)
        if programs is None:
            continue
        plan = _Plan(kernel, launch, statement, wrapper, pointer, tensor, mine[0], reductions, programs)
        if _covers_tensor(plan, parents):
            return plan
    return None


def _stores_through(store: cst.Call, pointer: str) -> bool:
    return bool(store.args) and pointer_roots(store.args[0].value, {}) == {pointer}


def _untouched_after(after: list[cst.BaseStatement], tensor: str, wrapper: cst.FunctionDef) -> bool:
    """Nothing after the launch launches again or writes `tensor`, or a name viewing the same host tensor
    (`z = y` then `z.mul_(2)`): a reassignment, an in-place op, `out=`."""
    block = cst.IndentedBlock(body=after)
    if m.findall(block, m.Call(func=m.Subscript())) or tensor in assigned_names(block):
        return False
    written = wrapper.with_changes(body=block)
    return not any(mutated_in_place(written, name) for name in host_aliases(wrapper, tensor))


def _covers_tensor(plan: _Plan, parents: Any) -> bool:
    """Whether the store writes each element of T once: its offsets `pid * BLOCK + tl.arange(0, BLOCK)`
    at the kernel's top level, masked by `offsets < N`, N being T's numel at the launch and the grid
    `triton.cdiv(N, BLOCK)`."""
    kernel, store = plan.kernel, plan.store
    if parents.get(parents.get(parents.get(store))) is not kernel.body:
        return False  # in a loop or a branch
    access = flat_access(kernel, store)
    if access is None:
        return False  # a mask missing (the grid's last program would store past T unless N divides) or not read
    block, bound_name = access.block, access.bound
    bound = launch_arguments(kernel, plan.launch)
    count = bound.get(bound_name)
    block_arg = bound.get(block.value) if isinstance(block, cst.Name) else None
    if count is None or block_arg is None or not numel_of(count.value, plan.tensor, plan.launch, parents):
        return False
    grid = plan.programs
    return (isinstance(grid, cst.Call) and dotted(grid.func) == "triton.cdiv" and len(grid.args) == 2
            and grid.args[0].value.deep_equals(count.value) and grid.args[1].value.deep_equals(block_arg.value))


def _kernel_with_partials(plan: _Plan, kinds: set[str]) -> cst.FunctionDef:
    """The kernel storing, beside T, each program's partial of every reduction kind asked for (one buffer per
    kind, `_kb_partials_<kind>`)."""
    store = plan.store
    where = mask_argument(store)
    value = store.args[1].value
    mask = store.args[where].value if where is not None else None
    cast = f"({code(value)}).to({plan.pointer}.dtype.element_ty).to(tl.float32)"
    lanes = f"tl.where({code(mask)}, {cast}, 0.0)" if mask is not None else cast
    lines = [f"_kb_lanes = {lanes}"]
    for kind in sorted(kinds):
        partial = {"sum": "tl.sum(_kb_lanes, axis=0)", "mean": f"tl.sum(_kb_lanes, axis=0) * {_SCALE}",
                   "norm": "tl.sqrt(tl.sum(_kb_lanes * _kb_lanes, axis=0))"}[kind]
        lines.append(f"tl.store({_PARTIALS}_{kind}_ptr + tl.program_id(0), {partial})")
    added = [cst.parse_statement(line) for line in lines]
    body = list(plan.kernel.body.body)
    at = next(i for i, s in enumerate(body) if m.findall(s, m.Call()) and any(c is store for c in m.findall(s, m.Call())))
    body[at + 1:at + 1] = added
    params = [f"{_PARTIALS}_{k}_ptr" for k in sorted(kinds)] + ([_SCALE] if "mean" in kinds else [])
    kernel = plan.kernel.with_changes(body=plan.kernel.body.with_changes(body=body))
    return with_parameters(kernel, params, set())


class _Rewired(cst.CSTTransformer):
    def __init__(self, plan: _Plan, kinds: set[str]) -> None:
        self.plan, self.kinds = plan, kinds
        self.by_call = {id(r.call): r for r in plan.reductions}

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original is self.plan.kernel:
            return _kernel_with_partials(self.plan, self.kinds)
        if original is not self.plan.wrapper:
            return updated
        body = list(updated.body.body)
        at = next(i for i, s in enumerate(self.plan.wrapper.body.body) if s is self.plan.statement)
        tensor = self.plan.tensor
        lines = [f"{_PROGRAMS} = {code(self.plan.programs)}"]
        lines += [f"{_PARTIALS}_{k} = torch.empty({_PROGRAMS}, dtype=torch.float32, device={tensor}.device)"
                  for k in sorted(self.kinds)]
        if "mean" in self.kinds:
            lines.append(f"{_SCALE} = {_PROGRAMS} / {tensor}.numel()")
        body[at:at] = [cst.parse_statement(line) for line in lines]
        return updated.with_changes(body=updated.body.with_changes(body=body))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if original is self.plan.launch:
            keywords: dict[str, cst.BaseExpression] = {f"{_PARTIALS}_{k}_ptr": cst.Name(f"{_PARTIALS}_{k}")
                                                       for k in sorted(self.kinds)}
            if "mean" in self.kinds:
                keywords[_SCALE] = cst.Name(_SCALE)
            return with_keywords(updated, keywords)
        reduction = self.by_call.get(id(original))
        if reduction is None:
            return updated
        on_partials = updated.visit(SubstituteNames({self.plan.tensor: cst.Name(f"{_PARTIALS}_{reduction.kind}")}))
        tensor = self.plan.tensor
        if reduction.dtype is None:
            dtype = f"{tensor}.dtype"
        elif isinstance(reduction.dtype, cst.Name):
            name = reduction.dtype.value
            dtype = f"({name} if {name} is not None else {tensor}.dtype)"
        else:
            dtype = code(reduction.dtype)
        return cst.parse_expression(f"({code(cst.ensure_type(on_partials, cst.Call))}).to({dtype})")


@register("fold-output-reduction")
def fold_output_reduction(source: str, context: dict[str, Any]) -> list[Variant]:
    """The whole-tensor reductions the wrapper runs on the kernel's output reduced in the kernel as it stores
    (see the module's docstring); [] where it does not apply."""
    if "tl.store" not in source:
        return []
    module = cst.parse_module(source)
    plan = _plan(module, context)
    if plan is None:
        return []
    kinds = {r.kind for r in plan.reductions}
    new = module.visit(_Rewired(plan, kinds))
    return [Variant({"reduced_in_kernel": sorted(kinds)}, new.code)]
