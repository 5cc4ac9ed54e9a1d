"""exp -> exp2: with log2(e) folded into the scale the exponentiated values already carry, or applied at
each call.

`tl.exp(x)` lowers to `ex2.approx(x * log2(e))`: one multiply per element before the exponential. In an
attention kernel's online softmax every score pays it twice over (`s = tl.dot(q, k) * scale`, then
`p = tl.exp(s - m)`), and on the H200 that multiply is what separates a plain flash kernel from SDPA more
than tiles do: 0.74x -> 0.86x of SDPA at 4x16x1024x64 with the tile unchanged
(scripts/attention_headroom.py, docs/device/2026-12-03-h200-attention/).

The fold scales the whole *score domain* by log2(e): the values the exponentials' arguments are built
from, closed under what a softmax does with them. Every operation there commutes with a positive scale
(sums and differences, max, where with -inf, a product with or a quotient by a value outside the domain,
broadcasting, casts to fp32 or fp64), so multiplying the domain's entry points by log2(e) multiplies every value in it by
log2(e), and `tl.exp(d)` becomes `tl.exp2(d)`:

    s = tl.dot(q, tl.trans(k)) * (scale * 1.4426950408889634)    # the entry: folded into its scalar factor
    m_new = tl.maximum(m_i, tl.max(s, axis=1))                     # in the domain: scaled by it
    p = tl.exp2(s - m_new[:, None])                                # the exits: exp -> exp2
    alpha = tl.exp2(m_i - m_new)

Preconditions, per kernel, on the syntax tree: every name in the domain is assigned only by plain
`name = value` statements in the kernel (no parameter, no loop target, no augmented assignment); every
use of a domain name feeds another domain name or an exponential (a stored score, a log-sum-exp written
out, a comparison, an `exp2` already there: the rewrite declines); every entry point is a product with a
scalar factor (a number, a launched kernel's parameter that addresses no memory, or a name computed from
those) times a value that is not index arithmetic (integer math a float factor would turn into float), or
a numeric literal that stays finite once scaled (-3e38 would become -inf, and a masked row's -inf - -inf
NaN; in fp16 any literal past 65504 / log2(e), unless every product entering is a dot's fp32 result or a
widened cast), so the fold costs nothing per element and changes no value but by rounding; no cast in the domain
narrows (an int or fp16 cast rounds a scaled value differently); an invariant (0, +-inf, `tl.full`/`tl.zeros` of one) needs no scaling. Where
the fold does not apply, `tl.exp(x)` -> `tl.exp2(x * log2(e))` at each call (the pattern's plain form).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from diagnose.rewriters.base import InJit, ReplaceNodes, Variant, dotted, jit_functions, register
from diagnose.rewriters.blocks import calls_in, code, infinity_sign, names_in, number

__all__ = ["ScoreDomain", "exp2_fast_math", "score_domains"]

LOG2E = "1.4426950408889634"
_EXP = {"tl.exp", "tl.math.exp"}
_REDUCE = {"tl.max", "tl.min"}
_PAIRWISE = {"tl.maximum", "tl.minimum"}
# calls whose first argument is an address: the parameters in it are pointers
_ADDRESSING = {"load", "store", "make_block_ptr", "make_tensor_descriptor", "atomic_add", "atomic_max", "atomic_min",
               "atomic_cas", "atomic_xchg", "atomic_and", "atomic_or", "atomic_xor"}


_FP32_MAX = 3.4028234663852886e38
_FP16_MAX = 65504.0
_WIDE_FLOATS = {"tl.float32", "tl.float64"}


def _widening_cast(e: cst.BaseExpression) -> bool:
    """`x.to(tl.float32)` / `x.to(tl.float64)`: a cast that keeps a scaled value's order and magnitude
    (an integer or a 16-bit float one would round it, and rounding does not commute with a scale)."""
    return (isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "to"
            and bool(e.args) and dotted(e.args[0].value) in _WIDE_FLOATS)


@dataclass(frozen=True)
class ScoreDomain:
    """A kernel whose exponentials the fold rewrites: their lines, the names scaled, and the entry points
    as written (`tl.dot(q, tl.trans(k)) * scale`)."""

    kernel: str
    exp_lines: tuple[int, ...]
    names: tuple[str, ...]
    entries: tuple[str, ...]


class _NotFoldable(Exception):
    """The domain reaches something that does not commute with a scale: the fold declines."""


class _Domain:
    """One kernel's score domain, grown from its exponentials' arguments to a fixed point."""

    def __init__(self, kernel: cst.FunctionDef, parents: Mapping[cst.CSTNode, cst.CSTNode], helper: bool) -> None:
        self.kernel = kernel
        self.parents = parents
        self.params = {p.name.value for p in kernel.params.params}
        # A launched kernel's parameters that are not pointers hold one value for every lane; a helper's
        # (a jit function other jit functions call, or one that addresses no memory, as a launched kernel
        # must to write its result) may be tiles, and folding into a tile costs a multiply per element.
        pointers = {n for c in calls_in(kernel) if dotted(c.func).rsplit(".", 1)[-1] in _ADDRESSING and c.args
                    for n in names_in(c.args[0].value)} & self.params
        self.scalar_params = set() if helper or not pointers else self.params - pointers
        self.defs: dict[str, list[cst.BaseExpression]] = {}
        self.opaque: set[str] = set()  # assigned other than by `name = value`
        self.loop_vars: set[str] = set()
        self.updates: dict[str, list[cst.BaseExpression]] = {}  # `name += value` and the like
        for node in m.findall(kernel, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For() | m.NamedExpr()):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                self.defs.setdefault(node.targets[0].target.value, []).append(node.value)
            elif isinstance(node, cst.Assign):
                self.opaque |= {n for t in node.targets for n in names_in(t.target)}
            elif isinstance(node, (cst.For, cst.AugAssign, cst.AnnAssign, cst.NamedExpr)):
                self.opaque |= names_in(node.target)
            if isinstance(node, cst.For):
                self.loop_vars |= names_in(node.target)
            elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                self.updates.setdefault(node.target.value, []).append(node.value)
        self.exps = [c for c in calls_in(kernel) if dotted(c.func) in _EXP and len(c.args) == 1 and not c.args[0].keyword]
        self.names: set[str] = set()
        # id(entry point) -> (the entry point, its replacement)
        self.entries: dict[int, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        # Literals whose scaled value overflows fp16, and products whose values may be fp16 (a load, not a
        # dot's fp32 result nor a widened cast): together, a scaled sentinel becomes -inf in a 16-bit domain.
        self.beyond_fp16: list[str] = []
        self.maybe_narrow: list[str] = []

    # ------------------------------------------------------------------ which expressions are in the domain
    def _scalar(self, e: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> bool:
        """A value the same in every lane: a number, a runtime kernel parameter, arithmetic of those."""
        if isinstance(e, (cst.Integer, cst.Float)):
            return True
        if isinstance(e, cst.Name):
            if e.value in self.params:
                return e.value in self.scalar_params
            values = self.defs.get(e.value, [])
            return (bool(values) and e.value not in self.opaque and e.value not in seen
                    and all(self._scalar(v, seen | {e.value}) for v in values))
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
            return self._scalar(e.expression, seen)
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Add, cst.Subtract, cst.Multiply,
                                                                            cst.Divide, cst.Power)):
            return self._scalar(e.left, seen) and self._scalar(e.right, seen)
        return False

    @staticmethod
    def _invariant(e: cst.BaseExpression) -> bool:
        """A value any positive scale leaves as it is: 0, +-inf, and tiles filled with one."""
        if infinity_sign(e) is not None or number(e) == 0:
            return True
        if isinstance(e, cst.Call) and dotted(e.func) == "tl.zeros":
            return True
        if isinstance(e, cst.Call) and dotted(e.func) == "tl.full" and len(e.args) >= 2:
            return _Domain._invariant(e.args[1].value)
        return False

    def _touches(self, e: cst.CSTNode) -> bool:
        return bool(names_in(e) & self.names)

    def _entry(self, e: cst.BaseExpression) -> None:
        """A value entering the domain (it names nothing in it): scaled by log2(e) through a scalar factor."""
        def scaled(scalar: cst.BaseExpression) -> cst.BaseExpression:
            return cst.parse_expression(f"({code(scalar)} * {LOG2E})")

        if self._invariant(e):
            return
        if self._scalar(e):
            # A lone value enters as it is (a bound, a sentinel): only a literal can be seen to stay finite
            # once scaled; -3e38 times log2(e) is -inf in fp32, and a masked row's -inf - -inf is NaN.
            value = number(e)
            if value is None or abs(value * float(LOG2E)) >= _FP32_MAX:
                raise _NotFoldable(f"{code(e)} enters the domain alone: its scaled value may not be finite")
            if abs(value * float(LOG2E)) >= _FP16_MAX:
                self.beyond_fp16.append(code(e))
            self.entries[id(e)] = (e, scaled(e))
            return
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Multiply, cst.Divide)):
            inside, factor = (e.left, e.right) if self._scalar(e.right) else (e.right, e.left)
            if isinstance(e.operator, cst.Divide) and factor is not e.right or not self._scalar(factor):
                raise _NotFoldable(f"{code(e)} enters the domain without a scalar factor to fold log2(e) into")
            if self._integral(inside):
                raise _NotFoldable(f"{code(e)}: integer arithmetic, which a float factor would turn into float")
            if not self._wide(inside):
                self.maybe_narrow.append(code(e))
            new = f"({code(factor)} / {LOG2E})" if isinstance(e.operator, cst.Divide) else f"({code(factor)} * {LOG2E})"
            self.entries[id(factor)] = (e, cst.parse_expression(new))
            return
        raise _NotFoldable(f"{code(e)} enters the domain without a scalar factor to fold log2(e) into")

    def _integral(self, e: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `e` may be integer-typed: built from indices (tl.arange, program ids), integer literals
        or integer casts, through the names it reads (a loaded tile counts as data, whatever its address)."""
        if isinstance(e, cst.Integer):
            return True
        if isinstance(e, cst.Name):
            if e.value in self.loop_vars:
                return True
            values = self.defs.get(e.value, []) + self.updates.get(e.value, [])
            return e.value not in seen and any(self._integral(v, seen | {e.value}) for v in values)
        if isinstance(e, cst.Call):
            name = dotted(e.func)
            if name in ("tl.arange", "tl.program_id", "tl.num_programs"):
                return True
            if name.rsplit(".", 1)[-1] in ("load", "dot"):
                return False
            if isinstance(e.func, cst.Attribute) and e.func.attr.value == "to":
                return not _widening_cast(e)
            return any(self._integral(a.value, seen) for a in e.args)
        if isinstance(e, cst.BinaryOperation):  # int op int stays int; with a float, or `/`, it is float
            return (not isinstance(e.operator, cst.Divide) and self._integral(e.left, seen)
                    and self._integral(e.right, seen))
        if isinstance(e, (cst.UnaryOperation, cst.Subscript)):
            return self._integral(e.expression if isinstance(e, cst.UnaryOperation) else e.value, seen)
        return False

    def _value(self, e: cst.BaseExpression) -> None:
        """`e` sits where a domain value goes: a domain name, an invariant, an operation that commutes with a
        scale (whose operands are values in turn), or an entry point."""
        if self._invariant(e) or isinstance(e, cst.Name) and e.value in self.names:
            return
        products = isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Multiply, cst.Divide))
        if products and not self._touches(e):
            return self._entry(e)
        self._expression(e)

    def _expression(self, e: cst.BaseExpression) -> None:
        """An operation that commutes with a positive scale, its operands values in turn; else an entry."""
        if isinstance(e, cst.Subscript) and all(  # broadcasting: x[:, None], x[None, :]
                isinstance(s.slice, cst.Slice) and s.slice.lower is s.slice.upper is s.slice.step is None
                or isinstance(s.slice, cst.Index) and m.matches(s.slice.value, m.Name("None")) for s in e.slice):
            return self._value(e.value)
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
            return self._value(e.expression)
        if isinstance(e, cst.BinaryOperation):
            if isinstance(e.operator, (cst.Add, cst.Subtract)):
                self._value(e.left)
                self._value(e.right)
                return
            if isinstance(e.operator, (cst.Multiply, cst.Divide)):
                inside, factor = (e.left, e.right) if self._touches(e.left) else (e.right, e.left)
                if self._touches(factor) or (isinstance(e.operator, cst.Divide) and inside is e.right):
                    raise _NotFoldable(f"{code(e)}: a product of two domain values")
                return self._value(inside)
        if isinstance(e, cst.Call):
            name = dotted(e.func)
            positional = [a for a in e.args if a.keyword is None]
            if name in _REDUCE and positional:
                if any(self._touches(a.value) for a in e.args[1:]):
                    raise _NotFoldable(code(e))
                return self._value(positional[0].value)
            if name in _PAIRWISE and len(positional) == 2:
                self._value(positional[0].value)
                self._value(positional[1].value)
                return
            if name == "tl.where" and len(positional) == 3:
                if self._touches(positional[0].value):
                    raise _NotFoldable(f"{code(e)} selects on a domain value")
                self._value(positional[1].value)
                self._value(positional[2].value)
                return
            if _widening_cast(e):
                return self._value(e.func.value)  # type: ignore[attr-defined]
        if self._touches(e):
            raise _NotFoldable(f"{code(e)} does not commute with a scale")
        self._entry(e)

    # --------------------------------------------------------------------------------- where they are used
    def _exit_ok(self, name: cst.Name) -> None:
        """A use of a domain name must flow, through domain operations, into a domain name or an exponential."""
        node: cst.CSTNode = name
        while True:
            parent = self.parents.get(node)
            if parent is None:
                raise _NotFoldable(f"{name.value} escapes")
            if isinstance(parent, cst.Arg):
                call = self.parents.get(parent)
                if isinstance(call, cst.Call) and any(c is call for c in self.exps):
                    return
                node = parent
                continue
            if isinstance(parent, cst.Assign):
                target = parent.targets[0].target if len(parent.targets) == 1 else None
                if node is parent.value and isinstance(target, cst.Name) and target.value in self.names:
                    return
                if isinstance(target, cst.Name) and node is parent.value:
                    self.names.add(target.value)  # grows the domain: the caller iterates to a fixed point
                    return
                raise _NotFoldable(f"{name.value} is assigned in a way the fold does not follow")
            if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Subscript, cst.SubscriptElement,
                                   cst.Index, cst.Call, cst.Attribute)):
                node = parent
                continue
            raise _NotFoldable(f"{name.value} is used in {type(parent).__name__}")

    def solve(self) -> None:
        for call in self.exps:
            self.names |= self._value_names(call.args[0].value) & (set(self.defs) | self.opaque | self.params)
        while True:
            before = set(self.names)
            for name in sorted(self.names):
                if name in self.opaque or name in self.params or name not in self.defs:
                    raise _NotFoldable(f"{name} is not assigned by plain assignments in the kernel")
                for value in self.defs[name]:
                    if self._touches(value):
                        self.names |= self._value_names(value) & set(self.defs)
            for use in m.findall(self.kernel, m.Name()):
                assert isinstance(use, cst.Name)
                if use.value in self.names and not self._is_target(use):
                    self._exit_ok(use)
            if self.names == before:
                break
        self.entries = {}
        for name in sorted(self.names):
            for value in self.defs[name]:
                self._value(value)
        for call in self.exps:
            self._value(call.args[0].value)
        if self.beyond_fp16 and self.maybe_narrow:
            raise _NotFoldable(f"{self.beyond_fp16[0]} scaled overflows fp16, and {self.maybe_narrow[0]} may be fp16")

    def _wide(self, e: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `e` is known to be fp32 or wider: a dot's result (fp32 unless `out_dtype` says), a widening
        cast, arithmetic with such a value (promoted), or a name every definition of which is one."""
        if isinstance(e, cst.Call):
            if dotted(e.func) == "tl.dot":
                return not any(a.keyword is not None and a.keyword.value == "out_dtype" for a in e.args)
            return _widening_cast(e)
        if isinstance(e, cst.Name):
            values = self.defs.get(e.value, [])
            return (bool(values) and e.value not in seen and e.value not in self.opaque
                    and all(self._wide(v, seen | {e.value}) for v in values))
        if isinstance(e, cst.BinaryOperation):
            return self._wide(e.left, seen) or self._wide(e.right, seen)
        if isinstance(e, cst.UnaryOperation):
            return self._wide(e.expression, seen)
        if isinstance(e, cst.Subscript):
            return self._wide(e.value, seen)
        return False

    def _value_names(self, e: cst.BaseExpression) -> set[str]:
        """The names where `e` puts domain values: not in a product's scalar factor (that product is an
        entry point), a select's condition or a reduction's axis."""
        if isinstance(e, cst.Name):
            return {e.value}
        if isinstance(e, cst.Subscript):
            return self._value_names(e.value)
        if isinstance(e, cst.UnaryOperation):
            return self._value_names(e.expression)
        if isinstance(e, cst.BinaryOperation):
            if isinstance(e.operator, (cst.Multiply, cst.Divide)) and (self._scalar(e.right) or self._scalar(e.left)):
                return set()
            return self._value_names(e.left) | self._value_names(e.right)
        if isinstance(e, cst.Call):
            name = dotted(e.func)
            positional = [a.value for a in e.args if a.keyword is None]
            if name in _REDUCE and positional:
                return self._value_names(positional[0])
            if name in _PAIRWISE or name == "tl.where" and len(positional) == 3:
                return set().union(*(self._value_names(a) for a in positional[-2:]))
            if _widening_cast(e):
                return self._value_names(e.func.value)  # type: ignore[attr-defined]
        return names_in(e)

    def _is_target(self, name: cst.Name) -> bool:
        parent = self.parents.get(name)
        return isinstance(parent, cst.AssignTarget)


def _domains(module: cst.Module) -> list[tuple[_Domain, ScoreDomain]]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)  # the same nodes: the rewrite replaces them by identity
    parents = wrapper.resolve(ParentNodeProvider)
    positions = wrapper.resolve(PositionProvider)
    out = []
    kernels = jit_functions(module)
    helpers = {dotted(c.func) for k in kernels.values() for c in calls_in(k)} & set(kernels)
    for name, kernel in kernels.items():
        domain = _Domain(kernel, parents, name in helpers)
        if not domain.exps:
            continue
        try:
            domain.solve()
        except _NotFoldable:
            continue
        if not domain.entries:
            continue  # nothing carries a scale: exp2 at each call is all there is
        lines = tuple(sorted({positions[c].start.line for c in domain.exps}))
        entries = tuple(sorted({code(e) for e, _ in domain.entries.values()}))
        out.append((domain, ScoreDomain(name, lines, tuple(sorted(domain.names)), entries)))
    return out


def score_domains(source: str) -> list[ScoreDomain]:
    """The kernels of `source` whose exponentials the fold rewrites (the L1 finding's sites)."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return []
    return [record for _, record in _domains(module)]


class _Exp2(InJit):
    """`tl.exp(x)` -> `tl.exp2(x * log2(e))` at every call in the jit functions."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.depth or dotted(updated.func) != "tl.exp" or len(updated.args) != 1:
            return updated
        self.changed += 1
        argument = updated.args[0].value
        if not isinstance(argument, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) \
                and not argument.lpar:  # `a if c else b`, `a + b`, `-a`: the factor must scale all of it
            argument = argument.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        scaled = cst.BinaryOperation(left=argument, operator=cst.Multiply(), right=cst.Float(LOG2E))
        return updated.with_changes(func=cst.Attribute(value=cst.Name("tl"), attr=cst.Name("exp2")),
                                    args=[cst.Arg(scaled)])


def _folded(module: cst.Module) -> tuple[cst.Module, int] | None:
    domains = _domains(module)
    if not domains:
        return None
    values: dict[int, cst.BaseExpression] = {}
    for domain, _ in domains:
        values.update({key: new for key, (_, new) in domain.entries.items()})
        for call in domain.exps:
            values[id(call.func)] = cst.Attribute(value=cst.Name("tl"), attr=cst.Name("exp2"))
    return module.visit(ReplaceNodes(values)), sum(len(d.exps) for d, _ in domains)


@register("exp2-fast-math")
def exp2_fast_math(source: str, context: dict[str, Any]) -> list[Variant]:
    """The fold where it applies (first), and exp2 at each call."""
    module = cst.parse_module(source)
    out = []
    folded = _folded(module)
    if folded is not None:
        out.append(Variant({"exp": "exp2", "log2e": "folded into the scale", "sites": folded[1]}, folded[0].code))
    plain = _Exp2()
    new = module.visit(plain)
    if plain.changed:
        out.append(Variant({"exp": "exp2", "log2e": "at each call", "sites": plain.changed}, new.code))
    return out
