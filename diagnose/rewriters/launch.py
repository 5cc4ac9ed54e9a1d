"""Launch configuration: a small search over num_warps and num_stages, one knob per variant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.base import (
    TRITON_DEFAULT_KNOBS,
    Variant,
    dotted,
    jit_functions,
    launch_arguments,
    launch_grid_node,
    register,
)
from diagnose.rewriters.blocks import names_in, reaching_literal
from diagnose.rewriters.configs import autotuned_kernels, widen_autotune_configs
from diagnose.rewriters.resizing import kernels_resizing

_MAX_VARIANTS = 6


_STAGES = (1, 2, 3, 4, 5)


_WARPS = (1, 2, 4, 8, 16)



def log2(v: int) -> float:
    import math

    return math.log2(max(v, 1))


@dataclass(frozen=True)
class Knob:
    """A launch knob's integer value and where it is written: at the launch itself (a keyword, or a
    position bound to a constexpr parameter), as the default of the wrapper parameter `param` the launch
    passes, or as the literal that `local`, a name the launching function (or the module) assigns once,
    is bound to. A rewrite changes it where it is written, so whatever else reads that name (the grid,
    a second launch) changes with it."""

    value: int
    param: str | None = None
    local: str | None = None
    scope: str = ""  # with `local`: the function that assigns it ("" for the module)


def _is_block_name(name: str) -> bool:
    """A constexpr that is a tile size, not a problem size: only such names are read from positions and
    local names (a positional `N: tl.constexpr` of 4096 is a size, and sizes are never searched)."""
    return any(word in name.upper() for word in ("BLOCK", "TILE", "GROUP"))


class _LaunchKnobs(cst.CSTVisitor):
    """Integer launch keywords of `kernel[grid](...)` calls, and the wrapper defaults and local literals
    they are bound to."""

    def __init__(self, kernels: dict[str, cst.FunctionDef], parents: Mapping[cst.CSTNode, cst.CSTNode]) -> None:
        self.kernels, self.parents = kernels, parents
        self.literal: dict[str, int] = {}  # knob -> value written at the launch (keyword or position)
        self.bound: dict[str, str] = {}  # keyword -> wrapper parameter name it is passed from
        self.defaults: dict[str, int] = {}  # wrapper parameter -> its integer default
        self.locals: dict[str, Knob] = {}  # knob -> the name it is passed as, bound to a literal where the launch runs
        self.named: set[str] = set()  # every keyword a launch passes, whatever its value
        self.positional: set[str] = set()  # the knobs a launch passes by position

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for p in node.params.params:
            if p.default is not None and isinstance(p.default, cst.Integer):
                self.defaults[p.name.value] = int(p.default.value)

    def visit_Call(self, node: cst.Call) -> None:
        if not (isinstance(node.func, cst.Subscript) and dotted(node.func.value) in self.kernels):
            return
        kernel = self.kernels[dotted(node.func.value)]
        constexprs = {p.name.value for p in kernel.params.params if p.annotation is not None
                      and dotted(p.annotation.annotation).endswith("constexpr")}
        for key, arg in launch_arguments(kernel, node).items():
            keyword = arg.keyword is not None
            if keyword:
                self.named.add(key)
            elif key not in constexprs:
                continue
            else:
                self.positional.add(key)
            if isinstance(arg.value, cst.Integer) and (keyword or _is_block_name(key)):
                self.literal[key] = int(arg.value.value)
            elif isinstance(arg.value, cst.Name) and keyword and arg.value.value in self.defaults:
                self.bound[key] = arg.value.value
            elif isinstance(arg.value, cst.Name) and (keyword or _is_block_name(key)) \
                    and (reaching := reaching_literal(arg.value.value, node, self.parents)) is not None:
                value, owner = reaching
                self.locals[key] = Knob(value, local=arg.value.value, scope=owner.name.value if owner else "")


class SetKnob(cst.CSTTransformer):
    """Sets one launch knob where it is written (`Knob`). A block size written twice, as the keyword
    and as the divisor of the wrapper's `triton.cdiv(n, 64)` grid, changes in both places, so the grid
    still covers the data."""

    def __init__(self, kernels: set[str], key: str, value: int, knob: Knob | None, old: int | None = None,
                 grids: set[int] | None = None) -> None:
        self.kernels, self.key, self.value, self.old = kernels, key, value, old
        # ids of the grids (as written) of the launches passing the knob: only there is a `triton.cdiv(n, 64)`
        # this knob's divisor; another kernel's grid may divide by 64 for a block of its own
        self.grids = grids
        self.inside = 0
        self.knob = knob or Knob(0)  # none read: written at the launch, if anywhere
        self.functions: list[str] = []
        # each kernel's definition: a keyword a launch lacks is added only where the kernel takes it (a
        # module with a second kernel, a split's cast, must not get the first one's BLOCK_M)
        self.definitions: dict[str, cst.FunctionDef] = {}
        self.done = False

    def visit_Module(self, node: cst.Module) -> None:
        self.definitions = jit_functions(node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.grids is not None and id(node) in self.grids:
            self.inside += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        if self.grids is not None and id(original_node) in self.grids:
            self.inside -= 1
        return super().on_leave(original_node, updated_node)

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if self.knob.param and original.name.value == self.knob.param and isinstance(original.default, cst.Integer):
            self.done = True
            return updated.with_changes(default=cst.Integer(str(self.value)))
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node.name.value)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        # Every `NAME = <old value>` of the function that binds the launch's: a wrapper's two branches
        # that each set the same block for their own launch move together.
        knob = self.knob
        if knob.local and (self.functions[-1] if self.functions else "") == knob.scope and m.matches(
                updated, m.Assign(targets=[m.AssignTarget(target=m.Name(knob.local))], value=m.Integer(str(knob.value)))):
            self.done = True
            return updated.with_changes(value=cst.Integer(str(self.value)))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        bound = self.knob.param or self.knob.local  # written at a name, not at the launch
        if self.old is not None and not self.knob.param and cdiv_divisor(updated) == self.old \
                and (self.grids is None or self.inside):
            return with_divisor(updated, self.value)
        if not (isinstance(original.func, cst.Subscript) and dotted(original.func.value) in self.kernels):
            return updated
        kernel = self.definitions.get(dotted(original.func.value))
        arg = launch_arguments(kernel, updated).get(self.key)
        if arg is not None:
            if not isinstance(arg.value, cst.Integer) and (bound or self.key not in LAUNCH_OPTIONS):
                # A name bound where the reader found it changes there; a block from an expression it could not
                # read stays, since the grid may compute with the same expression. Warps and stages size nothing
                # else, so a heuristic's value (`num_warps=nw`) gives way to the literal.
                return updated
            self.done = True
            return updated.with_changes(args=[a.with_changes(value=cst.Integer(str(self.value))) if a is arg else a
                                              for a in updated.args])
        if bound or self.key not in LAUNCH_OPTIONS \
                and (kernel is None or self.key not in {p.name.value for p in kernel.params.params}):
            return updated
        args = list(updated.args)
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        if args:
            args[-1] = args[-1].with_changes(comma=comma)
        args.append(cst.Arg(keyword=cst.Name(self.key), value=cst.Integer(str(self.value)),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.done = True
        return updated.with_changes(args=args)


def jit_names(module: cst.Module) -> set[str]:
    return set(jit_functions(module))


# Keywords Triton's launch takes for every kernel, parameters or not.
LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "warp_specialize"})


def launch_knobs(module: cst.Module, kernels: set[str], parents: Mapping[cst.CSTNode, cst.CSTNode] | None = None
                 ) -> _LaunchKnobs:
    """The module's launches read; `parents`: its ParentNodeProvider metadata where the caller has it."""
    parents = parents or MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    knobs = _LaunchKnobs({name: fn for name, fn in jit_functions(module).items() if name in kernels}, parents)
    module.visit(knobs)
    return knobs


