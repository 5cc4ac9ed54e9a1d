"""More programs for an underfilled grid: the block of a program axis halved at launch until the grid
gives the device's SMs their programs (issue 27, family 1; pattern split-work-over-programs, for L1's
`parallelism.grid-underfilled`).

A recurrence over time run by one program per 128 columns puts 1,024 columns on 8 programs: 8 of the
H200's 132 SMs walk all T steps while the rest idle, and nothing inside a program (vector width,
pipelining) reaches the other 124. Each program's columns are independent of the others', so smaller
blocks give more programs at no cost but a narrower tile. The block is chosen at launch from the grid the
launch itself computes: halved while the grid runs fewer than `per_sm` programs per SM and the block is
above a floor, so a launch whose grid already fills the device runs exactly as written. num_warps shrinks
with the block (the same elements per thread), or is left as written.

It applies where the smaller block cannot leave an element uncovered or read past the end:

- the kernel is the one the call runs (`base.target_launch`), not under `@triton.autotune` (its configs
  own the block and the warps), launched at one site;
- the kernel has a program axis `offs = pid * BLOCK + tl.arange(0, BLOCK)`, `pid` from `tl.program_id`,
  BLOCK a constexpr parameter, and a mask comparing the axis with a parameter (`fit.masked_axes`);
- each program's lanes are independent of the block: BLOCK appears only there and in tile shapes, that
  program index nowhere else (no partial or scale stored per program), and nothing combines lanes across
  the tile (no sum, scan, reshape: a chunk's own cumsum would change); other grid axes are free;
- the launch passes BLOCK as a name or a number, and its grid (a tuple, or a name bound once to a tuple
  or to `lambda meta: (...)`, `base.launch_grid_axes`; not starred) reads it, so the grid follows the block;
- the wrapper reads a name passed as BLOCK only where it binds it (not to another name: an alias's
  original would go on sizing what it sized), in the grid and as that argument; a grid bound to a name is
  read only at the launch, and the names it reads are bound once; no `**kwargs` at the launch, and the
  launch is a statement of its own in the function (not in a lambda or comprehension);
- a kernel with `tl.dot` keeps blocks of at least 16.

Rounds no finding asked for get no variants: the sizing only acts on a launch whose grid is short, which
such a round has no launch to say.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    ReplaceNodes,
    SubstituteNames,
    Variant,
    autotune_decorated,
    dotted,
    jit_functions,
    launch_arguments,
    launch_grid_axes,
    only_launch,
    register,
    simple_assign,
    sm_count_statement,
    start_plus_arange,
    target_launch,
    with_keywords,
)
from diagnose.rewriters.blocks import names_in
from diagnose.rewriters.fit import MaskedAxis, masked_axes
from diagnose.rewriters.pipelining import tl_range_pipelining
from diagnose.rewriters.rowread import program_id_axis
from diagnose.rewriters.rowsplit import triton_imports
from diagnose.rewriters.split import split_reduction

__all__ = ["FILL_HELPER", "smaller_blocks", "split_work"]

# (floor, programs per SM): the block stops halving at the floor, or once the grid holds per_sm x SMs.
_VARIANTS = ((32, 2), (16, 2), (8, 2))
_DOT_VARIANTS = ((64, 2), (32, 2), (16, 2))

FILL_HELPER = '''
def _kb_fill_block(block, programs, floor, target):
    """The block halved while the grid `programs(block)` runs fewer than `target` programs and the block is
    above `floor`: more, smaller programs for a grid too short for the device; a full grid keeps `block`."""
    while block > floor and programs(block) < target:
        block //= 2
    return block
'''


# Calls that combine a tile's lanes or reorder them: under a smaller block each would see fewer lanes.
_ACROSS = frozenset({"sum", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "reduce", "associative_scan",
                     "sort", "xor_sum", "histogram", "flip", "reshape", "view", "permute", "trans", "split", "join",
                     "interleave", "softmax", "reduce_or", "gather", "topk", "cat", "bitonic_merge", "ravel",
                     "broadcast_to", "expand_dims", "squeeze", "unsqueeze", "slice"})


def _combines_lanes(fn: cst.FunctionDef, helpers: dict[str, cst.FunctionDef], imported: dict[str, str],
                    depth: int = 0) -> bool:
    """Whether `fn`, or a @triton.jit helper it calls (`x / _absmax(x)`), combines or reorders lanes: a call
    among `_ACROSS` as `tl.sum(x)`, `x.sum()` or a name imported from triton.language."""
    for node in m.findall(fn.body, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _ACROSS:
            return True
        name = dotted(call.func)
        if name in imported and imported[name].rsplit(".", 1)[-1] in _ACROSS:
            return True
        if name in helpers and name != fn.name.value and (depth >= 3 or _combines_lanes(helpers[name], helpers,
                                                                                      imported, depth + 1)):
            return True
    return False


def _only_the_axis_reads(kernel: cst.FunctionDef, axis: MaskedAxis, helpers: dict[str, cst.FunctionDef],
                         imported: dict[str, str]) -> bool:
    """Whether the block and the program index reach nothing but the axis: BLOCK only in the statement
    that defines the axis (`offs = pid * BLOCK + tl.arange(0, BLOCK)`) and in tile shapes (`tl.zeros((BLOCK,),
    ...)`), the program index behind that start nowhere else, no lanes combined across the tile. Anything
    more (a second arange over BLOCK, a reshape or static_assert on it, a scale or partial stored at `pid`,
    a sum or scan over the tile) gives the block a meaning a smaller one would change."""
    if _combines_lanes(kernel, helpers, imported):
        return False  # lanes combined across the tile (a chunk's cumsum): a smaller block changes the result
    defining = [s for s in kernel.body.body if (a := simple_assign(s)) is not None and a[0] == axis.offsets
                and (parts := start_plus_arange(a[1])) is not None and axis.block in names_in(parts[0])]
    if len(defining) != 1:
        return False
    start = start_plus_arange(simple_assign(defining[0])[1])[0]  # type: ignore[index]
    shapes = {id(n) for call in m.findall(kernel.body, m.Call(func=m.Attribute(value=m.Name("tl"),
                                                                   attr=m.Name("zeros") | m.Name("full"))))
              for n in m.findall(cst.ensure_type(call, cst.Call).args[0], m.Name(axis.block))}
    inside = {id(n) for n in m.findall(defining[0], m.Name())}
    if not all(id(n) in inside | shapes for n in m.findall(kernel.body, m.Name(axis.block))):
        return False
    program_id = m.Call(func=m.Attribute(attr=m.Name("program_id")))
    assigned = [a for stmt in kernel.body.body if (a := simple_assign(stmt)) is not None]
    local = {name for name, _ in assigned}
    program_names = names_in(start) & local  # the start's names the kernel binds: each from tl.program_id
    if any(name in program_names and not m.findall(value, program_id) for name, value in assigned):
        return False
    calls = [*m.findall(start, program_id), *[c for name, value in assigned if name in program_names
                                              for c in m.findall(value, program_id)]]
    ours = {program_id_axis(cst.ensure_type(c, cst.Call)) for c in calls}
    others = [c for c in m.findall(kernel.body, program_id) if program_id_axis(cst.ensure_type(c, cst.Call)) in ours]
    if not calls or None in ours or len(others) > len(calls):
        return False  # the axis's program index read elsewhere too (a partial or a scale stored at `pid`)
    return all(id(n) in inside for name in program_names for n in m.findall(kernel.body, m.Name(name))
               if not _binds(kernel, n))


def _binds(kernel: cst.FunctionDef, name: cst.CSTNode) -> bool:
    return any(t.target is name for t in m.findall(kernel, m.AssignTarget()) if isinstance(t, cst.AssignTarget))


def _block_uses_ok(fn: cst.FunctionDef, block: cst.Arg, grid: _Grid, call: cst.Call) -> bool:
    """Whether the wrapper reads the block's name only in the grid and as the block argument, the name a
    parameter of the launching function or bound in it to something other than another name (an alias's
    original would go on sizing what it sized)."""
    name = cst.ensure_type(block.value, cst.Name).value
    params = {p.name.value for p in [*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params]}
    bound = [t for t in m.findall(fn.body, m.Assign()) if isinstance(t, cst.Assign)
             and any(m.matches(x.target, m.Name(name)) for x in t.targets)]
    if name not in params and not bound or any(isinstance(a.value, (cst.Name, cst.Attribute)) for a in bound):
        return False
    allowed = {id(n) for node in [*grid.nodes, block.value] for n in m.findall(node, m.Name(name))}
    targets = {id(x.target) for a in bound for x in a.targets}
    spelled = {id(a.keyword) for a in m.findall(fn.body, m.Arg()) if isinstance(a, cst.Arg) and a.keyword} | {
        id(a.attr) for a in m.findall(fn.body, m.Attribute()) if isinstance(a, cst.Attribute)}  # not the variable
    return all(id(n) in allowed | targets | spelled for n in m.findall(fn.body, m.Name(name)))


class _Grid:
    """The launch's grid as written: the nodes the block may appear in, and whether the fill may inline it."""

    def __init__(self, fn: cst.FunctionDef, call: cst.Call) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.ok = False
        if not isinstance(call.func, cst.Subscript) or len(call.func.slice) != 1:
            return
        index = call.func.slice[0].slice
        if not isinstance(index, cst.Index):
            return
        self.nodes.append(index.value)
        if isinstance(index.value, cst.Name):
            grid = index.value.value
            bound = [a for a in m.findall(fn.body, m.Assign()) if isinstance(a, cst.Assign)
                     and any(m.matches(t.target, m.Name(grid)) for t in a.targets)]
            if len(bound) != 1:
                return
            self.nodes.append(bound[0].value)
            # the grid's name read elsewhere (`torch.empty(grid[0])`) would keep the count as written
            uses = [n for n in m.findall(fn.body, m.Name(grid))]
            if len(uses) != 2:
                return
            # a name the grid reads, bound twice (perhaps between the grid and the launch), may be read anew
            # at the launch with another value
            read = names_in(bound[0].value)
            targets = [n for t in m.findall(fn.body, m.AssignTarget()) if isinstance(t, cst.AssignTarget)
                       for n in names_in(t.target) & read]
            if len(targets) != len(set(targets)):
                return
        if any(m.findall(node, m.StarredElement()) for node in self.nodes):
            return  # `(cdiv(N, BLOCK), *x.shape[:-1])`: the axes read as a product would be wrong
        self.ok = True


