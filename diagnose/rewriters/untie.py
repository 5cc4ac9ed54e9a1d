"""Untie a dot kernel's shared block: one constexpr that sizes the M rows, the N columns and the K step of a
`tl.dot` tile at once becomes one block per role, so the tile search (tiles.py) can give it a Hopper tile.

LLM first drafts of addmm and matmul often write `BLOCK_SIZE` for all three (a 64 x 64 x 64 tile): the tile
search reads tile knobs by their roles (BLOCK_M, BLOCK_N, BLOCK_K) and found none, so the drafts were left to
one-knob steps (TritonBench-T's addmm on the H100, 2026-12-05: 1.027x against a 2.16x bound, 0.73x of
eager). The roles come from the kernel's structure, never from the name:

- the program axes: `pid = tl.program_id(i)`, an axis read as the rows of the dot's first operand is M,
  one read as the columns of its second is N (the names its loads' addresses are built from);
- the K loop: the `for` around the dot whose range steps by the block (`range(0, K, B)`), or counts
  `tl.cdiv(K, B)` steps (`k * B` is then a K offset);
- every use of the block takes the role of what it is combined with: `pid_m * B` an axis's role,
  `rm = pid_m * B + tl.arange(0, B)` the role of its other term, `tl.arange(0, B)` bound alone to a name
  the role of where that name indexes the dot's operands (`rk[None, :]` in the first operand's address is
  K), `acc = tl.zeros((B, B))` the accumulator's M x N, `a_ptrs += B * stride` in the K loop a K step.

It applies only where every use gets exactly one role and no name is read in two roles (a kernel that
relies on the block being square stays as written); the kernel is launched at one site, and the launch
grid's axes follow the new blocks (a wrapper local bound to a literal gets one local per role, a
`meta['B']` lambda grid reads the role's key, literal `triton.cdiv(n, 64)` divisors are the tile search's
to move). With every new block equal to the old one, the untied kernel computes what the draft did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.base import dotted, jit_functions, launch_arguments, only_launch, program_axis
from diagnose.rewriters.blocks import assigned_names, names_in, reaching_value

__all__ = ["Untied", "untie_shared_binding", "untie_shared_block"]

_ROLES = ("M", "N", "K")


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
        if len(dots) != 1 or only_launch(module, name) is None:
            continue
        for block in _constexpr_params(kernel):
            roles = _Roles.read(kernel, block, cst.ensure_type(dots[0], cst.Call))
            if roles is not None and len(set(roles.of_use.values())) > 1:
                untied = _rewrite(module, name, kernel, block, roles)
                if untied is not None:
                    return untied
    return None


def _constexpr_params(kernel: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in kernel.params.params
            if p.annotation is not None and dotted(p.annotation.annotation).endswith("constexpr")]


@dataclass
class _Roles:
    """The role of each use of the block in the kernel (by node identity) and each program axis's role."""

    of_use: dict[int, str]
    axis_role: dict[int, str]

    @classmethod
    def read(cls, kernel: cst.FunctionDef, block: str, dot: cst.Call) -> _Roles | None:
        if len(dot.args) < 2 or not all(isinstance(a.value, cst.Name) for a in dot.args[:2]):
            return None
        parents = MetadataWrapper(cst.Module(body=[kernel]), unsafe_skip_copy=True).resolve(ParentNodeProvider)
        values = _assigned_values(kernel)
        pids = {n: axis for n, vs in values.items() if len(vs) == 1 and (axis := program_axis(vs[0])) is not None}
        loop = _k_loop(dot, block, parents)
        if loop is None:
            return None
        loop_var, counts = loop
        operands = [cst.ensure_type(a.value, cst.Name).value for a in dot.args[:2]]
        # The names each operand's address is built from, and how each name indexes it ([:, None] or [None, :]).
        reads = [_address_names(o, values) for o in operands]
        axis_role: dict[int, str] = {}
        for role, (names, _) in zip("MN", reads):
            for pid in names & set(pids):
                if axis_role.get(pids[pid], role) != role:
                    return None
                axis_role[pids[pid]] = role
        # Rows of the first operand are M, its columns K; rows of the second K, its columns N.
        placed: dict[str, str] = {}
        for (_, positions), (row, col) in zip(reads, (("M", "K"), ("K", "N"))):
            for name, position in positions:
                role = row if position == 0 else col
                if placed.setdefault(name, role) != role:
                    return None
        return cls._resolve(kernel, block, parents, values, pids, axis_role, loop_var, counts, placed)

    @classmethod
    def _resolve(cls, kernel: cst.FunctionDef, block: str, parents: Mapping[cst.CSTNode, cst.CSTNode],
                 values: dict[str, list[cst.BaseExpression]], pids: dict[str, int], axis_role: dict[int, str],
                 loop_var: str, counts: bool, placed: dict[str, str]) -> _Roles | None:
        uses = [n for n in m.findall(kernel.body, m.Name(block)) if isinstance(n, cst.Name)]
        name_role: dict[str, str] = dict(placed)
        if not counts:
            name_role.setdefault(loop_var, "K")
        if name_role.get(loop_var, "K") != "K":
            return None
        of_use: dict[int, str] = {}
        for _ in range(len(uses) + len(values) + 1):  # to a fixed point: each pass settles a use or a name
            progress = False
            for use in uses:
                if id(use) not in of_use:
                    role = _use_role(use, parents, pids, axis_role, loop_var, counts, name_role, values)
                    if role is not None:
                        of_use[id(use)] = role
                        progress = True
            for name, vs in values.items():
                read = [_value_roles(v, of_use, name_role, loop_var, counts) for v in vs]
                if any(r is None for r in read):
                    continue  # an address, a mask or a tile: not a 1-D offset along one role
                roles = {r for rs in read if rs is not None for r in rs}
                if len(roles) > 1 or (roles and name_role.get(name, next(iter(roles))) != next(iter(roles))):
                    return None  # a name read in two roles: the kernel relies on a square tile
                if roles and name not in name_role:
                    name_role[name] = roles.pop()
                    progress = True
            if not progress:
                break
        if len(of_use) != len(uses):
            return None
        return cls(of_use, axis_role)


