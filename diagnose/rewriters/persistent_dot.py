"""Persistent tensor-descriptor matmul: a dot kernel on a 2-D grid of output tiles becomes one program per SM
walking the tiles, its operand tiles loaded through TMA descriptors created once per program, the tile loop
flattened into the K loop (the next tile's first loads issue during this tile's last steps), with and
without Hopper warp specialization.

Measured on the H200 (triton 3.6, fp16, docs/device/2026-12-04-h200-own-suite/): against cuBLAS, the
textbook kernel's best plain tile reaches 0.83x at 512^3 and 0.72x at 1024^3, where 64 to 128 output tiles
leave a partial wave on 132 SMs; this form reaches 0.89x and 0.93x, and matches the plain form's best from
2048^3 up. A kernel with launch-fixed tiles of at least 64x128 keeps them (two variants: with and without warp
specialization; a smaller fixed tile is declined, `MIN_FIXED_TILE`);
an autotuned one gets this form's measured tiles appended to its configs, each with and without warp
specialization as a config constexpr, so that its tuner picks both per shape.

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

from diagnose.rewriters.base import (
    Variant,
    dotted,
    is_jit,
    program_axis,
    simple_assign,
    sm_count_statement,
    start_plus_arange,
    with_parameters,
)
from diagnose.rewriters.blocks import assigned_names, code, kept_at_launch, names_in
from diagnose.rewriters.configs import append_configs, autotuned_kernels, listed_config_keys
from diagnose.rewriters.launch import current_knobs
from diagnose.rewriters.tma import tensor_descriptors

__all__ = ["PERSISTENT_TILES", "persistent_tma_dot"]

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): this form's best tiles on the H200 at 512^3-4096^3 and
# 3072x1024x4096 (scripts/matmul_headroom.py --forms persistent). 128x256x64 needs 3 stages here: with 4 its
# operand buffers and the epilogue's exceed sm90's shared memory.
PERSISTENT_TILES = ((128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 128, 64, 4, 4), (128, 256, 64, 3, 8))
# The constexpr an autotuned kernel's configs set to choose warp specialization per shape.
WS_FLAG = "_KB_WARP_SPECIALIZE"
# The fewest output elements a launch-fixed tile needs for this form. One program per SM leaves a small tile's
# SM nearly idle: on the H200 a TritonBench-T draft's 64x64x32 tile ran 2.4-3.5x slower persistent than on its
# own grid (1280^2-4096^2, docs/device/2026-12-04-h200-own-suite-2/), where the plain grid keeps several
# programs on each SM; 64x128 and larger tiles gained (PERSISTENT_TILES). A kernel with a smaller fixed tile
# is left to the tile search first, whose tuned kernel then gets this form's tiles.
MIN_FIXED_TILE = 64 * 128


def _program_ids(fn: cst.FunctionDef) -> dict[int, tuple[int, str]]:
    """Axis -> (statement index, name) of the kernel's top-level `name = tl.program_id(axis)` assignments."""
    out = {}
    for i, stmt in enumerate(fn.body.body):
        assign = simple_assign(stmt)
        axis = program_axis(assign[1]) if assign else None
        if assign is not None and axis is not None:
            out[axis] = (i, assign[0])
    return out


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


def _persistent_body(fn: cst.FunctionDef, warp_specialize: bool | str) -> cst.FunctionDef | None:
    """The kernel as a loop over its output tiles; `warp_specialize` True / False, or the name of the
    constexpr parameter (added here) that says it."""
    body = list(fn.body.body)
    if m.findall(fn, m.Return()) or m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("num_programs")))):
        return None
    pids = _program_ids(fn)
    uses = m.findall(fn, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("program_id"))))
    if sorted(pids) != [0, 1] or len(uses) != 2:
        return None
    assigned = assigned_names(fn.body)
    bounds = [_tile_bound(fn, pids[axis][1]) for axis in (0, 1)]
    if any(b is None for b in bounds) or any(assigned.get(n, 0) for b in bounds if b for n in
                                             names_in(cst.parse_expression(b[0]))):
        return None
    (rows_bound, rows_block), (cols_bound, cols_block) = bounds  # type: ignore[misc]
    kept = kept_at_launch(fn)
    if kept is None:
        return None
    saved, restored = kept
    descriptors = [st for st in body if (a := simple_assign(st)) and isinstance(a[1], cst.Call)
                   and dotted(a[1].func) == "tl.make_tensor_descriptor" and not (names_in(a[1]) & set(assigned))]
    first = min(i for i, _ in pids.values())
    head = [st for st in body[:first] if st not in descriptors]
    rest = [st for i, st in enumerate(body) if i >= first and st not in descriptors and i not in {j for j, _ in pids.values()}]
    pid_m, pid_n = pids[0][1], pids[1][1]
    options = "flatten=True" + (f", warp_specialize={warp_specialize}" if warp_specialize else "")
    loop = cst.parse_statement(
        f"for _kb_tile in tl.range(tl.program_id(0), _kb_tiles_m * _kb_tiles_n, tl.num_programs(0), {options}):\n"
        f"    {pid_m} = _kb_tile % _kb_tiles_m\n    {pid_n} = _kb_tile // _kb_tiles_m\n")
    assert isinstance(loop, cst.For)
    loop = loop.with_changes(body=loop.body.with_changes(body=[*restored, *loop.body.body, *rest]), leading_lines=[
        cst.EmptyLine(comment=cst.Comment("# persistent: each program walks the output tiles num_programs apart, "
                                          "in the 2-D grid's launch order"))])
    prologue = saved + [
        cst.parse_statement(f"_kb_tiles_m = tl.cdiv({rows_bound}, {rows_block})"),
        cst.parse_statement(f"_kb_tiles_n = tl.cdiv({cols_bound}, {cols_block})")]
    new = fn.with_changes(body=fn.body.with_changes(body=[*head, *prologue, *descriptors, loop]))
    return with_parameters(new, [warp_specialize], {warp_specialize}, default="False") \
        if isinstance(warp_specialize, str) else new