def _grid_with(axes: list[cst.BaseExpression], block: cst.BaseExpression, value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The grid's axes with the launch's block argument (a name, or the number a meta lambda read) replaced."""
    swap: cst.CSTTransformer = SubstituteNames({block.value: value}) if isinstance(block, cst.Name) \
        else ReplaceNodes({id(block): value})
    out = [a.visit(swap) for a in axes]
    assert all(isinstance(a, cst.BaseExpression) for a in out)  # an expression's node replaced by expressions
    return out  # type: ignore[return-value]


def _reads_block(axes: list[cst.BaseExpression], block: cst.BaseExpression) -> bool:
    if isinstance(block, cst.Name):
        return any(block.value in names_in(a) for a in axes)
    return any(any(n is block for n in m.findall(a, m.Integer())) for a in axes)


def _parenthesized(expr: cst.BaseExpression) -> str:
    code = cst.Module([]).code_for_node(expr)
    return code if isinstance(expr, (cst.Name, cst.Integer, cst.Call, cst.Attribute, cst.Subscript)) else f"({code})"


class _FillLaunch(cst.CSTTransformer):
    """The launch's statement preceded by the block's sizing; the launch given the sized block, a grid that
    follows it, and (when `warps`) num_warps scaled with it."""

    def __init__(self, call: cst.Call, block: cst.Arg, axes: list[cst.BaseExpression], floor: int, per_sm: int,
                 warps: bool) -> None:
        self.call, self.block, self.axes, self.floor, self.per_sm, self.warps = call, block, axes, floor, per_sm, warps
        self.done = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if original is not self.call:
            return updated
        sized = cst.Name("_kb_block")
        grid = cst.Tuple([cst.Element(a) for a in _grid_with(self.axes, self.block.value, sized)])
        args = [a.with_changes(value=sized) if o is self.block else a for a, o in zip(updated.args, original.args)]
        new = updated.with_changes(func=updated.func.with_changes(
            slice=[cst.SubscriptElement(cst.Index(grid))]), args=args)
        if not self.warps:
            return new
        given = next((a for a in new.args if a.keyword is not None and a.keyword.value == "num_warps"), None)
        written = _parenthesized(given.value) if given is not None else "4"
        scaled = cst.parse_expression(f"max(1, {written} * _kb_block // _kb_written)")
        if given is not None:
            return new.with_changes(args=[a.with_changes(value=scaled) if a is given else a for a in new.args])
        return with_keywords(new, {"num_warps": scaled})

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(original.body) != 1 or not any(c is self.call for c in m.findall(original, m.Call())):
            return updated  # `n = ...; launch` on one line: the sizing would run before `n` is bound
        self.done += 1
        written = cst.Module([]).code_for_node(self.block.value)
        programs = " * ".join(_parenthesized(a) for a in _grid_with(self.axes, self.block.value, cst.Name("_kb_b")))
        sizing = [
            # a name of its own: a module-level `sm_count` the wrapper reads stays global
            sm_count_statement("132", "_kb_sm_count").with_changes(
                leading_lines=[*updated.leading_lines, cst.EmptyLine(comment=cst.Comment(
                    f"# fill the grid: the block halved (not below {self.floor}) until "
                    f"{self.per_sm} programs per SM; a full grid keeps it"))]),
            cst.parse_statement(f"_kb_written = {written}\n"),
            cst.parse_statement(f"_kb_block = _kb_fill_block(_kb_written, lambda _kb_b: {programs}, "
                                f"{self.floor}, {self.per_sm} * _kb_sm_count)\n"),
        ]
        return cst.FlattenSentinel([*sizing, updated.with_changes(leading_lines=[])])


def _fill(module: cst.Module, kernel: cst.FunctionDef, call: cst.Call, axis: MaskedAxis, floor: int, per_sm: int,
          warps: bool) -> str | None:
    launch = only_launch(module, kernel.name.value)
    axes = launch_grid_axes(module, call)
    block = launch_arguments(kernel, call).get(axis.block)
    if launch is None or axes is None or block is None or not isinstance(block.value, (cst.Name, cst.Integer)):
        return None
    if any(a.star for a in call.args) or _in_expression_scope(launch[0], call):
        return None  # `**opts` may hold num_warps; a lambda's or comprehension's names are not the wrapper's
    grid = _Grid(launch[0], call)
    if not grid.ok or not _reads_block(axes, block.value):
        return None  # the grid would not follow a smaller block, or could not be evaluated again at the launch
    if isinstance(block.value, cst.Name) and not _block_uses_ok(launch[0], block, grid, call):
        return None
    transform = _FillLaunch(call, block, axes, floor, per_sm, warps)
    new = module.visit(transform)
    if transform.done != 1:
        return None
    # Beside the kernel, so that the module's own code after it (an `if __name__ == "__main__":`) sees it.
    helper = [s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
              for s in cst.parse_module(FILL_HELPER).body if isinstance(s, cst.FunctionDef)]
    at = next(i for i, s in enumerate(new.body) if isinstance(s, cst.FunctionDef) and s.name.value == kernel.name.value)
    return new.with_changes(body=[*new.body[:at + 1], *helper, *new.body[at + 1:]]).code


def _in_expression_scope(fn: cst.FunctionDef, call: cst.Call) -> bool:
    scopes = m.Lambda() | m.ListComp() | m.SetComp() | m.DictComp() | m.GeneratorExp()
    return any(any(c is call for c in m.findall(s, m.Call())) for s in m.findall(fn.body, scopes))


def smaller_blocks(source: str, context: dict[str, Any]) -> list[Variant]:
    if context.get("finding") == "":
        return []
    module = cst.parse_module(source)
    launch = target_launch(module, context)
    if launch is None:
        return []
    kernel = jit_functions(module).get(launch[0])
    if kernel is None or autotune_decorated(kernel):
        return []
    dot = bool(m.findall(kernel, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("dot")))))
    filled: list[Variant] = []
    helpers, imported = jit_functions(module), triton_imports(module)
    for axis in (a for a in masked_axes(kernel) if a.split and _only_the_axis_reads(kernel, a, helpers, imported)):
        written = launch_arguments(kernel, launch[1]).get(axis.block)
        for floor, per_sm in (_DOT_VARIANTS if dot else _VARIANTS):
            if written is not None and isinstance(written.value, cst.Integer) and int(written.value.value) <= floor:
                continue  # a block written at or below the floor never halves: the variant would be the kernel
            new = _fill(module, kernel, launch[1], axis, floor, per_sm, warps=not dot)
            if new is not None:
                filled.append(Variant({"fill": f"{axis.block} halved at launch", "floor": floor, "per_sm": per_sm,
                                       "num_warps": "scaled with the block" if not dot else "as written"}, new))
    # A program whose loop waits on each load takes as long on a short grid as on a full one: the loop's
    # chain of load latencies, not the SMs, sets its time. More programs pay once the loop keeps loads in
    # flight, so the two smallest blocks also come with the loop pipelined (the two rewrites composed).
    composed = []
    for variant in filled[-2:]:
        pipelined = tl_range_pipelining(variant.source, context)
        if pipelined:
            composed.append(Variant({**variant.params, **pipelined[0].params, "composed": "tl-range-pipelining"},
                                    pipelined[0].source))
    unique = list({v.source: v for v in [*filled[:4], *composed]}.values())  # an axis with two masks: once
    return unique[:6]


def split_work(source: str, context: dict[str, Any]) -> list[Variant]:
    """Both ways the pattern gives a short grid its programs: the loop split over a second axis (reductions),
    and smaller blocks along the axis programs already split (independent outputs)."""
    return [*split_reduction(source, context), *smaller_blocks(source, context)]


register("split-work-over-programs")(split_work)
