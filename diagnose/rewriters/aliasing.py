"""Whether a rewrite that reorders a kernel's accesses could let code read what other code already wrote.

Rewrites that cut a program's tile into pieces (a row's chunks on a second grid axis, a row walked in
chunks by one program) keep each element's arithmetic but change when each store happens relative to
the loads. That is sound only where no load reads memory a store of the same launch writes, other
than the very elements it stores back (`x = f(x)` in place). Two ways to break it, both found by an
adversarial review on the interpreter:

- in the kernel: a load from a buffer the kernel stores to, at another address (`first = tl.load(X + row)`,
  then the whole row stored over X: a chunk that runs later reads the first element already rewritten);
- at the launch: two pointer parameters handed views of one host tensor, one stored, the other loaded
  (`kernel[grid](buf, buf[:, 1:], ...)`: each chunk's store lands on columns the next chunk loads), also
  through the wrapper's names (`y = x`).

The same facts decide other rewrites: a kernel that loads what it stores reads the zeros an output was
made with (empty outputs), or runs differently twice on the same buffers (an autotuner's reruns); a copy
the wrapper makes is needed where the kernel writes the original or the wrapper changes it in place (fold).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted, jit_functions, launch_arguments, launching_function
from diagnose.rewriters.blocks import code, plain_assignments, pointer_roots

__all__ = ["accessed_parameters", "aliased_kernels", "host_aliases", "host_root", "launch_aliases", "loads_what_it_stores",
           "mutated_in_place", "reads_other_writes"]


def _accesses(fn: cst.FunctionDef) -> tuple[list[tuple[cst.BaseExpression, set[str]]],
                                             list[tuple[cst.BaseExpression, set[str]]]]:
    """Every load and every store (atomics count as both) of the kernel: its address, and the parameters
    that address starts from (`blocks.pointer_roots`, through the kernel's plain assignments)."""
    params = {p.name.value for p in fn.params.params}
    assigned = plain_assignments(fn)
    loads: list[tuple[cst.BaseExpression, set[str]]] = []
    stores: list[tuple[cst.BaseExpression, set[str]]] = []
    for node in m.findall(fn, m.Call()):
        call = cst.ensure_type(node, cst.Call)
        name = dotted(call.func)
        if not call.args or not (name in ("tl.load", "tl.store") or name.startswith("tl.atomic_")):
            continue
        address = call.args[0].value
        access = (address, pointer_roots(address, assigned) & params)
        if name != "tl.store":
            loads.append(access)
        if name != "tl.load":
            stores.append(access)
    return loads, stores


def accessed_parameters(fn: cst.FunctionDef) -> tuple[set[str], set[str]]:
    """The parameters the kernel loads through and those it stores through (atomics: both)."""
    loads, stores = _accesses(fn)
    return set().union(*(roots for _, roots in loads)), set().union(*(roots for _, roots in stores))


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
    stored_at: dict[str, set[str]] = {}
    for address, roots in stores:
        for root in roots:
            stored_at.setdefault(root, set()).add(code(address))
    return any(code(address) not in stored_at[root] for address, roots in loads for root in roots if root in stored_at)


def loads_what_it_stores(fn: cst.FunctionDef) -> bool:
    """Whether the kernel loads any buffer it stores to, at any address (`out = load(out) + x`)."""
    loaded, stored = accessed_parameters(fn)
    return bool(loaded & stored)


# Tensor methods and attributes that return a view of the tensor (`contiguous` and `reshape` may copy:
# counted as views, the safe side).
_VIEW_METHODS = frozenset({"view", "view_as", "reshape", "reshape_as", "contiguous", "t", "transpose", "permute",
                           "expand", "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "narrow", "select",
                           "as_strided", "detach", "unfold", "movedim", "swapaxes", "diagonal", "split", "chunk"})
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})


def host_root(node: cst.BaseExpression) -> str | None:
    """The host tensor a launch argument views: `buf` of `buf`, `buf[:, 1:]`, `buf.view(-1)`, `buf.T`,
    `buf.contiguous()`; None for anything else (a new tensor: `torch.empty_like(x)` views nothing)."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Attribute) and node.attr.value in _VIEW_ATTRIBUTES:
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in _VIEW_METHODS:
            node = node.func.value
        else:
            return None


def _views(scope: cst.CSTNode | None) -> dict[str, str]:
    """Names the host code binds once to a view of another (`y = x`, `y = x.view(-1)`): name -> that tensor."""
    if scope is None:
        return {}
    bound: dict[str, list[str | None]] = {}
    for node in m.findall(scope, m.Assign() | m.AugAssign() | m.AnnAssign()):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            bound.setdefault(node.targets[0].target.value, []).append(host_root(node.value))
        else:
            for target in ([t.target for t in node.targets] if isinstance(node, cst.Assign)
                           else [cst.ensure_type(node, cst.AugAssign | cst.AnnAssign).target]):  # type: ignore[arg-type]
                if isinstance(target, cst.Name):
                    bound.setdefault(target.value, []).append(None)
    return {name: roots[0] for name, roots in bound.items() if len(roots) == 1 and roots[0] is not None}


def _resolved(name: str | None, views: dict[str, str]) -> str | None:
    for _ in range(8):
        if name is None or name not in views or views[name] == name:
            return name
        name = views[name]
    return name


def host_aliases(scope: cst.CSTNode, name: str) -> set[str]:
    """`name` and the names `scope` binds once to a view of the same host tensor (`z = y`, `y = y0.view(-1)`):
    what a write to any of them may change."""
    views = _views(scope)
    root = _resolved(name, views)
    return {name} | {n for n in views if _resolved(n, views) == root} | ({root} if root else set())


def launch_aliases(fn: cst.FunctionDef, call: cst.Call, scope: cst.CSTNode | None = None) -> bool:
    """Whether the launch hands a parameter the kernel stores through and another it loads through views of
    one host tensor (`kernel[grid](buf, buf[:, 1:])`; with the launching function as `scope`, also through
    its names bound once to a view, `y = x` then `kernel[grid](x, y)`)."""
    loaded, stored = accessed_parameters(fn)
    views = _views(scope)
    hosts = {param: _resolved(host_root(arg.value), views) for param, arg in launch_arguments(fn, call).items()}
    return any(p != q and hosts.get(p) is not None and hosts.get(p) == hosts.get(q)
               for p in stored for q in loaded)


def aliased_kernels(module: cst.Module) -> set[str]:
    """The module's kernels that some launch of it hands views of one tensor to a stored and a loaded
    parameter (`launch_aliases`)."""
    return {name for name, fn in jit_functions(module).items()
            if any(launch_aliases(fn, call := cst.ensure_type(c, cst.Call), launching_function(module, call))
                   for c in m.findall(module, m.Call(func=m.Subscript(value=m.Name(name)))))}