def _assigned_values(kernel: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """Each name the kernel assigns, with every value it is given (`x = v`, `x += v`, `x: T = v`)."""
    out: dict[str, list[cst.BaseExpression]] = {}
    for node in m.findall(kernel.body, m.Assign() | m.AugAssign() | m.AnnAssign()):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        else:
            targets = [cst.ensure_type(node, (cst.AugAssign, cst.AnnAssign)).target]  # type: ignore[arg-type]
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, cst.Name) and value is not None:
                out.setdefault(target.value, []).append(value)
    return out


def _k_loop(dot: cst.Call, block: str, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> tuple[str, bool] | None:
    """The loop variable of the `for` around the dot that steps by the block (False) or counts
    `tl.cdiv(_, block)` steps (True); None without one."""
    node: cst.CSTNode = dot
    while node in parents:
        node = parents[node]
        if not (isinstance(node, cst.For) and isinstance(node.target, cst.Name) and isinstance(node.iter, cst.Call)
                and dotted(node.iter.func) in ("range", "tl.range")):
            continue
        args = [a.value for a in node.iter.args if a.keyword is None]
        if len(args) >= 3 and m.matches(args[2], m.Name(block)):
            return node.target.value, False
        stop = args[1] if len(args) >= 2 else args[0] if args else None
        if stop is not None and m.matches(stop, m.Call(args=[m.DoNotCare(), m.Arg(value=m.Name(block))])) \
                and dotted(cst.ensure_type(stop, cst.Call).func) in ("tl.cdiv", "triton.cdiv"):
            return node.target.value, True
    return None


def _address_names(operand: str, values: dict[str, list[cst.BaseExpression]]) -> tuple[set[str], list[tuple[str, int]]]:
    """The names the address of the load that gives `operand` is built from (transitively), and every
    `name[:, None]` (0) or `name[None, :]` (1) in those addresses."""
    seen: set[str] = set()
    positions: list[tuple[str, int]] = []
    todo = [operand]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for value in values.get(name, []):
            if isinstance(value, cst.Call) and dotted(value.func) == "tl.load" and value.args:
                value = value.args[0].value  # the address, not the mask
            for sub in m.findall(value, m.Subscript(value=m.Name())):
                position = _broadcast_position(cst.ensure_type(sub, cst.Subscript))
                if position is not None:
                    positions.append((cst.ensure_type(cst.ensure_type(sub, cst.Subscript).value, cst.Name).value,
                                      position))
            todo += names_in(value) - seen
    return seen, positions


def _broadcast_position(sub: cst.Subscript) -> int | None:
    """0 for `x[:, None]`, 1 for `x[None, :]`, else None."""
    parts = [s.slice for s in sub.slice]
    if len(parts) != 2:
        return None
    kinds = ["none" if isinstance(p, cst.Index) and m.matches(p.value, m.Name("None")) else
             "all" if isinstance(p, cst.Slice) and p.lower is None and p.upper is None else "" for p in parts]
    return {("all", "none"): 0, ("none", "all"): 1}.get((kinds[0], kinds[1]))


def _use_role(use: cst.Name, parents: Mapping[cst.CSTNode, cst.CSTNode], pids: dict[str, int],
              axis_role: dict[int, str], loop_var: str, counts: bool, name_role: dict[str, str],
              values: dict[str, list[cst.BaseExpression]]) -> str | None:
    parent = parents.get(use)
    arg = parent if isinstance(parent, cst.Arg) else None
    call = parents.get(arg) if arg is not None else None
    if isinstance(call, cst.Call):
        func = dotted(call.func)
        if func in ("range", "tl.range", "tl.cdiv", "triton.cdiv"):  # the K loop's step, or its count of steps
            return "K" if _in_range_of(call, loop_var, parents) else None
        if func == "tl.arange":
            return _term_role(call, parents, pids, axis_role, loop_var, counts, name_role)
    if isinstance(parent, cst.Element):  # a shape tuple: tl.zeros((B, B), ...) of the dot's accumulator
        shape = parents.get(parent)
        shape_arg = parents.get(shape) if shape is not None else None
        holder = parents.get(shape_arg) if shape_arg is not None else None
        if isinstance(shape, (cst.Tuple, cst.List)) and isinstance(holder, cst.Call) \
                and dotted(holder.func) in ("tl.zeros", "tl.full") and len(shape.elements) == 2:
            target = _assigned_to(holder, parents)
            if target is not None and _is_accumulator(target, values):
                return ("M", "N")[[e is parent for e in shape.elements].index(True)]
        return None
    if isinstance(parent, cst.AugAssign) and _inside_loop(parent, loop_var, parents):
        return "K"  # an address advanced by one K step per iteration (`a_ptrs += B`)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Multiply):
        other = parent.right if parent.left is use else parent.left
        role = _scalar_role(other, pids, axis_role, loop_var, counts, name_role)
        if role is not None:
            return role
        statement = parents.get(parent)
        if isinstance(statement, cst.AugAssign) and isinstance(statement.target, cst.Name) \
                and _inside_loop(statement, loop_var, parents):
            return "K"  # an address advanced by a K step times a stride (`b_ptrs += B * stride_bk`)
    return None


def _in_range_of(call: cst.Call, loop_var: str, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    node: cst.CSTNode = call
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.For):
            return isinstance(node.target, cst.Name) and node.target.value == loop_var
        if isinstance(node, (cst.BaseSuite, cst.BaseStatement)):
            return False
    return False


def _inside_loop(node: cst.CSTNode, loop_var: str, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.For) and isinstance(node.target, cst.Name) and node.target.value == loop_var:
            return True
    return False


def _assigned_to(expr: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> str | None:
    parent = parents.get(expr)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
        return parent.targets[0].target.value
    return None


def _is_accumulator(name: str, values: dict[str, list[cst.BaseExpression]]) -> bool:
    """Whether `name` takes a dot's result: `acc += tl.dot(..)`, `acc = tl.dot(a, b, acc)` or `acc = acc + tl.dot(..)`."""
    return any(any(dotted(c.func) == "tl.dot" for c in m.findall(v, m.Call()) if isinstance(c, cst.Call))
               for v in values.get(name, []))


def _scalar_role(node: cst.BaseExpression, pids: dict[str, int], axis_role: dict[int, str], loop_var: str,
                 counts: bool, name_role: dict[str, str]) -> str | None:
    """The role of the factor a block is multiplied by: a program id's axis, the K loop's count."""
    axis = pids.get(node.value) if isinstance(node, cst.Name) else program_axis(node)
    if axis is not None:
        return axis_role.get(axis)
    if isinstance(node, cst.Name) and node.value == loop_var and counts:
        return "K"
    return None


def _term_role(arange: cst.Call, parents: Mapping[cst.CSTNode, cst.CSTNode], pids: dict[str, int],
               axis_role: dict[int, str], loop_var: str, counts: bool, name_role: dict[str, str]) -> str | None:
    """The role of `tl.arange(0, B)`: that of the term it is added to, else of the name it is bound to."""
    node: cst.CSTNode = arange
    parent = parents.get(node)
    while isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, (cst.Add, cst.Subtract)):
        other = parent.right if parent.left is node else parent.left
        role = _expr_role(other, pids, axis_role, loop_var, counts, name_role)
        if role is not None:
            return role
        node, parent = parent, parents.get(parent)
    target = _assigned_to(node, parents)
    return name_role.get(target) if target is not None and name_role.get(target) in _ROLES else None


def _expr_role(node: cst.BaseExpression, pids: dict[str, int], axis_role: dict[int, str], loop_var: str,
               counts: bool, name_role: dict[str, str]) -> str | None:
    """The role of a scalar offset: `pid_m * B`, the K loop's offset, a name of a known role."""
    if isinstance(node, cst.Name):
        if node.value == loop_var and not counts:
            return "K"
        role = name_role.get(node.value)
        return role if role in _ROLES else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        for factor in (node.left, node.right):
            role = _scalar_role(factor, pids, axis_role, loop_var, counts, name_role)
            if role is not None:
                return role
    return None


def _value_roles(value: cst.BaseExpression, of_use: dict[int, str], name_role: dict[str, str], loop_var: str,
                 counts: bool) -> set[str] | None:
    """The roles a name's value carries as a 1-D offset: those of the block's uses in it and of the offset
    names it adds; None for what is no such offset (an address or mask built with broadcasts, a comparison,
    a tile, a load)."""
    if m.findall(value, m.Subscript()) or isinstance(value, cst.Comparison) or any(
            dotted(c.func) in ("tl.zeros", "tl.full", "tl.load", "tl.dot")
            for c in m.findall(value, m.Call()) if isinstance(c, cst.Call)):
        return None
    roles = {of_use[id(n)] for n in m.findall(value, m.Name()) if id(n) in of_use}
    roles |= {name_role[n] for n in names_in(value) if name_role.get(n) in _ROLES}
    if not counts and loop_var in names_in(value):
        roles.add("K")
    return roles


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
            params += [p.with_changes(name=cst.Name(self.names[r])) for r in _ROLES if r in self.names]
        return updated.with_changes(params=updated.params.with_changes(params=params))

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        role = self.roles.get(id(original))
        return updated.with_changes(value=self.names[role]) if self.depth and role else updated


def _rewrite(module: cst.Module, name: str, kernel: cst.FunctionDef, block: str, roles: _Roles) -> Untied | None:
    used = set(roles.of_use.values())
    taken = {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}
    names: dict[str, str] = {}
    for role in _ROLES:
        if role in used:
            fresh = next((c for c in (f"BLOCK_{role}", f"BLOCK_SIZE_{role}", f"{block}_{role}") if c not in taken), None)
            if fresh is None:
                return None
            names[role] = fresh
    launch = only_launch(module, name)
    assert launch is not None
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
        if reaching is None or not isinstance(reaching[0], cst.Integer):
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


class _Rewired(cst.CSTTransformer):
    """The wrapper side: the launch passes one block per role, a local bound to the block's literal gets one
    local per role after it, and each grid axis reads its role's block."""

    def __init__(self, kernel: str, definition: cst.FunctionDef, block: str, names: dict[str, str], local: str | None,
                 grid: cst.Tuple, axes: dict[int, str], wrapper: cst.FunctionDef) -> None:
        self.kernel, self.definition, self.block, self.names = kernel, definition, block, names
        self.local, self.grid, self.axes, self.wrapper = local, grid, axes, wrapper
        self.in_wrapper = 0
        self.done = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == self.wrapper.name.value:
            self.in_wrapper += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value == self.wrapper.name.value:
            self.in_wrapper -= 1
        return updated

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.Tuple:
        # the grid as found (the kernel's renaming may have rebuilt the nodes around it): in the wrapper only
        if original is not self.grid and not (self.in_wrapper and original.deep_equals(self.grid)):
            return updated
        elements = list(updated.elements)
        for axis, role in self.axes.items():
            new = self.names[role]
            value = elements[axis].value
            if self.local:
                value = value.visit(_NameSwap(self.local, new))  # type: ignore[assignment]
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
            for role in _ROLES:
                if role not in self.names:
                    continue
                value = cst.Name(self.names[role]) if self.local else a.value
                args.append(a.with_changes(value=value, keyword=cst.Name(self.names[role])) if a.keyword is not None
                            else a.with_changes(value=value))
        self.done = True
        return updated.with_changes(args=args)

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        if not (self.local and self.in_wrapper) or not m.matches(
                original, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(self.local))],
                                                               value=m.Integer())])):
            return updated
        literal = cst.ensure_type(original.body[0], cst.Assign).value
        copies = [cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(n))], value=literal)],
                                          leading_lines=[]) for n in self.names.values()]
        return cst.FlattenSentinel([updated, *copies])


