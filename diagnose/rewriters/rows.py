"""Several rows per program (issue 27, family 1; pattern rows-per-program, for L1's
`parallelism.masked-lanes` and `vectorization.small-tile`): a kernel that gives each program one row
(`row = tl.program_id(0)`) and that row's short 1-D tile runs most of its lanes masked, or too few
elements per thread. Our avg_pool2d's 56x56 planes: 28 of 256 lanes live, 0.22-0.47 of the copy rate on
the H200. The program becomes a [ROWS, BLOCK] tile, ROWS consecutive rows at once:

- `tl.program_id(0)` becomes `_kb_row = tl.program_id(0) * _KB_ROWS + tl.arange(0, _KB_ROWS)[:, None]`,
  and the lane axis `tl.arange(0, BLOCK)` becomes `tl.arange(0, BLOCK)[None, :]`: everything computed
  from them broadcasts to [ROWS, 1], [1, BLOCK] or [ROWS, BLOCK] as it was a scalar, a row or a tile;
- a reduction over the row (`tl.sum(x, axis=0)`, `tl.max(x)`) reduces axis 1 with `keep_dims=True`
  (a [ROWS, 1] column broadcasts where the scalar did), a scan runs along axis 1, and
  `tl.zeros([BLOCK])` / `tl.full([BLOCK], ...)` become [ROWS, BLOCK];
- every access whose pointer depends on the row gets `_kb_row < _kb_n_rows` in its mask (the last
  program's rows past the grid); accesses that do not depend on it (a weight vector) stay as they were;
- the launch's grid axis 0 (G rows) becomes `cdiv(G, ROWS)`, and G is passed as `_kb_n_rows`.

Where the lanes' block can be fitted, the variants size it `min(BLOCK, next_power_of_2(E))` at launch and
give the freed lanes to rows: ROWS = f * BLOCK // that, for f = 1, 2, 4 (the written tile, twice, four
times), never past 8,192 elements. That needs: the lanes are a name bound to `tl.arange(0, BLOCK)` or
`tl.program_id(k) * BLOCK + tl.arange(0, BLOCK)` (k > 0); BLOCK is a constexpr the launch passes and the
kernel uses only there and in tile shapes; every access through the lanes has a mask with a term
`lanes < E` (through names), the same kernel parameter E for all; and nothing reduces or scans (a masked
lane's `other` may reach a max). Covering is then unchanged: a block shrunk below the written one covers
all of E in its first program along that axis, as the written block did, and every lane past E did
nothing. Elsewhere the variants take 2, 4 or 8 rows with the tile as written (2 or 4 where the block is
tuned and unknown at the launch).

A top-level early exit of a row (`if row >= n_rows: return`, the first draft's guard for the programs a
rounded-up grid adds) narrows `_kb_row_ok` from where it stood: `_kb_row_ok = _kb_row_ok & ((C) == 0)`.
A scalar accumulator a row's reduction adds to, started from a number at the top level (`total = 0.0`,
`top = -float("inf")`), starts as the column it becomes: `tl.full([_KB_ROWS, 1], 0.0, tl.float32)`.

It declines what it cannot rewrite soundly: a kernel with a subscript (already 2-D), more than one
`tl.arange`, `tl.num_programs`, a dot, a layout change, any other `return` (and a store or atomic of the
whole program after a row's exit), a branch, loop bound or conditional expression that reads a
row-dependent value (it would become a tensor), a name whose assignments give it different dimensions
(a loop-carried accumulator started from anything but a number, a float argument a loop sums into), a hint
(`tl.multiple_of`) or a `tl.full` fill on a row-dependent value, a reduction's options by position, a
helper @triton.jit function that reduces, loads or stores, a module-level function it cannot read (an
import, `f = triton.jit(g)`) handed a tile, an access whose value or mask depends on the row while its
pointer does not, and an atomic once per program (a counter). A reduction of a value that does not
depend on the row reduces it whole, to the scalar it was. The judge then checks every case and the
held-out sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import (
    Variant,
    docstring_lines,
    dotted,
    jit_functions,
    launch_arguments,
    launch_grid_axes,
    mask_argument,
    only_launch,
    register,
    simple_assign,
    target_launch,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import code, number
from diagnose.rewriters.rowread import (
    ACCESS,
    HINTS,
    LANE,
    REDUCE,
    ROW,
    SCAN,
    Decline,
    RowKernel,
    axis_argument,
    call_name,
    is_tl,
    literal_kind,
    program_id_axis,
    read_row_kernel,
)

__all__ = ["row_kernel", "rows_per_program", "several_rows"]

_TILE_FACTORS = (1, 2, 4)  # a fitted variant's tile: the written one, twice, four times
_ROW_COUNTS = (2, 4, 8)  # rows per program where the lane block stays as written
# Rows stop adding where the tile would pass this many elements (a whole-row tile of 16,384 columns
# keeps its one row): more only spills registers and slows the compile.
_MAX_TILE = 8192
_ROWS, _N_ROWS, _ROW, _ROW_OK = "_KB_ROWS", "_kb_n_rows", "_kb_row", "_kb_row_ok"


class _RowsKernel(cst.CSTTransformer):
    """The kernel's body rewritten for a [ROWS, BLOCK] program (module docstring): each call is judged on
    the original tree (identity, dimensions) and rebuilt from its updated form, so nested rewrites (a
    masked load inside a reduction) compose."""

    def __init__(self, kernel: RowKernel) -> None:
        self.kernel = kernel
        self.dims = kernel.dims

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, last = call_name(original)
        if program_id_axis(original) == 0:
            return cst.Name(_ROW)
        if original is self.kernel.lanes:
            return cst.Subscript(updated, [cst.SubscriptElement(cst.Index(cst.Name("None"))),
                                           cst.SubscriptElement(cst.Slice(None, None))])
        if not is_tl(name):
            return updated
        if last in ("zeros", "full"):
            shape = cst.parse_expression(f"[{_ROWS}, {self.kernel.block}]")
            return updated.with_changes(args=[updated.args[0].with_changes(value=shape), *updated.args[1:]])
        if last in REDUCE | SCAN:
            # A row's reduction reduces axis 1 of the tile, keeping a [ROWS, 1] column; a value that does not
            # depend on the row is a [1, BLOCK] tile, reduced whole (axis None) to the scalar it was.
            whole = last in REDUCE and ROW not in self.dims.of(original.args[0].value)
            axis: cst.BaseExpression = cst.Name("None") if whole else cst.Integer("1")
            at, _ = axis_argument(updated, 1)
            args = list(updated.args)
            if at is None:
                new = with_keywords(updated, {"axis": axis})
            else:
                args[at] = args[at].with_changes(value=axis)
                new = updated.with_changes(args=args)
            if last not in REDUCE or whole:
                return new
            keep = next((i for i, a in enumerate(new.args) if a.keyword is not None and a.keyword.value == "keep_dims"), None)
            if keep is None:
                return with_keywords(new, {"keep_dims": cst.Name("True")})
            args = list(new.args)
            args[keep] = args[keep].with_changes(value=cst.Name("True"))
            return new.with_changes(args=args)
        if last in HINTS and len(updated.args) > 1 and self.dims.of(original.args[0].value) == {LANE}:
            args = list(updated.args)
            args[1] = args[1].with_changes(value=cst.parse_expression(f"[1, {code(args[1].value)}]"))
            return updated.with_changes(args=args)
        if last in ACCESS and original.args and ROW in self.dims.of(original.args[0].value):
            at = mask_argument(updated)
            if at is None:
                return with_keywords(updated, {"mask": cst.Name(_ROW_OK)})
            args = list(updated.args)
            if m.matches(args[at].value, m.Name("None")):
                args[at] = args[at].with_changes(value=cst.Name(_ROW_OK))
                return updated.with_changes(args=args)
            old = args[at].value
            old = old if isinstance(old, cst.Name) else old.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            args[at] = args[at].with_changes(value=cst.BinaryOperation(
                old, cst.BitAnd(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")),
                cst.Name(_ROW_OK)))
            return updated.with_changes(args=args)
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if not any(original is a for a in self.kernel.widened):
            return updated
        dtype = "tl.float32" if literal_kind(original.value) == "float" else "tl.int32"
        return updated.with_changes(value=cst.parse_expression(
            f"tl.full([{_ROWS}, 1], {code(updated.value)}, {dtype})"))  # a column of the rows' accumulators

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.BaseStatement:
        if not any(original is g for g in self.kernel.guards):
            return updated
        # The rows this early exit would have ended are masked from here on.
        test = updated.test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        live = cst.Comparison(test, [cst.ComparisonTarget(cst.Equal(), cst.Integer("0"))])
        return cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(_ROW_OK))],
                        cst.BinaryOperation(cst.Name(_ROW_OK), cst.BitAnd(), live.with_changes(
                            lpar=[cst.LeftParen()], rpar=[cst.RightParen()])))],
            leading_lines=updated.leading_lines)

    def rewrite(self) -> cst.FunctionDef:
        fn = cst.ensure_type(self.kernel.fn.visit(self), cst.FunctionDef)
        body = list(fn.body.body)
        at = docstring_lines(body)
        head = [cst.parse_statement(f"{_ROW} = tl.program_id(0) * {_ROWS} + tl.arange(0, {_ROWS})[:, None]\n"),
                cst.parse_statement(f"{_ROW_OK} = {_ROW} < {_N_ROWS}\n")]
        head[0] = head[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            "# rows per program: this program's rows, each computed as a program computed its one row"))])
        body[at:at] = head
        fn = fn.with_changes(body=fn.body.with_changes(body=body))
        return with_parameters(fn, [_N_ROWS, _ROWS], {_ROWS}, default="1")


# Calls a launch argument may make and still be evaluated again at no cost and to the same value.
_PURE_CALLS = frozenset({"size", "stride", "numel", "dim", "len", "int", "min", "max", "triton.cdiv",
                         "triton.next_power_of_2"})


def _repeatable(expr: cst.BaseExpression) -> bool:
    """Whether a launch argument can be written again beside the launch (`kb_row_block = min(B, ...E)`):
    names, numbers, shapes and arithmetic on them, `x.size(1)`, `triton.cdiv(...)`."""
    calls = [c for c in m.findall(expr, m.Call()) if isinstance(c, cst.Call)]
    return not expr.deep_equals(cst.Name("None")) and not m.findall(expr, m.Lambda() | m.Await() | m.Yield()) and all(
        dotted(c.func) in _PURE_CALLS or dotted(c.func).rsplit(".", 1)[-1] in ("size", "stride", "numel", "dim")
        for c in calls) and not isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.Float))


@dataclass(frozen=True)
class _Fit:
    """The launch side of a variant: the block argument to fit to the extent (None: the block stays as
    written), and the rows per program (source text)."""
    block: cst.Arg | None
    extent: cst.BaseExpression | None
    rows: str


class _RowsLaunch(cst.CSTTransformer):
    """The launch statement preceded by the row count, the fitted block and the rows per program; its
    grid's axis 0 divided by the rows, the two new arguments passed."""

    def __init__(self, call: cst.Call, axes: list[cst.BaseExpression], fit: _Fit) -> None:
        self.call, self.axes, self.fit = call, axes, fit
        self.done = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if original is not self.call:
            return updated
        rows = cst.Element(cst.parse_expression("triton.cdiv(kb_rows, kb_rows_per_program)"))
        grid = cst.Tuple([rows, *[cst.Element(a) for a in self.axes[1:]]]) if len(self.axes) > 1 else cst.Tuple([rows])
        args = [u.with_changes(value=cst.Name("kb_row_block")) if o is self.fit.block else u
                for o, u in zip(original.args, updated.args)]
        made = with_keywords(updated.with_changes(args=args),
                             {_N_ROWS: cst.Name("kb_rows"), _ROWS: cst.Name("kb_rows_per_program")})
        self.done += 1
        return made.with_changes(func=cst.ensure_type(made.func, cst.Subscript).with_changes(
            slice=[cst.SubscriptElement(cst.Index(grid))]))

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(original.body) != 1 or not isinstance(original.body[0], (cst.Expr, cst.Assign)) \
                or original.body[0].value is not self.call:
            return updated
        head: list[cst.BaseStatement] = [cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name("kb_rows"))], self.axes[0])], leading_lines=updated.leading_lines)]
        if self.fit.block is not None and self.fit.extent is not None:
            head.append(cst.parse_statement(
                f"kb_row_block = min({code(self.fit.block.value)}, triton.next_power_of_2(max(1, {code(self.fit.extent)})))"
                "  # the lanes fitted to the row, the lanes freed given to more rows\n"))
        head.append(cst.parse_statement(f"kb_rows_per_program = {self.fit.rows}\n"))
        self.done += 1
        return cst.FlattenSentinel([*head, updated.with_changes(leading_lines=[])])


