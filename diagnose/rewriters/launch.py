"""Launch configuration: a small search over num_warps and num_stages, one knob per variant."""

from __future__ import annotations

from typing import Any

import libcst as cst

from diagnose.rewriters.base import TRITON_DEFAULT_KNOBS, Variant, dotted, jit_functions, register
from diagnose.rewriters.configs import autotuned_kernels, widen_autotune_configs

_MAX_VARIANTS = 6


_STAGES = (1, 2, 3, 4, 5)


_WARPS = (1, 2, 4, 8, 16)



def log2(v: int) -> float:
    import math

    return math.log2(max(v, 1))


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
        if isinstance(node.func, cst.Subscript) and dotted(node.func.value) in self.kernels:
            for arg in node.args:
                if arg.keyword is None:
                    continue
                key = arg.keyword.value
                self.named.add(key)
                if isinstance(arg.value, cst.Integer):
                    self.literal[key] = int(arg.value.value)
                elif isinstance(arg.value, cst.Name):
                    self.bound[key] = arg.value.value


class SetKnob(cst.CSTTransformer):
    """Sets one launch keyword. A block size written twice, as the keyword and as the divisor of the
    wrapper's `triton.cdiv(n, 64)` grid, changes in both places, so the grid still covers the data."""

    def __init__(self, kernels: set[str], key: str, value: int, param: str | None, old: int | None = None) -> None:
        self.kernels, self.key, self.value, self.param, self.old = kernels, key, value, param, old
        # each kernel's parameters: a keyword a launch lacks is added only where the kernel takes it (a
        # module with a second kernel, a split's cast, must not get the first one's BLOCK_M)
        self.parameters: dict[str, set[str]] = {}
        self.done = False

    def visit_Module(self, node: cst.Module) -> None:
        self.parameters = kernel_parameters(node)


    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if self.param and original.name.value == self.param and isinstance(original.default, cst.Integer):
            self.done = True
            return updated.with_changes(default=cst.Integer(str(self.value)))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.old is not None and not self.param and cdiv_divisor(updated) == self.old:
            return with_divisor(updated, self.value)
        if self.param or not (isinstance(original.func, cst.Subscript) and dotted(original.func.value) in self.kernels):
            return updated
        args = list(updated.args)
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == self.key:
                args[i] = arg.with_changes(value=cst.Integer(str(self.value)))
                break
        else:
            kernel = dotted(original.func.value)
            if self.key not in LAUNCH_OPTIONS and self.key not in self.parameters.get(kernel, set()):
                return updated
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


def kernel_parameters(module: cst.Module) -> dict[str, set[str]]:
    return {name: {p.name.value for p in fn.params.params} for name, fn in jit_functions(module).items()}


def launch_knobs(module: cst.Module, kernels: set[str]) -> _LaunchKnobs:
    knobs = _LaunchKnobs(kernels)
    module.visit(knobs)
    return knobs


def current_knobs(module: cst.Module, kernels: set[str], knobs: _LaunchKnobs | None = None
                   ) -> dict[str, tuple[int, str | None]]:
    """Launch keyword -> (its value, the wrapper parameter it is bound to or None when written at the launch).
    `knobs`: the module's launch keywords when the caller has visited them already."""
    knobs = knobs or launch_knobs(module, kernels)
    current: dict[str, tuple[int, str | None]] = {k: (v, None) for k, v in knobs.literal.items()}
    for key, param in knobs.bound.items():
        if param in knobs.defaults:
            current[key] = (knobs.defaults[param], param)
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


def launch_config(source: str, context: dict[str, Any]) -> list[Variant]:
    """One knob per variant: num_warps, num_stages (for loops), and power-of-two block sizes halved or
    doubled. `context["direction"]`: "fewer-warps", "more-warps", "fewer-stages", or "" (both ways)."""
    module = cst.parse_module(source)
    kernels = jit_names(module)
    if autotuned_kernels(module):
        # its configs own the knobs: a launch keyword would clash with them, so the list itself grows
        return widen_autotune_configs(source, context)
    current = current_knobs(module, kernels)
    direction = context.get("direction", "")
    proposals: list[tuple[str, int]] = []
    warps = current.get("num_warps", (TRITON_DEFAULT_KNOBS["num_warps"], None))[0]
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
        return abs(log2(kv[1]) - log2(current.get(first, (4 if first == "num_warps" else 3,))[0]))

    proposals.sort(key=distance)  # nearest first: each variant one step from the parent
    variants = []
    for joined, value in proposals[:_MAX_VARIANTS]:
        new, done = module, False
        for key in joined.split("+"):
            old, param = current.get(key, (None, None))
            block = key not in ("num_warps", "num_stages")
            setter = SetKnob(kernels, key, value, param, old if block else None)
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