def current_knobs(module: cst.Module, kernels: set[str], knobs: _LaunchKnobs | None = None) -> dict[str, Knob]:
    """Launch knob -> its value and where it is written. `knobs`: the module's launches when the caller
    has visited them already."""
    knobs = knobs or launch_knobs(module, kernels)
    current = {k: Knob(v) for k, v in knobs.literal.items()}
    current.update(knobs.locals)
    current.update({key: Knob(knobs.defaults[param], param=param) for key, param in knobs.bound.items()
                    if param in knobs.defaults})
    return current


def cdiv_divisor(node: cst.CSTNode) -> int | None:
    """B of `triton.cdiv(x, B)` written as an integer literal, else None."""
    if (isinstance(node, cst.Call) and dotted(node.func) == "triton.cdiv" and len(node.args) == 2
            and isinstance(node.args[1].value, cst.Integer)):
        return int(node.args[1].value.value)
    return None


def with_divisor(call: cst.Call, value: int | cst.BaseExpression) -> cst.Call:
    divisor = cst.Integer(str(value)) if isinstance(value, int) else value
    return call.with_changes(args=[call.args[0], call.args[1].with_changes(value=divisor)])


def _knob_grids(module: cst.Module, kernels: set[str], key: str) -> list[cst.BaseExpression | None]:
    """The grid, as written, of each launch of `kernels` that passes `key` (None: one not found)."""
    definitions = jit_functions(module)
    launches = [cst.ensure_type(node, cst.Call) for node in m.findall(module, m.Call(func=m.Subscript()))]
    return [launch_grid_node(module, call) for call in launches
            if (kernel := dotted(cst.ensure_type(call.func, cst.Subscript).value)) in kernels
            and key in launch_arguments(definitions.get(kernel), call)]


