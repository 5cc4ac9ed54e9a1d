"""Split a reduction loop over programs: a grid too small for the device gets a second axis whose
programs each take every n-th iteration of the kernel's loop, their partial results summed into the
output with `tl.atomic_add` (the output zeroed first).

It applies where splitting cannot change the result but by summation order (issue 27, family 1):

- the kernel is the one the call runs (`base.target_launch`: the module's only launched kernel, or the
  only one of them the diagnosis saw launched), launched at one site on a 1-D grid: `(G,)`, or a name
  bound to `(G,)` or to `lambda meta: (G,)` (`base.launch_grid`), and it uses program_id(0) only;
- the kernel has one top-level `for` over `range(a, b[, c])` / `tl.range(...)`, without nested loops,
  whose only loop-carried values are accumulators: `acc = tl.zeros(...)` before it, `acc += ...` in it,
  and no other use of `acc` in the loop;
- its one write is a `tl.store` after the loop whose value is linear in the accumulators (`acc`,
  `tl.sum(acc, axis=k)`, either times or divided by something without them, directly or through names
  assigned such a value once after the loop), through a pointer computed from one parameter, or a cast of such a
  value (`acc.to(out.dtype)`, or a store's own implicit cast); the partials add up in fp32: into the
  output where it is fp32, else into an fp32 workspace that a second small kernel casts into the output
  (the output's dtype decides at each launch), since atomics into an fp16 output round the running sum
  at every add (a gemv of 1000 terms split 16 ways was 2.5% off); accumulators made as ints or fp64
  are declined (the fp32 sums would drop their bits);
- the stored-to argument is a tensor the wrapper makes with `torch.empty(...)` / `torch.empty_like(...)`
  (the split path zeroes it, `out.zero_()`, and the atomics add into it), launched by a statement of its own.

The split is sized at launch: enough programs for `per_sm` per SM, at most `max_split` per output
block. Where the grid already fills the device the original kernel runs as it was (no zeroing, no
atomics), so the cases that need no split cannot get slower; the split copy of the kernel sits beside it.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.aliasing import launch_aliases
from diagnose.rewriters.base import (
    SubstituteNames,
    Variant,
    dotted,
    is_jit,
    jit_functions,
    launch_arguments,
    launch_grid,
    launching_function,
    simple_assign,
    sm_count_statement,
    target_launch,
)
from diagnose.rewriters.blocks import derived_names, fresh_name, names_in, trips_by_position

__all__ = ["split_reduction", "strided_loop"]

# The last is for a grid of one or a few blocks over a long loop (a whole-tensor sum): up to 256
# programs per block, a few per SM.
_VARIANTS = ({"per_sm": 2, "max_split": 16}, {"per_sm": 2, "max_split": 64}, {"per_sm": 4, "max_split": 64},
             {"per_sm": 4, "max_split": 256})


def _assigned(stmt: cst.CSTNode) -> set[str]:
    out: set[str] = set()
    for assign in m.findall(stmt, m.Assign() | m.AugAssign() | m.AnnAssign()):
        targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]  # type: ignore[attr-defined]
        for t in targets:
            out |= names_in(t) if isinstance(t, (cst.Name, cst.Tuple)) else set()
    return out


class _Plan:
    """What the kernel and its launch must look like for the split; None fields: not applicable."""

    def __init__(self, module: cst.Module, context: dict[str, Any]) -> None:
        self.kernel: str | None = None
        self.out_param: str | None = None  # the kernel parameter the store writes through
        self.out_arg: str | None = None  # the wrapper's name for that tensor
        self.grid: cst.BaseExpression | None = None  # G of the launch's 1-D grid
        launch = target_launch(module, context)
        grid = launch_grid(module, launch[1]) if launch is not None else None
        if launch is None or grid is None:
            return
        name, call = launch
        fn = jit_functions(module)[name]
        if launch_aliases(fn, call, launching_function(module, call)) or any(any(c is call for c in m.findall(loop, m.Call()))
                                           for loop in m.findall(module, m.For() | m.While())):
            return  # the zeroed output also an input, or zeroed again by each launch of a loop over slices
        param = self._kernel_ok(fn)
        if param is None:
            return
        bound = launch_arguments(fn, call).get(param)
        if bound is None or not isinstance(bound.value, cst.Name):
            return
        arg = bound.value.value
        self.kernel, self.out_param, self.out_arg, self.grid = name, param, arg, grid

    def _kernel_ok(self, fn: cst.FunctionDef) -> str | None:
        """The parameter the kernel's one store writes through, when the split keeps its result."""
        if m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("program_id")), args=[m.Arg(value=~m.Integer("0"))])) \
                or m.findall(fn, m.Return()) or m.findall(fn, m.While()):
            return None
        body = list(fn.body.body)
        loops = [i for i, st in enumerate(body) if isinstance(st, cst.For)]
        if len(loops) != 1 or len(m.findall(fn, m.For())) != 1:
            return None
        at = loops[0]
        loop = body[at]
        assert isinstance(loop, cst.For)
        if not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) in ("range", "tl.range")
                and 1 <= len([a for a in loop.iter.args if a.keyword is None]) <= 3) \
                or not trips_by_position(loop.iter):
            return None  # `step=` by keyword: the strided loop would pass the step twice
        zeros = m.Assign(value=m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("zeros"))))
        accumulators = {name for st in body[:at] for name in _assigned(st) if m.findall(st, zeros)}
        if any(sum(name in _assigned(st) for st in body[:at]) != 1 for name in accumulators):
            return None  # `acc += bias` before the loop: every program's partial would start from it
        if any(_wide_or_integer(st) for st in body[:at] if m.findall(st, zeros) and _assigned(st) & accumulators):
            return None  # partial sums of ints or fp64 through the fp32 workspace would lose bits
        carried: set[str] = set()
        written: set[str] = set()
        for st in loop.body.body:
            aug = m.findall(st, m.AugAssign(operator=m.AddAssign(), target=m.Name()))
            if aug and isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and isinstance(st.body[0], cst.AugAssign):
                target = st.body[0].target.value  # type: ignore[attr-defined]
                value_reads = names_in(st.body[0].value)
                if target in accumulators and not value_reads & accumulators:
                    if (value_reads - written) & _assigned_in(loop.body):
                        return None  # it adds a value from the last iteration
                    carried.add(target)
                    continue
            reads = _reads(st)
            if reads & accumulators or (reads - written) & _assigned_in(loop.body):
                return None  # an accumulator read another way, or a value carried from the last iteration
            written |= _assigned(st)
        if not carried:
            return None
        after = body[at + 1:]
        # What the loop's sums become after it (`total = tl.sum(acc, axis=1)`, assigned once) are sums too.
        before_and_in = set().union(*(_assigned(st) for st in body[:at + 1]))
        derived: set[int] = set()
        for i, stmt in enumerate(after):
            assign = simple_assign(stmt)
            if assign is not None and assign[0] not in before_and_in and _linear(assign[1], carried):
                carried.add(assign[0])
                derived.add(i)
        writes = [c for c in m.findall(fn, m.Call()) if dotted(c.func).startswith("tl.atomic") or dotted(c.func) == "tl.store"]  # type: ignore[attr-defined]
        stores = [c for st in after for c in m.findall(st, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("store"))))]
        if len(writes) != 1 or len(stores) != 1:
            return None
        store = stores[0]
        assert isinstance(store, cst.Call)
        positional = [a for a in store.args if a.keyword is None]
        if len(positional) < 2 or any(a.keyword and a.keyword.value not in ("mask",) for a in store.args):
            return None
        if any(names_in(a.value) & carried for a in store.args if a is not positional[1]):
            return None  # a pointer or mask computed from the sum: each program would see its partial only
        value = positional[1].value
        if not _linear(_cast_of(value) or value, carried):
            return None
        if any(_reads(stmt) & carried for i, stmt in enumerate(after)
               if i not in derived and not m.findall(stmt, m.Call(func=m.Attribute(attr=m.Name("store"))))):
            return None
        # a constexpr (a block size in the offsets) is never the pointer
        params = {p.name.value for p in fn.params.params
                  if not (p.annotation and dotted(p.annotation.annotation).endswith("constexpr"))}
        pointers = derived_names(positional[0].value, fn) & params
        return next(iter(pointers)) if len(pointers) == 1 else None


