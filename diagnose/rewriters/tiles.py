"""Dot tiles: whole tile shapes (BLOCK_M/N/K, stages, warps) for tl.dot kernels, as configurations or under
@triton.autotune, the launch grid's divisors moved with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.base import (
    InJit,
    SubstituteNames,
    Variant,
    dotted,
    jit_functions,
    launch_arguments,
    program_axis,
    register,
)
from diagnose.rewriters.blocks import enclosing_function, names_in, plain_assignments, pointer_roots, reaching_value
from diagnose.rewriters.configs import DOT_TILES, autotuned_kernels
from diagnose.rewriters.launch import (
    TRITON_DEFAULT_KNOBS,
    Knob,
    SetKnob,
    cdiv_divisor,
    current_knobs,
    jit_names,
    launch_config,
    launch_knobs,
    with_divisor,
)
from diagnose.rewriters.resizing import kernels_resizing
from diagnose.rewriters.untie import untie_shared_binding, untie_shared_block

# A dot kernel with an M x N tile and no K block (attention: K is the head dimension, a constexpr),
# (BLOCK_M, BLOCK_N, num_stages, num_warps), measured: the four best of nine (the fused-attention
# tutorial's six Hopper points, and 64x64 at 3 stages / 4 warps, 128x64 and 128x128 at 3 stages / 8 warps)
# for a plain flash kernel, fp16, heads of 64 and 128, against SDPA on the H200 with Triton 3.6
# (scripts/attention_headroom.py, docs/device/2026-12-03-h200-attention/). With exp2 and the split key loop
# 128x64 at 8 warps is best (0.853x of SDPA over the five cases), with plain exp 64x64 (0.698x); the
# tutorial's 4-warp 128-row tiles lose a third at a 128-wide head, and 128x128 at 2 stages loses everywhere.
_DOT_TILES_NO_K = ((128, 64, 3, 8), (64, 64, 3, 4), (128, 64, 4, 4), (128, 128, 3, 8))


class _AxisBlocks(cst.CSTVisitor):
    """In the jit kernels, the block size each program-id axis steps by: `pid_m = tl.program_id(0)` and
    `pid_m * BLOCK_M` (or `tl.program_id(0) * BLOCK_M`) make axis 0 BLOCK_M."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.axis_block: dict[int, str] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        axis = program_axis(node.value)
        if axis is not None and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self.pids[node.targets[0].target.value] = axis

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Multiply):
            return
        for pid, block in ((node.left, node.right), (node.right, node.left)):
            axis = self.pids.get(pid.value) if isinstance(pid, cst.Name) else program_axis(pid)
            if axis is not None and isinstance(block, cst.Name) and block.value.isupper():
                self.axis_block.setdefault(axis, block.value)


class _LaunchGrids(cst.CSTVisitor):
    """Outside the kernels: each launched kernel's grid tuples (`kernel[(..)]`, or `kernel[grid]` where
    `grid = (..)` is the assignment that reaches the launch), and every `triton.cdiv(x, <literal>)` call,
    wherever it is."""

    def __init__(self, module: cst.Module, kernels: set[str], parents: Mapping[cst.CSTNode, cst.CSTNode]) -> None:
        self.module, self.kernels, self.parents = module, kernels, parents
        self.grids_of: dict[str, list[cst.Tuple]] = {}
        self.lambdas_of: dict[str, list[cst.Tuple]] = {}  # the tuples `lambda meta: (...)` grids return
        self.literal_cdivs = 0
        self.launched: set[str] = set()  # the jit functions launched with a grid (not helpers they call)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node.name.value not in self.kernels

    def visit_Subscript(self, node: cst.Subscript) -> None:
        kernel = dotted(node.value)
        if kernel not in self.kernels or len(node.slice) != 1:
            return
        self.launched.add(kernel)
        index = node.slice[0].slice
        value = index.value if isinstance(index, cst.Index) else None
        tuples: list[cst.BaseExpression] = [value] if isinstance(value, cst.Tuple) else []
        if isinstance(value, cst.Name):
            reaching = reaching_value(value.value, node, self.parents)
            # Where branches assign it, every tuple the launching function binds to that name is a grid to check.
            scope = enclosing_function(node, self.parents) or self.module
            tuples = [reaching[0]] if reaching else [
                a.value for a in m.findall(scope, m.Assign(targets=[m.AssignTarget(m.Name(value.value))]))
                if isinstance(a, cst.Assign)]
        self.grids_of.setdefault(kernel, []).extend(t for t in tuples if isinstance(t, cst.Tuple))
        # a lambda of meta follows the blocks where it reads them (`meta['BLOCK_M']`); checked, not rewritten
        self.lambdas_of.setdefault(kernel, []).extend(
            t.body for t in tuples if isinstance(t, cst.Lambda) and isinstance(t.body, cst.Tuple))

    def visit_Call(self, node: cst.Call) -> None:
        if cdiv_divisor(node) is not None:
            self.literal_cdivs += 1

    def grids(self, kernels: set[str] | None = None) -> list[cst.Tuple]:
        """The grid tuples of `kernels`' launches (default: every launch's)."""
        return [t for k, tuples in self.grids_of.items() if kernels is None or k in kernels for t in tuples]


