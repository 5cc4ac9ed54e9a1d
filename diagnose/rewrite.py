"""Deterministic rewriters: source transformations a catalog pattern justifies, on the syntax tree.

Each rewriter takes a kernel module's source and returns variants (a parameter description and the
new source); an empty list means the pattern does not apply to this source. They
work on libcst's concrete syntax tree, so comments and formatting outside the changed nodes
survive and the result reads like the input.

| pattern id                  | rewrite |
|-----------------------------|---------|
| block-size-num-warps, autotune-configs, warp-local-reduction, reduce-register-pressure, num-stages | launch configuration: a small search, one knob per variant |
| autotune-configs (tl.dot kernels), wgmma-friendly-tiles | six whole tile shapes (BLOCK_M/N/K, stages, warps) from Triton's matmul tutorial, or from its fused-attention tutorial for an M x N tile without a K block; the grid's divisors moved with them |
| autotune-configs (tl.dot kernels) | also those six under `@triton.autotune` keyed on the kernel's sizes, the grid a function of the picked config (pure kernels only) |
| tl-range-pipelining         | `for ... in range(...)` over loads without a dot -> `tl.range(..., num_stages=3)` |
| masked-tail-split           | a 1-D masked block -> `if START + BLOCK <= N:` unmasked, `else:` as written |
| divisibility-hints          | `pid * BLOCK + tl.arange(0, BLOCK)` -> wrapped in tl.multiple_of / tl.max_contiguous |
| persistent-kernel           | a 1-D grid `(G,)` -> a loop over the G tiles on at most 1, 2 or 4 programs per SM |
| tensor-descriptors-tma      | dot-loop tile loads -> `tl.make_tensor_descriptor(...).load`, dispatched where TMA's rules hold |
| dot-input-precision-tf32    | `input_precision="ieee"` -> "tf32" where the task's fp32 tolerance admits it, else "tf32x3" |
| int32-offsets               | drop per-element `.to(tl.int64)` casts |
| relaxed-atomics             | `sem="relaxed"` on atomics that give none |
| exp2-fast-math              | `tl.exp(x)` -> `tl.exp2(x * log2(e))` |
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

__all__ = ["REWRITERS", "Variant", "dot_tile_configs", "rewrite", "unified_diff"]

_LOG2E = "1.4426950408889634"
_WARPS = (1, 2, 4, 8, 16)
_STAGES = (1, 2, 3, 4, 5)
_MAX_VARIANTS = 6


@dataclass(frozen=True)
class Variant:
    params: dict[str, Any]  # what changed, e.g. {"num_warps": 4}
    source: str


Rewriter = Callable[[str, dict[str, Any]], list[Variant]]


def unified_diff(before: str, after: str, name: str = "kernel.py") -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}"))


def _is_jit(fn: cst.FunctionDef) -> bool:
    return any(m.matches(d.decorator, m.Attribute(attr=m.Name("jit")) | m.Name("jit")
                         | m.Call(func=m.Attribute(attr=m.Name("jit")))) for d in fn.decorators)


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class _InJit(cst.CSTTransformer):
    """Base: only nodes inside @triton.jit functions are rewritten."""

    def __init__(self) -> None:
        self.depth = 0
        self.changed = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if _is_jit(node):
            self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if _is_jit(original):
            self.depth -= 1
        return updated


# ------------------------------------------------------------------------------ launch configuration
class _LaunchKnobs(cst.CSTVisitor):
    """Integer launch keywords of `kernel[grid](...)` calls, and wrapper defaults they are bound to."""

    def __init__(self, kernels: set[str]) -> None:
        self.kernels = kernels
        self.literal: dict[str, int] = {}  # keyword -> value written at the launch
        self.bound: dict[str, str] = {}  # keyword -> wrapper parameter name it is passed from
        self.defaults: dict[str, int] = {}  # wrapper parameter -> its integer default
        self.named: set[str] = set()  # every keyword a launch passes, whatever its value

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for p in node.params.params:
            if p.default is not None and isinstance(p.default, cst.Integer):
                self.defaults[p.name.value] = int(p.default.value)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Subscript) and _dotted(node.func.value) in self.kernels:
            for arg in node.args:
                if arg.keyword is None:
                    continue
                key = arg.keyword.value
                self.named.add(key)
                if isinstance(arg.value, cst.Integer):
                    self.literal[key] = int(arg.value.value)
                elif isinstance(arg.value, cst.Name):
                    self.bound[key] = arg.value.value


class _SetKnob(cst.CSTTransformer):
    """Sets one launch keyword. A block size written twice, as the keyword and as the divisor of the
    wrapper's `triton.cdiv(n, 64)` grid, changes in both places, so the grid still covers the data."""

    def __init__(self, kernels: set[str], key: str, value: int, param: str | None, old: int | None = None) -> None:
        self.kernels, self.key, self.value, self.param, self.old = kernels, key, value, param, old
        self.done = False


    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if self.param and original.name.value == self.param and isinstance(original.default, cst.Integer):
            self.done = True
            return updated.with_changes(default=cst.Integer(str(self.value)))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.old is not None and not self.param and _cdiv_divisor(updated) == self.old:
            return _with_divisor(updated, self.value)
        if self.param or not (isinstance(original.func, cst.Subscript) and _dotted(original.func.value) in self.kernels):
            return updated
        args = list(updated.args)
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == self.key:
                args[i] = arg.with_changes(value=cst.Integer(str(self.value)))
                break
        else:
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            if args:
                args[-1] = args[-1].with_changes(comma=comma)
            args.append(cst.Arg(keyword=cst.Name(self.key), value=cst.Integer(str(self.value)),
                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.done = True
        return updated.with_changes(args=args)


def _jit_names(module: cst.Module) -> set[str]:
    return {n.name.value for n in module.body if isinstance(n, cst.FunctionDef) and _is_jit(n)}


def _launch_knobs(module: cst.Module, kernels: set[str]) -> _LaunchKnobs:
    knobs = _LaunchKnobs(kernels)
    module.visit(knobs)
    return knobs


def _current_knobs(module: cst.Module, kernels: set[str], knobs: _LaunchKnobs | None = None
                   ) -> dict[str, tuple[int, str | None]]:
    """Launch keyword -> (its value, the wrapper parameter it is bound to or None when written at the launch).
    `knobs`: the module's launch keywords when the caller has visited them already."""
    knobs = knobs or _launch_knobs(module, kernels)
    current: dict[str, tuple[int, str | None]] = {k: (v, None) for k, v in knobs.literal.items()}
    for key, param in knobs.bound.items():
        if param in knobs.defaults:
            current[key] = (knobs.defaults[param], param)
    return current


def _autotuned(module: cst.Module, kernels: set[str]) -> bool:
    """Whether a jit kernel of the module is under @triton.autotune."""
    return any(isinstance(n, cst.FunctionDef) and n.name.value in kernels
               and any(m.matches(d.decorator, m.Call(func=m.Attribute(attr=m.Name("autotune")) | m.Name("autotune")))
                       for d in n.decorators)
               for n in module.body)


def _cdiv_divisor(node: cst.CSTNode) -> int | None:
    """B of `triton.cdiv(x, B)` written as an integer literal, else None."""
    if (isinstance(node, cst.Call) and _dotted(node.func) == "triton.cdiv" and len(node.args) == 2
            and isinstance(node.args[1].value, cst.Integer)):
        return int(node.args[1].value.value)
    return None


def _with_divisor(call: cst.Call, value: int | cst.BaseExpression) -> cst.Call:
    divisor = cst.Integer(str(value)) if isinstance(value, int) else value
    return call.with_changes(args=[call.args[0], call.args[1].with_changes(value=divisor)])


def launch_config(source: str, context: dict[str, Any]) -> list[Variant]:
    """One knob per variant: num_warps, num_stages (for loops), and power-of-two block sizes halved or
    doubled. `context["direction"]`: "fewer-warps", "more-warps", "fewer-stages", or "" (both ways)."""
    module = cst.parse_module(source)
    kernels = _jit_names(module)
    if _autotuned(module, kernels):
        return []  # its configs own the knobs: a launch keyword would clash with them
    current = _current_knobs(module, kernels)
    direction = context.get("direction", "")
    proposals: list[tuple[str, int]] = []
    warps = current.get("num_warps", (_TRITON_DEFAULT_KNOBS["num_warps"], None))[0]
    for w in _WARPS:
        if w != warps and (direction != "fewer-warps" or w < warps) and (direction != "more-warps" or w > warps):
            proposals.append(("num_warps", w))
    stages = current.get("num_stages", (3, None))[0]
    warps_only = direction in ("fewer-warps", "more-warps")
    if not warps_only and ("loop" in context.get("features", "") or direction == "fewer-stages"
                           or "num_stages" in current):
        for s in _STAGES:
            if s != stages and (direction != "fewer-stages" or s < stages):
                proposals.append(("num_stages", s))
    # Block sizes that are equal move together (BLOCK_M = BLOCK_N = 64 -> 128): a grid written as
    # cdiv(m, 64), cdiv(n, 64) then stays consistent with every block it divides by.
    groups: dict[int, list[str]] = {}
    for key, (value, _) in current.items():
        if key.upper() == key and value >= 16 and value & (value - 1) == 0 and direction != "fewer-stages" \
                and not warps_only:
            groups.setdefault(value, []).append(key)
    for value, keys in groups.items():
        proposals += [("+".join(keys), value * 2), ("+".join(keys), value // 2)]
    # Nearest first: the search stays small and each variant is one step from the parent.
    def distance(kv: tuple[str, int]) -> float:
        first = kv[0].split("+")[0]
        return abs(_log2(kv[1]) - _log2(current.get(first, (4 if first == "num_warps" else 3,))[0]))

    proposals.sort(key=distance)  # nearest first: each variant one step from the parent
    variants = []
    for keys, value in proposals[:_MAX_VARIANTS]:
        new, done = module, False
        for key in keys.split("+"):
            old, param = current.get(key, (None, None))
            block = key not in ("num_warps", "num_stages")
            setter = _SetKnob(kernels, key, value, param, old if block else None)
            new = new.visit(setter)
            done = done or setter.done
        if done:
            variants.append(Variant({k: value for k in keys.split("+")}, new.code))
    return variants


# ------------------------------------------------------------------------------ dot tiles
# Hopper tile shapes for 16-bit tl.dot kernels, (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): the
# first six configurations Triton's matmul tutorial (03-matrix-multiplication) autotunes over on CUDA.
# Each sets every knob at once: one-knob steps from a 64x64x32 start need several rounds to get there.
_DOT_TILES = ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
              (64, 128, 32, 4, 4), (128, 32, 32, 4, 4))
# A dot kernel with an M x N tile and no K block (attention: K is the head dimension, a constexpr),
# (BLOCK_M, BLOCK_N, num_stages, num_warps): six points of the space Triton's fused-attention tutorial
# (06) autotunes over, BLOCK_M 64/128 x BLOCK_N 32/64/128 x stages x 4/8 warps, 8 warps only with
# 128 x 128 as its Hopper filter keeps. Two stages at 128 x 128 so a 128-wide head's K and V tiles fit.
_DOT_TILES_NO_K = ((128, 64, 3, 4), (128, 64, 4, 4), (128, 128, 2, 8), (128, 32, 3, 4), (64, 128, 3, 4),
                   (64, 32, 4, 4))
# What a launch that names neither knob gets from Triton on CUDA (the tile tables above are CUDA's too).
_TRITON_DEFAULT_KNOBS = {"num_warps": 4, "num_stages": 3}


class _AxisBlocks(cst.CSTVisitor):
    """In the jit kernels, the block size each program-id axis steps by: `pid_m = tl.program_id(0)` and
    `pid_m * BLOCK_M` (or `tl.program_id(0) * BLOCK_M`) make axis 0 BLOCK_M."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.axis_block: dict[int, str] = {}

    @staticmethod
    def _axis(node: cst.BaseExpression) -> int | None:
        if isinstance(node, cst.Call) and _dotted(node.func) == "tl.program_id" and node.args \
                and isinstance(node.args[0].value, cst.Integer):
            return int(node.args[0].value.value)
        return None

    def visit_Assign(self, node: cst.Assign) -> None:
        axis = self._axis(node.value)
        if axis is not None and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self.pids[node.targets[0].target.value] = axis

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Multiply):
            return
        for pid, block in ((node.left, node.right), (node.right, node.left)):
            axis = self.pids.get(pid.value) if isinstance(pid, cst.Name) else self._axis(pid)
            if axis is not None and isinstance(block, cst.Name) and block.value.isupper():
                self.axis_block.setdefault(axis, block.value)


class _LaunchGrids(cst.CSTVisitor):
    """Outside the kernels: the tuples that are launch grids (`kernel[(..)]`, or `grid = (..)` with
    `kernel[grid]`), and every `triton.cdiv(x, <literal>)` call, wherever it is."""

    def __init__(self, kernels: set[str]) -> None:
        self.kernels = kernels
        # (enclosing function, name): a `grid = (..)` counts only in the function that launches with it.
        self.grid_names: set[tuple[str, str]] = set()
        self.tuples: list[cst.Tuple] = []
        self.assigned: dict[tuple[str, str], list[cst.Tuple]] = {}
        self.literal_cdivs = 0
        self.launched: set[str] = set()  # the jit functions launched with a grid (not helpers they call)
        self.scopes: list[str] = [""]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value in self.kernels:
            return False
        self.scopes.append(node.name.value)
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if original_node.name.value not in self.kernels:
            self.scopes.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and isinstance(node.value, cst.Tuple):
            self.assigned.setdefault((self.scopes[-1], node.targets[0].target.value), []).append(node.value)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if _dotted(node.value) in self.kernels and len(node.slice) == 1:
            self.launched.add(_dotted(node.value))
            index = node.slice[0].slice
            if isinstance(index, cst.Index):
                if isinstance(index.value, cst.Name):
                    self.grid_names.add((self.scopes[-1], index.value.value))
                elif isinstance(index.value, cst.Tuple):
                    self.tuples.append(index.value)

    def visit_Call(self, node: cst.Call) -> None:
        if _cdiv_divisor(node) is not None:
            self.literal_cdivs += 1

    def grids(self) -> list[cst.Tuple]:
        return self.tuples + [t for key in self.grid_names for t in self.assigned.get(key, [])]


class _GridDivisors(cst.CSTTransformer):
    """In the launch grids only, `(triton.cdiv(m, 64), triton.cdiv(n, 64), ...)`: each axis's literal
    divisor becomes its block's new size, or an expression (`meta["BLOCK_M"]`, with `as_lambda` making
    the grid `lambda meta: (...)` for an autotuned kernel). `changed` counts the divisors set."""

    def __init__(self, grids: list[cst.Tuple], axis_value: dict[int, int | cst.BaseExpression],
                 as_lambda: bool = False) -> None:
        self.grids, self.axis_value, self.as_lambda = grids, axis_value, as_lambda
        self.changed = 0

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.BaseExpression:
        if not any(original is g for g in self.grids):
            return updated
        elements = list(updated.elements)
        for axis, element in enumerate(elements):
            if axis in self.axis_value and _cdiv_divisor(element.value) is not None:
                elements[axis] = element.with_changes(value=_with_divisor(element.value, self.axis_value[axis]))
                self.changed += 1
        if not self.as_lambda:
            return updated.with_changes(elements=elements)
        return cst.Lambda(params=cst.Parameters(params=[cst.Param(cst.Name("meta"))]),
                          body=updated.with_changes(elements=elements, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))


@dataclass
class _TilePlan:
    """What the tile search of a dot kernel needs: the module, its kernels and launch knobs, the
    block name of each axis (M, N and maybe K), the tile shapes to try, and the grid axes tied to a block."""
    module: cst.Module
    kernels: set[str]
    current: dict[str, tuple[int, str | None]]
    named: set[str]  # every keyword the launches pass, known value or not
    shapes: list[dict[str, int]]
    grids: _LaunchGrids
    axes: dict[int, str]  # grid axis -> the block name its program id steps by


def _tile_plan(source: str) -> _TilePlan | None:
    if "dot(" not in source:
        return None
    module = cst.parse_module(source)
    kernels = _jit_names(module)
    launched = _launch_knobs(module, kernels)
    current = _current_knobs(module, kernels, launched)
    names = {axis: next((k for k in current if k.startswith("BLOCK") and k.endswith(f"_{axis}")), None) for axis in "MNK"}
    if names["M"] is None or names["N"] is None:
        return None
    if names["K"] is None:
        del names["K"]
        shapes = [dict(zip((names["M"], names["N"], "num_stages", "num_warps"), t)) for t in _DOT_TILES_NO_K]
    else:
        shapes = [dict(zip((names["M"], names["N"], names["K"], "num_stages", "num_warps"), t)) for t in _DOT_TILES]
    blocks = _AxisBlocks()
    for node in module.body:
        if isinstance(node, cst.FunctionDef) and node.name.value in kernels:
            node.visit(blocks)
    found = _LaunchGrids(kernels)
    module.visit(found)
    axes = {a: b for a, b in blocks.axis_block.items() if b in names.values()}
    # Each grid must count its tile axes as `triton.cdiv(.., B)`: `(m + 63) // 64` would keep the old size.
    for grid in found.grids():
        if any(a < len(grid.elements) and _cdiv_divisor(grid.elements[a].value) is None for a in axes):
            return None
    return _TilePlan(module, kernels, current, launched.named, shapes, found, axes)


def dot_tile_configs(source: str, context: dict[str, Any]) -> list[Variant]:
    """For a kernel with `tl.dot` and BLOCK_M / BLOCK_N / BLOCK_K launch knobs (or BLOCK_M / BLOCK_N
    alone): the tile shapes above, every knob of one shape set together, and the grid's literal
    `triton.cdiv(.., B)` divisors moved with the block of their axis (found from the kernel's
    `tl.program_id(axis) * BLOCK`). [] when the kernel is not of that form or a grid divisor cannot be
    tied to a block."""
    plan = _tile_plan(source)
    if plan is None:
        return []
    variants = []
    for values in plan.shapes:
        grid = _GridDivisors(plan.grids.grids(), {a: values[b] for a, b in plan.axes.items()})
        new = plan.module.visit(grid)  # the grids first, while their nodes are the ones `found` saw
        # Every literal `triton.cdiv` outside the kernels must be a grid divisor of an axis whose block
        # is one of the tile's; one elsewhere (a tile count, a grouped 1-D grid) would keep the old size.
        if grid.changed != plan.grids.literal_cdivs:
            return []
        for key, value in values.items():
            new = new.visit(_SetKnob(plan.kernels, key, value, plan.current.get(key, (None, None))[1]))
        variants.append(Variant(values, new.code))
    return variants


class _PointerRoots(_InJit):
    """Kernel parameters written through tl.store and read through tl.load, and whether any atomic is
    issued: an autotuned kernel runs several times on the same buffers while it is tuned."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.atomics = False

    def visit_Call(self, node: cst.Call) -> None:
        if not self.depth or not node.args:
            return
        name = _dotted(node.func)
        root = node.args[0].value
        while isinstance(root, cst.BinaryOperation):
            root = root.left
        target = {"tl.load": self.loaded, "tl.store": self.stored}.get(name)
        if target is not None:
            # The root name of the pointer; one built elsewhere (`ptrs = x_ptr + offs`) is a local name,
            # which the caller's "only parameters" test rejects, as it does "?" for anything else.
            target.add(root.value if isinstance(root, cst.Name) else "?")
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in ("load", "store") \
                and not name.startswith("tl."):
            self.stored.add("?")  # a tensor descriptor or block pointer: what it reads and writes is unknown
        self.atomics = self.atomics or name.startswith("tl.atomic_")


class _Autotuned(cst.CSTTransformer):
    """The launch without the tile knobs, and the kernel under @triton.autotune over the tile shapes
    keyed on its size parameters (the grid is `_GridDivisors`' work)."""

    def __init__(self, kernels: set[str], kernel: str, knobs: list[str], decorator: cst.Decorator) -> None:
        self.kernels, self.kernel, self.knobs, self.decorator = kernels, kernel, knobs, decorator

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value == self.kernel:
            return updated.with_changes(decorators=[self.decorator, *updated.decorators])
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not (isinstance(original.func, cst.Subscript) and _dotted(original.func.value) in self.kernels):
            return updated
        args = [a for a in updated.args if a.keyword is None or a.keyword.value not in self.knobs]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)


def dot_tile_autotune(source: str, context: dict[str, Any]) -> list[Variant]:
    """The same tile shapes as `dot_tile_configs`, chosen per problem size by @triton.autotune on the
    one launched kernel, keyed on its parameters other than tensors, strides and the tile knobs (sizes,
    and constexprs such as a head dimension): one tile cannot suit 512^2 and 4096^2 at once. Only for
    kernels that neither issue atomics nor read a buffer they write, since tuning runs the kernel several
    times; [] where the tile search would give up, or the knobs are bound to wrapper parameters."""
    plan = _tile_plan(source)
    if plan is None or len(plan.grids.launched) != 1:
        return []
    knobs = list(plan.shapes[0])
    if any(plan.current.get(k, (None, None))[1] for k in knobs):
        return []
    name = next(iter(plan.grids.launched))
    kernel = next(n for n in plan.module.body if isinstance(n, cst.FunctionDef) and n.name.value == name)
    params = [p.name.value for p in kernel.params.params]
    roots = _PointerRoots()
    plan.module.visit(roots)
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
    own = {k: plan.current.get(k, (None if k in plan.named else _TRITON_DEFAULT_KNOBS.get(k), None))[0]
           for k in knobs}
    shapes = ([own] if None not in own.values() and own not in plan.shapes else []) + list(plan.shapes)
    configs = ",\n".join(
        "    triton.Config({" + ", ".join(f'"{b}": {shape[b]}' for b in blocks) + "}, "
        f"num_stages={shape['num_stages']}, num_warps={shape['num_warps']})" for shape in shapes)
    decorator = cst.Decorator(cst.parse_expression(f"triton.autotune(configs=[\n{configs},\n], key={key!r})"))
    grid = _GridDivisors(plan.grids.grids(), {a: cst.parse_expression(f'meta["{b}"]') for a, b in plan.axes.items()},
                         as_lambda=True)
    new = plan.module.visit(grid)  # the grids first, while their nodes are the ones the plan saw
    # As in the tile search: every literal `triton.cdiv` must be a grid divisor tied to a tile block.
    if grid.changed != plan.grids.literal_cdivs:
        return []
    new = new.visit(_Autotuned(plan.kernels, name, knobs, decorator))
    return [Variant({"autotune": [dict(s) for s in shapes], "key": key}, new.code)]


def _log2(v: int) -> float:
    import math

    return math.log2(max(v, 1))


# ------------------------------------------------------------------------------ loop pipelining
class _Pipeline(_InJit):
    def __init__(self, stages: int) -> None:
        super().__init__()
        self.stages = stages

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        if not self.depth or not isinstance(updated.iter, cst.Call):
            return updated
        name = _dotted(updated.iter.func)
        calls = {_dotted(c.func).split(".")[-1] for c in m.findall(original.body, m.Call())}  # type: ignore[union-attr]
        if "load" not in calls or "dot" in calls or name not in ("range", "tl.range"):
            return updated
        args = list(updated.iter.args)
        if any(a.keyword is not None and a.keyword.value == "num_stages" for a in args):
            return updated
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = args[-1].with_changes(comma=comma)
        args.append(cst.Arg(keyword=cst.Name("num_stages"), value=cst.Integer(str(self.stages)),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.changed += 1
        func = cst.Attribute(value=cst.Name("tl"), attr=cst.Name("range"))
        return updated.with_changes(iter=updated.iter.with_changes(func=func, args=args))


def tl_range_pipelining(source: str, context: dict[str, Any]) -> list[Variant]:
    out = []
    for stages in (3, 2, 4):
        t = _Pipeline(stages)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"num_stages": stages, "loops": t.changed}, new.code))
    return out


