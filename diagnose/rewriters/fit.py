"""Fit a tile to the extent it covers (issue 27, parallelism; pattern fit-tile-to-extent, found by L1's
`parallelism.masked-lanes`): a block wider than the axis it tiles leaves most lanes masked off.

TritonBench-T's first draft of torch.sum tiles rows by `BLOCK_M = 128` and sums a vector as one row:
127 of every 128 lanes of each step load nothing, on one program. The block of such an axis is sized
at launch to the axis, `min(BLOCK, triton.next_power_of_2(extent))` (never above what was written, so
large extents run as before), and in a second variant the lanes freed go to the kernel's other block,
the one its loop steps by (`BLOCK_N * (BLOCK // new BLOCK)`): the same tile size, along the axis that is
long.

It applies where the change keeps every element covered:

- the kernel's axis is `offs = start + tl.arange(0, BLOCK)` at its top level, `start` being 0 or
  computed from `tl.program_id`, BLOCK a constexpr parameter, and some mask compares the axis with a
  parameter (`offs < M`, `offs[:, None] < M`): M is the extent;
- every access along the axis is masked by M, and by no other parameter (a pad kernel's loads masked by
  K and stores by N keep their block); BLOCK is only the arange's width, a tile shape and the axis's
  start (not a stride: `Out + row * BLOCK`);
- the kernel has one launch; it passes M as a name, and BLOCK as a name the launching function binds
  once to a number before that launch (where programs split the axis, the grid must read the name, so
  that it follows), or as a number where the grid reads it back as `meta['BLOCK']`;
- a kernel with `tl.dot` keeps blocks of at least 16.

The judge checks every case: a grid that did not follow the block leaves rows unwritten, which its
poisoned outputs reject.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    ReplaceNodes,
    Variant,
    dotted,
    jit_functions,
    launch_arguments,
    launch_grid_axes,
    only_launch,
    register,
    simple_assign,
    start_plus_arange,
)
from diagnose.rewriters.blocks import names_in, plain_assignments
from diagnose.rewriters.resizing import block_resizing

__all__ = ["MaskedAxis", "fit_tile_to_extent", "masked_axes"]


@dataclass(frozen=True)
class MaskedAxis:
    block: str  # the constexpr parameter the axis's arange spans
    extent: str  # the parameter its mask compares it with
    split: bool  # whether programs split the axis (its start comes from tl.program_id); else one tile spans it
    offsets: str = ""  # the name the axis is bound to (`offs` of `offs = start + tl.arange(0, BLOCK)`)


def masked_axes(kernel: cst.FunctionDef) -> list[MaskedAxis]:
    """The kernel's program axes whose mask bounds them by a parameter."""
    params = {p.name.value for p in kernel.params.params}
    constexpr = {p.name.value for p in kernel.params.params
                 if p.annotation and dotted(p.annotation.annotation).endswith("constexpr")}
    top = _top_level(kernel)

    def from_program_id(expr: cst.BaseExpression, seen: set[str]) -> bool:
        if m.findall(expr, m.Call(func=m.Attribute(attr=m.Name("program_id")))):
            return True
        return any(len(top.get(n, [])) == 1 and from_program_id(top[n][0], seen | {n})
                   for n in names_in(expr) - seen)

    offsets: dict[str, tuple[str, bool]] = {}  # axis name -> its block, and whether programs split it
    for name, values in top.items():
        parts = start_plus_arange(values[0]) if len(values) == 1 else None
        if parts is None and len(values) == 1 and isinstance(values[0], cst.Call) and dotted(values[0].func) == "tl.arange" \
                and len(values[0].args) == 2 and m.matches(values[0].args[0].value, m.Integer("0")):
            parts = (cst.Integer("0"), values[0].args[1].value)
        if parts is None or not isinstance(parts[1], cst.Name) or parts[1].value not in constexpr:
            continue
        start = parts[0]
        if m.matches(start, m.Integer("0")):
            offsets[name] = (parts[1].value, False)
        elif from_program_id(start, {name}):
            offsets[name] = (parts[1].value, True)
    axes = []
    for comparison in m.findall(kernel.body, m.Comparison()):
        assert isinstance(comparison, cst.Comparison)
        if len(comparison.comparisons) != 1 or not isinstance(comparison.comparisons[0].operator, cst.LessThan):
            continue
        left, right = comparison.left, comparison.comparisons[0].comparator
        if isinstance(left, cst.Subscript):
            left = left.value
        if isinstance(left, cst.Name) and left.value in offsets and isinstance(right, cst.Name) \
                and right.value in params - constexpr:
            axis = MaskedAxis(*offsets[left.value][:1], right.value, offsets[left.value][1], left.value)
            if axis not in axes:
                axes.append(axis)
    return axes


