"""Persistent tensor-descriptor matmul: a dot kernel on a 2-D grid of output tiles becomes one program per SM
walking the tiles, its operand tiles loaded through TMA descriptors created once per program, the tile loop
flattened into the K loop (the next tile's first loads issue during this tile's last steps), with and
without Hopper warp specialization.

Measured on the H200 (triton 3.6, fp16, docs/device/2026-12-04-h200-own-suite/): against cuBLAS, the
textbook kernel's best plain tile reaches 0.83x at 512^3 and 0.72x at 1024^3, where 64 to 128 output tiles
leave a partial wave on 132 SMs; this form reaches 0.89x and 0.93x, and matches the plain form's best from
2048^3 up. The tiles stay the kernel's own (its launch's, or its autotuner's configs).

    pid_m = tl.program_id(0)                  _kb_tiles_m = tl.cdiv(M, BLOCK_M)   # the row mask's bound
    pid_n = tl.program_id(1)                  _kb_tiles_n = tl.cdiv(N, BLOCK_N)
    ...                           ->          a_desc = tl.make_tensor_descriptor(...)
                                              for _kb_tile in tl.range(tl.program_id(0), _kb_tiles_m * _kb_tiles_n,
                                                                       tl.num_programs(0), flatten=True, ...):
                                                  pid_m = _kb_tile % _kb_tiles_m  # the 2-D grid's launch order
                                                  pid_n = _kb_tile // _kb_tiles_m
                                                  ...

Preconditions, on the syntax tree: the TMA rewrite applies (`tma.tensor_descriptors`: tile loads of the form
it reads, dispatched at run time on TMA's alignment rules, the kernel as written otherwise); the kernel reads
`tl.program_id(0)` and `tl.program_id(1)` once each, into names, and no other program index; rows and columns
are `pid * BLOCK + tl.arange(0, BLOCK)` compared with `<` against bounds the body does not reassign (the tile
counts come from those bounds, so a grid wider than them only had idle programs); no `return`. Parameters the
body moves start each tile from their launch value.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import Variant, dotted, is_jit, simple_assign, sm_count_statement, start_plus_arange
from diagnose.rewriters.blocks import assigned_names, code, names_in
from diagnose.rewriters.tma import tensor_descriptors

__all__ = ["persistent_tma_dot"]


def _program_axis(value: cst.BaseExpression) -> int | None:
    if isinstance(value, cst.Call) and dotted(value.func) == "tl.program_id" and len(value.args) == 1 \
            and isinstance(value.args[0].value, cst.Integer):
        return int(value.args[0].value.value)
    return None


def _tile_bound(fn: cst.FunctionDef, pid: str) -> tuple[str, str] | None:
    """(bound, block) of the tile `pid` indexes: the name bound to `pid * BLOCK + tl.arange(0, BLOCK)` and
    the one expression it is compared `<` against."""
    ranges: list[tuple[str, str]] = []
    for stmt in fn.body.body:
        assign = simple_assign(stmt)
        split = start_plus_arange(assign[1]) if assign else None
        if assign is None or split is None:
            continue
        start, block = split
        start = start.with_changes(lpar=[], rpar=[])
        if isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Multiply) and \
                {code(start.left), code(start.right)} == {pid, code(block)}:
            ranges.append((assign[0], code(block)))
    if len(ranges) != 1:
        return None
    name, width = ranges[0]
    bounds: set[str] = set()
    for comparison in m.findall(fn, m.Comparison()):
        assert isinstance(comparison, cst.Comparison)
        left = comparison.left.with_changes(lpar=[], rpar=[])
        base = left.value if isinstance(left, cst.Subscript) else left
        if m.matches(base, m.Name(name)) and len(comparison.comparisons) == 1 \
                and isinstance(comparison.comparisons[0].operator, cst.LessThan):
            bounds.add(code(comparison.comparisons[0].comparator))
    return (bounds.pop(), width) if len(bounds) == 1 else None


def _persistent_body(fn: cst.FunctionDef, warp_specialize: bool) -> cst.FunctionDef | None:
    body = list(fn.body.body)
    if m.findall(fn, m.Return()) or m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("num_programs")))):
        return None
    pids: dict[int, tuple[int, str]] = {}  # axis -> (statement index, name)
    for i, stmt in enumerate(body):
        assign = simple_assign(stmt)
        axis = _program_axis(assign[1]) if assign else None
        if assign is not None and axis is not None:
            pids[axis] = (i, assign[0])
    uses = m.findall(fn, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("program_id"))))
    if sorted(pids) != [0, 1] or len(uses) != 2:
        return None
    assigned = assigned_names(fn.body)
    bounds = [_tile_bound(fn, pids[axis][1]) for axis in (0, 1)]
    if any(b is None for b in bounds) or any(assigned.get(n, 0) for b in bounds if b for n in
                                             names_in(cst.parse_expression(b[0]))):
        return None
    (rows_bound, rows_block), (cols_bound, cols_block) = bounds  # type: ignore[misc]
    params = {p.name.value: p for p in fn.params.params}
    moved = [name for name in assigned if name in params]
    if any((note := params[n].annotation) is not None and "constexpr" in code(note.annotation) for n in moved):
        return None
    descriptors = [st for st in body if (a := simple_assign(st)) and isinstance(a[1], cst.Call)
                   and dotted(a[1].func) == "tl.make_tensor_descriptor" and not (names_in(a[1]) & set(assigned))]
    first = min(i for i, _ in pids.values())
    head = [st for st in body[:first] if st not in descriptors]
    rest = [st for i, st in enumerate(body) if i >= first and st not in descriptors and i not in {j for j, _ in pids.values()}]
    pid_m, pid_n = pids[0][1], pids[1][1]
    options = "flatten=True" + (", warp_specialize=True" if warp_specialize else "")
    loop = cst.parse_statement(
        f"for _kb_tile in tl.range(tl.program_id(0), _kb_tiles_m * _kb_tiles_n, tl.num_programs(0), {options}):\n"
        f"    {pid_m} = _kb_tile % _kb_tiles_m\n    {pid_n} = _kb_tile // _kb_tiles_m\n")
    assert isinstance(loop, cst.For)
    restored = [cst.parse_statement(f"{name} = _kb_{name}_at_launch") for name in moved]
    loop = loop.with_changes(body=loop.body.with_changes(body=[*restored, *loop.body.body, *rest]), leading_lines=[
        cst.EmptyLine(comment=cst.Comment("# persistent: each program walks the output tiles num_programs apart, "
                                          "in the 2-D grid's launch order"))])
    prologue = [cst.parse_statement(f"_kb_{name}_at_launch = {name}") for name in moved] + [
        cst.parse_statement(f"_kb_tiles_m = tl.cdiv({rows_bound}, {rows_block})"),
        cst.parse_statement(f"_kb_tiles_n = tl.cdiv({cols_bound}, {cols_block})")]
    return fn.with_changes(body=fn.body.with_changes(body=[*head, *prologue, *descriptors, loop]))


class _OneProgramPerSM(cst.CSTTransformer):
    """`kernel[grid](...)` -> `sm_count = ...` and `kernel[(sm_count,)](...)`: programs past the last tile
    find their loop empty."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.changed = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        calls = m.findall(updated, m.Call(func=m.Subscript(value=m.Name(self.kernel))))
        if len(calls) != 1:
            return updated
        call = cst.ensure_type(calls[0], cst.Call)
        grid = cst.parse_expression("(sm_count,)")
        new = call.with_changes(func=cst.ensure_type(call.func, cst.Subscript).with_changes(
            slice=[cst.SubscriptElement(cst.Index(grid))]))
        self.changed += 1
        return cst.FlattenSentinel([sm_count_statement("4"), cst.ensure_type(updated.deep_replace(call, new),
                                                                             cst.SimpleStatementLine)])


def persistent_tma_dot(source: str) -> list[Variant]:
    """The persistent TMA form of each dot kernel the TMA rewrite takes, without and with warp
    specialization; [] where its preconditions do not hold."""
    before = {n.name.value for n in cst.parse_module(source).body if isinstance(n, cst.FunctionDef)}
    out = []
    for tma in tensor_descriptors(source, {}):
        module = cst.parse_module(tma.source)
        kernels = [n for n in module.body if isinstance(n, cst.FunctionDef) and is_jit(n) and n.name.value not in before]
        if len(kernels) != 1:
            continue
        kernel = kernels[0]
        for warp_specialize in (False, True):
            persistent = _persistent_body(kernel, warp_specialize)
            if persistent is None:
                break
            launches = _OneProgramPerSM(kernel.name.value)
            body = [persistent if n is kernel else n.visit(launches) if not (isinstance(n, cst.FunctionDef) and is_jit(n))
                    else n for n in module.body]
            if launches.changed:
                out.append(Variant({**tma.params, "persistent": "one program per SM, tiles in launch order",
                                    "warp_specialize": warp_specialize}, module.with_changes(body=body).code))
    return out
