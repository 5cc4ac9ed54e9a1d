"""Split an online-softmax loop over programs, merged by log-sum-exp (flash-decoding; issue 27, families 1
and 4): a kernel that walks a long key loop with a running maximum `m` and sums rescaled to it
(`l = l * exp(m_old - m) + sum(p)`, `o = o * exp(m_old - m) + sum(p * v)`) on a grid smaller than the
device gets a second grid axis; each of its programs runs every n-th step of the loop and writes its
partial state (m and the sums) to an fp32 workspace, and a second launch on the original grid merges the
partials, `M = max_j m_j`, `x = sum_j x_j * exp(m_j - M)`, before running the kernel's own code after
the loop (the division, a sink term, the store) on the merged state.

The merge is exact up to summation order because of what the loop is checked to compute, not because
of what it is called. Its body is read by a small abstract interpretation over the syntax tree (`LoopReader`),
where every value is one of:

- free: it does not depend on the carried state (loads, the loop index, names set before the loop);
- the running maximum, old (`m` at the step's start) or new (`tl.maximum(m_old, free)`);
- a rescale factor `E(m_old - m_new)` and a scaled term `E(free - m_new)`, closed under products and
  quotients by free values, sums, reductions (`tl.sum`), casts, views, `tl.dot` with a free operand and
  `tl.where(free, scaled, 0)`; E is one exponential (`tl.exp`, `tl.exp2`, a module's own `exp`) for all;
- an accumulator step: `x_old * rescale[view]`, plus scaled terms (`+`, `+=`, `tl.dot(p, v, acc)`).

The kernel is the one the call runs (`base.target_launch`), launched once on a 1-D or 2-D grid (the
split takes the next axis; a flash kernel's `(cdiv(N, BLOCK_M), B * H)` as well as a decoder's
`(B * HQ,)`), with one top-level loop. It qualifies when, at the end of the loop body, the one maximum is new and every other carried
name is an accumulator step of itself (so `x = sum_k c_k E(s_k - m)` holds after every step), nothing
else the loop assigns is read after it, no store or atomic sits outside the code after the loop, and the
accumulators start at zero (or the maximum at -inf). The merge then multiplies each partial `x_j` by
`E(m_j - M)` under the same view the loop rescaled it with (`alpha[:, None]`).

The workspace holds one record per (program, split): the maximum and the sums, each raveled, sized at
the launch from their `tl.zeros` / `tl.full` shapes (block sizes the launch passes); a static assert in
the kernel checks the record against the tensors it stores. The split is sized at launch from the SM
count; where the grid already fills the device the kernel runs as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    SubstituteNames,
    Variant,
    dotted,
    is_jit,
    jit_functions,
    launch_arguments,
    launch_grid_axes,
    register,
    simple_assign,
    sm_count_statement,
    target_launch,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import assigned_names, code, fresh_name, infinity_sign, names_in, number
from diagnose.rewriters.online_softmax import UNKNOWN, Kind, LoopReader
from diagnose.rewriters.split import strided_loop

__all__ = ["split_online_softmax"]

_VARIANTS = ({"per_sm": 2, "max_split": 16}, {"per_sm": 4, "max_split": 32}, {"per_sm": 8, "max_split": 64})

@dataclass
class _State:
    """A carried name: its init statement's shape and the view its rescale takes (accumulators)."""

    name: str
    shape: list[cst.BaseExpression]
    view: str = ""


def _literal(node: cst.BaseExpression) -> float | None:
    """A literal number, infinities as kernels spell them included (`float('-inf')`)."""
    value, sign = number(node), infinity_sign(node)
    return value if value is not None else sign * math.inf if sign is not None else None


