"""An autotuned kernel's own config list, widened: the configs it has stay, Hopper points are added.

A kernel under `@triton.autotune(configs=..., key=...)` owns its launch knobs: a launch keyword would
clash with the configs, so the one-knob search has nothing to set. Often the list was written for
another GPU (A100 tiles, 4 warps everywhere), or comes from a helper (`configs=get_configs()`, a
module-level list, a comprehension). The rewrite appends to it, whatever its form, and the tuner keeps
choosing per key among the old configs and the new ones, so no key can get a worse pick than it had
(up to timing noise in the tuner's own measurement):

- `warps`: each config again with twice its warps (up to 16), or half (down to 1) where the finding asks
  for fewer (`context["direction"] == "fewer-warps"`, a cross-warp reduction);
- `stages`: each config again with one stage more and one fewer (from 1 to 5): latency hiding vs
  shared memory;
- `blocks`: each config again with its block sizes doubled, only for block keys whose value already
  differs between configs, that the launch grid reads from the picked config (`meta["BLOCK"]`), or
  whose value the wrapper never writes as a literal (a grid `cdiv(n, 1024)` pins BLOCK=1024), so the
  grid follows whatever block the tuner picks;
- `hopper-tiles` (kernels with tl.dot whose configs name an M, N and K block): the wgmma-friendly tiles
  of `DOT_TILES`, the other keys (GROUP_SIZE_M ...) as in the first config.

For dot kernels, a new config whose 16-bit operand buffers alone exceed sm90's shared memory
(`dot_operand_bytes`) is not added: it would compile only to fail with OutOfResources.

A comprehension over integer literals (`[triton.Config({"BD": BD}, num_warps=w) for BD in [32, 64] for w in
[1, 2, 4] + ([] if hopper else [8])]`, fla's and Liger's style) is expanded to the configs it lists. A
part chosen at run time (`a if cond else b`) may give either branch: its values serve as templates, but
only values every branch gives count as already listed, so a config that one branch lacks is still
added (on the other branch the tuner times it twice). Configs whose values are not literals (a call's
result, a filtered comprehension) are kept but not used as templates; without any readable config there
is nothing to derive from, and the rewrite declines.

Where the finding is a grid too small for the device, block sizes are halved instead of doubled: more,
smaller programs.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.aliasing import aliased_kernels, loads_what_it_stores
from diagnose.rewriters.base import TRITON_DEFAULT_KNOBS, SubstituteNames, Variant, dotted, is_jit
from diagnose.rewriters.blocks import calls_in
from diagnose.rewriters.resizing import Resizing, block_resizing

__all__ = ["DOT_TILES", "SHARED_LIMIT_SM90", "autotuned_kernels", "dot_operand_bytes", "widen_autotune_configs"]

_MAX_WARPS = 16
_STAGES = range(1, 6)
# Hopper tile shapes for 16-bit tl.dot kernels, (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), measured:
# the six best of eleven (Triton's matmul tutorial's six CUDA configs and five larger-K ones) for the
# textbook masked 2-D-grid fp16 matmul on the H200 with Triton 3.6, at 256^3 to 4096^3 and 3072x1024x4096
# (scripts/matmul_headroom.py, docs/device/2026-12-03-h200-matmul/). Every size's best tile is among them;
# no one tile passes 0.76 of cuBLAS's geomean over the sizes, so a size-keyed tuner over them is the point.
# tiles.py gives them to dot kernels that are not autotuned yet; here they join an autotuner's list.
DOT_TILES = ((128, 256, 64, 4, 8), (128, 128, 32, 4, 4), (64, 256, 32, 4, 4), (64, 128, 32, 4, 4),
             (128, 128, 64, 3, 8), (128, 128, 64, 4, 4))
_ROLE = {role: re.compile(rf"^BLOCK(_SIZE)?_{role}$") for role in "MNK"}
# Shared memory one block may use on sm90 (227 KiB, the CUDA occupancy calculator's Hopper figure).
SHARED_LIMIT_SM90 = 227 * 1024


def dot_operand_bytes(bm: int, bn: int, bk: int, stages: int, element_bytes: int = 2) -> int:
    """The least shared memory a pipelined tl.dot loop needs: `stages` buffers of its BM x BK and BK x BN
    operand tiles (16-bit elements unless told; fp32 doubles it, fp8 halves it). The epilogue's layout
    conversions come on top."""
    return stages * (bm * bk + bk * bn) * element_bytes


@dataclass(frozen=True)
class _Config:
    meta: tuple[tuple[str, int], ...]  # the kwargs dict, in order
    num_warps: int
    num_stages: int

    def code(self, callee: str) -> str:
        body = ", ".join(f'"{k}": {v}' for k, v in self.meta)
        return f"{callee}({{{body}}}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def autotuned_kernels(module: cst.Module) -> dict[str, cst.Decorator]:
    """Jit kernel name -> its @triton.autotune decorator."""
    out: dict[str, cst.Decorator] = {}
    for node in m.findall(module, m.FunctionDef()):
        assert isinstance(node, cst.FunctionDef)
        if not is_jit(node):
            continue
        for d in node.decorators:
            if isinstance(d.decorator, cst.Call) and dotted(d.decorator.func).rsplit(".", 1)[-1] == "autotune":
                out[node.name.value] = d
    return out


def _literal_config(call: cst.Call) -> _Config | None:
    """A `triton.Config({...}, num_warps=W, num_stages=S)` whose values are all integer literals."""
    if not call.args or call.args[0].keyword is not None or not isinstance(call.args[0].value, cst.Dict):
        return None
    meta: list[tuple[str, int]] = []
    for element in call.args[0].value.elements:
        if not (isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
                and isinstance(element.value, cst.Integer)):
            return None
        meta.append((element.key.evaluated_value, int(element.value.value)))  # type: ignore[arg-type]
    knobs = dict(TRITON_DEFAULT_KNOBS)
    for arg in call.args[1:]:
        if arg.keyword is None or arg.keyword.value not in knobs:
            if arg.keyword is not None and arg.keyword.value in ("pre_hook", "num_ctas", "maxnreg"):
                return None  # a config with more to it than tiles: not a template to copy blindly
            continue
        if not isinstance(arg.value, cst.Integer):
            return None
        knobs[arg.keyword.value] = int(arg.value.value)
    return _Config(tuple(meta), knobs["num_warps"], knobs["num_stages"])


@dataclass
class _Listed:
    """The configs a list holds as far as the source says: `surely` those it holds whichever way its
    run-time choices go, `maybe` those it may hold (the templates); and the callee spelling it uses."""

    surely: list[_Config]
    maybe: list[_Config]
    callees: set[str]


def _int_choices(expr: cst.BaseExpression) -> tuple[list[int], list[int]] | None:
    """A comprehension's iterable built from integer literals: the values it surely yields and those it
    may (`a if c else b` may yield either); None when it is anything else."""
    if isinstance(expr, (cst.List, cst.Tuple)):
        values = [int(e.value.value) for e in expr.elements
                  if isinstance(e, cst.Element) and isinstance(e.value, cst.Integer)]
        return (values, values) if len(values) == len(expr.elements) else None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left, right = _int_choices(expr.left), _int_choices(expr.right)
        return (left[0] + right[0], left[1] + right[1]) if left and right else None
    if isinstance(expr, cst.IfExp):
        body, orelse = _int_choices(expr.body), _int_choices(expr.orelse)
        return ([v for v in body[0] if v in orelse[0]], body[1] + orelse[1]) if body and orelse else None
    if (isinstance(expr, cst.Call) and dotted(expr.func) == "range" and 1 <= len(expr.args) <= 3
            and all(a.keyword is None and isinstance(a.value, cst.Integer) for a in expr.args)):
        values = list(range(*(int(a.value.value) for a in expr.args)))  # type: ignore[attr-defined]
        return values, values
    return None


_MAX_EXPANDED = 512  # configs a comprehension may expand to before it is not read


def _expanded(comp: cst.ListComp) -> tuple[list[_Config], list[_Config]] | None:
    """The configs a comprehension of `Config(...)` over integer literals lists (surely, maybe)."""
    if not (isinstance(comp.elt, cst.Call) and dotted(comp.elt.func).rsplit(".", 1)[-1] == "Config"):
        return None
    loops: list[tuple[str, tuple[list[int], list[int]]]] = []
    clause: cst.CompFor | None = comp.for_in
    while clause is not None:
        choices = _int_choices(clause.iter)
        if clause.ifs or clause.asynchronous or not isinstance(clause.target, cst.Name) or choices is None:
            return None
        loops.append((clause.target.value, choices))
        clause = clause.inner_for_in
    out: tuple[list[_Config], list[_Config]] = ([], [])
    for which, configs in enumerate(out):
        axes = [list(dict.fromkeys(choices[which])) for _, choices in loops]
        if len(list(itertools.islice(itertools.product(*axes), _MAX_EXPANDED + 1))) > _MAX_EXPANDED:
            return None
        for combo in itertools.product(*axes):
            values = SubstituteNames({name: cst.Integer(str(v)) for (name, _), v in zip(loops, combo)})
            # in the arguments' values only: `num_warps=num_warps` keeps its keyword
            call = comp.elt.with_changes(args=[a.with_changes(value=a.value.visit(values)) for a in comp.elt.args])
            config = _literal_config(call)
            if config is None:
                return None
            if config not in configs:
                configs.append(config)
    return out


def _configs_in(node: cst.CSTNode) -> _Listed:
    """The configs under `node` that can be read: literal `Config(...)` calls, and comprehensions of them
    over integer literals."""
    listed = _Listed([], [], set())

    def add(configs: list[_Config], into: list[_Config]) -> None:
        into.extend(c for c in configs if c not in into)

    for call in calls_in(node):
        callee = dotted(call.func)
        if callee.rsplit(".", 1)[-1] == "Config":
            listed.callees.add(callee)
            config = _literal_config(call)
            if config is not None:
                add([config], listed.surely)
                add([config], listed.maybe)
    for comp in m.findall(node, m.ListComp()):
        assert isinstance(comp, cst.ListComp)
        expanded = _expanded(comp)
        if expanded is not None:
            add(expanded[0], listed.surely)
            add(expanded[1], listed.maybe)
    return listed


def _source_of_list(module: cst.Module, expression: cst.BaseExpression) -> cst.CSTNode:
    """Where the list's configs are written: the expression itself, the module-level binding of a name,
    or the body of the module-level function a call names."""
    target = expression.func if isinstance(expression, cst.Call) else expression
    if isinstance(target, cst.Name):
        for statement in module.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == target.value:
                return statement
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Assign) and any(m.matches(t.target, m.Name(target.value)) for t in small.targets):
                        return small.value
    return expression


def _grid_reads(module: cst.Module) -> set[str]:
    """Keys the launch grids read from the picked config: `meta["BLOCK_M"]`, `META['BLOCK']`."""
    keys = set()
    for node in m.findall(module, m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.SimpleString()))])):
        assert isinstance(node, cst.Subscript)
        index = node.slice[0].slice
        assert isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)
        keys.add(str(index.value.evaluated_value))
    return keys


class _WrapperLiterals(cst.CSTVisitor):
    """Integer literals outside the jit functions and the configs: where a wrapper may have spelled a block
    size out (`triton.cdiv(n, 1024)`), which a config changing that block would contradict."""

    def __init__(self) -> None:
        self.values: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return not is_jit(node)

    def visit_Call(self, node: cst.Call) -> bool:
        return dotted(node.func).rsplit(".", 1)[-1] != "Config"

    def visit_Integer(self, node: cst.Integer) -> None:
        self.values.add(int(node.value))


def _movable(module: cst.Module, configs: list[_Config]) -> set[str]:
    """Block keys a config may change: those the configs already vary, those the grid reads from the
    picked config, and those whose value the wrapper never spells out."""
    literals = _WrapperLiterals()
    module.visit(literals)
    first = dict(configs[0].meta)
    varied = {k for k in first if len({dict(c.meta).get(k) for c in configs}) > 1}
    unspelled = {k for k, v in first.items() if all(dict(c.meta).get(k) not in literals.values for c in configs)}
    return varied | _grid_reads(module) | unspelled


def _derived(configs: list[_Config], have: set[_Config], movable: set[str], dot: bool, fewer_warps: bool,
             smaller_blocks: bool, resizing: dict[str, Resizing]) -> dict[str, list[_Config]]:
    """Each family's new configs from the templates `configs`, those in `have` (surely listed) left out; a
    block grows or shrinks only where the kernel lets it (`resizing`)."""
    out: dict[str, list[_Config]] = {"warps": [], "stages": [], "blocks": [], "hopper-tiles": []}

    def add(family: str, config: _Config) -> None:
        if config not in have and config not in out[family]:
            out[family].append(config)

    for c in configs:
        warps = c.num_warps // 2 if fewer_warps else c.num_warps * 2
        if 1 <= warps <= _MAX_WARPS:
            add("warps", _Config(c.meta, warps, c.num_stages))
        for stages in (c.num_stages + 1, c.num_stages - 1):
            if stages in _STAGES:
                add("stages", _Config(c.meta, c.num_warps, stages))
        blocks = [k for k, v in c.meta if k in movable and v >= 16 and v & (v - 1) == 0
                  and (resizing[k].shrink if smaller_blocks else resizing[k].grow)]
        if smaller_blocks:
            blocks = [k for k in blocks if dict(c.meta)[k] >= 32]
        if blocks:
            resized = tuple((k, (v // 2 if smaller_blocks else v * 2) if k in blocks else v) for k, v in c.meta)
            add("blocks", _Config(resized, c.num_warps, c.num_stages))
    roles = {role: next((k for k, _ in configs[0].meta if pattern.match(k)), None) for role, pattern in _ROLE.items()}
    if dot and all(roles.values()) and {roles["M"], roles["N"], roles["K"]} <= movable:
        template = dict(configs[0].meta)
        for bm, bn, bk, stages, warps in DOT_TILES:
            tile: dict[str, int] = {roles["M"]: bm, roles["N"]: bn, roles["K"]: bk}  # type: ignore[dict-item]
            if all((v <= template[k] or resizing[k].grow) and (v >= template[k] or resizing[k].shrink)
                   for k, v in tile.items()):
                add("hopper-tiles", _Config(tuple((k, tile.get(k, v)) for k, v in configs[0].meta), warps, stages))
    if dot and all(roles.values()):
        # A config whose 16-bit operand buffers alone exceed the block's shared memory fails with
        # OutOfResources only after it compiled: in a compile-heavy round that is time for nothing (the H200's
        # matmul, widened from its six measured tiles, had 6 of 28 such: 128x256x64 at 5 stages, most doubled
        # blocks). Only the 16-bit bound is applied, so an fp8 kernel loses those candidates, never correctness.
        def fits(c: _Config) -> bool:
            meta = dict(c.meta)
            return dot_operand_bytes(meta[roles["M"]], meta[roles["N"]], meta[roles["K"]],  # type: ignore[index]
                                     c.num_stages) <= SHARED_LIMIT_SM90
        out = {family: [c for c in new if fits(c)] for family, new in out.items()}
    return {family: new for family, new in out.items() if new}


class _Append(cst.CSTTransformer):
    """`configs=X` of one decorator -> `configs=X + [new...]` (or the new ones appended to a literal list)."""

    def __init__(self, kernel: str, new: list[str]) -> None:
        self.kernel = kernel
        self.new = new
        self.done = False

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value != self.kernel:
            return updated
        decorators = []
        for d in updated.decorators:
            if isinstance(d.decorator, cst.Call) and dotted(d.decorator.func).rsplit(".", 1)[-1] == "autotune":
                d = d.with_changes(decorator=self._widen(d.decorator))
            decorators.append(d)
        return updated.with_changes(decorators=decorators)

    def _widen(self, call: cst.Call) -> cst.Call:
        args = list(call.args)
        index = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "configs"), None)
        if index is None and args and args[0].keyword is None:
            index = 0
        if index is None:
            return call
        value = args[index].value
        if isinstance(value, cst.List) and value.elements:
            # the new configs written the way the list writes its own: the separator between its
            # elements, and its last element's trailing comma (or none) at the new end
            elements = list(value.elements)
            sep = next((e.comma for e in reversed(elements[:-1]) if isinstance(e.comma, cst.Comma)),
                       cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            end = elements[-1].comma
            added = [cst.Element(cst.parse_expression(code), comma=sep) for code in self.new]
            added[-1] = added[-1].with_changes(comma=end)
            new_value: cst.BaseExpression = value.with_changes(elements=[*elements[:-1], elements[-1].with_changes(comma=sep),
                                                                         *added])
        else:
            listed = "".join(f"\n    {code}," for code in self.new)
            new_value = cst.parse_expression(f"{cst.Module(body=[]).code_for_node(value)} + [{listed}\n]")
        args[index] = args[index].with_changes(value=new_value)
        self.done = True
        return call.with_changes(args=args)


def listed_config_keys(decorator: cst.Decorator) -> tuple[set[tuple[str, ...]], str | None]:
    """The kwargs keys of every config an @triton.autotune decorator surely lists, and the callee it
    spells them with (`triton.Config`); another rewrite appends configs of the same keys."""
    listed = _configs_in(decorator)
    return {tuple(k for k, _ in c.meta) for c in listed.surely}, next(iter(sorted(listed.callees)), None)


def append_configs(module: cst.Module, kernel: str, configs: list[str]) -> cst.Module | None:
    """`module` with `configs` (source text of Config calls) appended to `kernel`'s autotune list; None
    when its list cannot be extended in place."""
    append = _Append(kernel, configs)
    new = module.visit(append)
    return new if append.done else None


def _reruns_change_it(module: cst.Module, fn: cst.FunctionDef, decorator: cst.Call) -> bool:
    """Whether running the kernel twice on the same buffers gives another result than once (an atomic, an
    in-place update, an output handed in as an input too), and the decorator restores nothing between the
    tuner's runs (`restore_value`, `reset_to_zero`)."""
    if any(a.keyword is not None and a.keyword.value in ("restore_value", "reset_to_zero") for a in decorator.args):
        return False
    atomics = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v.startswith("atomic_"))))))
    return bool(atomics) or loads_what_it_stores(fn) or fn.name.value in aliased_kernels(module)


