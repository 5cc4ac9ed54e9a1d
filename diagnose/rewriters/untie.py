"""Tile blocks the tile search (tiles.py) can read by role, made from dot kernels that do not have them:

- `untie_shared_block`: one constexpr that sizes the M rows, the N columns and the K step at once becomes one
  block per role. LLM first drafts of addmm and matmul often write `BLOCK_SIZE` for all three (a 64 x 64 x
  64 tile); the tile search found no tile knobs there and left them to one-knob steps (TritonBench-T's addmm
  on the H100, 2026-12-05: 1.027x against a 2.16x bound, 0.73x of eager);
- `untie_shared_binding`: tile blocks the launch binds to one wrapper local (`BLOCK_M=BS, BLOCK_N=BS`) get a
  local each, so a tile does not set the one local three times.

The roles come from the kernel's structure (dot_roles.py), never from the names; a rewrite applies only where
every use of the blocks gets exactly one role, the kernel is launched at one site, and each launch grid axis
that reads a block follows its role's (a wrapper local bound to a literal gets one local per role, a
`meta['B']` lambda grid reads the role's key, literal `triton.cdiv(n, 64)` divisors are the tile search's to
move). With every new block equal to the old one, the rewritten kernel computes what the draft did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.base import SubstituteNames, dotted, jit_functions, launch_arguments, only_launch
from diagnose.rewriters.blocks import assigned_names, names_in, reaching_value
from diagnose.rewriters.dot_roles import ROLES, Roles, constexpr_params

__all__ = ["Untied", "untie_shared_binding", "untie_shared_block"]


@dataclass(frozen=True)
class Untied:
    """The module with `block` split into one constexpr per role (`names`: role -> the new name)."""

    source: str
    block: str
    names: dict[str, str]


def untie_shared_block(source: str) -> Untied | None:
    """The module with its one launched dot kernel's shared block untied; None where no kernel has one, or
    the roles of its uses cannot all be read (see the module's docstring)."""
    if "dot(" not in source:
        return None
    module = cst.parse_module(source)
    for name, kernel in jit_functions(module).items():
        dots = [c for c in m.findall(kernel, m.Call()) if dotted(cst.ensure_type(c, cst.Call).func) == "tl.dot"]
        launch = only_launch(module, name)
        if len(dots) != 1 or launch is None:
            continue
        for block in constexpr_params(kernel):
            roles = Roles.read(kernel, frozenset({block}), cst.ensure_type(dots[0], cst.Call))
            if roles is not None and len(set(roles.of_use.values())) > 1:
                untied = _rewrite(module, name, kernel, launch, block, roles)
                if untied is not None:
                    return untied
    return None


class _Renamed(cst.CSTTransformer):
    """The kernel's uses of the block renamed by role, and its parameter split into one per role."""

    def __init__(self, kernel: str, block: str, roles: dict[int, str], names: dict[str, str]) -> None:
        self.kernel, self.block, self.roles, self.names = kernel, block, roles, names
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == self.kernel:
            self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value != self.kernel:
            return updated
        self.depth -= 1
        params = []
        for p in updated.params.params:
            if p.name.value != self.block:
                params.append(p)
                continue
            params += [p.with_changes(name=cst.Name(self.names[r])) for r in ROLES if r in self.names]
        return updated.with_changes(params=updated.params.with_changes(params=params))

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        role = self.roles.get(id(original))
        return updated.with_changes(value=self.names[role]) if self.depth and role else updated


def _rewrite(module: cst.Module, name: str, kernel: cst.FunctionDef, launch: tuple[cst.FunctionDef, cst.Call],
             block: str, roles: Roles) -> Untied | None:
    used = set(roles.of_use.values())
    taken = {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}
    names: dict[str, str] = {}
    for role in ROLES:
        if role in used:
            fresh = next((c for c in (f"BLOCK_{role}", f"BLOCK_SIZE_{role}", f"{block}_{role}") if c not in taken), None)
            if fresh is None:
                return None
            names[role] = fresh
    wrapper, call = launch
    arg = launch_arguments(kernel, call).get(block)
    if arg is None:
        return None
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    grid = _grid_of(call, parents)
    if grid is None:
        return None
    value = arg.value
    local = None
    if isinstance(value, cst.Name):
        reaching = reaching_value(value.value, call, parents)
        if reaching is None or not isinstance(reaching[0], cst.Integer) \
                or not _read_only_by(wrapper, value.value, (call, grid), parents):
            return None
        local = value.value
    elif not isinstance(value, cst.Integer):
        return None
    # Each grid axis takes its role's block: the local's name, `meta['B']`, or a literal divisor.
    axes: dict[int, str] = {}
    for axis, element in enumerate(grid.elements):
        reads = local in names_in(element.value) if local else False
        keyed = any(cst.ensure_type(s, cst.SimpleString).evaluated_value == block
                    for s in m.findall(element.value, m.SimpleString()))
        if reads or keyed:
            axis_role = roles.axis_role.get(axis)
            if axis_role is None or axis_role not in names:
                return None
            axes[axis] = axis_role
    transformer = _Rewired(name, kernel, block, names, local, grid, axes, wrapper)
    new = module.visit(_Renamed(name, block, roles.of_use, names)).visit(transformer)
    if not transformer.done:
        return None
    return Untied(new.code, block, names)


def _read_only_by(wrapper: cst.FunctionDef, local: str, readers: tuple[cst.CSTNode, ...],
                  parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether the wrapper reads `local` only inside `readers` (the launch, its grid): a buffer sized by it
    elsewhere would keep the old block once the tile search moves the role's."""
    for name in m.findall(wrapper, m.Name(local)):
        node: cst.CSTNode = name
        if isinstance(parents.get(node), cst.AssignTarget):
            continue
        while node in parents and not any(node is r for r in readers):
            node = parents[node]
        if not any(node is r for r in readers):
            return False
    return True


def _grid_of(call: cst.Call, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> cst.Tuple | None:
    """The launch's grid tuple: written at the launch, bound to a name that reaches it, or a lambda's."""
    index = cst.ensure_type(call.func, cst.Subscript).slice[0].slice
    value = index.value if isinstance(index, cst.Index) else None
    if isinstance(value, cst.Name):
        reaching = reaching_value(value.value, call, parents)
        value = reaching[0] if reaching else None
    if isinstance(value, cst.Lambda):
        value = value.body
    return value if isinstance(value, cst.Tuple) else None


class _WrapperSide(cst.CSTTransformer):
    """What both wrapper rewrites share: knowing when they are in the wrapper, and a local per new block written
    after the shared local's literal (`BLOCK_SIZE = 64` then `BLOCK_M = 64`, ...)."""

    def __init__(self, wrapper: str, local: str | None, new_locals: list[str]) -> None:
        self.wrapper, self.local, self.new_locals = wrapper, local, new_locals
        self.in_wrapper = 0
        self.done = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.in_wrapper += node.name.value == self.wrapper

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.in_wrapper -= original.name.value == self.wrapper
        return updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        if not (self.local and self.in_wrapper) or not m.matches(original, m.SimpleStatementLine(
                body=[m.Assign(targets=[m.AssignTarget(m.Name(self.local))], value=m.Integer())])):
            return updated
        literal = cst.ensure_type(original.body[0], cst.Assign).value
        return cst.FlattenSentinel([updated, *(cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(n))], value=literal)]) for n in self.new_locals)])