def _grid_follows(grid: cst.BaseExpression | None, key: str, knob: Knob | None) -> bool:
    """Whether a grid changes with the knob: it reads the name the knob is written at, `meta['KEY']`, or
    divides by the knob's literal (`triton.cdiv(n, 64)`, which the setter rewrites with it)."""
    if grid is None:
        return False
    if knob is not None and (knob.local or knob.param) in names_in(grid):
        return True
    if any(cst.ensure_type(s, cst.SimpleString).evaluated_value == key for s in m.findall(grid, m.SimpleString())):
        return True
    return knob is not None and any(cdiv_divisor(c) == knob.value for c in m.findall(grid, m.Call()))


def _as_launched(context: dict[str, Any], kernels: set[str]) -> dict[str, int]:
    """The launch options the diagnosis intercepted (`context["launched"]`: kernel -> {num_warps,
    num_stages}) that every launched kernel of the module shares: where the source computes a knob
    (Liger's `BLOCK_SIZE, num_warps = calculate_settings(n)`), the search steps from its real value."""
    seen = [knobs for kernel, knobs in (context.get("launched") or {}).items() if kernel in kernels]
    return {key: seen[0][key] for key in TRITON_DEFAULT_KNOBS
            if seen and all(key in k and k[key] == seen[0][key] for k in seen)}


def launch_config(source: str, context: dict[str, Any]) -> list[Variant]:
    """One knob per variant: num_warps, num_stages (for loops), and power-of-two block sizes halved or
    doubled where the kernel lets them (`resizing.block_resizing`), stepping from the value the source
    writes, else the launch's own (`_as_launched`), else Triton's default. `context["direction"]`: "fewer-warps", "more-warps", "fewer-stages", or "" (both
    ways)."""
    module = cst.parse_module(source)
    kernels = jit_names(module)
    if autotuned_kernels(module):
        # its configs own the knobs: a launch keyword would clash with them, so the list itself grows
        return widen_autotune_configs(source, context)
    current = current_knobs(module, kernels)
    start = {**TRITON_DEFAULT_KNOBS, **_as_launched(context, kernels),
             **{key: current[key].value for key in TRITON_DEFAULT_KNOBS if key in current}}
    direction = context.get("direction", "")
    proposals: list[tuple[str, int]] = []
    warps = start["num_warps"]
    # a launch already at 16 warps (a whole 16K-wide row per program) may take 32, Triton's most
    for w in (*_WARPS, 32) if warps >= 16 else _WARPS:
        if w != warps and (direction != "fewer-warps" or w < warps) and (direction != "more-warps" or w > warps):
            proposals.append(("num_warps", w))
    stages = start["num_stages"]
    warps_only = direction in ("fewer-warps", "more-warps")
    if not warps_only and ("loop" in context.get("features", "") or direction == "fewer-stages"
                           or "num_stages" in current):
        for s in _STAGES:
            if s != stages and (direction != "fewer-stages" or s < stages):
                proposals.append(("num_stages", s))
    # Block sizes that are equal move together (BLOCK_M = BLOCK_N = 64 -> 128): a grid written as
    # cdiv(m, 64), cdiv(n, 64) then stays consistent with every block it divides by.
    groups: dict[int, list[str]] = {}
    for key, knob in current.items():
        value = knob.value
        if key.upper() == key and value >= 16 and value & (value - 1) == 0 and direction != "fewer-stages" \
                and not warps_only:
            groups.setdefault(value, []).append(key)
    jit = jit_functions(module)
    resizing = {key: kernels_resizing(jit, kernels, key) for keys in groups.values() for key in keys}
    for value, keys in groups.items():
        if all(resizing[k].grow for k in keys):
            proposals.append(("+".join(keys), value * 2))
        if all(resizing[k].shrink and (not resizing[k].axis or all(
                _grid_follows(g, k, current.get(k)) for g in _knob_grids(module, kernels, k))) for k in keys):
            proposals.append(("+".join(keys), value // 2))  # a program axis's block: where the grid follows it
    # Nearest first: the search stays small and each variant is one step from the parent.
    def distance(kv: tuple[str, int]) -> float:
        first = kv[0].split("+")[0]
        now = current[first].value if first in current else start.get(first, 3)
        return abs(log2(kv[1]) - log2(now))

    proposals.sort(key=distance)  # nearest first: each variant one step from the parent
    variants = []
    for joined, value in proposals[:_MAX_VARIANTS]:
        new, done = module, False
        for key in joined.split("+"):
            was = current.get(key)
            block = key not in ("num_warps", "num_stages")
            grids = {id(g) for g in _knob_grids(new, kernels, key) if g is not None}
            setter = SetKnob(kernels, key, value, was, was.value if was and block else None, grids)
            new = new.visit(setter)
            done = done or setter.done
        if done:
            variants.append(Variant({k: value for k in joined.split("+")}, new.code))
    return variants


register("block-size-num-warps")(launch_config)
register("warp-local-reduction")(lambda s, c: launch_config(s, {**c, "direction": "fewer-warps"}))
register("reduce-register-pressure")(lambda s, c: launch_config(s, {**c, "direction": "more-warps"}))
register("num-stages")(lambda s, c: launch_config(s, {**c, "direction": "fewer-stages" if "shared-memory" in
                                                          c.get("finding", "") else ""}))
