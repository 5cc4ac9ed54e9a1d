"""eviction-hints: L2 eviction priorities for a kernel that streams one operand past another it re-reads.

A memory-bound kernel often reads two kinds of data: an operand each program reads once and no other
program touches (a row of x in a norm, a block of A's rows in a GEMV), and one every program reads
again (the norm's weight and bias, the GEMV's vector). Under LRU the stream evicts the shared operand
from L2 as fast as it passes, and every program fetches it from DRAM again. `tl.load(...,
eviction_policy=...)` lowers on sm90 to `createpolicy.fractional.L2::evict_first|evict_last` and a
`ld.global.L1::evict_*.L2::cache_hint` with that policy (LoadOpConversion in
third_party/nvidia/lib/TritonNVIDIAGPUToLLVM/LoadStoreOpToLLVM.cpp): the stream marked evict_first
leaves first, the shared operand marked evict_last stays. A hint changes no value, so the rewrite is
always correct; only the judge says whether it pays.

Which loads are which is read from their addresses, per kernel (a @triton.jit function that calls
`tl.program_id`; helpers, whose parameters could be anything, are left alone):
- *shared*: the address depends on no program axis (no `tl.program_id`, directly or through locals,
  loop targets included);
- *streamed*: the address depends on every program axis the kernel reads, and its pointer is loaded at
  that one site only (a two-pass kernel reads its row again in a second loop: evict_first would throw
  away what the second pass needs).
Loads that already name an eviction policy or a cache modifier, or are volatile, are left as written;
so are loads whose address is loaded itself (a gather's index, a work-stealing counter: any program may
get any row), loads a loop repeats with an address that does not move with it, and kernels that divide
or take a program index modulo something (a flat grid mapped onto rows and columns, a GROUP_M swizzle:
one axis then reaches addresses other programs share). Kernels with `tl.dot` are declined: a dot's
operand tiles are re-read by the programs of the other output axis, which this reading of addresses
cannot tell from a stream. The rewrite applies where a kernel has both kinds, and its variants
are: both hints, the streams' evict_first alone, the shared operands' evict_last alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.base import Variant, dotted, is_jit, jit_functions, program_axis, register, with_keywords
from diagnose.rewriters.blocks import names_in, plain_assignments, pointer_roots

__all__ = ["EvictionSites", "eviction_sites"]

_HINTED = {"eviction_policy", "cache_modifier"}


@dataclass(frozen=True)
class EvictionSites:
    """A kernel's loads the rewrite would hint, by line: streamed (evict_first) and shared (evict_last)."""

    kernel: str
    streamed: tuple[int, ...]
    shared: tuple[int, ...]


_UNKNOWN = -2  # a local whose value the program axes do not decide: loaded, or bound by an unpaired unpacking


def _bindings(fn: cst.FunctionDef) -> list[tuple[set[str], cst.CSTNode | None]]:
    """Every binding of a local in the kernel: (names, the value they are bound to; None where unknown):
    plain and augmented assignments, loop targets, unpackings paired element by element."""
    out: list[tuple[set[str], cst.CSTNode | None]] = []
    for node in m.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                target, value = t.target, node.value
                if isinstance(target, cst.Name):
                    out.append(({target.value}, value))
                elif (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))
                      and len(target.elements) == len(value.elements)
                      and not any(isinstance(e, cst.StarredElement) for e in [*target.elements, *value.elements])):
                    out += [(names_in(te.value), ve.value) for te, ve in zip(target.elements, value.elements)]
                else:
                    out.append((names_in(target), None))
        elif isinstance(node, cst.AugAssign):
            out.append((names_in(node.target), node.value))
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            out.append((names_in(node.target), node.value))
        elif isinstance(node, cst.For):
            out.append((names_in(node.target), node.iter))
    return out


def _spread(bindings: list[tuple[set[str], cst.CSTNode | None]], origin: Callable[[cst.CSTNode | None], set[int]],
            seeds: dict[str, set[int]] | None = None) -> dict[str, set[int]]:
    """What each local's value depends on, to a fixed point: `origin` of the values bound to it, and what
    the locals those values read depend on."""
    found: dict[str, set[int]] = {k: set(v) for k, v in (seeds or {}).items()}
    changed = True
    while changed:
        changed = False
        for targets, value in bindings:
            reach = origin(value) | ({a for n in names_in(value) for a in found.get(n, set())} if value is not None else set())
            for name in targets:
                if not reach <= found.get(name, set()):
                    found[name] = found.get(name, set()) | reach
                    changed = True
    return found


def _axes(value: cst.CSTNode | None) -> set[int]:
    """The program axes an expression reads directly, and _UNKNOWN where it loads (a gather's index, a
    work-stealing counter: any program may get any value)."""
    if value is None:
        return {_UNKNOWN}
    out = _direct_axes(value)
    called = {dotted(cst.ensure_type(c, cst.Call).func) for c in m.findall(value, m.Call())}
    if any(name == "tl.load" or name.startswith("tl.atomic_") for name in called):
        out.add(_UNKNOWN)
    return out