class _NameSwap(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.new) if original.value == self.old else updated


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
    if reaching is None or not isinstance(reaching[0], cst.Integer) or grid is None or set(keys) & taken:
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


class _Rebound(cst.CSTTransformer):
    """The wrapper side of `untie_shared_binding`: a local per block after the shared one, the launch passing
    each block its own, each grid axis reading its block's."""

    def __init__(self, local: str, names: dict[str, str], grid: cst.Tuple, axes: dict[int, str], call: cst.Call,
                 wrapper: str, definition: cst.FunctionDef) -> None:
        self.local, self.names, self.grid, self.axes, self.call, self.wrapper = local, names, grid, axes, call, wrapper
        self.definition = definition
        self.in_wrapper = 0
        self.done = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.in_wrapper += node.name.value == self.wrapper

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.in_wrapper -= original.name.value == self.wrapper
        return updated

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.Tuple:
        if original is not self.grid:
            return updated
        elements = list(updated.elements)
        for axis, key in self.axes.items():
            value = elements[axis].value.visit(_NameSwap(self.local, self.names[key]))
            elements[axis] = elements[axis].with_changes(value=value)
        return updated.with_changes(elements=elements)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if original is not self.call:
            return updated
        key_of = {id(a): key for key, a in launch_arguments(self.definition, updated).items() if key in self.names}
        args = [a.with_changes(value=cst.Name(self.names[key_of[id(a)]]))
                if id(a) in key_of and m.matches(a.value, m.Name(self.local)) else a for a in updated.args]
        self.done = True
        return updated.with_changes(args=args)

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        if not self.in_wrapper or not m.matches(original, m.SimpleStatementLine(
                body=[m.Assign(targets=[m.AssignTarget(m.Name(self.local))], value=m.Integer())])):
            return updated
        literal = cst.ensure_type(original.body[0], cst.Assign).value
        return cst.FlattenSentinel([updated, *(cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(n))], value=literal)]) for n in self.names.values())])
