"""An online softmax read off a loop body's syntax tree: a small abstract interpretation that gives every
value the loop computes a kind relative to the state carried into the step (the running maximum, sums
rescaled to it, terms scaled by exp(s - m)). `splitkv` asks it whether a key loop's state may be split
and merged by log-sum-exp.

The kinds:

- free: it does not depend on the carried state (loads, the loop index, names set before the loop);
- m_old / m_new: the running maximum at the step's start / after `tl.maximum(m_old, free)`;
- diff_old / diff_new: `m_old - m_new` / `free - m_new`;
- rescale: `E(diff_old)`, under a view (`alpha[:, None]`); scaled: `E(diff_new)`, closed under products and
  quotients by free values, sums of scaled terms, `tl.sum`, casts, layout calls, `tl.dot` with a free
  operand and `tl.where(free, scaled, 0)`; E is one exponential for all (`tl.exp`, `tl.exp2`, a module's own
  `exp`);
- x_old / x_rescaled / x_step: a carried sum at the step's start / times a rescale / plus scaled terms
  (`+`, `+=`, `tl.dot(p, v, acc)`);
- unknown: anything else, which makes the loop not an online softmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted
from diagnose.rewriters.blocks import code, infinity_sign, is_broadcast, number

__all__ = ["FREE", "UNKNOWN", "Kind", "LoopReader"]

_AUGMENTED: dict[type, cst.BaseBinaryOp] = {cst.AddAssign: cst.Add(), cst.MultiplyAssign: cst.Multiply(),
                                            cst.SubtractAssign: cst.Subtract(), cst.DivideAssign: cst.Divide()}

# Calls that pass the kind of their first argument through: casts and layout changes are linear.
_LINEAR_CALLS = frozenset({"tl.reshape", "tl.trans", "tl.permute", "tl.broadcast_to", "tl.expand_dims", "tl.ravel"})


@dataclass(frozen=True)
class Kind:
    """What a value in the loop body is, relative to the state carried into the step."""

    tag: str  # free | m_old | m_new | diff_new | diff_old | rescale | scaled | x_old | x_rescaled | x_step | unknown
    exp: str = ""  # the exponential of a rescale or scaled term (its source text)
    view: str = ""  # the subscript a rescale factor is taken under (`[:, None]`)
    x: str = ""  # the accumulator of an x_* kind


FREE = Kind("free")
UNKNOWN = Kind("unknown")


def _exp_name(func: cst.BaseExpression) -> str:
    name = dotted(func)
    return name if name.rsplit(".", 1)[-1] in ("exp", "exp2") else ""


class LoopReader:
    """Kinds of the names a loop body assigns, statement after statement, from the state carried in."""

    def __init__(self, env: dict[str, Kind]) -> None:
        self.env = dict(env)
        self.exps: set[str] = set()
        self.views: dict[str, set[str]] = {}  # accumulator -> the views it was rescaled under
        self.ok = True

    # ---------------------------------------------------------------- expressions
    def kind(self, e: cst.BaseExpression) -> Kind:  # noqa: C901 - one case per node type
        if isinstance(e, cst.Name):
            return self.env.get(e.value, FREE)
        if isinstance(e, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
            return FREE
        if isinstance(e, cst.Attribute):
            inner = self.kind(e.value)
            return FREE if inner == FREE or e.attr.value in ("dtype", "shape", "numel") else UNKNOWN
        if isinstance(e, cst.Subscript):
            inner = self.kind(e.value)
            if inner == FREE:
                return FREE if all(self._free(el) for el in m.findall(e, m.Name())) else UNKNOWN
            if not is_broadcast(e):
                return UNKNOWN
            return replace(inner, view=inner.view + code(cst.Subscript(cst.Name("_"), e.slice))[1:]) \
                if inner.tag == "rescale" else inner
        if isinstance(e, cst.UnaryOperation):
            return FREE if self.kind(e.expression) == FREE else UNKNOWN
        if isinstance(e, (cst.Comparison, cst.BooleanOperation)):
            return FREE if all(self._free(n) for n in m.findall(e, m.Name())) else UNKNOWN
        if isinstance(e, cst.BinaryOperation):
            return self._binary(e)
        if isinstance(e, cst.Call):
            return self._call(e)
        return FREE if all(self._free(n) for n in m.findall(e, m.Name())) else UNKNOWN

    def _free(self, name: cst.CSTNode) -> bool:
        return not isinstance(name, cst.Name) or self.env.get(name.value, FREE) == FREE

    def _binary(self, e: cst.BinaryOperation) -> Kind:
        a, b = self.kind(e.left), self.kind(e.right)
        op = e.operator
        if a == FREE and b == FREE:
            return FREE
        if isinstance(op, cst.Subtract):
            if a == FREE and b.tag == "m_new":
                return Kind("diff_new")
            if a.tag == "m_old" and b.tag == "m_new":
                return Kind("diff_old")
            return UNKNOWN
        if isinstance(op, cst.Multiply):
            for x, r in ((a, b), (b, a)):
                if x.tag == "x_old" and r.tag == "rescale":
                    self.views.setdefault(x.x, set()).add(r.view)
                    self.exps.add(r.exp)
                    return Kind("x_rescaled", x=x.x)
                if x.tag == "scaled" and r == FREE:
                    return x
            return UNKNOWN
        if isinstance(op, cst.Divide):
            return a if a.tag == "scaled" and b == FREE else UNKNOWN
        if isinstance(op, cst.Add):
            for x, s in ((a, b), (b, a)):
                if x.tag in ("x_rescaled", "x_step") and s.tag == "scaled":
                    self.exps.add(s.exp)
                    return Kind("x_step", x=x.x)
            if a.tag == b.tag == "scaled" and a.exp == b.exp:
                return a
        return UNKNOWN

    def _call(self, e: cst.Call) -> Kind:
        func = dotted(e.func)
        args = [self.kind(a.value) for a in e.args]
        if isinstance(e.func, cst.Attribute) and e.func.attr.value == "to":  # a cast
            inner = self.kind(e.func.value)
            return inner if all(k == FREE for k in args) else UNKNOWN
        if all(k == FREE for k in args) and (not isinstance(e.func, cst.Attribute) or self.kind(e.func.value) == FREE):
            return FREE
        if _exp_name(e.func) and len(args) == 1:
            if args[0].tag == "diff_new":
                return Kind("scaled", exp=_exp_name(e.func))
            if args[0].tag == "diff_old":
                return Kind("rescale", exp=_exp_name(e.func))
            return UNKNOWN
        if func in ("tl.maximum", "tl.math.max") and len(args) == 2 and {args[0].tag, args[1].tag} == {"m_old", "free"}:
            return Kind("m_new")
        rest_free = all(k == FREE for k in args[1:])
        if (func == "tl.sum" or func in _LINEAR_CALLS) and args and args[0].tag == "scaled" and rest_free:
            return args[0]
        if func == "tl.where" and len(e.args) == 3 and args[0] == FREE:
            value, other = (args[1], e.args[2].value) if args[2] == FREE else (args[2], e.args[1].value)
            if value.tag == "scaled" and number(other) == 0:
                return value
            if value.tag == "diff_new" and infinity_sign(other) == -1:
                return value
            return UNKNOWN
        if func == "tl.dot":
            positional = [k for a, k in zip(e.args, args, strict=True) if a.keyword is None]
            keyword = {a.keyword.value: k for a, k in zip(e.args, args, strict=True) if a.keyword is not None}
            operands, acc = positional[:2], (positional[2:3] or [keyword.get("acc", FREE)])[0]
            if len(operands) == 2 and {o.tag for o in operands} == {"scaled", "free"}:
                scaled = next(o for o in operands if o.tag == "scaled")
                if acc == FREE:
                    return scaled
                if acc.tag in ("x_rescaled", "x_step"):
                    self.exps.add(scaled.exp)
                    return Kind("x_step", x=acc.x)
        return UNKNOWN

    # ---------------------------------------------------------------- statements
    def block(self, statements: Sequence[cst.BaseStatement | cst.BaseSmallStatement]) -> None:
        """A suite's statements (a one-line `if c: x = y` holds small statements)."""
        for st in statements:
            if not self.ok:
                return
            if isinstance(st, cst.BaseSmallStatement):
                self.small(st)
            else:
                self.statement(st)

    def statement(self, st: cst.BaseStatement) -> None:
        if isinstance(st, cst.If):
            if self.kind(st.test) != FREE:
                self.ok = False
                return
            branches: list[Sequence[cst.BaseStatement | cst.BaseSmallStatement]] = [st.body.body]
            orelse = st.orelse
            while isinstance(orelse, cst.If):
                if self.kind(orelse.test) != FREE:
                    self.ok = False
                    return
                branches.append(orelse.body.body)
                orelse = orelse.orelse
            branches.append(orelse.body.body if isinstance(orelse, cst.Else) else ())
            before, results = dict(self.env), []
            for body in branches:
                self.env = dict(before)
                self.block(body)
                results.append(self.env)
            self.env = {name: (results[0].get(name, UNKNOWN) if all(r.get(name) == results[0].get(name) for r in results)
                               else UNKNOWN) for name in set().union(*results)}
            return
        if not isinstance(st, cst.SimpleStatementLine):
            self.ok = False  # a nested loop, a with, a def
            return
        for small in st.body:
            self.small(small)

    def small(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                self.env[target.value] = self.kind(small.value)
                return
            if isinstance(target, cst.Tuple) and isinstance(small.value, cst.Tuple) \
                    and len(target.elements) == len(small.value.elements) \
                    and all(isinstance(t.value, cst.Name) for t in target.elements):
                values = [self.kind(v.value) for v in small.value.elements]  # all read before any is set
                for t, k in zip(target.elements, values, strict=True):
                    self.env[cst.ensure_type(t.value, cst.Name).value] = k
                return
        if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
            op = _AUGMENTED.get(type(small.operator))
            if op is not None:
                self.env[small.target.value] = self.kind(cst.BinaryOperation(small.target, op, small.value))
                return
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) \
                and not dotted(small.value.func).split(".")[-1].startswith(("store", "atomic")) \
                and self.kind(small.value) == FREE:
            return  # a print, an assert
        if isinstance(small, cst.Pass):
            return
        self.ok = False
