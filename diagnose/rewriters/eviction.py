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
Loads that already name an eviction policy or a cache modifier, or are volatile, are left as written.
Kernels with `tl.dot` are declined: a dot's operand tiles are re-read by the programs of the other
output axis (and of a GROUP_M swizzle, which maps one program axis onto both), which this reading of
addresses cannot tell from a stream. The rewrite applies where a kernel has both kinds, and its variants
are: both hints, the streams' evict_first alone, the shared operands' evict_last alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from diagnose.rewriters.base import Variant, dotted, is_jit, jit_functions, program_axis, register
from diagnose.rewriters.blocks import names_in, plain_assignments, pointer_roots

__all__ = ["EvictionSites", "eviction_sites"]

_HINTED = {"eviction_policy", "cache_modifier"}


@dataclass(frozen=True)
class EvictionSites:
    """A kernel's loads the rewrite would hint, by line: streamed (evict_first) and shared (evict_last)."""

    kernel: str
    streamed: tuple[int, ...]
    shared: tuple[int, ...]


def _axes_of(fn: cst.FunctionDef) -> dict[str, set[int]]:
    """Each local's program axes: those of the `tl.program_id` calls its bindings reach (plain and augmented
    assignments, loop targets), to a fixed point."""
    bindings: list[tuple[set[str], cst.CSTNode]] = []
    for node in m.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
        if isinstance(node, cst.Assign):
            bindings.append(({n for t in node.targets for n in names_in(t.target)}, node.value))
        elif isinstance(node, cst.AugAssign):
            bindings.append((names_in(node.target), node.value))
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            bindings.append((names_in(node.target), node.value))
        elif isinstance(node, cst.For):
            bindings.append((names_in(node.target), node.iter))
    axes: dict[str, set[int]] = {}
    changed = True
    while changed:
        changed = False
        for targets, value in bindings:
            found = _direct_axes(value) | {a for n in names_in(value) for a in axes.get(n, set())}
            for name in targets:
                if not found <= axes.get(name, set()):
                    axes[name] = axes.get(name, set()) | found
                    changed = True
    return axes


def _direct_axes(node: cst.CSTNode) -> set[int]:
    out: set[int] = set()
    for call in m.findall(node, m.Call()):
        call = cst.ensure_type(call, cst.Call)
        if dotted(call.func) == "tl.program_id":
            axis = program_axis(call)
            out.add(axis if axis is not None else -1)  # -1: an axis not written as a literal
    return out


def _hinted(call: cst.Call) -> bool:
    return any(a.keyword is not None and (a.keyword.value in _HINTED or
                                          (a.keyword.value == "volatile" and not m.matches(a.value, m.Name("False"))))
               for a in call.args)


def _classify(fn: cst.FunctionDef) -> tuple[list[cst.Call], list[cst.Call]] | None:
    """(streamed loads, shared loads) of a kernel, or None where the kernel is not one to hint."""
    calls = [cst.ensure_type(c, cst.Call) for c in m.findall(fn.body, m.Call())]
    if any(dotted(c.func) == "tl.dot" for c in calls):
        return None
    used = _direct_axes(fn.body)
    if not used or -1 in used:
        return None
    axes, assigned = _axes_of(fn), plain_assignments(fn)
    loads = [c for c in calls if dotted(c.func) == "tl.load" and c.args and c.args[0].keyword is None]
    roots: dict[str, int] = {}
    for c in loads:
        for root in pointer_roots(c.args[0].value, assigned):
            roots[root] = roots.get(root, 0) + 1
    streamed, shared = [], []
    for c in loads:
        if _hinted(c):
            continue
        address = c.args[0].value
        reach = _direct_axes(address) | {a for n in names_in(address) for a in axes.get(n, set())}
        if not reach:
            shared.append(c)
        elif reach == used and all(roots[r] == 1 for r in pointer_roots(address, assigned)):
            streamed.append(c)
    return (streamed, shared) if streamed and shared else None


class _Hint(cst.CSTTransformer):
    def __init__(self, policies: dict[int, str]) -> None:
        self.policies = policies  # id() of an original load -> the policy it gets

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        policy = self.policies.get(id(original))
        if policy is None:
            return updated
        args = list(updated.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(args=[*args, cst.Arg(cst.SimpleString(f'"{policy}"'),
                                                         keyword=cst.Name("eviction_policy"),
                                                         equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                                               cst.SimpleWhitespace("")))])


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