class _Rewired(_WrapperSide):
    """The wrapper side: the launch passes one block per role, a local bound to the block's literal gets one
    local per role after it, and each grid axis reads its role's block."""

    def __init__(self, kernel: str, definition: cst.FunctionDef, block: str, names: dict[str, str], local: str | None,
                 grid: cst.Tuple, axes: dict[int, str], wrapper: cst.FunctionDef) -> None:
        super().__init__(wrapper.name.value, local, list(names.values()))
        self.kernel, self.definition, self.block, self.names = kernel, definition, block, names
        self.grid, self.axes = grid, axes

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.Tuple:
        # the grid as found (the kernel's renaming may have rebuilt the nodes around it): in the wrapper only
        if original is not self.grid and not (self.in_wrapper and original.deep_equals(self.grid)):
            return updated
        elements = list(updated.elements)
        for axis, role in self.axes.items():
            new = self.names[role]
            value = elements[axis].value
            if self.local:
                value = value.visit(SubstituteNames({self.local: cst.Name(new)}))  # type: ignore[assignment]
            value = value.visit(_KeySwap(self.block, new))  # type: ignore[assignment]
            elements[axis] = elements[axis].with_changes(value=value)
        return updated.with_changes(elements=elements)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not (isinstance(original.func, cst.Subscript) and dotted(original.func.value) == self.kernel):
            return updated
        bound = launch_arguments(self.definition, updated).get(self.block)
        if bound is None:
            return updated
        args: list[cst.Arg] = []
        for a in updated.args:
            if a is not bound:
                args.append(a)
                continue
            for role in ROLES:
                if role not in self.names:
                    continue
                value = cst.Name(self.names[role]) if self.local else a.value
                args.append(a.with_changes(value=value, keyword=cst.Name(self.names[role])) if a.keyword is not None
                            else a.with_changes(value=value))
        self.done = True
        return updated.with_changes(args=args)