def _init(value: cst.BaseExpression) -> tuple[list[cst.BaseExpression], float | None] | None:
    """(shape, fill) of `tl.zeros(shape, ...)`, `tl.full(shape, v, ...)`, either `+-` a literal."""
    shift = 0.0
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
        term = _literal(value.right)
        if term is None:
            return None
        shift = term if isinstance(value.operator, cst.Add) else -term
        value = value.left
    if not (isinstance(value, cst.Call) and dotted(value.func) in ("tl.zeros", "tl.full") and value.args
            and isinstance(value.args[0].value, (cst.List, cst.Tuple))):
        return None
    dims = value.args[0].value
    assert isinstance(dims, (cst.List, cst.Tuple))
    shape = [el.value for el in dims.elements]
    if dotted(value.func) == "tl.zeros":
        return shape, 0.0 + shift
    fill = _literal(value.args[1].value) if len(value.args) > 1 else None
    return shape, None if fill is None else fill + shift


@dataclass
class _Plan:
    kernel: str
    at: int  # the loop's index in the kernel body
    maximum: _State
    sums: list[_State]
    exp: str
    call: cst.Call
    grid: list[cst.BaseExpression]  # the launch's axes, one or two
    device: str  # a launch argument that is a tensor on the kernel's device (what it stores through)


def _plan(module: cst.Module, context: dict[str, Any]) -> _Plan | None:
    launch = target_launch(module, context)
    if launch is None:
        return None
    kernel, call = launch
    grid = launch_grid_axes(module, call)
    fn = jit_functions(module)[kernel]
    if grid is None or not 1 <= len(grid) <= 2:
        return None
    axes = m.OneOf(*(m.Integer(str(a)) for a in range(len(grid))))
    if m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("program_id")), args=[m.Arg(value=~axes)])) \
            or m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("num_programs")), args=[m.Arg(value=~axes)])) \
            or m.findall(fn, m.Return()) or m.findall(fn, m.While()) or len(m.findall(fn, m.For())) != 1:
        return None
    body = list(fn.body.body)
    loops = [i for i, st in enumerate(body) if isinstance(st, cst.For)]
    if len(loops) != 1:
        return None
    at = loops[0]
    loop = cst.ensure_type(body[at], cst.For)
    if not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) in ("range", "tl.range")
            and isinstance(loop.target, cst.Name) and not loop.orelse):
        return None
    before = {n for st in body[:at] for n in assigned_names(st)}
    in_loop = set().union(*(assigned_names(st) for st in loop.body.body)) | {loop.target.value}
    carried = sorted(in_loop & before)
    plan = None
    for candidate in carried:  # which carried name is the running maximum
        env = {n: Kind("x_old", x=n) for n in carried} | {candidate: Kind("m_old")}
        reader = LoopReader(env)
        reader.block(loop.body.body)
        ends = {n: reader.env.get(n, UNKNOWN) for n in in_loop}
        sums = [n for n in carried if n != candidate and ends[n].tag in ("x_rescaled", "x_step") and ends[n].x == n]
        if not (reader.ok and ends[candidate].tag == "m_new" and sums and len(sums) == len(carried) - 1
                and len(reader.exps) == 1 and all(len(reader.views.get(n, {""})) == 1 for n in sums)):
            continue
        plan = (candidate, sums, reader)
        break
    if plan is None:
        return None
    maximum_name, sum_names, reader = plan
    after = [st for st in body[at + 1:] if isinstance(st, cst.BaseStatement)]
    if set().union(set(), *(names_in(st) for st in after)) & (in_loop - set(sum_names) - {maximum_name}):
        return None  # the code after the loop reads what only the last step set
    writes = [c for c in m.findall(fn, m.Call()) if dotted(c.func).rsplit(".", 1)[-1] in ("store", "atomic_add")  # type: ignore[attr-defined]
              or dotted(c.func).startswith("tl.atomic")]  # type: ignore[attr-defined]
    after_writes = {id(c) for st in after for c in m.findall(st, m.Call())}
    if not writes or any(id(c) not in after_writes for c in writes) or any(dotted(c.func).startswith("tl.atomic") for c in writes):  # type: ignore[attr-defined]
        return None
    inits: dict[str, tuple[list[cst.BaseExpression], float | None]] = {}
    for name in (maximum_name, *sum_names):
        setting = [st for st in body[:at] if name in assigned_names(st)]
        assign = simple_assign(setting[0]) if len(setting) == 1 else None
        found = _init(assign[1]) if assign is not None else None
        if found is None:
            return None  # set twice, in a branch, or not by tl.zeros / tl.full: its shape is not known
        inits[name] = found
    if not all(inits[n][1] == 0.0 for n in sum_names) and inits[maximum_name][1] != float("-inf"):
        return None  # a nonzero start of a sum survives only where the maximum starts at -inf
    # The record's sizes must be computable at the launch: block sizes it passes, and numbers.
    arguments = launch_arguments(fn, call)
    params = {p.name.value for p in fn.params.params}
    for shape, _ in inits.values():
        for dim in shape:
            for n in names_in(dim):
                if n not in params or n not in arguments or arguments[n].star:
                    return None
    device = _device_argument(fn, after, arguments)
    if device is None:
        return None
    states = [_State(n, inits[n][0], next(iter(reader.views[n]))) for n in sum_names]
    return _Plan(kernel, at, _State(maximum_name, inits[maximum_name][0]), states, next(iter(reader.exps)), call,
                 grid, device)