def _reads(stmt: cst.CSTNode) -> set[str]:
    """Names a statement reads: an assignment's value (and an augmented target), else every name in it."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign):
            return names_in(small.value) | {n for t in small.targets if not isinstance(t.target, (cst.Name, cst.Tuple))
                                          for n in names_in(t.target)}
        if isinstance(small, cst.AugAssign):
            return names_in(small.value) | names_in(small.target)
    return names_in(stmt)


def _assigned_in(block: cst.BaseSuite) -> set[str]:
    return set().union(*(_assigned(st) for st in getattr(block, "body", [])))


def _wide_or_integer(stmt: cst.CSTNode) -> bool:
    """Whether `acc = tl.zeros(shape, D)` (D by keyword or second) names an integer or fp64 D."""
    for call in m.findall(stmt, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("zeros")))):
        args = cst.ensure_type(call, cst.Call).args
        dtype = next((a.value for a in args if a.keyword is not None and a.keyword.value == "dtype"),
                     args[1].value if len(args) > 1 and args[1].keyword is None else None)
        if dtype is not None and dotted(dtype).startswith(("tl.int", "tl.uint", "tl.float64")):
            return True
    return False


def _cast_of(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """X of `X.to(...)`, else None."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to":
        return value.func.value
    return None


def _linear(value: cst.BaseExpression, accumulators: set[str]) -> bool:
    """Whether a stored value is a sum over the loop's iterations when the accumulators are."""
    if isinstance(value, cst.Name):
        return value.value in accumulators
    if isinstance(value, cst.Call) and dotted(value.func) == "tl.sum" and value.args:
        return _linear(value.args[0].value, accumulators) and not any(
            names_in(a.value) & accumulators for a in value.args[1:])
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
        left, right = names_in(value.left) & accumulators, names_in(value.right) & accumulators
        if isinstance(value.operator, cst.Divide):
            return _linear(value.left, accumulators) and not right
        return (_linear(value.left, accumulators) and not right) or (_linear(value.right, accumulators) and not left)
    return False