# ------------------------------------------------------------------------------ keyword rewrites
class _DotPrecision(_InJit):
    def __init__(self, precision: str) -> None:
        super().__init__()
        self.precision = precision

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.depth or _dotted(updated.func) != "tl.dot":
            return updated
        args = []
        for arg in updated.args:
            if arg.keyword is not None and arg.keyword.value == "input_precision" and m.matches(
                    arg.value, m.SimpleString('"ieee"') | m.SimpleString("'ieee'")):
                arg = arg.with_changes(value=cst.SimpleString(f'"{self.precision}"'))
                self.changed += 1
            elif arg.keyword is not None and arg.keyword.value == "allow_tf32" and m.matches(arg.value, m.Name("False")):
                arg = arg.with_changes(keyword=cst.Name("input_precision"),
                                       value=cst.SimpleString(f'"{self.precision}"'))
                self.changed += 1
            args.append(arg)
        return updated.with_changes(args=args)


def dot_input_precision(source: str, context: dict[str, Any]) -> list[Variant]:
    # tf32 keeps 10 mantissa bits (about 1e-3 relative); tf32x3 recovers about fp32 accuracy.
    rtol = float(context.get("fp32_rtol", 1e-4))
    out = []
    for precision in (("tf32", "tf32x3") if rtol >= 1e-3 else ("tf32x3",)):
        t = _DotPrecision(precision)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"input_precision": precision}, new.code))
    return out


