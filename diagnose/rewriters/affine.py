"""An affine reader of a kernel's 2-D tile loads: which pointer, which rows and columns from where, with which
strides and bounds, however the kernel spells them. A rewrite that moves such a load onto another mechanism
(a TMA tensor descriptor) needs exactly that, and kernels spell it many ways; on TritonBench-T's answers the
textbook form alone (`tl.load(P + R[:, None] * S0 + C[None, :] * S1, mask=(R[:, None] < M) & ...)` with `R`
and `C` top-level ranges) reached none of the 290 that call `tl.dot`. Read here:

- pointers built in steps, through names and parentheses: `a_ptrs = a_ptr + (offs_m[:, None] * s_am + ...)`,
  a parameter moved in place (`x_ptr += stride * offs[:, None]`), strides on either side, unit strides left
  out (`rm[:, None] * K + k_range[None, :]`);
- pointers advanced in the loop (`a_ptrs += BLOCK_K * stride_ak`): the start moves by the iteration index
  times the step, which `range(0, N)`, `range(0, K, BLOCK_K)` or `tl.range` gives;
- ranges made inside the loop (`k_range = k + tl.arange(0, BLOCK_K)`);
- masks through names (`rm_mask = rm < M` ... `mask=rm_mask[:, None] & k_mask[None, :]`), and bounds that
  follow an advanced pointer (`offs_k[None, :] < K - k * BLOCK_K`);
- rows wrapped into range (`(pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M`), where the tile feeds only the
  non-contracted side of a `tl.dot`: a wrapped row only reaches an output row the store masks, so reading it
  as zero instead changes no output.

Anything else is declined, load by load: gathers (an index loaded from memory), ranges that are not
`START + tl.arange(0, BLOCK)`, offsets the read cannot place on an axis, names assigned more than once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted
from diagnose.rewriters.blocks import arange_width, assigned_names, calls_in, code, names_in

__all__ = ["TileAxis", "TileLoad", "tile_loads"]


@dataclass(frozen=True)
class TileAxis:
    """One axis of a 2-D tile load: rows `start + tl.arange(0, block)` of an array `bound` long, `stride` apart."""

    start: str
    block: str
    stride: str
    bound: str


@dataclass(frozen=True)
class TileLoad:
    base: str  # the pointer parameter the address starts from
    axes: tuple[TileAxis, TileAxis]


# --- the symbolic values an expression of the kernel evaluates to ---------------------------------------------

@dataclass(frozen=True)
class _Scalar:  # a value the same for the whole program (a parameter, a program index, arithmetic of those)
    code: str


@dataclass(frozen=True)
class _Span:  # start + tl.arange(0, block), maybe wrapped (% wrap)
    start: str
    block: str
    wrap: str | None = None


@dataclass(frozen=True)
class _Placed:  # a span along axis 0 (`[:, None]`) or 1 (`[None, :]`), times a stride
    span: _Span
    axis: int
    stride: str = "1"


@dataclass(frozen=True)
class _Sum:  # scalars plus placed spans: an address before its base is known
    scalars: tuple[str, ...]
    terms: tuple[_Placed, ...]


@dataclass(frozen=True)
class _Mask:  # spans bounded above: ((axis or None for 1-D, span, bound), ...)
    limits: tuple[tuple[int | None, _Span, str], ...]


_Value = _Scalar | _Span | _Placed | _Sum | _Mask | None

_SCALAR_CALLS = {"tl.program_id", "tl.num_programs", "tl.cdiv", "triton.cdiv", "min", "max"}
# Operations that combine values across a tile's rows or columns (a wrapped row would reach them).
_ACROSS = {"sum", "max", "min", "argmax", "argmin", "reduce", "cumsum", "cumprod", "associative_scan", "sort",
           "xor_sum", "histogram", "gather", "trans", "permute", "reshape", "view"}


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _paren(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


_LOOSER_THAN_PLUS = re.compile(r"<<|>>|[&|^<>=!]|\b(?:if|and|or|not|lambda)\b")


def _plus(a: str, b: str) -> str:
    if a == "0":
        return b
    if b == "0":
        return a
    a, b = (f"({x})" if _LOOSER_THAN_PLUS.search(x) else x for x in (a, b))
    return f"{a} + {b}"


def _times(a: str, b: str) -> str:
    if a == "1":
        return b
    return a if b == "1" else f"{_paren(a)} * {_paren(b)}"


def _as_sum(v: _Value) -> _Sum | None:
    if isinstance(v, _Scalar):
        return _Sum((v.code,), ())
    if isinstance(v, _Placed):
        return _Sum((), (v,))
    return v if isinstance(v, _Sum) else None


def _axis(sub: cst.Subscript) -> int | None:
    """0 for `v[:, None]`, 1 for `v[None, :]`."""
    if len(sub.slice) != 2:
        return None
    first, second = (e.slice for e in sub.slice)
    none = m.Index(value=m.Name("None"))
    if isinstance(first, cst.Slice) and m.matches(second, none):
        return 0
    if isinstance(second, cst.Slice) and m.matches(first, none):
        return 1
    return None


class _Reader:
    """Evaluates the kernel's statements in order; `loads` ends up holding every tile load it could read,
    keyed by the `tl.load` call node."""

    def __init__(self, fn: cst.FunctionDef) -> None:
        self.fn = fn
        self.params = {p.name.value for p in fn.params.params}
        self.counts = assigned_names(fn.body)
        self.env: dict[str, _Value] = {p: _Scalar(p) for p in self.params}  # a parameter's launch value
        self.loops: list[tuple[str, str]] = []  # (loop variable, iteration index expression)
        # pointer name -> (step expression, applied before its load, its loop's iteration index)
        self.advanced: dict[str, tuple[str, bool, str]] = {}
        self.loads: dict[cst.Call, TileLoad] = {}

    # expressions
    def value(self, e: cst.BaseExpression) -> _Value:  # noqa: PLR0911, PLR0912 - one case per node kind
        e = e.with_changes(lpar=[], rpar=[]) if hasattr(e, "lpar") else e
        if isinstance(e, cst.Name):
            if e.value not in self.env:  # a global, or a local not assigned yet at this point: unknown
                return None if self.counts.get(e.value) else _Scalar(e.value)
            if e.value in self.advanced:
                return None  # its start moves each iteration: read only as a load's whole address
            held = self.env[e.value]
            if isinstance(held, _Scalar) and self.stable(e.value):
                return _Scalar(e.value)  # a scalar that keeps one value is read by its name
            return held  # a moved one by what it holds (`p += pid_b * stride`), which `stable` then declines
        if isinstance(e, cst.Integer | cst.Float):
            return _Scalar(code(e))
        if isinstance(e, cst.Attribute):
            return _Scalar(code(e)) if e.value.__class__ is cst.Name and e.value.value in self.params else None
        if isinstance(e, cst.Call):
            name = dotted(e.func)
            if (width := arange_width(e)) is not None:
                return _Span("0", width)
            if name in _SCALAR_CALLS and all(isinstance(self.value(a.value), _Scalar) for a in e.args):
                return _Scalar(code(e))
            return None
        if isinstance(e, cst.Subscript) and (axis := _axis(e)) is not None:
            inner = self.value(e.value)
            if isinstance(inner, _Span):
                return _Placed(inner, axis)
            if isinstance(inner, _Mask) and all(a is None for a, _, _ in inner.limits):
                return _Mask(tuple((axis, s, b) for _, s, b in inner.limits))
            return None
        if isinstance(e, cst.Comparison) and len(e.comparisons) == 1 and \
                isinstance(e.comparisons[0].operator, cst.LessThan):
            left, bound = self.value(e.left), self.value(e.comparisons[0].comparator)
            if not isinstance(bound, _Scalar):
                return None
            if isinstance(left, _Span):
                return _Mask(((None, left, bound.code),))
            if isinstance(left, _Placed) and left.stride == "1":
                return _Mask(((left.axis, left.span, bound.code),))
            return None
        if isinstance(e, cst.BinaryOperation):
            return self._binary(e)
        return None

    def _binary(self, e: cst.BinaryOperation) -> _Value:  # noqa: PLR0911 - one case per operator
        left, right, op = self.value(e.left), self.value(e.right), e.operator
        if isinstance(left, _Scalar) and isinstance(right, _Scalar):
            return _Scalar(code(e.with_changes(lpar=[], rpar=[])))
        if isinstance(op, cst.BitAnd):
            return _Mask(left.limits + right.limits) if isinstance(left, _Mask) and isinstance(right, _Mask) else None
        if isinstance(op, cst.Modulo):
            if isinstance(left, _Span) and left.wrap is None and isinstance(right, _Scalar):
                return replace(left, wrap=right.code)
            return None
        if isinstance(op, cst.Multiply):
            for placed, scale in ((left, right), (right, left)):
                if isinstance(placed, _Placed) and isinstance(scale, _Scalar):
                    return replace(placed, stride=_times(placed.stride, scale.code))
            return None
        if not isinstance(op, cst.Add):
            return None
        for span, offset in ((left, right), (right, left)):
            if isinstance(span, _Span) and isinstance(offset, _Scalar) and span.wrap is None:
                return replace(span, start=_plus(offset.code, span.start))
        a, b = _as_sum(left), _as_sum(right)
        if a is None or b is None:
            return None
        return _Sum(a.scalars + b.scalars, a.terms + b.terms)

    # statements
    def block(self, statements: list[cst.BaseStatement]) -> None:
        for stmt in statements:
            self.statement(stmt)

    def statement(self, stmt: cst.BaseStatement) -> None:
        if isinstance(stmt, cst.For):
            self.loop(stmt)
            return
        if isinstance(stmt, cst.If | cst.While | cst.With | cst.Try):
            for name in assigned_names(stmt):  # whatever a branch assigns is unknown in it and afterwards
                self.env[name] = None
            self.find_loads(stmt)
            return
        self.find_loads(stmt)
        if not isinstance(stmt, cst.SimpleStatementLine):
            return
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and \
                    isinstance(small.targets[0].target, cst.Name):
                self.env[small.targets[0].target.value] = self.value(small.value)
            elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and \
                    isinstance(small.operator, cst.AddAssign):
                name = small.target.value
                if name in self.advanced:
                    continue
                total = self._binary(cst.BinaryOperation(small.target, cst.Add(), small.value))
                self.env[name] = total
            else:
                for name in assigned_names(small):
                    self.env[name] = None

    def loop(self, loop: cst.For) -> None:
        index = self._iteration(loop)
        target = loop.target.value if isinstance(loop.target, cst.Name) else None
        body: list[cst.BaseStatement] = [st for st in loop.body.body if isinstance(st, cst.BaseStatement)]
        advanced = {}
        if index is not None and target is not None:
            self.env[target] = _Scalar(target)
            for i, stmt in enumerate(body):
                step = self._advance(stmt)
                if step is not None and self.counts.get(step[0]) == 2 and not names_in(cst.parse_expression(step[1])) \
                        & set(self.counts) - self.params:
                    reads = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")),
                                   args=[m.Arg(value=m.Name(step[0])), m.ZeroOrMore()])
                    before = any(m.findall(s, reads) for s in body[:i])
                    after = any(m.findall(s, reads) for s in body[i + 1:])
                    if not (before and after):  # loads on both sides of the step see two different starts
                        advanced[step[0]] = (step[1], after, index)
        for name in assigned_names(loop.body):  # loop-carried: the value at entry is the first iteration's only
            if name not in advanced:
                self.env[name] = None
        self.loops.append((target or "", index or ""))
        saved = dict(self.advanced)
        self.advanced.update(advanced)
        self.find_loads(loop.iter)
        self.block(body)
        self.advanced = saved
        self.loops.pop()
        for name in assigned_names(loop):  # after the loop, values it changed are unknown
            self.env[name] = None

    def _advance(self, stmt: cst.BaseStatement) -> tuple[str, str] | None:
        """(pointer, increment) of `p += increment` with a scalar increment."""
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.AugAssign):
            aug = stmt.body[0]
            if isinstance(aug.target, cst.Name) and isinstance(aug.operator, cst.AddAssign) and \
                    isinstance(self.value(aug.value), _Scalar):
                return aug.target.value, code(aug.value.with_changes(lpar=[], rpar=[]))
        return None

    def _iteration(self, loop: cst.For) -> str | None:
        """The 0-based iteration index of `for v in range(...)` / `tl.range(...)`, as an expression of `v`."""
        if not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Call) or \
                dotted(loop.iter.func) not in ("range", "tl.range", "tl.static_range"):
            return None
        args = [a for a in loop.iter.args if a.keyword is None]
        named = {a.keyword.value: a.value for a in loop.iter.args if a.keyword is not None}
        v = loop.target.value
        if "step" in named:
            if len(args) != 2:
                return None
            args = [*args, cst.Arg(named["step"])]
        if len(args) == 1:
            return v
        start = code(args[0].value)
        step = code(args[2].value) if len(args) > 2 else "1"
        moved = v if start == "0" else f"({v} - {_paren(start)})"
        return moved if step == "1" else f"({moved} // {_paren(step)})"

    # loads
    def find_loads(self, node: cst.CSTNode) -> None:
        if not self.loops:
            return
        for call in calls_in(node, "tl.load"):
            read = self.load(call)
            if read is not None:
                self.loads[call] = read

    def load(self, call: cst.Call) -> TileLoad | None:  # noqa: PLR0911 - each way a load is declined
        if not call.args or call.args[0].keyword is not None:
            return None
        kw = {a.keyword.value: a.value for a in call.args[1:] if a.keyword is not None}
        if len(call.args) - 1 != len(kw) or set(kw) - {"mask", "other"}:
            return None
        if "other" in kw and not m.matches(kw["other"], m.Float("0.0") | m.Integer("0") | m.Float("0.")):
            return None
        address = call.args[0].value.with_changes(lpar=[], rpar=[])
        shift: dict[int, str] = {}
        if isinstance(address, cst.Name) and address.value in self.advanced:
            step, before, index = self.advanced[address.value]
            shift = self._shift(address.value, step, before, index)
            if not shift:
                return None
            total = _as_sum(self.env.get(address.value))  # its start at the loop's entry, moved by `shift`
        else:
            total = _as_sum(self.value(address))
        if total is None or sorted(t.axis for t in total.terms) != [0, 1]:
            return None
        # The base is a pointer parameter at its launch value, even where the kernel moves it in place.
        bases = [s for s in total.scalars if s in self.params]
        if len(total.scalars) != 1 or len(bases) != 1:
            return None
        mask = self.value(kw["mask"]) if "mask" in kw else _Mask(())
        if not isinstance(mask, _Mask):
            return None
        axes = []
        for term in sorted(total.terms, key=lambda t: t.axis):
            moved = shift.get(term.axis, "0")
            bound = self._bound(term, moved, mask)
            if bound is None:
                return None
            masked = any(axis == term.axis for axis, _, _ in mask.limits)
            if not masked and not self._wrap_is_harmless(call, term.axis, term.span.wrap or ""):
                return None
            axes.append(TileAxis(_plus(term.span.start, moved), term.span.block, term.stride, bound))
        if len(mask.limits) != sum(any(a == t.axis for a, _, _ in mask.limits) for t in total.terms) or \
                len({a for a, _, _ in mask.limits}) != len(mask.limits):
            return None  # a limit the descriptor's shape does not carry (a split's own end, a second bound)
        used = {n for a in axes for part in (a.start, a.block, a.stride, a.bound)
                for n in names_in(cst.parse_expression(part))}
        if not all(self.stable(n) for n in used):
            return None  # a name read at the load that was made earlier may have changed in between
        return TileLoad(bases[0], (axes[0], axes[1]))

    def stable(self, name: str) -> bool:
        """Whether `name` holds one value wherever it is read: a loop variable, a parameter the kernel never
        reassigns, a local assigned once, or a global."""
        if name in {v for v, _ in self.loops}:
            return True
        return not self.counts.get(name) if name in self.params else self.counts.get(name, 0) <= 1

    def _shift(self, pointer: str, step: str, before: bool, index: str) -> dict[int, str]:
        """Axis -> how far an advanced pointer has moved along it at this load."""
        start = self.env.get(pointer)
        total = _as_sum(start)
        if total is None:
            return {}
        times = _plus(index, "1") if before else index
        for term in total.terms:
            if (stride_step := self._step(step, term.stride)) is not None:
                return {term.axis: _times(times, stride_step)}
        return {}

    def _step(self, increment: str, stride: str) -> str | None:
        """The step along an axis of stride `stride` that `p += increment` takes (`BLOCK_K * stride_ak`), or
        None where the increment does not move along that axis."""
        if _norm(increment) == _norm(stride) and stride != "1":
            return "1"
        expr = cst.parse_expression(increment)
        if stride == "1":
            return increment if isinstance(self.value(expr), _Scalar) and "stride" not in increment else None
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
            for a, b in ((expr.left, expr.right), (expr.right, expr.left)):
                if _norm(code(b)) == _norm(stride):
                    return code(a)
        return None

    def _bound(self, term: _Placed, moved: str, mask: _Mask) -> str | None:
        """The array's length along the term's axis: the bound its mask gives (net of the pointer's advance),
        or the wrap, where the rows past it are masked out elsewhere."""
        for axis, span, bound in mask.limits:
            if axis != term.axis or (span.start, span.block) != (term.span.start, term.span.block):
                continue
            if moved == "0":
                return bound
            expr = cst.parse_expression(bound)
            if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Subtract) and \
                    _norm(code(expr.right)) in (_norm(moved), _norm(f"({moved})")):
                return code(expr.left)
            return None
        return term.span.wrap if moved == "0" or term.span.wrap is None else None

    def _wrap_is_harmless(self, call: cst.Call, axis: int, wrap: str) -> bool:
        """Whether reading the rows past `wrap` as zero, not as the wrapped rows, changes no output: the tile
        only feeds `tl.dot` on its non-contracted side, so such a row reaches only its own output row; nothing
        in the kernel reduces, scans or accumulates atomically across output rows; and every store is
        masked by a comparison with `wrap`."""
        if not wrap or not self._feeds_dot_on(call, axis):
            return False
        across = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.MatchIfTrue(
            lambda a: isinstance(a, cst.Name) and (a.value in _ACROSS or a.value.startswith("atomic_")))))
        if m.findall(self.fn, across):
            return False
        stores = calls_in(self.fn, "tl.store")
        bounded = [c for c in stores if any(
            a.keyword is not None and a.keyword.value == "mask" and any(
                isinstance(cmp, cst.Comparison) and _norm(code(cmp.comparisons[0].comparator)) == _norm(wrap)
                for cmp in m.findall(a.value, m.Comparison())) for a in c.args)]
        return bool(stores) and len(bounded) == len(stores)

    def _feeds_dot_on(self, call: cst.Call, axis: int) -> bool:
        """Whether the loaded tile is only an operand of `tl.dot`, on the side where `axis` is not contracted
        (rows of the left operand, columns of the right one)."""
        owner = next((a.targets[0].target.value for a in m.findall(self.fn, m.Assign(value=m.MatchIfTrue(
            lambda v: v is call))) if isinstance(a, cst.Assign) and isinstance(a.targets[0].target, cst.Name)), None)
        if owner is None or self.counts.get(owner) != 1:
            return False
        uses = len([n for n in m.findall(self.fn, m.Name(owner))]) - 1
        dots = calls_in(self.fn, "tl.dot")
        sides = [i for c in dots for i, a in enumerate(c.args[:2]) if m.matches(a.value, m.Name(owner))]
        return uses == len(sides) and set(sides) == {0 if axis == 0 else 1}


def tile_loads(fn: cst.FunctionDef) -> dict[cst.Call, TileLoad]:
    """Every `tl.load` inside a loop of the kernel `fn` that reads a 2-D tile the reader can place: the call
    node (as it is in `fn`) -> where it reads."""
    reader = _Reader(fn)
    reader.block(list(fn.body.body))  # type: ignore[arg-type]
    return reader.loads