def _binding(fn: cst.FunctionDef, name: str) -> tuple[cst.SimpleStatementLine, int] | None:
    """The one statement of `fn`'s top level that binds `name` to a number, and the number."""
    statements = [s for s in m.findall(fn, m.Assign()) if isinstance(s, cst.Assign)
                  and any(m.matches(t.target, m.Name(name)) for t in s.targets)]
    if len(statements) != 1:
        return None
    line = next((s for s in fn.body.body if isinstance(s, cst.SimpleStatementLine)
                 and any(small is statements[0] for small in s.body)), None)
    assign = simple_assign(line) if line is not None else None
    if assign is None or not isinstance(assign[1], cst.Integer):
        return None
    return line, int(assign[1].value)  # type: ignore[return-value]


def _defined_before(fn: cst.FunctionDef, line: cst.SimpleStatementLine, names: set[str]) -> bool:
    """Whether each name is a parameter of `fn` or bound by a top-level statement before `line`."""
    known = {p.name.value for p in [*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params]}
    for stmt in fn.body.body:
        if stmt is line:
            return names <= known
        for target in m.findall(stmt, m.AssignTarget()):
            known |= names_in(cst.ensure_type(target, cst.AssignTarget).target)
    return False


def _sole_extent(kernel: cst.FunctionDef, axis: MaskedAxis) -> bool:
    """Whether the extent bounds every access along the axis: each access stepping through its lanes is
    masked from above (`resizing`), and no comparison bounds the axis by another parameter (a pad kernel
    loads `offs < K` and stores `offs < N`: fitted to K, the stores past K would be lost)."""
    if not block_resizing(kernel, axis.block).grow:
        return False
    return all(a.extent == axis.extent for a in masked_axes(kernel) if a.offsets == axis.offsets)