def _device_argument(fn: cst.FunctionDef, after: list[cst.BaseStatement], arguments: dict[str, cst.Arg]) -> str | None:
    """The launch's argument (a name) for the pointer the code after the loop stores through: the base of
    `ptr + offsets`, followed through the kernel's assignments (`p_o = o + i * V + o_v` -> `o`)."""
    bases: dict[str, cst.BaseExpression] = {}
    for st in fn.body.body:
        assign = simple_assign(st)
        if assign is not None:
            bases[assign[0]] = assign[1]
    for st in after:
        for store in m.findall(st, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("store")))):
            pointer = cst.ensure_type(store, cst.Call).args[0].value
            for _ in range(8):  # a chain of assignments, never a cycle
                while isinstance(pointer, cst.BinaryOperation) and isinstance(pointer.operator, cst.Add):
                    pointer = pointer.left
                if not isinstance(pointer, cst.Name):
                    break
                bound = arguments.get(pointer.value)
                if bound is not None and isinstance(bound.value, cst.Name):
                    return bound.value.value
                if pointer.value not in bases:
                    break
                pointer = bases[pointer.value]
    return None


# ---------------------------------------------------------------------------- the kernels

_RECORD, _PARTIALS, _SPLITS = "_KB_RECORD", "_kb_partials", "_kb_n_split"


def _statements(lines: list[str]) -> list[cst.BaseStatement]:
    return list(cst.parse_module("\n".join(lines) + "\n").body)


def _program(axes: int) -> str:
    """The program's index on the original grid, linear (int64): its record's place in the workspace."""
    return "tl.program_id(0).to(tl.int64)" if axes == 1 else \
        "(tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1))"


def _partial_kernel(fn: cst.FunctionDef, plan: _Plan) -> cst.FunctionDef:
    body = list(fn.body.body)
    loop = strided_loop(cst.ensure_type(body[plan.at], cst.For), axis=len(plan.grid))
    states = [plan.maximum, *plan.sums]
    numels = " + ".join(f"{s.name}.numel" for s in states)
    lines = [f"tl.static_assert({numels} == {_RECORD})",
            f"_kb_at = {_PARTIALS} + ({_program(len(plan.grid))} * tl.num_programs({len(plan.grid)}) "
            f"+ tl.program_id({len(plan.grid)})) * {_RECORD}"]
    offset = "0"
    for s in states:
        lines.append(f"tl.store(_kb_at + {offset} + tl.arange(0, {s.name}.numel), tl.ravel({s.name}).to(tl.float32))")
        offset = f"{offset} + {s.name}.numel"
    tail = _statements(lines)
    tail[0] = tail[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        "# this split's partial state (the maximum, then the sums rescaled to it) for the merge kernel"))])
    # A split may see only blocks a row masks out (a causal row's later keys, padding, a window's start),
    # where the kernel's own first block never was: from -inf, exp(m_old - m_new) is exp(-inf + inf) = NaN
    # and the sums stay NaN. A finite floor far below any score keeps them 0 (an fp32 maximum; a 16-bit
    # one rounds it back to -inf, as written).
    mx = plan.maximum.name
    floor = cst.parse_statement(f"{mx} = tl.where({mx} == float('-inf'), -1.0e30, {mx}).to({mx}.dtype)\n")
    new = fn.with_changes(name=cst.Name(f"{plan.kernel}_partial"),
                          body=fn.body.with_changes(body=[*body[:plan.at], floor, loop, *tail]))
    return with_parameters(new, [_PARTIALS, _RECORD], {_RECORD})


