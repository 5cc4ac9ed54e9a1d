"""Whether a rewrite that reorders a kernel's accesses could let code read what other code already wrote.

Rewrites that cut a program's tile into pieces (a row's chunks on a second grid axis, a row walked in
chunks by one program) keep each element's arithmetic but change when each store happens relative to
the loads. That is sound only where no load reads memory a store of the same launch writes, other
than the very elements it stores back (`x = f(x)` in place). Two ways to break it, both found by an
adversarial review on the interpreter:

- in the kernel: a load from a buffer the kernel stores to, at another address (`first = tl.load(X + row)`,
  then the whole row stored over X: a chunk that runs later reads the first element already rewritten);
- at the launch: two pointer parameters handed views of one host tensor, one stored, the other loaded
  (`kernel[grid](buf, buf[:, 1:], ...)`: each chunk's store lands on columns the next chunk loads).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted, jit_functions, launch_arguments
from diagnose.rewriters.blocks import code, plain_assignments, pointer_roots

__all__ = ["accessed_parameters", "aliased_kernels", "host_root", "mutated_in_place", "launch_aliases", "loads_what_it_stores", "reads_other_writes"]


def _accesses(fn: cst.FunctionDef) -> tuple[list[cst.BaseExpression], list[cst.BaseExpression]]:
    """The address of every load and every store (atomics count as both) in the kernel."""
    loads: list[cst.BaseExpression] = []
    stores: list[cst.BaseExpression] = []
    for node in m.findall(fn, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        name = dotted(call.func)
        if not call.args:
            continue
        address = call.args[0].value
        if name == "tl.load":
            loads.append(address)
        elif name == "tl.store":
            stores.append(address)
        elif name.startswith("tl.atomic_"):
            loads.append(address)
            stores.append(address)
    return loads, stores


def _roots(address: cst.BaseExpression, fn: cst.FunctionDef) -> set[str]:
    params = {p.name.value for p in fn.params.params}
    return pointer_roots(address, plain_assignments(fn)) & params


def accessed_parameters(fn: cst.FunctionDef) -> tuple[set[str], set[str]]:
    """The parameters the kernel loads through and those it stores through (atomics: both)."""
    loads, stores = _accesses(fn)
    return set().union(*(_roots(a, fn) for a in loads)), set().union(*(_roots(a, fn) for a in stores))


def mutated_in_place(fn: cst.FunctionDef, name: str) -> bool:
    """Whether host code `fn` may change tensor `name` in place: `name.add_(...)` (a method ending in one
    underscore), `name[...] = ...`, `name += ...`, or `out=name`."""
    for node in m.findall(fn, m.Call() | m.Assign() | m.AugAssign()):
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and m.matches(func.value, m.Name(name)) \
                    and func.attr.value.endswith("_") and not func.attr.value.startswith("_"):
                return True
            if any(a.keyword is not None and a.keyword.value == "out" and host_root(a.value) == name for a in node.args):
                return True
        elif isinstance(node, cst.AugAssign):
            if host_root(node.target) == name:
                return True
        elif any(isinstance(t.target, cst.Subscript) and host_root(t.target) == name
                 for t in cst.ensure_type(node, cst.Assign).targets):
            return True
    return False


def reads_other_writes(fn: cst.FunctionDef) -> bool:
    """Whether a load reads a buffer the kernel stores to at an address no store of that buffer uses."""
    loads, stores = _accesses(fn)
    stored = {root: {code(s) for s in stores if root in _roots(s, fn)}
              for root in set().union(*(_roots(s, fn) for s in stores))}
    return any(code(load) not in stored[root] for load in loads for root in _roots(load, fn) if root in stored)


def loads_what_it_stores(fn: cst.FunctionDef) -> bool:
    """Whether the kernel loads any buffer it stores to, at any address (`out = load(out) + x`)."""
    loads, stores = _accesses(fn)
    stored = set().union(*(_roots(s, fn) for s in stores))
    return any(_roots(load, fn) & stored for load in loads)


def host_root(node: cst.BaseExpression) -> str | None:
    """The host tensor a launch argument views: `buf` of `buf`, `buf[:, 1:]`, `buf.view(-1)`, `buf.T`,
    `buf.contiguous()` (which may or may not copy: counted as a view); None for anything else."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        else:
            return None


def launch_aliases(fn: cst.FunctionDef, call: cst.Call) -> bool:
    """Whether the launch hands a parameter the kernel stores through and another it loads through views of
    one host tensor (`kernel[grid](buf, buf[:, 1:])`)."""
    loads, stores = _accesses(fn)
    loaded = set().union(*(_roots(a, fn) for a in loads))
    stored = set().union(*(_roots(a, fn) for a in stores))
    hosts = {param: host_root(arg.value) for param, arg in launch_arguments(fn, call).items()}
    return any(p != q and hosts.get(p) is not None and hosts.get(p) == hosts.get(q)
               for p in stored for q in loaded)


def aliased_kernels(module: cst.Module) -> set[str]:
    """The module's kernels that some launch of it hands views of one tensor to a stored and a loaded
    parameter (`launch_aliases`)."""
    return {name for name, fn in jit_functions(module).items()
            if any(launch_aliases(fn, cst.ensure_type(c, cst.Call))
                   for c in m.findall(module, m.Call(func=m.Subscript(value=m.Name(name)))))}