class _AddSplitKernel(cst.CSTTransformer):
    """The kernel stays as it is (the launch keeps it where the grid fills the device); its split copy,
    `<kernel>_split`, follows it."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body: list[cst.CSTNode] = []
        for node in updated.body:
            body.append(node)
            if isinstance(node, cst.FunctionDef) and is_jit(node) and node.name.value == self.kernel:
                split = cst.ensure_type(node.visit(_SplitKernel()), cst.FunctionDef)
                body.append(split.with_changes(name=cst.Name(f"{self.kernel}_split"), leading_lines=[
                    cst.EmptyLine(), cst.EmptyLine(),
                    cst.EmptyLine(comment=cst.Comment(f"# {self.kernel}, its loop split over a second grid axis: "
                                                      "partial results are added into a zeroed output"))]))
                body.append(cst.parse_statement(_CAST_KERNEL).with_changes(leading_lines=[
                    cst.EmptyLine(), cst.EmptyLine(), cst.EmptyLine(comment=cst.Comment(
                        "# the split's fp32 partial sums, cast into the output's dtype once they are all in"))]))
        return updated.with_changes(body=body)


_CAST_KERNEL = """@triton.jit
def _kb_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n).to(dst_ptr.dtype.element_ty), mask=offs < n)
"""


def strided_loop(loop: cst.For, axis: int = 1) -> cst.For:
    """`for i in range(a, b, c)` (or `tl.range`, its keywords kept) -> program (i, j) of a grid split
    along `axis` takes every num_programs(axis)-th step, from the j-th."""
    call = loop.iter
    assert isinstance(call, cst.Call)
    positional = [a.value for a in call.args if a.keyword is None]
    keywords = [a for a in call.args if a.keyword is not None]
    if len(positional) == 1:
        positional = [cst.Integer("0"), positional[0]]
    start, stop = positional[0], positional[1]
    step = positional[2] if len(positional) == 3 else cst.Integer("1")
    wrap = lambda e: e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
        if isinstance(e, cst.BinaryOperation) else e  # noqa: E731
    new_start = cst.ensure_type(cst.parse_expression(f"__s + tl.program_id({axis}) * __c").visit(
        SubstituteNames({"__s": start, "__c": wrap(step)})), cst.BinaryOperation)
    new_step = cst.ensure_type(cst.parse_expression(f"__c * tl.num_programs({axis})").visit(
        SubstituteNames({"__c": wrap(step)})), cst.BinaryOperation)
    args = [cst.Arg(new_start), cst.Arg(stop), cst.Arg(new_step), *keywords]
    args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in args[:-1]] + [args[-1]]
    comment = cst.EmptyLine(comment=cst.Comment(
        f"# split: program (i, j) takes every num_programs({axis})-th step, from the j-th"))
    return loop.with_changes(iter=call.with_changes(args=args), leading_lines=[*loop.leading_lines, comment])


class _SplitKernel(cst.CSTTransformer):
    """The kernel's copy, split: its loop strided over the second grid axis, its store an atomic add."""

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        return strided_loop(updated)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if dotted(updated.func) != "tl.store":
            return updated
        args = [a for a in updated.args]
        uncast = _cast_of(args[1].value)
        if uncast is not None:  # into an fp32 output or workspace: the cast is the second kernel's
            args[1] = args[1].with_changes(value=uncast)
        sem = cst.Arg(keyword=cst.Name("sem"), value=cst.SimpleString('"relaxed"'),
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in args] + [sem]
        return updated.with_changes(func=cst.parse_expression("tl.atomic_add"), args=args)