def _merge_kernel(fn: cst.FunctionDef, plan: _Plan) -> cst.FunctionDef:
    body = list(fn.body.body)
    mx = plan.maximum.name
    load = (f"tl.reshape(tl.load(_kb_at + _kb_j * {_RECORD} + {{offset}} + tl.arange(0, {{name}}.numel)), "
            f"{{name}}.shape)")
    lines = [f"_kb_at = {_PARTIALS} + {_program(len(plan.grid))} * {_SPLITS} * {_RECORD}",
            f"_kb_max = tl.full({mx}.shape, float('-inf'), tl.float32)",
            f"for _kb_j in range(0, {_SPLITS}):",
            f"    _kb_max = tl.maximum(_kb_max, {load.format(offset='0', name=mx)})"]
    lines += [f"_kb_{s.name} = tl.zeros({s.name}.shape, tl.float32)" for s in plan.sums]
    lines += [f"for _kb_j in range(0, {_SPLITS}):",
             f"    _kb_mj = {load.format(offset='0', name=mx)}",
             f"    _kb_w = tl.where(_kb_mj == float('-inf'), 0.0, {plan.exp}(_kb_mj - _kb_max))"]
    offset = f"{mx}.numel"
    for s in plan.sums:
        # a split that saw no key of a row adds nothing, whatever its sums hold (NaN times 0 is NaN)
        lines.append(f"    _kb_{s.name} += tl.where((_kb_mj == float('-inf')){s.view}, 0.0, "
                     f"{load.format(offset=offset, name=s.name)} * _kb_w{s.view})")
        offset = f"{offset} + {s.name}.numel"
    lines += [f"{s.name} = _kb_{s.name}.to({s.name}.dtype)" for s in plan.sums]
    lines.append(f"{mx} = _kb_max.to({mx}.dtype)")
    merge = _statements(lines)
    merge[0] = merge[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        "# the splits' partial states merged: each sum rescaled from its split's maximum to the largest"))])
    new = fn.with_changes(name=cst.Name(f"{plan.kernel}_merge"),
                          body=fn.body.with_changes(body=[*body[:plan.at], *merge, *body[plan.at + 1:]]))
    return with_parameters(new, [_PARTIALS, _SPLITS, _RECORD], {_RECORD})


class _AddKernels(cst.CSTTransformer):
    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body: list[cst.CSTNode] = []
        for node in updated.body:
            body.append(node)
            if isinstance(node, cst.FunctionDef) and is_jit(node) and node.name.value == self.plan.kernel:
                for made, what in ((_partial_kernel(node, self.plan), "its key loop split over a second grid axis"),
                                   (_merge_kernel(node, self.plan), "the splits merged, then its code after the loop")):
                    body.append(made.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), cst.EmptyLine(
                        comment=cst.Comment(f"# {self.plan.kernel}, {what}"))]))
        return updated.with_changes(body=body)