class _DropInt64(_InJit):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if (self.depth and isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "to"
                and len(updated.args) == 1 and _dotted(updated.args[0].value) in ("tl.int64", "tl.uint64")):
            self.changed += 1
            return updated.func.value
        return updated


class _RelaxAtomics(_InJit):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        name = _dotted(updated.func)
        if not self.depth or not name.startswith("tl.atomic_") or name == "tl.atomic_cas":
            return updated
        if any(a.keyword is not None and a.keyword.value == "sem" for a in updated.args):
            return updated
        args = list(updated.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(keyword=cst.Name("sem"), value=cst.SimpleString('"relaxed"'),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.changed += 1
        return updated.with_changes(args=args)


class _Exp2(_InJit):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.depth or _dotted(updated.func) != "tl.exp" or len(updated.args) != 1:
            return updated
        self.changed += 1
        scaled = cst.BinaryOperation(left=cst.ensure_type(updated.args[0].value, cst.BaseExpression),
                                     operator=cst.Multiply(), right=cst.Float(_LOG2E))
        if isinstance(updated.args[0].value, cst.BinaryOperation):
            scaled = scaled.with_changes(left=updated.args[0].value.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        return updated.with_changes(func=cst.Attribute(value=cst.Name("tl"), attr=cst.Name("exp2")),
                                    args=[cst.Arg(scaled)])


# ------------------------------------------------------------------------------ masked tail split
class _DropMask(cst.CSTTransformer):
    """Removes `mask=M` (and the `other=` that only matters under it) from tl.load / tl.store."""

    def __init__(self, mask: str) -> None:
        self.mask = mask
        self.changed = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if _dotted(updated.func) not in ("tl.load", "tl.store"):
            return updated
        if not any(a.keyword is not None and a.keyword.value == "mask" and m.matches(a.value, m.Name(self.mask))
                   for a in updated.args):
            return updated
        args = [a for a in updated.args if a.keyword is None or a.keyword.value not in ("mask", "other")]
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        self.changed += 1
        return updated.with_changes(args=args)


class _TailSplit(cst.CSTTransformer):
    """In a 1-D kernel written as `offs = START + tl.arange(0, BLOCK)`, `mask = offs < N`, the statements
    after the mask run twice: unmasked when the whole block is in bounds (`START + BLOCK <= N`, a
    scalar branch), as written otherwise."""

    def __init__(self) -> None:
        self.changed = 0

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if not _is_jit(original) or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        starts: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        for i, stmt in enumerate(body):
            assign = _simple_assign(stmt)
            if assign is None:
                continue
            target, value = assign
            split = _start_plus_arange(value)
            if split is not None:
                starts[target] = split
                continue
            if (isinstance(value, cst.Comparison) and isinstance(value.left, cst.Name) and value.left.value in starts
                    and len(value.comparisons) == 1 and isinstance(value.comparisons[0].operator, cst.LessThan)):
                start, block = starts[value.left.value]
                bound = value.comparisons[0].comparator
                rest = body[i + 1:]
                dropper = _DropMask(target)
                fast = [st.visit(dropper) for st in rest]
                if not dropper.changed:
                    return updated
                cond = cst.Comparison(
                    left=cst.BinaryOperation(left=start, operator=cst.Add(), right=block),
                    comparisons=[cst.ComparisonTarget(cst.LessThanEqual(), bound)])
                branch = cst.If(test=cond, body=cst.IndentedBlock(body=fast),
                                orelse=cst.Else(body=cst.IndentedBlock(body=rest)),
                                leading_lines=[cst.EmptyLine(comment=cst.Comment(
                                    "# full blocks: no mask, so loads and stores keep their vector width"))])
                self.changed += 1
                return updated.with_changes(body=updated.body.with_changes(body=[*body[:i + 1], branch]))
        return updated


def _simple_assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
            and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None


def _start_plus_arange(value: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(START, BLOCK) of `START + tl.arange(0, BLOCK)` (either order)."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return None
    for arange, start in ((value.right, value.left), (value.left, value.right)):
        if (isinstance(arange, cst.Call) and _dotted(arange.func) == "tl.arange" and len(arange.args) == 2
                and m.matches(arange.args[0].value, m.Integer("0"))):
            start = start.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
                if isinstance(start, cst.BinaryOperation) else start
            return start, arange.args[1].value
    return None


def masked_tail_split(source: str, context: dict[str, Any]) -> list[Variant]:
    t = _TailSplit()
    new = cst.parse_module(source).visit(t)
    return [Variant({"tail_split": t.changed}, new.code)] if t.changed else []


# ------------------------------------------------------------------------------ divisibility hints
class _OffsetHints(_InJit):
    """`offs = pid * BLOCK + tl.arange(0, BLOCK)` -> the same wrapped in tl.multiple_of / tl.max_contiguous.

    Only this form is rewritten: its start is a multiple of BLOCK and its BLOCK values are
    contiguous by construction, so the hint is true for every launch. Hints on runtime strides or
    sizes could be false (a silent miscompile) and are left to a person or the LLM."""

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        split = _start_plus_arange(updated.value) if self.depth else None
        if split is None:
            return updated
        start, block = split
        inner = start.with_changes(lpar=[], rpar=[]) if isinstance(start, cst.BinaryOperation) else start
        if not (isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Multiply)
                and (inner.right.deep_equals(block) or inner.left.deep_equals(block))):
            return updated
        tl_call = lambda name, *args: cst.Call(cst.Attribute(cst.Name("tl"), cst.Name(name)),  # noqa: E731
                                               [cst.Arg(a) for a in args])
        self.changed += 1
        return updated.with_changes(value=tl_call("max_contiguous", tl_call("multiple_of", updated.value, block), block))


def divisibility_hints(source: str, context: dict[str, Any]) -> list[Variant]:
    t = _OffsetHints()
    new = cst.parse_module(source).visit(t)
    return [Variant({"hints": t.changed}, new.code)] if t.changed else []


# ------------------------------------------------------------------------------ persistent launch
class _ProgramIdToTile(cst.CSTTransformer):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if _dotted(updated.func) == "tl.program_id" and len(updated.args) == 1 and m.matches(
                updated.args[0].value, m.Integer("0")):
            return cst.Name("tile")
        return updated


class _Persistent(cst.CSTTransformer):
    """A kernel launched on a 1-D grid `(G,)` becomes a loop over its G tiles, `tl.num_programs(0)`
    apart, launched on at most `PROGRAMS_PER_SM` programs per SM: one wave, no tail, no relaunch."""

    def __init__(self, per_sm: int) -> None:
        self.per_sm = per_sm
        self.kernel: str | None = None
        self.changed = 0

    def visit_Module(self, node: cst.Module) -> None:
        # The kernel to convert: launched on a literal 1-tuple grid, using only program_id(0).
        jit = _jit_names(node)
        for call in m.findall(node, m.Call(func=m.Subscript())):
            name = _dotted(call.func.value)  # type: ignore[union-attr]
            index = call.func.slice[0].slice if len(call.func.slice) == 1 else None  # type: ignore[union-attr]
            if name in jit and isinstance(index, cst.Index) and isinstance(index.value, cst.Tuple) \
                    and len(index.value.elements) == 1:
                self.kernel = name
                return

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if self.kernel is None:
            return updated
        if _is_jit(original) and original.name.value == self.kernel:
            if m.findall(original, m.Call(func=m.Attribute(attr=m.Name("program_id")),
                                          args=[m.Arg(value=~m.Integer("0"))])) or m.findall(original, m.Return()):
                self.kernel = None  # a 2-D or early-returning kernel: not this rewrite
                return updated
            body = [st.visit(_ProgramIdToTile()) for st in updated.body.body]
            loop = cst.For(target=cst.Name("tile"), iter=cst.parse_expression(
                "tl.range(tl.program_id(0), n_tiles, tl.num_programs(0))"), body=cst.IndentedBlock(body=body),
                leading_lines=[cst.EmptyLine(comment=cst.Comment(
                    "# persistent: each program walks the tiles num_programs apart"))])
            params = updated.params.with_changes(params=[*updated.params.params, cst.Param(cst.Name("n_tiles"))])
            self.changed += 1
            return updated.with_changes(params=params, body=updated.body.with_changes(body=[loop]))
        return updated.with_changes(body=updated.body.visit(_PersistentLaunch(self.kernel, self.per_sm)))


class _PersistentLaunch(cst.CSTTransformer):
    def __init__(self, kernel: str, per_sm: int) -> None:
        self.kernel, self.per_sm = kernel, per_sm

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        calls = m.findall(updated, m.Call(func=m.Subscript(value=m.Name(self.kernel))))
        if not calls:
            return updated
        call = calls[0]
        grid = call.func.slice[0].slice.value.elements[0].value  # type: ignore[union-attr]
        tiles = cst.parse_statement("n_tiles = 0").with_changes(
            body=[cst.Assign([cst.AssignTarget(cst.Name("n_tiles"))], grid)])
        sms = cst.parse_statement(
            "sm_count = (torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count\n"
            "            if torch.cuda.is_available() else n_tiles)\n")
        programs = cst.parse_expression(f"(min(n_tiles, {self.per_sm} * sm_count),)")
        new_call = call.with_changes(
            func=call.func.with_changes(slice=[cst.SubscriptElement(cst.Index(programs))]),  # type: ignore[union-attr]
            args=[*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                  cst.Arg(keyword=cst.Name("n_tiles"), value=cst.Name("n_tiles"),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])
        return cst.FlattenSentinel([tiles, sms, updated.deep_replace(call, new_call)])


def persistent_launch(source: str, context: dict[str, Any]) -> list[Variant]:
    out = []
    for per_sm in (1, 2, 4):
        t = _Persistent(per_sm)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"programs_per_sm": per_sm}, new.code))
    return out


# ------------------------------------------------------------------------------ tensor descriptors (TMA)
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
        if not self.loop or _dotted(updated.func) != "tl.load" or not updated.args or updated.args[0].keyword:
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
                term, stride = term.left, term.right
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
                  *[cst.Arg(cst.List([cst.Element(e) for e in vals]), keyword=cst.Name(k),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
                    for k, vals in (("shape", [bounds[axes[0][0]], bounds[axes[1][0]]]), ("strides", strides),
                                    ("block_shape", [axes[0][1][1], axes[1][1][1]]))]])
        self.descriptors.setdefault(base, cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], make)]))
        self.strides[base] = tuple(self.module.code_for_node(x) if isinstance(x, cst.Name) else None for x in strides)
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
    out = {}
    for stmt in fn.body.body:
        assign = _simple_assign(stmt)
        if assign is None:
            continue
        name, value = assign
        if isinstance(value, cst.Call) and _dotted(value.func) == "tl.arange" and len(value.args) == 2 \
                and m.matches(value.args[0].value, m.Integer("0")):
            out[name] = (cst.Integer("0"), value.args[1].value)
        elif (split := _start_plus_arange(value)) is not None:
            out[name] = split
    return out


