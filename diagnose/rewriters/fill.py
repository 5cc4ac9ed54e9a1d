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
- the kernel has a program axis `offs = start + tl.arange(0, BLOCK)`, `start` computed from
  `tl.program_id`, BLOCK a constexpr parameter, and a mask comparing the axis with a parameter
  (`fit.masked_axes`): its tail is masked whatever the block;
- the launch passes BLOCK as a name or a number, and its grid (a tuple, or a name bound once to a tuple
  or to `lambda meta: (...)`, `base.launch_grid_axes`) reads it, so the grid follows the block;
- a name passed as BLOCK is read by the launching function only where it is bound, in the grid and at
  the launch (an allocation sized by it would no longer match the kernel's blocks);
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
    jit_functions,
    launch_arguments,
    launch_grid_axes,
    only_launch,
    register,
    sm_count_statement,
    target_launch,
    with_keywords,
)
from diagnose.rewriters.blocks import names_in
from diagnose.rewriters.fit import MaskedAxis, masked_axes
from diagnose.rewriters.pipelining import tl_range_pipelining
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


def _block_uses_ok(fn: cst.FunctionDef, block: str, grid_nodes: list[cst.BaseExpression], call: cst.Call) -> bool:
    """Whether the wrapper reads the name `block` only in the grid and the launch (and binds it)."""
    allowed = {id(n) for node in [*grid_nodes, call] for n in m.findall(node, m.Name(block))}
    bindings = {id(t.target) for t in m.findall(fn, m.AssignTarget()) if isinstance(t, cst.AssignTarget)}
    params = {id(p.name) for p in [*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params]}
    return all(id(n) in allowed | bindings | params for n in m.findall(fn.body, m.Name(block)))


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
        if not any(c is self.call for c in m.findall(original, m.Call())):
            return updated
        self.done += 1
        written = cst.Module([]).code_for_node(self.block.value)
        programs = " * ".join(_parenthesized(a) for a in _grid_with(self.axes, self.block.value, cst.Name("_kb_b")))
        sizing = [
            sm_count_statement("132").with_changes(leading_lines=[*updated.leading_lines, cst.EmptyLine(
                comment=cst.Comment(f"# fill the grid: the block halved (not below {self.floor}) until "
                                    f"{self.per_sm} programs per SM; a full grid keeps it"))]),
            cst.parse_statement(f"_kb_written = {written}\n"),
            cst.parse_statement(f"_kb_block = _kb_fill_block(_kb_written, lambda _kb_b: {programs}, "
                                f"{self.floor}, {self.per_sm} * sm_count)\n"),
        ]
        return cst.FlattenSentinel([*sizing, updated.with_changes(leading_lines=[])])


def _fill(module: cst.Module, kernel: cst.FunctionDef, call: cst.Call, axis: MaskedAxis, floor: int, per_sm: int,
          warps: bool) -> str | None:
    launch = only_launch(module, kernel.name.value)
    axes = launch_grid_axes(module, call)
    block = launch_arguments(kernel, call).get(axis.block)
    if launch is None or axes is None or block is None or not isinstance(block.value, (cst.Name, cst.Integer)):
        return None
    if not _reads_block(axes, block.value):
        return None  # the grid would not follow a smaller block
    if isinstance(block.value, cst.Name) and not _block_uses_ok(launch[0], block.value.value, axes, call):
        return None
    transform = _FillLaunch(call, block, axes, floor, per_sm, warps)
    new = module.visit(transform)
    if transform.done != 1:
        return None
    helper = [s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
              for s in cst.parse_module(FILL_HELPER).body if isinstance(s, cst.FunctionDef)]
    return new.with_changes(body=[*new.body, *helper]).code


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
    for axis in (a for a in masked_axes(kernel) if a.split):
        for floor, per_sm in (_DOT_VARIANTS if dot else _VARIANTS):
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
    return [*filled[:4], *composed][:6]


def split_work(source: str, context: dict[str, Any]) -> list[Variant]:
    """Both ways the pattern gives a short grid its programs: the loop split over a second axis (reductions),
    and smaller blocks along the axis programs already split (independent outputs)."""
    return [*split_reduction(source, context), *smaller_blocks(source, context)]


register("split-work-over-programs")(split_work)