class _SplitLaunch(cst.CSTTransformer):
    """`K[grid](args)` -> the split sized from the SM count; `K_partial[(*grid, n_split)](args, ...)` then
    `K_merge[grid](args, ...)` where it splits, the launch as it was elsewhere."""

    def __init__(self, plan: _Plan, record: cst.BaseExpression, per_sm: int, max_split: int, taken: set[str]) -> None:
        self.plan, self.record, self.per_sm, self.max_split = plan, record, per_sm, max_split
        # The wrapper's new locals, named apart from every name the module uses (a wrapper's own `n_blocks`)
        taken = set(taken)
        self.names = {n: fresh_name(n, taken) for n in ("n_blocks", "n_split", "kb_record", "kb_partials")}
        self.axes = [fresh_name(f"kb_axis{i}", taken) for i in range(len(plan.grid))] if len(plan.grid) > 1 else []
        self.launched = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        kernel = self.plan.kernel
        if not (len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr)
                and m.matches(updated.body[0].value, m.Call(func=m.Subscript(value=m.Name(kernel))))):
            return updated
        call = cst.ensure_type(updated.body[0].value, cst.Call)

        def launch(name: str, grid: str, extra: dict[str, str]) -> cst.BaseStatement:
            made = with_keywords(call, {k: cst.parse_expression(v) for k, v in extra.items()}).with_changes(
                func=cst.Subscript(cst.Name(name), [cst.SubscriptElement(cst.Index(cst.parse_expression(grid)))]))
            return cst.SimpleStatementLine([cst.Expr(made)])

        blocks, splits, record, partials = (self.names[n] for n in ("n_blocks", "n_split", "kb_record", "kb_partials"))
        axes = self.axes or [blocks]
        head: list[cst.BaseStatement] = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(n))], a)])
                                         for n, a in zip(axes, self.plan.grid, strict=True)]
        head[0] = head[0].with_changes(leading_lines=updated.leading_lines)
        if len(axes) > 1:
            head.append(cst.parse_statement(f"{blocks} = {' * '.join(axes)}\n"))
        head += [sm_count_statement("132", "_kb_sm_count").with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
                    f"# split the key loop over programs until each SM has {self.per_sm} (none when the grid "
                    "fills them); a second launch merges the splits"))]),
                cst.parse_statement(
                    f"{splits} = max(1, min({self.max_split}, -(-{self.per_sm} * _kb_sm_count // max(1, {blocks}))))\n")]
        sized = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(record))], self.record)])
        workspace = cst.parse_statement(f"{partials} = torch.empty({blocks} * {splits} * {record}, dtype=torch.float32, "
                                        f"device={self.plan.device}.device)\n")
        grid = ", ".join(axes)
        partial = launch(f"{kernel}_partial", f"({grid}, {splits})", {_PARTIALS: partials, _RECORD: record})
        merge = launch(f"{kernel}_merge", f"({grid},)", {_PARTIALS: partials, _SPLITS: splits, _RECORD: record})
        plain = updated.with_changes(body=[cst.Expr(call.with_changes(func=cst.ensure_type(call.func, cst.Subscript).with_changes(
            slice=[cst.SubscriptElement(cst.Index(cst.parse_expression(f"({grid},)")))])))], leading_lines=[])
        branch = cst.If(test=cst.parse_expression(f"{splits} > 1"),
                        body=cst.IndentedBlock([sized, workspace, partial, merge]),
                        orelse=cst.Else(cst.IndentedBlock([plain])))
        self.launched += 1
        return cst.FlattenSentinel([*head, branch])


def _record_size(plan: _Plan, fn: cst.FunctionDef) -> cst.BaseExpression:
    """The record's element count at the launch: each state's shape with the kernel's parameters replaced
    by what the launch passes for them."""
    arguments = {n: a.value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                 if isinstance(a.value, cst.BinaryOperation) else a.value for n, a in launch_arguments(fn, plan.call).items()}
    terms = []
    for s in [plan.maximum, *plan.sums]:
        dims = [d for d in (x.visit(SubstituteNames(arguments)) for x in s.shape) if isinstance(d, cst.BaseExpression)]
        dims = dims or [cst.Integer("1")]
        terms.append(" * ".join(f"({code(d)})" if isinstance(d, cst.BinaryOperation) else code(d) for d in dims))
    return cst.parse_expression(" + ".join(f"({t})" if "*" in t else t for t in terms))


def split_online_softmax(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    plan = _plan(module, context)
    if plan is None:
        return []
    record = _record_size(plan, jit_functions(module)[plan.kernel])
    with_kernels = module.visit(_AddKernels(plan))
    out = []
    taken = names_in(module)
    for params in _VARIANTS:
        launch = _SplitLaunch(plan, record, params["per_sm"], params["max_split"], taken)
        new = with_kernels.visit(launch)
        if launch.launched == 1:
            out.append(Variant({"split": "key loop over programs, log-sum-exp merge", **params,
                                "state": [plan.maximum.name, *(s.name for s in plan.sums)]}, new.code))
    return out


register("split-kv-online-softmax")(split_online_softmax)