def widen_autotune_configs(source: str, context: dict[str, Any]) -> list[Variant]:
    """One variant per family (module docstring) for each autotuned kernel with literal configs."""
    module = cst.parse_module(source)
    variants = []
    for kernel, decorator in autotuned_kernels(module).items():
        call = decorator.decorator
        assert isinstance(call, cst.Call)
        listed = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "configs"),
                      call.args[0].value if call.args and call.args[0].keyword is None else None)
        if listed is None:
            continue
        found = _configs_in(_source_of_list(module, listed))
        configs = found.maybe
        if not configs:
            continue
        callee = sorted(found.callees)[0] if len(found.callees) == 1 else "triton.Config"
        fn = next(n for n in m.findall(module, m.FunctionDef(name=m.Name(kernel))))
        if len(configs) < 2 and _reruns_change_it(module, cst.ensure_type(fn, cst.FunctionDef), call):
            continue  # one config is never tuned; with more, the tuner would run it again on the same buffers
        dot = bool(m.findall(fn, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("dot")))))
        movable = _movable(module, configs)
        fewer_warps = context.get("direction") == "fewer-warps"
        smaller_blocks = context.get("finding") == "parallelism.grid-underfilled"
        resizing = {k: block_resizing(cst.ensure_type(fn, cst.FunctionDef), k) for k in movable}
        for family, new in _derived(configs, set(found.surely), movable, dot, fewer_warps, smaller_blocks,
                                    resizing).items():
            append = _Append(kernel, [c.code(callee) for c in new])
            widened = module.visit(append)
            if append.done:
                variants.append(Variant({"kernel": kernel, "configs_added": family, "count": len(new)}, widened.code))
    return variants