class _GridDivisors(cst.CSTTransformer):
    """In the launch grids only, `(triton.cdiv(m, 64), triton.cdiv(n, 64), ...)`: each axis's literal
    divisor becomes its block's new size, or an expression (`meta["BLOCK_M"]`, with `as_lambda` making
    the grid `lambda meta: (...)` for an autotuned kernel). `changed` counts the divisors set."""

    def __init__(self, grids: list[cst.Tuple], axis_value: dict[int, int | cst.BaseExpression],
                 as_lambda: bool = False, names: dict[str, cst.BaseExpression] | None = None) -> None:
        self.grids, self.axis_value, self.as_lambda = grids, axis_value, as_lambda
        self.names = names or {}  # wrapper names of blocks the grid reads (`(m + BLOCK_M - 1) // BLOCK_M`), replaced
        self.changed = 0

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.BaseExpression:
        if not any(original is g for g in self.grids):
            return updated
        if self.names:
            updated = cst.ensure_type(updated.visit(SubstituteNames(self.names)), cst.Tuple)
        elements = list(updated.elements)
        for axis, element in enumerate(elements):
            if axis in self.axis_value and cdiv_divisor(element.value) is not None:
                elements[axis] = element.with_changes(value=with_divisor(element.value, self.axis_value[axis]))  # type: ignore[arg-type]
                self.changed += 1
        if not self.as_lambda:
            return updated.with_changes(elements=elements)
        return cst.Lambda(params=cst.Parameters(params=[cst.Param(cst.Name("meta"))]),
                          body=updated.with_changes(elements=elements, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))


@dataclass
class _TilePlan:
    """What the tile search of a dot kernel needs: the module, its launch knobs and parent links, the
    block name of each axis (M, N and maybe K), the tile shapes to try, and the grid axes tied to a block."""
    module: cst.Module
    current: dict[str, Knob]
    named: set[str]  # every keyword the launches pass, known value or not
    shapes: list[dict[str, int]]
    grids: _LaunchGrids
    tiled: set[str]  # the kernels that take the tile's blocks
    tile_grids: list[cst.Tuple]  # their launches' grids
    axes: dict[int, str]  # grid axis -> the block name its program id steps by
    parents: Mapping[cst.CSTNode, cst.CSTNode]  # the module's parent links, resolved once for every reader


