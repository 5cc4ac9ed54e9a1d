"""relaxed-atomics: ordered atomics that only accumulate into memory -> `sem="relaxed"`.

`tl.atomic_add` and its kin default to acq_rel at gpu scope. On sm90 ptxas brackets each such atomic
with a GPU-wide memory barrier and an L1 invalidation (SASS `MEMBAR.ALL.GPU`, `ERRBAR`, `CCTL.IVALL`
around every `ATOMG`) and makes the thread wait for the old value; a relaxed atomic whose result is
unused lowers to a fire-and-forget `red` (`REDG`) with neither. On the H200 relaxing index_add's scatter
gave 1.29x (docs/device/2026-12-04-h200-own-suite).

Relaxing is safe only where the ordering orders nothing this kernel relies on: every atomic in the
module's kernels discards its result (an accumulation, not a ticket or a lock), none is a
compare-and-swap or an exchange, none names its own ordering stronger than relaxed, no load is
volatile (a spin on a flag), and no load reads a pointer an atomic updates (its own update, read back;
also through a jit helper's parameters).
Then no program can observe another's atomics before the kernel ends, and the kernel boundary orders
them for whatever runs next. Anything else is declined, whole: a
ticket counter's ordering may be what publishes the accumulations beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.aliasing import aliased_kernels
from diagnose.rewriters.base import InJit, Variant, dotted, is_jit, jit_functions, register
from diagnose.rewriters.blocks import plain_assignments, pointer_roots

__all__ = ["OrderedAtomic", "ordered_atomics"]

_ACCUMULATING = {"tl.atomic_add", "tl.atomic_max", "tl.atomic_min", "tl.atomic_and", "tl.atomic_or", "tl.atomic_xor"}
_SYNCHRONIZING = {"tl.atomic_cas", "tl.atomic_xchg"}
_SEM_POSITION = 3  # atomic_add(pointer, val, mask, sem, scope)


@dataclass(frozen=True)
class OrderedAtomic:
    """An accumulating atomic that leaves its ordering to the default (acq_rel) and discards its result."""

    line: int
    op: str  # e.g. "tl.atomic_add"


def _sem(call: cst.Call) -> cst.BaseExpression | None:
    keyword = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "sem"), None)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return keyword or (positional[_SEM_POSITION].value if len(positional) > _SEM_POSITION else None)


def _bound(fn: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """The arguments of a call to jit function `fn` by the parameter each binds."""
    params = [p.name.value for p in fn.params.params]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    return {**dict(zip(params, positional)), **{a.keyword.value: a.value for a in call.args if a.keyword is not None}}


def _through_parameters(module: cst.Module) -> dict[str, dict[str, set[str]]]:
    """For each jit function, the parameters it (or a jit function it calls) loads through ("read") and
    updates with an accumulating atomic ("updated"): a helper's `tl.load(q + offs)` reads what its caller
    passes as q."""
    kernels = jit_functions(module)
    found: dict[str, dict[str, set[str]]] = {name: {"read": set(), "updated": set()} for name in kernels}
    changed = True
    while changed:  # helpers calling helpers: until nothing more is found
        changed = False
        for name, fn in kernels.items():
            params, assigned = {p.name.value for p in fn.params.params}, plain_assignments(fn)
            for call in (cst.ensure_type(c, cst.Call) for c in m.findall(fn.body, m.Call())):
                callee = dotted(call.func)
                through: list[tuple[str, cst.BaseExpression]] = []
                if callee == "tl.load" and call.args:
                    through.append(("read", call.args[0].value))
                elif callee in _ACCUMULATING and call.args:
                    through.append(("updated", call.args[0].value))
                elif callee in kernels:
                    for param, arg in _bound(kernels[callee], call).items():
                        through += [(kind, arg) for kind in ("read", "updated") if param in found[callee][kind]]
                for kind, address in through:
                    new = pointer_roots(address, assigned) & params - found[name][kind]
                    if new:
                        found[name][kind] |= new
                        changed = True
    return found


class _Reader(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: cst.Module) -> None:
        self.kernels = jit_functions(module)
        self.through = _through_parameters(module)
        self.depth = 0
        self.discarded: set[int] = set()  # id() of calls that are a whole statement
        self.sites: list[OrderedAtomic] = []
        self.blockers: list[str] = []
        self.assigned: dict[str, list[cst.BaseExpression]] = {}  # the current kernel's `name = value`s
        self.updated: dict[str, int] = {}  # pointer an accumulating atomic targets -> its line
        self.read: dict[str, int] = {}  # pointer a load reads -> its line

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += is_jit(node)
        self.assigned = plain_assignments(node)

    def leave_FunctionDef(self, original: cst.FunctionDef) -> None:
        self.depth -= is_jit(original)

    def visit_Expr(self, node: cst.Expr) -> None:
        if isinstance(node.value, cst.Call):
            self.discarded.add(id(node.value))

    def visit_Call(self, node: cst.Call) -> None:
        if not self.depth:
            return
        name, line = dotted(node.func), self.get_metadata(PositionProvider, node).start.line
        if name in _SYNCHRONIZING:
            self.blockers.append(f"line {line}: `{name}` synchronizes through memory")
        elif name in _ACCUMULATING:
            sem = _sem(node)
            if node.args:
                for root in pointer_roots(node.args[0].value, self.assigned):
                    self.updated.setdefault(root, line)
            if id(node) not in self.discarded:
                self.blockers.append(f"line {line}: the result of `{name}` is read (a ticket or a lock may rely on "
                                     "its ordering)")
            elif sem is None:
                self.sites.append(OrderedAtomic(line, name))
            elif not m.matches(sem, m.SimpleString('"relaxed"') | m.SimpleString("'relaxed'")):
                self.blockers.append(f"line {line}: `{name}` asks for its own ordering")
        if name == "tl.load" and node.args:
            for root in pointer_roots(node.args[0].value, self.assigned):
                self.read.setdefault(root, line)
        if name in self.kernels:  # a helper's loads and atomics, through the pointers passed to it
            for param, arg in _bound(self.kernels[name], node).items():
                for kind, seen in (("read", self.read), ("updated", self.updated)):
                    if param in self.through[name][kind]:
                        for root in pointer_roots(arg, self.assigned):
                            seen.setdefault(root, line)
        if name == "tl.load" and any(a.keyword is not None and a.keyword.value == "volatile"
                                       and not m.matches(a.value, m.Name("False")) for a in node.args):
            self.blockers.append(f"line {line}: a volatile load (a spin on a flag) may wait for other programs' atomics")

    def leave_Module(self, original: cst.Module) -> None:
        # A load of what an atomic updates may read its own update back: ordered atomics invalidate L1 after
        # the update (CCTL.IVALL), a relaxed one does not, and a later load may hit a stale L1 line.
        both = sorted(set(self.updated) & set(self.read))
        if both:
            self.blockers.append(f"line {self.read[both[0]]}: the kernel loads from `{both[0]}`, which its atomic "
                                 f"at line {self.updated[both[0]]} updates")


def ordered_atomics(source: str) -> list[OrderedAtomic]:
    """The atomics `relaxed-atomics` relaxes in this module: [] where there are none or where relaxing any
    would be unsafe (see the module's docstring)."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return []
    reader = _Reader(wrapper.module)
    wrapper.visit(reader)
    if aliased_kernels(wrapper.module):
        return []  # `k[grid](x, x)`: a load through one parameter may read the other's relaxed update
    return [] if reader.blockers else reader.sites


class _RelaxAtomics(InJit):
    """`sem="relaxed"` on the sites `ordered_atomics` reads: accumulating atomics that are a statement of
    their own in a kernel and name no ordering."""

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr) -> cst.Expr:
        call = updated.value
        if not self.depth or not isinstance(call, cst.Call) or dotted(call.func) not in _ACCUMULATING or _sem(call):
            return updated
        args = list(call.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(keyword=cst.Name("sem"), value=cst.SimpleString('"relaxed"'),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.changed += 1
        return updated.with_changes(value=call.with_changes(args=args))


@register("relaxed-atomics")
def relaxed_atomics(source: str, context: dict[str, Any]) -> list[Variant]:
    sites = ordered_atomics(source)
    if not sites:
        return []
    t = _RelaxAtomics()
    new = cst.parse_module(source).visit(t)
    return [Variant({"sem": "relaxed", "sites": t.changed}, new.code)] if t.changed else []