class _SplitLaunch(cst.CSTTransformer):
    """In the wrapper, `K[(G,)](args)` becomes: the split sized from the SM count, then
    `if n_split > 1: out.zero_(); K_split[(G, n_split)](args)` else the launch as it was."""

    def __init__(self, kernel: str, out: str, grid: cst.BaseExpression, per_sm: int, max_split: int,
                 taken: set[str]) -> None:
        self.kernel, self.out, self.grid, self.per_sm, self.max_split = kernel, out, grid, per_sm, max_split
        # The wrapper's new locals, named apart from every name the module uses (a wrapper's own `n_blocks`
        # read after the launch, functools' `partial`)
        taken = set(taken)
        self.blocks, self.splits, self.partial = (fresh_name(n, taken) for n in ("n_blocks", "n_split", "partial"))
        self.allocated = 0
        self.launched = 0

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if [dotted(t.target) for t in updated.targets] == [self.out] and isinstance(updated.value, cst.Call) \
                and dotted(updated.value.func) in ("torch.empty", "torch.empty_like"):
            self.allocated += 1  # fresh memory the kernel writes whole: zeroing it loses nothing
        return updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if not (len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr)
                and m.matches(updated.body[0].value, m.Call(func=m.Subscript(value=m.Name(self.kernel))))):
            return updated
        call = cst.ensure_type(updated.body[0].value, cst.Call)
        blocks, splits = self.blocks, self.splits
        first = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(blocks))], self.grid)])
        sms = sm_count_statement("132", "_kb_sm_count").with_changes(leading_lines=[cst.EmptyLine(
            comment=cst.Comment(f"# split the loop over programs until each SM has {self.per_sm} "
                                f"(none when the grid fills them)"))])
        split = cst.parse_statement(
            f"{splits} = max(1, min({self.max_split}, -(-{self.per_sm} * _kb_sm_count // max(1, {blocks}))))\n")
        split_call = call.with_changes(func=cst.Subscript(cst.Name(f"{self.kernel}_split"), [
            cst.SubscriptElement(cst.Index(cst.parse_expression(f"({blocks}, {splits})")))]))
        plain_call = call.with_changes(func=call.func.with_changes(
            slice=[cst.SubscriptElement(cst.Index(cst.parse_expression(f"({blocks},)")))]))
        # Partials add up in fp32: straight into an fp32 output, else into an fp32 workspace cast into the
        # output once they are all in (atomics into fp16 round the running sum at every add: a gemv of 1000
        # terms split 16 ways was 2.5% off). The output's dtype decides at each launch.
        into = self.partial
        workspace_call = split_call.with_changes(args=[  # the output's argument only, not any name spelled alike
            a.with_changes(value=cst.Name(into)) if m.matches(a.value, m.Name(self.out)) else a for a in split_call.args])
        direct = [cst.parse_statement(f"{self.out}.zero_()\n"), updated.with_changes(body=[cst.Expr(split_call)],
                                                                                     leading_lines=[])]
        workspace = [cst.parse_statement(f"{into} = torch.zeros_like({self.out}, dtype=torch.float32)\n"),
                     updated.with_changes(body=[cst.Expr(workspace_call)], leading_lines=[]),
                     cst.parse_statement(f"_kb_cast_kernel[(triton.cdiv({into}.numel(), 1024),)]({into}, {self.out}, "
                                         f"{into}.numel(), BLOCK=1024)\n")]
        by_dtype = cst.If(test=cst.parse_expression(f"{self.out}.dtype == torch.float32"), body=cst.IndentedBlock(direct),
                          orelse=cst.Else(cst.IndentedBlock(workspace)))
        branch = cst.If(
            test=cst.parse_expression(f"{splits} > 1"),
            body=cst.IndentedBlock([by_dtype]),
            orelse=cst.Else(cst.IndentedBlock([updated.with_changes(body=[cst.Expr(plain_call)], leading_lines=[])])),
            leading_lines=[])
        self.launched += 1
        return cst.FlattenSentinel([first.with_changes(leading_lines=updated.leading_lines), sms, split, branch])


def split_reduction(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    plan = _Plan(module, context)
    if plan.kernel is None or plan.out_arg is None or plan.grid is None:
        return []
    out = []
    taken = names_in(module)
    for params in _VARIANTS:
        launch = _SplitLaunch(plan.kernel, plan.out_arg, plan.grid, params["per_sm"], params["max_split"], taken)
        new = module.visit(launch).visit(_AddSplitKernel(plan.kernel))
        if launch.allocated == 1 and launch.launched == 1:
            out.append(Variant({"split": "loop over programs, atomics", **params}, new.code))
    return out