class _KeySwap(cst.CSTTransformer):
    """`meta['B']` -> `meta['NEW']` (the quote kept)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        if original.evaluated_value != self.old:
            return updated
        quote = original.value[0]
        return updated.with_changes(value=f"{quote}{self.new}{quote}")


def untie_shared_binding(source: str, kernel: str, axis_block: Mapping[int, str]) -> Untied | None:
    """The module with the launch of `kernel` passing its own wrapper local to each tile block that it passed
    one shared local bound to a literal (`BLOCK_M=BLOCK, BLOCK_N=BLOCK`), and each grid axis that read the
    shared local reading its block's (`axis_block`: the grid axis each block's program id steps); None where
    the launch shares no such local, the local is not a literal, or a grid axis reads it for no block."""
    module = cst.parse_module(source)
    definition = jit_functions(module).get(kernel)
    launch = only_launch(module, kernel)
    if definition is None or launch is None:
        return None
    wrapper, call = launch
    bound = launch_arguments(definition, call)
    blocks = set(axis_block.values()) | {k for k in bound if k.startswith("BLOCK") and k.endswith("_K")}
    by_local: dict[str, list[str]] = {}
    for key in sorted(blocks, key=lambda k: ("MNK".find(k[-1]), k)):  # the locals in M, N, K order
        arg = bound.get(key)
        if arg is not None and isinstance(arg.value, cst.Name):
            by_local.setdefault(arg.value.value, []).append(key)
    shared = [(local, keys) for local, keys in by_local.items() if len(keys) > 1]
    if len(shared) != 1:
        return None
    local, keys = shared[0]
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    reaching = reaching_value(local, call, parents)
    grid = _grid_of(call, parents)
    taken = set(assigned_names(wrapper.body)) | {p.name.value for p in wrapper.params.params}
    if reaching is None or not isinstance(reaching[0], cst.Integer) or grid is None or set(keys) & taken \
            or not _read_only_by(wrapper, local, (call, grid), parents):
        return None
    axes: dict[int, str] = {}
    for axis, element in enumerate(grid.elements):
        if local in names_in(element.value):
            if axis_block.get(axis) not in keys:
                return None
            axes[axis] = axis_block[axis]
    names = {key: key for key in keys}
    rewired = _Rebound(local, names, grid, axes, call, wrapper.name.value, definition)
    new = module.visit(rewired)
    return Untied(new.code, local, names) if rewired.done else None


class _Rebound(_WrapperSide):
    """The wrapper side of `untie_shared_binding`: a local per block after the shared one, the launch passing
    each block its own, each grid axis reading its block's."""

    def __init__(self, local: str, names: dict[str, str], grid: cst.Tuple, axes: dict[int, str], call: cst.Call,
                 wrapper: str, definition: cst.FunctionDef) -> None:
        super().__init__(wrapper, local, list(names.values()))
        self.shared = local  # never None here
        self.names, self.grid, self.axes, self.call, self.definition = names, grid, axes, call, definition

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.Tuple:
        if original is not self.grid:
            return updated
        elements = list(updated.elements)
        for axis, key in self.axes.items():
            value = elements[axis].value.visit(SubstituteNames({self.shared: cst.Name(self.names[key])}))
            elements[axis] = elements[axis].with_changes(value=value)
        return updated.with_changes(elements=elements)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if original is not self.call:
            return updated
        key_of = {id(a): key for key, a in launch_arguments(self.definition, updated).items() if key in self.names}
        args = [a.with_changes(value=cst.Name(self.names[key_of[id(a)]]))
                if id(a) in key_of and m.matches(a.value, m.Name(self.shared)) else a for a in updated.args]
        self.done = True
        return updated.with_changes(args=args)