def _tile_plan(source: str) -> _TilePlan | None:
    if "dot(" not in source:
        return None
    module = cst.parse_module(source)
    kernels = jit_names(module)
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    launched = launch_knobs(module, kernels, parents)
    current = current_knobs(module, kernels, launched)
    names = {axis: next((k for k in current if k.startswith("BLOCK") and k.endswith(f"_{axis}")), None) for axis in "MNK"}
    if names["M"] is None or names["N"] is None:
        return None
    # Blocks bound to one name (`BLOCK_M=BS, BLOCK_N=BS`) cannot take a tile's different sizes where they are
    # written: untie.py gives each its own first.
    bindings = [(k.scope, k.local) if k.local else ("", f"param {k.param}") if k.param else None
                for b in names.values() if b is not None and (k := current.get(b)) is not None]
    if len([b for b in bindings if b]) != len({b for b in bindings if b}):
        return None
    if names["K"] is None:
        del names["K"]
        shapes = [dict(zip((names["M"], names["N"], "num_stages", "num_warps"), t)) for t in _DOT_TILES_NO_K]
    else:
        # Hopper tile shapes set every knob at once: one-knob steps from 64x64x32 need rounds to get there
        shapes = [dict(zip((names["M"], names["N"], names["K"], "num_stages", "num_warps"), t)) for t in DOT_TILES]
    blocks = _AxisBlocks()
    for node in module.body:
        if isinstance(node, cst.FunctionDef) and node.name.value in kernels:
            node.visit(blocks)
    found = _LaunchGrids(module, kernels, parents)
    module.visit(found)
    # A kernel under @triton.autotune is not tiled here: its configs own the blocks (a launch keyword would
    # clash with them), and the config search widens them instead. A small-shape path beside it is.
    tiled = {name for name, fn in jit_functions(module).items()
             if {names["M"], names["N"]} <= {p.name.value for p in fn.params.params}} - set(autotuned_kernels(module))
    if not tiled:
        return None
    # A tile may only grow a block whose accesses are masked along it, and shrink one that steps a loop or
    # a program axis (`resizing`): a K loop that loads unmasked is right only for Ks its own BLOCK_K divides.
    jit = jit_functions(module)
    resizing = {b: kernels_resizing(jit, tiled, b) for b in names.values() if b is not None}

    def allowed(shape: dict[str, int]) -> bool:
        for b, r in resizing.items():
            now = current[b].value if b in current else None
            if (now is None or shape[b] > now) and not r.grow or (now is None or shape[b] < now) and not r.shrink:
                return False
        return True

    shapes = [s for s in shapes if allowed(s)]
    if not shapes:
        return None
    axes = {a: b for a, b in blocks.axis_block.items() if b in names.values()}
    # Each grid must count its tile axes as `triton.cdiv(.., B)`, or by the name the block is bound to
    # (`BLOCK_M = 64` in the wrapper, the grid `(m + BLOCK_M - 1) // BLOCK_M`), which changes with it:
    # `(m + 63) // 64` would keep the old size. A `lambda meta:` grid must read the block as `meta['BLOCK_M']`
    # (or by that name): `lambda meta: ((M + 127) // 128, ...)` keeps the old count of programs.
    def follows(count: cst.BaseExpression, block: str, in_lambda: bool) -> bool:
        knob = current.get(block)
        binding = knob and (knob.local or knob.param)
        if binding and binding in names_in(count):
            return True
        if in_lambda:
            return block in {cst.ensure_type(k, cst.SimpleString).evaluated_value
                             for k in m.findall(count, m.SimpleString())}
        return cdiv_divisor(count) is not None

    lambdas = [g for kernel in tiled for g in found.lambdas_of.get(kernel, [])]
    for grid, in_lambda in [*((g, False) for g in found.grids(tiled)), *((g, True) for g in lambdas)]:
        for a, block in axes.items():
            if a < len(grid.elements) and not follows(grid.elements[a].value, block, in_lambda):
                return None
    return _TilePlan(module, current, launched.named, shapes, found, tiled, found.grids(tiled), axes, parents)


def dot_tile_configs(source: str, context: dict[str, Any]) -> list[Variant]:
    """For a kernel with `tl.dot` and BLOCK_M / BLOCK_N / BLOCK_K launch knobs (or BLOCK_M / BLOCK_N
    alone): the tile shapes above, every knob of one shape set together, and the grid's literal
    `triton.cdiv(.., B)` divisors moved with the block of their axis (found from the kernel's
    `tl.program_id(axis) * BLOCK`). [] when the kernel is not of that form or a grid divisor cannot be
    tied to a block."""
    plan, untied = _plan_untied(source)
    if plan is None:
        return []
    variants = []
    for values in plan.shapes:
        grid = _GridDivisors(plan.tile_grids, {a: values[b] for a, b in plan.axes.items()})
        new = plan.module.visit(grid)  # the grids first, while their nodes are the ones `found` saw
        # Every literal `triton.cdiv` outside the kernels must be a grid divisor of an axis whose block
        # is one of the tile's; one elsewhere (a tile count, a grouped 1-D grid) would keep the old size.
        if grid.changed != plan.grids.literal_cdivs:
            return []
        for key, value in values.items():
            # only the tiled kernels' launches: a second kernel beside them keeps its warps and stages
            new = new.visit(SetKnob(plan.tiled, key, value, plan.current.get(key)))
        variants.append(Variant({**values, **untied}, new.code))
    return variants


def _plan_untied(source: str) -> tuple[_TilePlan | None, dict[str, str]]:
    """The tile plan of the kernel as written, else of the kernel with its shared block untied, or its blocks'
    shared wrapper local split (untie.py), with the params that say so (`{"untied": "BLOCK_SIZE"}`)."""
    plan = _tile_plan(source)
    if plan is not None:
        return plan, {}
    untied = untie_shared_block(source)
    if untied is None:
        module = cst.parse_module(source)
        for name, kernel in jit_functions(module).items():
            if m.findall(kernel, m.Call(func=m.Attribute(attr=m.Name("dot")))):
                blocks = _AxisBlocks()
                kernel.visit(blocks)
                untied = untie_shared_binding(source, name, blocks.axis_block)
                if untied is not None:
                    break
    if untied is None:
        return None, {}
    return _tile_plan(untied.source), {"untied": untied.block}


