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

from diagnose.rewriters.base import dotted, launch_arguments
from diagnose.rewriters.blocks import code, plain_assignments, pointer_roots

__all__ = ["host_root", "launch_aliases", "reads_other_writes"]


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


def reads_other_writes(fn: cst.FunctionDef) -> bool:
    """Whether a load reads a buffer the kernel stores to at an address no store of that buffer uses."""
    loads, stores = _accesses(fn)
    stored = {root: {code(s) for s in stores if root in _roots(s, fn)}
              for root in set().union(*(_roots(s, fn) for s in stores))}
    return any(code(load) not in stored[root] for load in loads for root in _roots(load, fn) if root in stored)


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
