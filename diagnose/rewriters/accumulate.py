"""Accumulate a loop's block lane by lane and reduce it once after the loop (issue 27, reductions; pattern
accumulate-then-reduce, found by L1's `reduction.in-loop`).

TritonBench-T's first draft of sigmoid(A @ v) - b gives each row a program that walks the row in blocks
of 128 and adds `tl.sum(a * v)` to a scalar every iteration: each step pays a cross-lane reduction
(shuffles, and across warps a shared-memory exchange between two barriers) to add one number. Summing
the blocks lane by lane and reducing once does the same additions in another order:

    acc = 0.0                                         acc = 0.0
    for k in range(0, K, BLOCK):                      _kb_acc_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        x = tl.load(x_ptr + k + offs, mask=...)  ->   for k in range(0, K, BLOCK):
        acc += tl.sum(x * w)                              x = tl.load(x_ptr + k + offs, mask=...)
                                                          _kb_acc_lanes += x * w
                                                      acc += tl.sum(_kb_acc_lanes)

A 2-D block reduced along an axis (`acc += tl.sum(a * x[None, :], axis=1)`, several rows per program)
keeps a 2-D accumulator and reduces it along that axis after the loop.

Preconditions, on the syntax tree of a @triton.jit function:

- the statement is `acc += tl.sum(E[, axis])` or `acc = acc + tl.sum(E[, axis])` at the top of a loop's
  body, `axis` a literal (or absent: the whole block), no other keyword;
- `acc` is read or written nowhere else in that loop, and E does not read it;
- `acc` is a float32 value: its plain assignments in the kernel are float literals or `tl.zeros` /
  `tl.full` with dtype tl.float32 (an integer accumulator would become a float one);
- E's shape is known from the source (`_Shapes`): built from `tl.arange(0, W)`, loads, `[:, None]` /
  `[None, :]` broadcasts, arithmetic, tl.where and elementwise math, over the kernel's parameters, and its
  extents read only parameters the kernel never assigns, so the accumulator can be made before the loop.

The accumulator is float32 whatever E's type (an fp16 block sums in fp32, as tl.sum does).

Variants: the rewrite alone, and, for a 1-D block whose width is the block the loop steps by, that width
raised at the launch to 1024 and 4096 (a wide block is what the per-step reduction made costly): only where
every load and store in the loop is masked, the kernel uses the width nowhere else, and the one launch
passes it as a number (or a name bound to one).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from diagnose.rewriters.base import (
    ReplaceNodes,
    Variant,
    dotted,
    is_jit,
    jit_functions,
    launch_arguments,
    mask_argument,
    only_launch,
    register,
)
from diagnose.rewriters.blocks import assigned_names, code, fresh_name, names_in, reaching_literal

__all__ = ["LoopReduction", "accumulate_then_reduce", "loop_reductions"]

_WIDTHS = (1024, 4096)

# A shape as written: one extent per axis ("BLOCK_K", "1" for an axis a broadcast added); None: unknown.
Shape = tuple[str, ...] | None

_ELEMENTWISE = {"tl.where", "tl.exp", "tl.exp2", "tl.log", "tl.log2", "tl.sqrt", "tl.sqrt_rn", "tl.rsqrt", "tl.abs",
                "tl.sigmoid", "tl.sin", "tl.cos", "tl.maximum", "tl.minimum", "tl.fma", "tl.erf", "tl.floor",
                "tl.ceil", "tl.clamp", "tl.fdiv", "tl.div_rn", "tl.softmax"}
_ELEMENTWISE_PREFIXES = ("tl.math.", "libdevice.", "tl.extra.cuda.libdevice.", "tl.extra.libdevice.")
_SCALARS = {"tl.program_id", "tl.num_programs", "tl.cdiv", "triton.cdiv"}
_REDUCTIONS = {"tl.sum", "tl.max", "tl.min", "tl.argmax", "tl.argmin", "tl.xor_sum"}
_SAME_SHAPE = {"tl.load", "tl.cast", "tl.multiple_of", "tl.max_contiguous", "tl.max_constancy"}  # that of argument 0
_LOOPS = ("range", "tl.range", "tl.static_range")


@dataclass(frozen=True)
class LoopReduction:
    """A reduction the rewrite moves out of its loop: where it is, what it adds to, the block it reduces."""

    line: int
    accumulator: str
    shape: tuple[str, ...]
    axis: int | None


def _broadcast(a: Shape, b: Shape) -> Shape:
    if a is None or b is None:
        return None
    a, b = ("1",) * (len(b) - len(a)) + a, ("1",) * (len(a) - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or y == "1":
            out.append(x)
        elif x == "1":
            out.append(y)
        else:
            return None  # two extents spelled differently: equal only at run time, if at all
    return tuple(out)


class _Shapes:
    """The shapes of a kernel's expressions as the source spells them. A name's shape joins those of
    every value assigned to it; a name met again while its own value is being read (`p += BLOCK`) adds
    nothing to the join."""

    def __init__(self, kernel: cst.FunctionDef) -> None:
        self.params = {p.name.value for p in [*kernel.params.params, *kernel.params.kwonly_params]}
        self.values: dict[str, list[cst.BaseExpression]] = {}
        self.opaque: set[str] = set()  # bound some other way (unpacked, annotated, a loop over a tensor)
        for node in m.findall(kernel.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        self.values.setdefault(target.target.value, []).append(node.value)
                    else:
                        self.opaque |= names_in(target.target)
            elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                self.values.setdefault(node.target.value, []).append(node.value)
            elif isinstance(node, cst.For) and isinstance(node.target, cst.Name) and isinstance(node.iter, cst.Call) \
                    and dotted(node.iter.func) in _LOOPS:
                self.values.setdefault(node.target.value, []).append(cst.Integer("0"))  # a scalar counter
            else:
                self.opaque |= names_in(node.target)  # type: ignore[attr-defined]
        self._reading: set[str] = set()

    def assigned(self, name: str) -> bool:
        return name in self.values or name in self.opaque

    def of(self, node: cst.BaseExpression) -> Shape:
        if isinstance(node, (cst.Integer, cst.Float)):
            return ()
        if isinstance(node, cst.Name):
            return self._name(node.value)
        if isinstance(node, cst.BinaryOperation):
            return _broadcast(self.of(node.left), self.of(node.right))
        if isinstance(node, cst.UnaryOperation):
            return self.of(node.expression)
        if isinstance(node, cst.Comparison):
            shape = self.of(node.left)
            for target in node.comparisons:
                shape = _broadcast(shape, self.of(target.comparator))
            return shape
        if isinstance(node, cst.BooleanOperation):
            return _broadcast(self.of(node.left), self.of(node.right))
        if isinstance(node, cst.IfExp):
            return _broadcast(self.of(node.body), self.of(node.orelse))
        if isinstance(node, cst.Subscript):
            return self._subscript(node)
        if isinstance(node, cst.Call):
            return self._call(node)
        return None

    def _name(self, name: str) -> Shape:
        if name in ("True", "False"):
            return ()
        if name in self.opaque:
            return None
        if name not in self.values:
            return () if name in self.params else None  # a parameter is a scalar or a pointer
        if name in self._reading:
            return ()  # neutral: the other assignments decide
        self._reading.add(name)
        try:
            shapes = [self.of(value) for value in self.values[name]]
            if len({len(s) for s in shapes if s}) > 1:
                return None  # blocks of different ranks under one name: which one a use reads is the flow's
            shape: Shape = ()  # what a parameter starts as; the kernel's own names take their values' shapes
            for value_shape in shapes:
                shape = _broadcast(shape, value_shape)
            return shape
        finally:
            self._reading.discard(name)

    def _subscript(self, node: cst.Subscript) -> Shape:
        shape = self.of(node.value)
        if shape is None:
            return None
        out, axes = [], iter(shape)
        for element in node.slice:
            if isinstance(element.slice, cst.Slice) and element.slice.lower is None and element.slice.upper is None \
                    and element.slice.step is None:
                axis = next(axes, None)
                if axis is None:
                    return None
                out.append(axis)
            elif isinstance(element.slice, cst.Index) and m.matches(element.slice.value, m.Name("None")):
                out.append("1")
            else:
                return None  # an index picks elements: not a broadcast
        rest = list(axes)
        return tuple(out + rest)

    def _call(self, node: cst.Call) -> Shape:
        name = dotted(node.func)
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        if name == "tl.arange" and len(positional) == 2 and m.matches(positional[0], m.Integer("0")):
            return (code(positional[1]),)
        if name in ("tl.zeros", "tl.full") and positional and isinstance(positional[0], (cst.List, cst.Tuple)):
            return tuple(code(e.value) for e in positional[0].elements)
        if name in _SCALARS:
            return ()
        if name in _REDUCTIONS and positional:
            return self._reduced(node, positional[0])
        if name in _SAME_SHAPE and positional:
            return self.of(positional[0])
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "to":
            return self.of(node.func.value)
        if name in _ELEMENTWISE or name.startswith(_ELEMENTWISE_PREFIXES):
            shape: Shape = ()
            for value in positional:
                shape = _broadcast(shape, self.of(value))
            return shape
        return None


    def _reduced(self, call: cst.Call, operand: cst.BaseExpression) -> Shape:
        """tl.sum / tl.max / ...: the operand's shape without the reduced axis (all of them without one)."""
        shape = self.of(operand)
        readable, axis = _axis(call, keep_dims=True)
        keep = any(a.keyword is not None and a.keyword.value == "keep_dims" and m.matches(a.value, m.Name("True"))
                   for a in call.args)
        if shape is None or not readable:
            return None
        if axis is None:
            return ("1",) * len(shape) if keep else ()
        if not -len(shape) <= axis < len(shape):
            return None
        axis %= len(shape)
        return shape[:axis] + (("1",) if keep else ()) + shape[axis + 1:]