def rows_per_program(source: str, context: dict[str, Any]) -> list[Variant]:
    if _grid_would_fall_short(source, context):
        return []
    return several_rows(source, context)


def _grid_would_fall_short(source: str, context: dict[str, Any]) -> bool:
    """Whether even 2 rows a program would leave the launch the diagnosis saw with fewer programs than the
    device's SMs: there the grid is the bottleneck and fewer, wider programs make it worse (a column scan
    on 8 programs ran 0.98 / 0.92 / 0.84x with 2 / 4 / 8 rows on the H200)."""
    target = target_launch(cst.parse_module(source), context)
    seen = (context.get("launched") or {}).get(target[0], {}) if target is not None else {}
    programs, sms = seen.get("programs", 0), seen.get("sms", 0)
    return bool(programs and sms and programs // 2 < sms)


def row_kernel(module: cst.Module, context: dict[str, Any]) -> RowKernel | None:
    """The launched kernel read as one row per program (`rowread`), None where it cannot be."""
    read = _launched_row_kernel(module, context)
    return read[2] if read is not None else None


def _launched_row_kernel(module: cst.Module, context: dict[str, Any]) -> tuple[str, cst.Call, RowKernel] | None:
    """The launched kernel's name, its launch, and the kernel read as one row per program."""
    target = target_launch(module, context)
    if target is None:
        return None
    helpers = jit_functions(module)
    try:
        return (*target, read_row_kernel(helpers[target[0]], helpers, _outside_names(module) - set(helpers)))
    except Decline:
        return None


def several_rows(source: str, context: dict[str, Any], counts: tuple[int, ...] | None = None) -> list[Variant]:
    """The rows-per-program variants (module docstring). `counts`: take exactly these rows per program, the
    lanes as written, each capped so the tile stays within _MAX_TILE elements (declined where the launch
    does not fix the block), instead of choosing by whether the lanes can be fitted."""
    module = cst.parse_module(source)
    read = _launched_row_kernel(module, context)
    if read is None:
        return []
    name, call, kernel = read
    fn = kernel.fn
    axes = launch_grid_axes(module, call)
    if not axes or any(a.star for a in call.args):
        return []
    bound = _grid_tuple_name(module, name, call)
    if bound is not None:
        # A tuple bound before the launch holds the row count of that moment (a reshape may come between):
        # read it from the tuple, not by evaluating its expression again.
        axes = [cst.parse_expression(f"{bound}[0]"), *([cst.parse_expression(f"{bound}[{i}]") for i in range(1, len(axes))])]
    arguments = launch_arguments(fn, call)
    block = arguments.get(kernel.block) if kernel.block is not None else None
    extent = arguments.get(kernel.extent) if kernel.extent is not None else None
    fitted = counts is None and block is not None and extent is not None and _repeatable(block.value) \
        and _repeatable(extent.value)
    rewritten = _RowsKernel(kernel).rewrite()
    plans: list[tuple[_Fit, dict[str, Any]]]
    if fitted and block is not None and extent is not None:
        written = code(block.value)
        plans = [(_Fit(block, extent.value, f"max(1, min({f} * {written}, max({written}, {_MAX_TILE})) // kb_row_block)"),
                  {"lanes": "fitted to the row", "tile": f"{f}x the written tile"}) for f in _TILE_FACTORS]
    else:
        known = block is not None and _repeatable(block.value)
        if counts is not None and kernel.block is not None:
            # Asked-for counts are wide: without the block at the launch to cap the tile by (a tuned or
            # defaulted block), 8 x a block of 2**17 would pass Triton's element limit.
            if not known or block is None:
                return []
            literal = number(block.value)
            if literal is not None:  # capped here: counts the cap would make equal are one variant
                counts = tuple(dict.fromkeys(c for r in counts if (c := min(r, _MAX_TILE // max(1, int(literal)))) > 1))
                if not counts:
                    return []  # a block that fills the tile alone: one column a program, as written
        choice = counts or _ROW_COUNTS
        counts = choice if known or kernel.block is None else choice[:2]  # a tuned block may be large
        plans = [(_Fit(None, None, f"max(1, min({r}, {_MAX_TILE} // {code(block.value)}))" if known and block else str(r)),
                  {"rows_per_program": r}) for r in counts]
    out = []
    for fit, params in plans:
        launch = _RowsLaunch(call, axes, fit)
        new = module.visit(launch)
        if launch.done != 2:  # the call and its statement
            continue
        body = [rewritten if isinstance(s, cst.FunctionDef) and s.name.value == name else s for s in new.body]
        out.append(Variant({"rows": "several rows per program", **params, "kernel": name},
                           new.with_changes(body=body).code))
    return out


def _outside_names(module: cst.Module) -> set[str]:
    """Module-level names bound by imports, assignments and function definitions, except Triton's language
    (`tl`, names imported from triton.language and its modules) and `triton` itself."""
    names: set[str] = set()
    for stmt in module.body:
        for node in m.findall(stmt, m.Import() | m.ImportFrom()):
            if isinstance(node, cst.ImportFrom):
                source = dotted(node.module) if node.module is not None else ""
                if source.startswith("triton.language") or isinstance(node.names, cst.ImportStar):
                    continue
                aliases = list(node.names)
            else:
                aliases = list(cst.ensure_type(node, cst.Import).names)
            for alias in aliases:
                bound = alias.asname.name if alias.asname is not None else alias.name
                text = dotted(bound) if isinstance(bound, (cst.Name, cst.Attribute)) else ""
                full = dotted(alias.name)
                if not full.startswith("triton.language") and full != "triton":
                    names.add(text.split(".")[0])
        if isinstance(stmt, cst.FunctionDef):
            names.add(stmt.name.value)
        assign = simple_assign(stmt)
        if assign is not None:
            names.add(assign[0])
    return names - {"", "tl", "triton"}


def _grid_tuple_name(module: cst.Module, kernel: str, call: cst.Call) -> str | None:
    """The name a launch's grid is, where the function holding the launch binds it to a tuple (not a
    lambda, whose body Triton evaluates at the launch anyway)."""
    index = call.func.slice[0].slice if isinstance(call.func, cst.Subscript) else None
    found = only_launch(module, kernel)
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Name)) or found is None:
        return None
    name = index.value.value
    values = [a.value for a in m.findall(found[0], m.Assign(targets=[m.AssignTarget(target=m.Name(name))]))
              if isinstance(a, cst.Assign)]
    return name if values and all(isinstance(v, cst.Tuple) for v in values) else None


register("rows-per-program")(rows_per_program)