def tensor_descriptors(source: str, context: dict[str, Any]) -> list[Variant]:
    """A `<kernel>_tma` copy of the kernel whose loop loads go through descriptors, and a wrapper that
    takes it only where TMA's rules hold (16-byte aligned bases and row strides, unit last stride, sm90+)
    and keeps the original kernel for every other launch."""
    module = cst.parse_module(source)
    body = list(module.body)
    for i, fn in enumerate(body):
        if not (isinstance(fn, cst.FunctionDef) and _is_jit(fn) and m.findall(fn, m.Call(func=m.Attribute(
                value=m.Name("tl"), attr=m.Name("dot"))))):
            continue
        loads = _TmaLoads(module, _kernel_ranges(fn))
        new_body = []
        for stmt in fn.body.body:
            rewritten = stmt.visit(loads)
            if isinstance(stmt, cst.For) and loads.descriptors:
                new_body += [d for d in loads.descriptors.values() if d not in new_body]
            new_body.append(rewritten)
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
        bound = {p: a.value for p, a in zip(self.params, [a for a in call.args if a.keyword is None])}
        bound.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
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
        tma_call = updated.deep_replace(call, call.with_changes(func=call.func.with_changes(  # type: ignore[union-attr]
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


def _one(transformer: Callable[[], _InJit], params: dict[str, Any]) -> Rewriter:
    def rewriter(source: str, context: dict[str, Any]) -> list[Variant]:
        t = transformer()
        new = cst.parse_module(source).visit(t)
        return [Variant({**params, "sites": t.changed}, new.code)] if t.changed else []
    return rewriter


REWRITERS: dict[str, Rewriter] = {
    "block-size-num-warps": launch_config,
    # A dot kernel's search starts from whole tile shapes; anything else steps one knob at a time.
    "autotune-configs": lambda s, c: dot_tile_configs(s, c) + dot_tile_autotune(s, c) or launch_config(s, c),
    "wgmma-friendly-tiles": dot_tile_configs,
    "warp-local-reduction": lambda s, c: launch_config(s, {**c, "direction": "fewer-warps"}),
    "reduce-register-pressure": lambda s, c: launch_config(s, {**c, "direction": "more-warps"}),
    "num-stages": lambda s, c: launch_config(s, {**c, "direction": "fewer-stages" if "shared-memory" in
                                                 c.get("finding", "") else ""}),
    "tl-range-pipelining": tl_range_pipelining,
    "masked-tail-split": masked_tail_split,
    "divisibility-hints": divisibility_hints,
    "persistent-kernel": persistent_launch,
    "tensor-descriptors-tma": tensor_descriptors,
    "dot-input-precision-tf32": dot_input_precision,
    "int32-offsets": _one(_DropInt64, {"cast": "removed int64"}),
    "relaxed-atomics": _one(_RelaxAtomics, {"sem": "relaxed"}),
    "exp2-fast-math": _one(_Exp2, {"exp": "exp2"}),
}


def rewrite(pattern_id: str, source: str, context: dict[str, Any]) -> list[Variant]:
    """Variants of `source` under the pattern's rewrite; [] when it has no rewriter or does not apply."""
    rewriter = REWRITERS.get(pattern_id)
    if rewriter is None:
        return []
    return [v for v in rewriter(source, context) if v.source != source]