@dataclass(frozen=True)
class _Site:
    statement: cst.SimpleStatementLine
    accumulator: str
    block: cst.BaseExpression  # E of tl.sum(E, axis)
    shape: tuple[str, ...]
    axis: int | None


def _summed(value: cst.BaseExpression, accumulator: str) -> cst.Call | None:
    """The tl.sum call of `acc + tl.sum(...)` / `tl.sum(...) + acc`."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return None
    for mine, other in ((value.left, value.right), (value.right, value.left)):
        if m.matches(mine, m.Name(accumulator)) and isinstance(other, cst.Call):
            return other
    return None


def _axis(call: cst.Call, keep_dims: bool = False) -> tuple[bool, int | None]:
    """(readable, axis) of a tl.sum call: its axis a literal or absent, no other argument (but keep_dims,
    where asked)."""
    rest = [a for a in call.args[1:] if not (keep_dims and a.keyword is not None and a.keyword.value == "keep_dims")]
    if len(rest) > 1 or any(a.keyword is not None and a.keyword.value != "axis" or a.star for a in rest):
        return False, None
    if not rest or m.matches(rest[0].value, m.Name("None")):
        return True, None
    value = rest[0].value
    if isinstance(value, cst.Integer):
        return True, int(value.value)
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus) and isinstance(value.expression, cst.Integer):
        return True, -int(value.expression.value)
    return False, None


def _float32(kernel: cst.FunctionDef, accumulator: str) -> bool:
    """Whether every plain assignment of `accumulator` makes a float32 (and one does)."""
    values = [a.value for a in m.findall(kernel.body, m.Assign(targets=[m.AssignTarget(target=m.Name(accumulator))]))
              if isinstance(a, cst.Assign)]
    initial = [v for v in values if not names_in(v) & {accumulator}]  # `acc = acc * s` keeps what acc was
    if not initial:
        return False
    for value in initial:
        if isinstance(value, cst.Float) or isinstance(value, cst.UnaryOperation) and isinstance(value.expression, cst.Float):
            continue
        if isinstance(value, cst.Call) and dotted(value.func) in ("tl.zeros", "tl.full") \
                and any(dotted(a.value) in ("tl.float32", "tl.fp32") for a in value.args):
            continue
        return False
    return True


def _sites(loop: cst.For, kernel: cst.FunctionDef, shapes: _Shapes) -> list[_Site]:
    if not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) in _LOOPS and loop.orelse is None
            and isinstance(loop.body, cst.IndentedBlock)):
        return []
    params = {p.name.value for p in [*kernel.params.params, *kernel.params.kwonly_params]}
    found = []
    for stmt in loop.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            continue
        small = stmt.body[0]
        if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign) and isinstance(small.target, cst.Name):
            accumulator, call = small.target.value, small.value
        elif isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            accumulator = small.targets[0].target.value
            call = _summed(small.value, accumulator)  # type: ignore[assignment]
        else:
            continue
        if not (isinstance(call, cst.Call) and dotted(call.func) == "tl.sum" and call.args and call.args[0].keyword is None
                and not call.args[0].star):
            continue
        readable, axis = _axis(call)
        block = call.args[0].value
        shape = shapes.of(block)
        if not readable or not shape or accumulator in names_in(block) or not _float32(kernel, accumulator):
            continue
        if axis is not None and not -len(shape) <= axis < len(shape):
            continue
        uses = len(m.findall(loop.body, m.Name(accumulator)))
        if uses != len(m.findall(stmt, m.Name(accumulator))):
            continue  # read or written elsewhere in the loop: it must see the running value
        if not all(names_in(cst.parse_expression(extent)) <= params and not any(shapes.assigned(n) for n in
                   names_in(cst.parse_expression(extent))) for extent in shape):
            continue  # the accumulator could not be made before the loop
        found.append(_Site(stmt, accumulator, block, shape, axis))
    return found


class _Hoist(cst.CSTTransformer):
    """Every loop's sites accumulated lane by lane, their reductions after the loop."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, taken: set[str], guard: bool = False) -> None:
        self.taken = set(taken)
        self.guard = guard  # lanes add only where the loop's loads are live (a widened block's tail)
        self.kernels: list[tuple[cst.FunctionDef, _Shapes]] = []
        self.found: list[LoopReduction] = []
        self.loops: list[tuple[cst.For, list[_Site]]] = []  # the loops rewritten, as they were

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if is_jit(node):
            self.kernels.append((node, _Shapes(node)))

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if is_jit(original):
            self.kernels.pop()
        return updated

    def _fresh(self, name: str) -> str:
        return fresh_name(name, self.taken)

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if not self.kernels:
            return updated
        sites = _sites(original, *self.kernels[-1])
        if not sites:
            return updated
        self.loops.append((original, sites))
        before: list[cst.BaseStatement] = []
        after: list[cst.BaseStatement] = []
        replaced: dict[int, cst.BaseStatement] = {}
        for site in sites:
            self.found.append(LoopReduction(self.get_metadata(PositionProvider, site.statement).start.line,
                                            site.accumulator, site.shape, site.axis))
            lanes = self._fresh(f"_kb_{site.accumulator}_lanes")
            before.append(cst.parse_statement(f"{lanes} = tl.zeros([{', '.join(site.shape)}], dtype=tl.float32)\n"))
            block = site.block
            live = _loop_mask(original) if self.guard else None
            if live is not None:
                block = cst.parse_expression(f"tl.where({code(live)}, {code(block)}, 0.0)")
            replaced[id(site.statement)] = site.statement.with_changes(
                body=[cst.AugAssign(cst.Name(lanes), cst.AddAssign(), block)])
            axis = "" if site.axis is None else f", axis={site.axis}"
            after.append(cst.parse_statement(f"{site.accumulator} += tl.sum({lanes}{axis})\n"))
        before[0] = before[0].with_changes(leading_lines=[
            *updated.leading_lines, cst.EmptyLine(comment=cst.Comment(
                "# the loop adds its blocks lane by lane; one reduction after it replaces one per iteration"))])
        new_body = [replaced.get(id(o), n) for o, n in zip(original.body.body, updated.body.body)]
        loop = updated.with_changes(leading_lines=[], body=updated.body.with_changes(body=new_body))
        return cst.FlattenSentinel([*before, loop, *after])