def _block_only_spans(kernel: cst.FunctionDef, axis: MaskedAxis) -> bool:
    """Whether BLOCK appears only as an arange's width, a tile factory's shape and in the axis's start
    (`pid * BLOCK`): a BLOCK that is also a stride (`Out + row * BLOCK`) or a count changes meaning."""
    allowed: set[int] = set()
    for node in m.findall(kernel.body, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        name = dotted(call.func)
        if name == "tl.arange" or name in ("tl.zeros", "tl.full") and call.args:
            spanned = call.args if name == "tl.arange" else call.args[:1]
            allowed |= {id(n) for a in spanned for n in m.findall(a, m.Name(axis.block))}
    for value in _start_chain(kernel, axis):
        allowed |= {id(n) for n in m.findall(value, m.Name(axis.block))}
    return all(id(n) in allowed for n in m.findall(kernel.body, m.Name(axis.block)))


def _top_level(kernel: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """The values each local is bound to by the kernel's top-level statements."""
    top: dict[str, list[cst.BaseExpression]] = {}
    for stmt in kernel.body.body:
        assign = simple_assign(stmt)
        if assign is not None:
            top.setdefault(assign[0], []).append(assign[1])
    return top


def _start_chain(kernel: cst.FunctionDef, axis: MaskedAxis) -> list[cst.BaseExpression]:
    """The axis's offsets and the top-level values they are computed from (`row_start = pid * BLOCK_M`,
    then `rows = row_start + tl.arange(0, BLOCK_M)`): where a program's part of the axis begins."""
    top = _top_level(kernel)
    chain, todo, seen = [], [axis.offsets], set()
    while todo:
        name = todo.pop()
        if name in seen or len(top.get(name, [])) != 1:
            continue
        seen.add(name)
        chain.append(top[name][0])
        todo += names_in(top[name][0])
    return chain


def _program_axis(kernel: cst.FunctionDef, axis: MaskedAxis) -> int | None:
    """Which grid axis splits the masked axis: the one `tl.program_id(k)` in its start reads."""
    found = {cst.ensure_type(call, cst.Call).args[0].value for value in _start_chain(kernel, axis)
             for call in m.findall(value, m.Call(func=m.Attribute(attr=m.Name("program_id"))))
             if cst.ensure_type(call, cst.Call).args}
    numbers = {int(n.value) for n in found if isinstance(n, cst.Integer)}
    return numbers.pop() if len(numbers) == 1 and len(found) == 1 else None


def _fitted(module: cst.Module, kernel: cst.FunctionDef, axis: MaskedAxis, compensate: bool) -> tuple[str, dict[str, Any]] | None:
    launch = only_launch(module, kernel.name.value)
    if launch is None or not _sole_extent(kernel, axis) or not _block_only_spans(kernel, axis):
        return None
    fn, call = launch
    arguments = {name: a.value for name, a in launch_arguments(kernel, call).items()}
    extent, block = arguments.get(axis.extent), arguments.get(axis.block)
    if extent is None or block is None or not _plain(extent):
        return None
    floor = 16 if m.findall(kernel, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("dot")))) else 1
    code = cst.Module([]).code_for_node
    fitted = f"max({floor}, min({{block}}, triton.next_power_of_2({code(extent)})))" if floor > 1 \
        else f"min({{block}}, triton.next_power_of_2({code(extent)}))"
    changes: dict[int, cst.BaseExpression] = {}
    if not axis.split and isinstance(block, (cst.Name, cst.Integer, cst.Attribute)):
        # One tile spans the axis: no grid depends on its block, so the launch's own argument changes.
        written = code(block)
        changes[id(block)] = cst.parse_expression(fitted.format(block=written))
    elif isinstance(block, cst.Name):
        binding = _binding(fn, block.value)
        if binding is None or not _defined_before(fn, binding[0], _roots(extent)):
            return None
        if axis.split and not _grid_follows(module, fn, call, axis.block, block.value, _program_axis(kernel, axis)):
            return None  # `(triton.cdiv(n, 1024),)`: the grid would not follow the block
        if not _other_launches_fit(module, fn, call, block.value, code(extent)):
            return None  # the name sizes another launch's block, which would change with it
        line, number = binding
        written = str(number)
        value = simple_assign(line)[1]  # type: ignore[index]
        changes[id(value)] = cst.parse_expression(fitted.format(block=written))
    elif isinstance(block, cst.Integer):
        if not _grid_reads_meta(fn, call, axis.block):
            return None  # the grid would not follow a block changed at the launch
        written = block.value
        changes[id(block)] = cst.parse_expression(fitted.format(block=written))
    else:
        return None
    params_out: dict[str, Any] = {"fit": f"{axis.block} to {axis.extent}"}
    if compensate:
        other = _loop_block(kernel, axis.block)
        given = arguments.get(other) if other else None
        if other is None or given is None or not block_resizing(kernel, other).grow:
            return None  # no loop block, or one whose accesses are unmasked along it: a larger step skips past K
        factor = f"({written} // {fitted.format(block=written)})"  # the lanes the fitted block frees
        if isinstance(given, cst.Integer):
            changes[id(given)] = cst.parse_expression(f"{given.value} * {factor}")
        elif isinstance(given, cst.Name) and (binding := _binding(fn, given.value)) is not None \
                and _defined_before(fn, binding[0], _roots(extent)) \
                and _other_launches_grow(module, fn, call, given.value, block):
            value = simple_assign(binding[0])[1]  # type: ignore[index]
            changes[id(value)] = cst.parse_expression(f"{binding[1]} * {factor}")
        else:
            return None
        params_out["grow"] = other
    new = module.visit(ReplaceNodes(changes))
    return new.code, params_out


def _grid_follows(module: cst.Module, fn: cst.FunctionDef, call: cst.Call, param: str, name: str,
                  index: int | None) -> bool:
    """Whether the launch's grid reads the block: as `meta['<param>']`, or at the program axis `index` that
    splits it, the name the launch passes, directly or through names `fn` binds once (`n_blocks =
    triton.cdiv(M, BLOCK_M)`, then `kernel[(n_blocks, n_split)]`; `n_split` reading `n_blocks` is no axis 0)."""
    if _grid_reads_meta(fn, call, param):
        return True
    axes = launch_grid_axes(module, call)
    return axes is not None and index is not None and index < len(axes) and name in _reads(fn, axes[index])


def _reads(fn: cst.FunctionDef, node: cst.CSTNode) -> set[str]:
    """The names an expression of `fn` reads, and those read by the names among them that `fn` binds once."""
    bound = plain_assignments(fn)
    seen: set[str] = set()
    todo = list(names_in(node))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            if len(bound.get(name, [])) == 1:
                todo += names_in(bound[name][0])
    return seen


