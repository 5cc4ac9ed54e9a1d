"""Which tile role (M rows, N columns, K step) each use of a block plays in a `tl.dot` kernel, read from the
kernel's structure, never from the names (untie.py splits a shared block by it):

- the program axes: `pid = tl.program_id(i)`, an axis read as the rows of the dot's first operand is M,
  one read as the columns of its second is N (the names its loads' addresses are built from);
- the K loop: the `for` around the dot whose range steps by a block (`range(0, K, B)`), or counts
  `tl.cdiv(K, B)` steps (`k * B` is then a K offset);
- every use of a block takes the role of what it is combined with: `pid_m * B` an axis's role,
  `rm = pid_m * B + tl.arange(0, B)` the role of its other term, `tl.arange(0, B)` bound alone to a name
  the role of where that name indexes the dot's operands (`rk[None, :]` in the first operand's address is
  K), `acc = tl.zeros((B, B))` the accumulator's M x N, `a_ptrs += B * stride` in the K loop a K step.

A reading fails (None) where a use gets no role or a name is read in two (a kernel that relies on a
square tile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.base import dotted, program_axis
from diagnose.rewriters.blocks import names_in

__all__ = ["ROLES", "Roles", "constexpr_params"]

ROLES = ("M", "N", "K")


def constexpr_params(kernel: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in kernel.params.params
            if p.annotation is not None and dotted(p.annotation.annotation).endswith("constexpr")]


@dataclass
class Roles:
    """The role of each use of the blocks in the kernel (by node identity) and each program axis's role."""

    of_use: dict[int, str]
    axis_role: dict[int, str]

    @classmethod
    def read(cls, kernel: cst.FunctionDef, blocks: frozenset[str], dot: cst.Call) -> Roles | None:
        """The roles of every use of `blocks` in the kernel; None where one has none, or a name two."""
        if len(dot.args) < 2 or not all(isinstance(a.value, cst.Name) for a in dot.args[:2]):
            return None
        parents = MetadataWrapper(cst.Module(body=[kernel]), unsafe_skip_copy=True).resolve(ParentNodeProvider)
        values = _assigned_values(kernel)
        pids = {n: axis for n, vs in values.items() if len(vs) == 1 and (axis := program_axis(vs[0])) is not None}
        loop = _k_loop(dot, blocks, parents)
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
        return cls._resolve(kernel, blocks, parents, values, pids, axis_role, loop_var, counts, placed)

    @classmethod
    def _resolve(cls, kernel: cst.FunctionDef, blocks: frozenset[str], parents: Mapping[cst.CSTNode, cst.CSTNode],
                 values: dict[str, list[cst.BaseExpression]], pids: dict[str, int], axis_role: dict[int, str],
                 loop_var: str, counts: bool, placed: dict[str, str]) -> Roles | None:
        uses = [n for n in m.findall(kernel.body, m.Name()) if isinstance(n, cst.Name) and n.value in blocks]
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


def _k_loop(dot: cst.Call, blocks: frozenset[str], parents: Mapping[cst.CSTNode, cst.CSTNode]) -> tuple[str, bool] | None:
    """The loop variable of the `for` around the dot that steps by one of the blocks (False) or counts
    `tl.cdiv(_, block)` steps (True); None without one."""
    node: cst.CSTNode = dot
    while node in parents:
        node = parents[node]
        if not (isinstance(node, cst.For) and isinstance(node.target, cst.Name) and isinstance(node.iter, cst.Call)
                and dotted(node.iter.func) in ("range", "tl.range")):
            continue
        args = [a.value for a in node.iter.args if a.keyword is None]
        if len(args) >= 3 and isinstance(args[2], cst.Name) and args[2].value in blocks:
            return node.target.value, False
        stop = args[1] if len(args) >= 2 else args[0] if args else None
        if stop is not None and m.matches(stop, m.Call(args=[m.DoNotCare(), m.Arg(value=m.Name())])) \
                and cst.ensure_type(cst.ensure_type(stop, cst.Call).args[1].value, cst.Name).value in blocks \
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
    return name_role.get(target) if target is not None and name_role.get(target) in ROLES else None


def _expr_role(node: cst.BaseExpression, pids: dict[str, int], axis_role: dict[int, str], loop_var: str,
               counts: bool, name_role: dict[str, str]) -> str | None:
    """The role of a scalar offset: `pid_m * B`, the K loop's offset, a name of a known role."""
    if isinstance(node, cst.Name):
        if node.value == loop_var and not counts:
            return "K"
        role = name_role.get(node.value)
        return role if role in ROLES else None
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
    roles |= {name_role[n] for n in names_in(value) if name_role.get(n) in ROLES}
    if not counts and loop_var in names_in(value):
        roles.add("K")
    return roles