def _hoisted(module: cst.Module, guard: bool = False) -> tuple[cst.Module, _Hoist]:
    transformer = _Hoist(names_in(module), guard)
    # no copy: the loops it records are the module's own nodes, which the widening looks up
    return MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer), transformer


def loop_reductions(source: str) -> list[LoopReduction]:
    """The reductions the module's kernels run every loop iteration that the rewrite can move after the
    loop (what L1 reports)."""
    try:
        return _hoisted(cst.parse_module(source))[1].found
    except cst.ParserSyntaxError:
        return []


def _loop_mask(loop: cst.For) -> cst.BaseExpression | None:
    """The one mask every tl.load of the loop takes (as written), else None."""
    masks = {}
    for call in m.findall(loop.body, m.Call()):
        if isinstance(call, cst.Call) and dotted(call.func) == "tl.load":
            at = mask_argument(call)
            if at is None:
                return None
            masks[code(call.args[at].value)] = call.args[at].value
    return next(iter(masks.values())) if len(masks) == 1 else None


def _masked(loop: cst.For) -> bool:
    """Whether every tl.load and tl.store in the loop carries a mask (lanes past the end touch nothing)."""
    return all(mask_argument(call) is not None for call in m.findall(loop.body, m.Call())
               if isinstance(call, cst.Call) and dotted(call.func) in ("tl.load", "tl.store"))