class _PointerRoots(InJit):
    """Kernel parameters written through tl.store and read through tl.load, and whether any atomic is
    issued: an autotuned kernel runs several times on the same buffers while it is tuned."""

    def __init__(self, assigned: Mapping[str, list[cst.BaseExpression]] | None = None) -> None:
        super().__init__()
        self.assigned = assigned or {}  # the kernel's plain assignments: a local address is followed to its roots
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.atomics = False

    def visit_Call(self, node: cst.Call) -> None:
        if not self.depth or not node.args:
            return
        name = dotted(node.func)
        target = {"tl.load": self.loaded, "tl.store": self.stored}.get(name)
        if target is not None:
            # The names the address starts from, followed through the kernel's plain assignments (`ptrs =
            # x_ptr + offs` starts from x_ptr); anything else is "?", which the caller's "only parameters" rejects.
            roots = pointer_roots(node.args[0].value, self.assigned)
            target.update(r if r.isidentifier() else "?" for r in roots if r not in self.assigned)
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in ("load", "store") \
                and not name.startswith("tl."):
            self.stored.add("?")  # a tensor descriptor or block pointer: what it reads and writes is unknown
        self.atomics = self.atomics or name.startswith("tl.atomic_")


class _Autotuned(cst.CSTTransformer):
    """The tuned kernel's launches without the tile knobs (keywords, or the trailing positions that bind
    them), and the kernel under @triton.autotune over the tile shapes keyed on its size parameters (the
    grid is `_GridDivisors`' work)."""

    def __init__(self, kernel: cst.FunctionDef, knobs: list[str], decorator: cst.Decorator) -> None:
        self.kernel, self.knobs, self.decorator = kernel, knobs, decorator

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value == self.kernel.name.value:
            return updated.with_changes(decorators=[self.decorator, *updated.decorators])
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not (isinstance(original.func, cst.Subscript) and dotted(original.func.value) == self.kernel.name.value):
            return updated
        knob_args = {id(a) for key, a in launch_arguments(self.kernel, updated).items() if key in self.knobs}
        args = [a for a in updated.args if id(a) not in knob_args]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)


def _knob_positions_trail(kernel: cst.FunctionDef, launch: cst.Call, knobs: list[str]) -> bool:
    """Whether the launch's positional arguments that bind knobs are its last positional ones: dropped for
    the tuner, they shift no other argument."""
    bound = launch_arguments(kernel, launch)
    positional = [a for a in launch.args if a.keyword is None]
    knob_args = {id(bound[k]) for k in knobs if k in bound and bound[k].keyword is None}
    return all(id(a) in knob_args for a in positional[len(positional) - len(knob_args):])


def _ancestors(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode], stop: cst.CSTNode) -> list[cst.CSTNode]:
    """`node`'s ancestors, innermost first, up to (not with) `stop`."""
    out = []
    while node in parents and parents[node] is not stop:
        node = parents[node]
        out.append(node)
    return out


def _is_launch(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Subscript)