def _launches_passing(module: cst.Module, fn: cst.FunctionDef, besides: cst.Call, name: str
                      ) -> list[tuple[cst.FunctionDef, cst.Call, list[str]]] | None:
    """The other kernel launches in `fn` that pass `name`, with the kernel and the parameters it binds; None
    where something other than a kernel is launched with it (not ours to read)."""
    kernels = jit_functions(module)
    found = []
    for node in m.findall(fn, m.Call(func=m.Subscript())):
        call = cst.ensure_type(node, cst.Call)
        if call is besides or not any(m.matches(a.value, m.Name(name)) for a in call.args):
            continue
        kernel = kernels.get(dotted(cst.ensure_type(call.func, cst.Subscript).value))
        if kernel is None:
            return None
        found.append((kernel, call, [p for p, a in launch_arguments(kernel, call).items()
                                     if m.matches(a.value, m.Name(name))]))
    return found


def _other_launches_fit(module: cst.Module, fn: cst.FunctionDef, call: cst.Call, name: str, extent: str) -> bool:
    """Whether every other launch the block's name reaches (a split rewrite's copy of the kernel, launched
    in both branches of a dtype test) takes it as a block that may be fitted to the same extent."""
    others = _launches_passing(module, fn, call, name)
    if others is None:
        return False
    code = cst.Module([]).code_for_node
    for kernel, launch, params in others:
        arguments = {p: a.value for p, a in launch_arguments(kernel, launch).items()}
        for param in params:
            axis = next((a for a in masked_axes(kernel) if a.block == param and a.extent in arguments
                         and code(arguments[a.extent]) == extent), None)
            if axis is None or not _sole_extent(kernel, axis) or not _block_only_spans(kernel, axis) \
                    or axis.split and not _grid_follows(module, fn, launch, param, name, _program_axis(kernel, axis)):
                return False
    return True


def _other_launches_grow(module: cst.Module, fn: cst.FunctionDef, call: cst.Call, name: str,
                         fitted: cst.BaseExpression) -> bool:
    """Whether every other launch the loop block's name reaches takes it as the block its loop steps by,
    beside the fitted block, with accesses masked along it (so that it may grow)."""
    others = _launches_passing(module, fn, call, name)
    if others is None:
        return False
    for kernel, launch, params in others:
        arguments = {p: a.value for p, a in launch_arguments(kernel, launch).items()}
        beside = [p for p, a in arguments.items() if a.deep_equals(fitted)]
        if any(len(beside) != 1 or _loop_block(kernel, beside[0]) != p or not block_resizing(kernel, p).grow
               for p in params):
            return False
    return True


def _roots(node: cst.BaseExpression) -> set[str]:
    """The variable a plain expression reads (`x` of `x.shape[1]`)."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return {node.value} if isinstance(node, cst.Name) else set()


def _plain(node: cst.BaseExpression) -> bool:
    """A name, an attribute or an integer subscript of one (`M`, `x.shape[1]`): evaluating it again
    computes nothing."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return _plain(node.value)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return _plain(node.value) and isinstance(node.slice[0].slice.value, cst.Integer)
    return False


def _grid_reads_meta(fn: cst.FunctionDef, call: cst.Call, block: str) -> bool:
    """Whether the launch's grid is a name `fn` binds once to a lambda that reads `meta['<block>']`."""
    if not isinstance(call.func, cst.Subscript) or len(call.func.slice) != 1:
        return False
    index = call.func.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Name)):
        return False
    bound = [a.value for a in m.findall(fn, m.Assign()) if isinstance(a, cst.Assign)
             and any(m.matches(t.target, m.Name(index.value.value)) for t in a.targets)]
    return len(bound) == 1 and isinstance(bound[0], cst.Lambda) and any(
        cst.ensure_type(key, cst.SimpleString).evaluated_value == block for key in m.findall(bound[0].body, m.SimpleString()))


def _loop_block(kernel: cst.FunctionDef, besides: str) -> str | None:
    """The constexpr block a loop of the kernel steps by (`for k in range(0, K, BLOCK_K)`), other than `besides`."""
    constexpr = {p.name.value for p in kernel.params.params
                 if p.annotation and dotted(p.annotation.annotation).endswith("constexpr")}
    steps = set()
    for loop in m.findall(kernel, m.For()):
        assert isinstance(loop, cst.For)
        if isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) in ("range", "tl.range") and len(loop.iter.args) >= 3:
            steps |= names_in(loop.iter.args[2].value) & constexpr
    steps.discard(besides)
    return steps.pop() if len(steps) == 1 else None


def fit_tile_to_extent(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    variants = []
    for kernel in jit_functions(module).values():
        for axis in masked_axes(kernel):
            for compensate in (False, True):
                fitted = _fitted(module, kernel, axis, compensate)
                if fitted is not None:
                    variants.append(Variant(fitted[1], fitted[0]))
    return variants


register("fit-tile-to-extent")(fit_tile_to_extent)