def _tuned_tiles(module: cst.Module, kernel: cst.FunctionDef) -> list[str] | None:
    """Configs to append to an autotuned kernel's list in the persistent form: each of PERSISTENT_TILES with
    and without warp specialization (its own configs stay, without). None when its configs' keys are not the
    tile's three blocks."""
    keys, callee = listed_config_keys(autotuned_kernels(module)[kernel.name.value])
    pids = _program_ids(kernel)
    rows, cols = (_tile_bound(kernel, pids[axis][1]) if axis in pids else None for axis in (0, 1))
    if len(keys) != 1 or callee is None or rows is None or cols is None:
        return None
    (names,) = keys
    k_block = [n for n in names if n not in (rows[1], cols[1])]
    if len(names) != 3 or len(k_block) != 1:
        return None
    out = []
    for bm, bn, bk, stages, warps in PERSISTENT_TILES:
        for ws in (False, True):
            blocks = {rows[1]: bm, cols[1]: bn, k_block[0]: bk}
            meta = ", ".join(f'"{n}": {blocks[n]}' for n in names)
            out.append(f'{callee}({{{meta}, "{WS_FLAG}": {ws}}}, num_warps={warps}, num_stages={stages})')
    return out


def _fixed_tile(original: cst.Module, kernel: cst.FunctionDef) -> float:
    """Output elements of the tile the original kernel's launch fixes (BLOCK_M x BLOCK_N, as the launch
    writes them: keywords, positions, wrapper locals or defaults); infinite where the launch does not say."""
    name = kernel.name.value.removesuffix("_tma")
    pids = _program_ids(kernel)
    blocks = [_tile_bound(kernel, pids[axis][1]) if axis in pids else None for axis in (0, 1)]
    knobs = current_knobs(original, {name})
    values = [knobs[b[1]].value if b is not None and b[1] in knobs else None for b in blocks]
    return float("inf") if None in values else float(values[0]) * float(values[1])  # type: ignore[arg-type]


class _OneProgramPerSM(cst.CSTTransformer):
    """`kernel[grid](...)` -> `_kb_sm_count = ...` and `kernel[(_kb_sm_count,)](...)`: programs past the last tile
    find their loop empty. Without a GPU (the interpreter) 4 programs, so that each walks several tiles."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.changed = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        calls = m.findall(updated, m.Call(func=m.Subscript(value=m.Name(self.kernel))))
        if len(calls) != 1:
            return updated
        call = cst.ensure_type(calls[0], cst.Call)
        grid = cst.parse_expression("(_kb_sm_count,)")
        new = call.with_changes(func=cst.ensure_type(call.func, cst.Subscript).with_changes(
            slice=[cst.SubscriptElement(cst.Index(grid))]))
        self.changed += 1
        return cst.FlattenSentinel([sm_count_statement("4", "_kb_sm_count"), cst.ensure_type(updated.deep_replace(call, new),
                                                                             cst.SimpleStatementLine)])


def persistent_tma_dot(source: str) -> list[Variant]:
    """The persistent TMA form of each dot kernel the TMA rewrite takes: without and with warp specialization,
    or one variant whose tuner chooses (an autotuned kernel); [] where its preconditions do not hold."""
    original = cst.parse_module(source)
    before = {n.name.value for n in original.body if isinstance(n, cst.FunctionDef)}
    out = []
    for tma in tensor_descriptors(source, {}):
        module = cst.parse_module(tma.source)
        kernels = [n for n in module.body if isinstance(n, cst.FunctionDef) and is_jit(n) and n.name.value not in before]
        if len(kernels) != 1:
            continue
        kernel = kernels[0]
        launches = _OneProgramPerSM(kernel.name.value)
        relaunched = [n.visit(launches) if not (isinstance(n, cst.FunctionDef) and is_jit(n)) else n for n in module.body]
        if not launches.changed:
            continue
        if kernel.name.value in autotuned_kernels(module):
            # Which tile, and whether to specialize warps, differs by shape: the kernel's own tuner picks both.
            persistent = _persistent_body(kernel, WS_FLAG)
            tiles = _tuned_tiles(module, kernel)
            if persistent is None or tiles is None:
                continue
            tuned = append_configs(module.with_changes(body=[persistent if n is kernel else n for n in relaunched]),
                                   kernel.name.value, tiles)
            if tuned is not None:
                out.append(Variant({**tma.params, "persistent": "one program per SM, tiles in launch order",
                                    "warp_specialize": "tuned", "configs_added": len(tiles)}, tuned.code))
            continue
        if _fixed_tile(original, kernel) < MIN_FIXED_TILE:
            continue
        for warp_specialize in (False, True):
            persistent = _persistent_body(kernel, warp_specialize)
            if persistent is None:
                break
            body = [persistent if n is kernel else n for n in relaunched]
            out.append(Variant({**tma.params, "persistent": "one program per SM, tiles in launch order",
                                "warp_specialize": warp_specialize}, module.with_changes(body=body).code))
    return out