def _grid_name(node: cst.CSTNode) -> str:
    """G of a launch `kernel[G](...)` whose grid is a name, else ""."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Subscript) and len(node.func.slice) == 1:
        index = node.func.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Name):
            return index.value.value
    return ""


def _locals_only_size_launches(module: cst.Module, scope: str, names: set[str], parents: Mapping[cst.CSTNode, cst.CSTNode]
                               ) -> bool:
    """Whether every read of the wrapper names `names` in the function `scope` (the module for "") sizes a
    launch: in its arguments or grid, or in a grid name's assignment. Once the tuner owns the blocks, a
    name read anywhere else (a tile count, a buffer's size) would keep the old block for the tuned kernel.
    A function defined inside the wrapper whose parameter has the name reads its own (a kernel defined there)."""
    functions = list(m.findall(module, m.FunctionDef(name=m.Name(scope)))) if scope else [module]
    for function in functions:
        grid_names = {_grid_name(c) for c in m.findall(function, m.Call())} - {""}
        for name in m.findall(function, m.Name()):
            if not isinstance(name, cst.Name) or name.value not in names:
                continue
            around = _ancestors(name, parents, function)
            if any(isinstance(a, cst.FunctionDef) and any(p.name.value == name.value for p in a.params.params)
                   for a in around):
                continue
            # A lambda grid reads the name when it is called: the tuner's pick would not reach it.
            if any(isinstance(a, cst.Lambda) for a in around) or not any(
                    isinstance(a, cst.AssignTarget) or _is_launch(a) or (
                        isinstance(a, cst.Assign) and len(a.targets) == 1 and dotted(a.targets[0].target) in grid_names)
                    for a in around):
                return False
    return True


def dot_tile_autotune(source: str, context: dict[str, Any]) -> list[Variant]:
    """The same tile shapes as `dot_tile_configs`, chosen per problem size by @triton.autotune on the
    one launched tiled kernel (other kernels' launches stay as written), keyed on its parameters other
    than tensors, strides and the tile knobs (sizes, and constexprs such as a head dimension): one tile
    cannot suit 512^2 and 4096^2 at once. Only for kernels that neither issue atomics nor read a buffer
    they write, since tuning runs the kernel several times; [] where the tile search would give up, the
    knobs are bound to wrapper parameters, or a wrapper local holding one is read other than to size a launch."""
    plan, untied = _plan_untied(source)
    tuned = plan.grids.launched & plan.tiled if plan is not None else set()
    if plan is None or len(tuned) != 1:
        return []
    knobs = list(plan.shapes[0])
    name = next(iter(tuned))
    kernel = jit_functions(plan.module)[name]
    launches = [c for c in m.findall(plan.module, m.Call(func=m.Subscript(value=m.Name(name))))
                if isinstance(c, cst.Call)]
    # The tuner owns the knobs, so they leave the launch. A wrapper parameter's default cannot (a caller
    # may pass it); a wrapper local can, where it is read by launches and grids only, the grid's reads
    # becoming the picked config's; a position can where no positional argument follows it.
    if any(k in plan.current and plan.current[k].param for k in knobs) \
            or not all(_knob_positions_trail(kernel, c, knobs) for c in launches):
        return []
    local = {bound: k for k in knobs if k in plan.current and (bound := plan.current[k].local)}
    scopes = {plan.current[k].scope for k in local.values()}
    if local and not all(_locals_only_size_launches(plan.module, scope, set(local), plan.parents) for scope in scopes):
        return []
    params = [p.name.value for p in kernel.params.params]
    roots = _PointerRoots(plain_assignments(kernel))
    kernel.visit(roots)
    if roots.atomics or roots.loaded & roots.stored or not (roots.loaded | roots.stored) <= set(params):
        return []
    # Not the tensors (whatever their names): a key holds values, and a tensor would make every call a new
    # key. Triton adds the tensors' dtypes to the key itself.
    tensors = roots.loaded | roots.stored
    key = [p for p in params if not (p in tensors or p.endswith("_ptr") or p.startswith("stride") or p in knobs)]
    blocks = [k for k in knobs if k.startswith("BLOCK")]
    # The kernel's own launch first, so the tuner can keep it: on the H200 attention's 64 x 64 tile beat
    # all six tutorial tiles, and a tuner without it measured 0.92x of the parent.
    # A knob passed as an expression (`num_warps=nw`) has no value here: then the launch is not known.
    own = {k: plan.current[k].value if k in plan.current else None if k in plan.named else TRITON_DEFAULT_KNOBS.get(k)
           for k in knobs}
    shapes = ([own] if None not in own.values() and own not in plan.shapes else []) + list(plan.shapes)
    configs = ",\n".join(
        "    triton.Config({" + ", ".join(f'"{b}": {shape[b]}' for b in blocks) + "}, "
        f"num_stages={shape['num_stages']}, num_warps={shape['num_warps']})" for shape in shapes)
    decorator = cst.Decorator(cst.parse_expression(f"triton.autotune(configs=[\n{configs},\n], key={key!r})"))
    grid = _GridDivisors(plan.grids.grids({name}), {a: cst.parse_expression(f'meta["{b}"]') for a, b in plan.axes.items()},
                         as_lambda=True, names={n: cst.parse_expression(f'meta["{k}"]') for n, k in local.items()})
    new = plan.module.visit(grid)  # the grids first, while their nodes are the ones the plan saw
    # As in the tile search: every literal `triton.cdiv` must be a grid divisor tied to a tile block.
    if grid.changed != plan.grids.literal_cdivs:
        return []
    new = new.visit(_Autotuned(kernel, knobs, decorator))
    return [Variant({"autotune": [dict(s) for s in shapes], "key": key, **untied}, new.code)]


register("wgmma-friendly-tiles")(dot_tile_configs)
# A dot kernel's search starts from whole tile shapes; anything else steps one knob at a time.
register("autotune-configs")(lambda s, c: dot_tile_configs(s, c) + dot_tile_autotune(s, c) or launch_config(s, c))