def _direct_axes(node: cst.CSTNode) -> set[int]:
    out: set[int] = set()
    for call in m.findall(node, m.Call()):
        call = cst.ensure_type(call, cst.Call)
        if dotted(call.func) == "tl.program_id":
            axis = program_axis(call)
            out.add(axis if axis is not None else -1)  # -1: an axis not written as a literal
    return out


def _hinted(call: cst.Call) -> bool:
    """A load to leave as written: one that names a policy, a cache modifier or volatility (by keyword, or
    positionally past `pointer, mask, other, boundary_check`), or spreads its arguments with `*`."""
    return len([a for a in call.args if a.keyword is None]) > 4 or any(a.star for a in call.args) or any(
        a.keyword is not None and (a.keyword.value in _HINTED or
                                   (a.keyword.value == "volatile" and not m.matches(a.value, m.Name("False"))))
        for a in call.args)


def _remapped(fn: cst.FunctionDef, axes: dict[str, set[int]]) -> bool:
    """Whether a program index is divided or taken modulo something (`pid // n`, `pid % n`): a flat grid
    mapped onto rows and columns, or a GROUP_M swizzle, where one axis reaches addresses other programs
    share."""
    for node in m.findall(fn.body, m.BinaryOperation(operator=m.FloorDivide() | m.Modulo())):
        if _direct_axes(node) or any(axes.get(n, set()) - {_UNKNOWN} for n in names_in(node)):
            return True
    return False


def _loop_invariant(fn: cst.FunctionDef, bindings: list[tuple[set[str], cst.CSTNode | None]]) -> set[int]:
    """id() of the loads inside a loop whose address does not move with it: read again every iteration."""
    out: set[int] = set()
    for loop in (cst.ensure_type(n, cst.For) for n in m.findall(fn.body, m.For())):
        moving = {n for n, marks in _spread(bindings, lambda _v: set(), {t: {0} for t in names_in(loop.target)}).items()
                  if marks}
        for call in (cst.ensure_type(c, cst.Call) for c in m.findall(loop.body, m.Call())):
            if dotted(call.func) == "tl.load" and call.args and not names_in(call.args[0].value) & moving:
                out.add(id(call))
    return out


def _classify(fn: cst.FunctionDef) -> tuple[list[cst.Call], list[cst.Call]] | None:
    """(streamed loads, shared loads) of a kernel, or None where the kernel is not one to hint."""
    calls = [cst.ensure_type(c, cst.Call) for c in m.findall(fn.body, m.Call())]
    if any(dotted(c.func) == "tl.dot" for c in calls):
        return None
    used = _direct_axes(fn.body)
    if not used or -1 in used:
        return None
    bindings = _bindings(fn)
    axes, assigned = _spread(bindings, _axes), plain_assignments(fn)
    if _remapped(fn, axes):
        return None
    again = _loop_invariant(fn, bindings)
    loads = [c for c in calls if dotted(c.func) == "tl.load" and c.args and c.args[0].keyword is None
             and not c.args[0].star]
    roots: dict[str, int] = {}
    for c in loads:
        for root in pointer_roots(c.args[0].value, assigned):
            roots[root] = roots.get(root, 0) + 1
    streamed, shared = [], []
    for c in loads:
        if _hinted(c):
            continue
        address = c.args[0].value
        reach = _axes(address) | {a for n in names_in(address) for a in axes.get(n, set())}
        if not reach:
            shared.append(c)
        elif reach == used and id(c) not in again and all(roots[r] == 1 for r in pointer_roots(address, assigned)):
            streamed.append(c)
    return (streamed, shared) if streamed and shared else None


class _Hint(cst.CSTTransformer):
    def __init__(self, policies: dict[int, str]) -> None:
        self.policies = policies  # id() of an original load -> the policy it gets

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        policy = self.policies.get(id(original))
        if policy is None:
            return updated
        return with_keywords(updated, {"eviction_policy": cst.SimpleString(f'"{policy}"')})


def eviction_sites(source: str) -> list[EvictionSites]:
    """Every kernel of `source` the rewrite applies to, with the lines of the loads it would hint."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    positions = wrapper.resolve(PositionProvider)
    out = []
    for name, fn in jit_functions(wrapper.module).items():
        found = _classify(fn) if is_jit(fn) else None
        if found is not None:
            line = lambda c: positions[c].start.line  # noqa: E731
            out.append(EvictionSites(name, tuple(line(c) for c in found[0]), tuple(line(c) for c in found[1])))
    return out


@register("eviction-hints")
def eviction_hints(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    streamed: list[cst.Call] = []
    shared: list[cst.Call] = []
    for fn in jit_functions(module).values():
        found = _classify(fn)
        if found is not None:
            streamed += found[0]
            shared += found[1]
    if not streamed:
        return []
    plans = [({**{id(c): "evict_first" for c in streamed}, **{id(c): "evict_last" for c in shared}},
              {"evict_first": len(streamed), "evict_last": len(shared)}),
             ({id(c): "evict_first" for c in streamed}, {"evict_first": len(streamed)}),
             ({id(c): "evict_last" for c in shared}, {"evict_last": len(shared)})]
    return [Variant(params, module.visit(_Hint(policies)).code) for policies, params in plans]