def _step(loop: cst.For) -> str | None:
    """The name a loop steps by: `range(a, b, W)`, or `range(tl.cdiv(N, W))` / `range(0, tl.cdiv(N, W))`."""
    assert isinstance(loop.iter, cst.Call)
    positional = [a.value for a in loop.iter.args if a.keyword is None]
    if len(positional) == 3 and isinstance(positional[2], cst.Name):
        # a start that reads the width too (`range(pid * W, N, W)`) would move with it
        return None if positional[2].value in names_in(positional[0]) else positional[2].value
    trips = positional[-1] if len(positional) in (1, 2) else None
    if isinstance(trips, cst.Call) and dotted(trips.func) in ("tl.cdiv", "triton.cdiv") and len(trips.args) == 2 \
            and isinstance(trips.args[1].value, cst.Name):
        return trips.args[1].value.value
    return None


def _widenings(module: cst.Module, hoist: _Hoist) -> Iterator[tuple[str, int, cst.BaseExpression]]:
    """(constexpr, its value, the launch argument that passes it) for each block the rewritten loops step by
    that may be widened at the launch."""
    kernels = jit_functions(module)
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    for loop, sites in hoist.loops:
        width = _step(loop)
        # A wider block loads past the end (masked) where the written one may have divided N exactly, and
        # a masked lane's term is not 0 in general (`(x - mean) * (x - mean)` adds mean**2): the widened
        # loop adds only where its one load mask holds (a helper's audit: N=768 off by 3.09 at 1024).
        if width is None or not any(s.shape == (width,) for s in sites) or not _masked(loop) \
                or _loop_mask(loop) is None:
            continue
        kernel = next((k for k in kernels.values() if any(f is loop for f in m.findall(k, m.For()))), None)
        if kernel is None or len(m.findall(kernel.body, m.Name(width))) != len(m.findall(loop, m.Name(width))):
            continue  # the width sizes something outside the loop too
        counts = assigned_names(kernel.body)
        if any(counts.get(name, 0) > 1 for name in names_in(_loop_mask(loop))):  # type: ignore[arg-type]
            continue  # `mask = ...` again after the load: the guard at the sum would read the other mask
        launch = only_launch(module, kernel.name.value)
        if launch is None:
            continue
        call = launch[1]
        argument = launch_arguments(kernel, call).get(width)
        if argument is None:
            continue
        if isinstance(argument.value, cst.Integer):
            value = int(argument.value.value)
        elif isinstance(argument.value, cst.Name) and (reaching := reaching_literal(argument.value.value, call, parents)):
            value = reaching[0]
        else:
            continue
        yield width, value, argument.value


def accumulate_then_reduce(source: str, context: dict[str, Any]) -> list[Variant]:
    """The reductions moved after their loops; then, where a 1-D block is the loop's step, that step widened."""
    module = cst.parse_module(source)
    new, hoist = _hoisted(module)
    if not hoist.found:
        return []
    variants = [Variant({"reductions": len(hoist.found)}, new.code)]
    for width, value, argument in _widenings(module, hoist):
        for wider in _WIDTHS:
            if wider > value:
                widened = module.visit(ReplaceNodes({id(argument): cst.Integer(str(wider))}))
                variants.append(Variant({"reductions": len(hoist.found), width: wider},
                                        _hoisted(widened, guard=True)[0].code))
    return variants


register("accumulate-then-reduce")(accumulate_then_reduce)
