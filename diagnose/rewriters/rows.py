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

It declines what it cannot rewrite soundly: a kernel with a subscript (already 2-D), more than one
`tl.arange`, `tl.num_programs`, a dot, a layout change, an early `return`, a branch, loop bound or
conditional expression that reads a row-dependent value (it would become a tensor), a name whose
assignments give it different dimensions (a loop-carried `acc = 0.0` that becomes a column), a hint
(`tl.multiple_of`) or a `tl.full` fill on a row-dependent value, a reduction's options by position, a
helper @triton.jit function that reduces, loads or stores, a module-level function it cannot read (an
import, `f = triton.jit(g)`) handed a tile, an access whose value or mask depends on the row while its
pointer does not, and an atomic once per program (a counter). A reduction of a value that does not
depend on the row reduces it whole, to the scalar it was. The judge then checks every case and the
held-out sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    program_axis,
    register,
    simple_assign,
    start_plus_arange,
    target_launch,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import code, names_in

__all__ = ["rows_per_program"]

ROW, LANE = "row", "lane"  # what a value varies along once the program holds several rows
_ROWS, _N_ROWS, _ROW, _ROW_OK = "_KB_ROWS", "_kb_n_rows", "_kb_row", "_kb_row_ok"
_REDUCE = frozenset({"sum", "max", "min", "argmax", "argmin", "reduce", "xor_sum"})
_SCAN = frozenset({"cumsum", "cumprod", "associative_scan"})
_ACCESS = frozenset({"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or",
                     "atomic_xor", "atomic_xchg"})
_HINTS = frozenset({"multiple_of", "max_contiguous", "max_constancy"})
# tl calls whose meaning depends on the tile's rank or the grid, which the rewrite cannot carry over.
_REFUSED = frozenset({"dot", "dot_scaled", "reshape", "view", "trans", "permute", "broadcast_to", "expand_dims", "join",
                      "split", "sort", "flip", "histogram", "gather", "ravel", "interleave", "num_programs",
                      "make_block_ptr", "advance", "make_tensor_descriptor", "topk", "atomic_cas",
                      "tensor_descriptor", "load_tensor_descriptor", "store_tensor_descriptor"})
_TILE_FACTORS = (1, 2, 4)  # a fitted variant's tile: the written one, twice, four times
_ROW_COUNTS = (2, 4, 8)  # rows per program where the lane block stays as written
# Rows stop adding where the tile would pass this many elements (a whole-row tile of 16,384 columns
# keeps its one row): more only spills registers and slows the compile.
_MAX_TILE = 8192


@dataclass
class _Kernel:
    """What the analysis found in the kernel: the lane arange (None: one element per row), its block, the
    extent its masks compare with (None: the block cannot be fitted), and the value dimensions."""
    fn: cst.FunctionDef
    lanes: cst.Call | None
    block: str | None
    extent: str | None
    dims: dict[str, frozenset[str]] = field(default_factory=dict)


class _Decline(Exception):
    pass


def _call_name(call: cst.Call) -> tuple[str, str]:
    """(dotted name, last part) of a call's function."""
    name = dotted(call.func)
    return name, name.rsplit(".", 1)[-1]


def _is_tl(name: str) -> bool:
    return name.startswith(("tl.", "triton.language."))


def _axis_argument(call: cst.Call, position: int) -> tuple[int | None, cst.Arg | None]:
    """Where a reduction's axis is given (index in args), and the argument; (None, None) when omitted."""
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == "axis":
            return i, a
    if len(call.args) > position and call.args[position].keyword is None:
        return position, call.args[position]
    return None, None


class _Dims:
    """Which values vary along the rows and along the lanes once the program holds several rows: a
    fixpoint over every assignment in the kernel (names are flow-insensitive: a name that is a tile
    anywhere is taken for one everywhere)."""

    def __init__(self, fn: cst.FunctionDef, lanes: cst.Call | None, helpers: dict[str, cst.FunctionDef]) -> None:
        self.fn, self.lanes, self.helpers = fn, lanes, helpers
        self.names: dict[str, frozenset[str]] = {}

    def solve(self) -> dict[str, frozenset[str]]:
        bindings = _bindings(self.fn.body)
        for _ in range(len(bindings) + 2):
            changed = False
            for name, value in bindings:
                new = self.names.get(name, frozenset()) | self.of(value)
                if new != self.names.get(name, frozenset()):
                    self.names[name], changed = new, True
            if not changed:
                return self.names
        return self.names

    def of(self, node: cst.CSTNode | None) -> frozenset[str]:
        if node is None:
            return frozenset()
        if isinstance(node, cst.Name):
            return self.names.get(node.value, frozenset())
        if isinstance(node, cst.Call):
            return self._call(node)
        if isinstance(node, cst.Attribute):
            return frozenset()  # x.dtype, ptr.dtype.element_ty: types, not values
        out: frozenset[str] = frozenset()
        for child in node.children:
            if isinstance(child, cst.BaseExpression) or isinstance(child, (cst.Arg, cst.Element, cst.ComparisonTarget)):
                out |= self.of(child)
        return out

    def _call(self, call: cst.Call) -> frozenset[str]:
        name, last = _call_name(call)
        args = frozenset().union(*(self.of(a.value) for a in call.args)) if call.args else frozenset()
        if call is self.lanes:
            return frozenset({LANE})
        if program_axis(call) == 0 or (name == "tl.program_id" and _keyword_axis(call) == 0):
            return frozenset({ROW})
        if _is_tl(name) and last in ("zeros", "full"):
            return frozenset({ROW, LANE})
        if _is_tl(name) and last in _REDUCE:
            return self.of(call.args[0].value) - {LANE} if call.args else frozenset()
        if _is_tl(name) and last == "load":
            return self.of(call.args[0].value) if call.args else frozenset()
        if isinstance(call.func, cst.Attribute) and not _is_tl(name):
            return self.of(call.func.value) | args  # a tensor's method: x.to(...)
        return args


def _keyword_axis(call: cst.Call) -> int | None:
    axis = next((a for a in call.args if a.keyword is not None and a.keyword.value == "axis"), None)
    return int(axis.value.evaluated_value) if axis is not None and isinstance(axis.value, cst.Integer) else None


def _bindings(node: cst.CSTNode) -> list[tuple[str, cst.BaseExpression]]:
    """(name, value) of every assignment under `node`; an augmented one binds its value (which joins the
    name's), a loop target binds its iterable."""
    out: list[tuple[str, cst.BaseExpression]] = []
    for found in m.findall(node, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
        if isinstance(found, cst.Assign):
            out += [(n, found.value) for t in found.targets for n in names_in(t.target)]
        elif isinstance(found, (cst.AugAssign, cst.AnnAssign)) and found.value is not None:
            out += [(n, found.value) for n in names_in(found.target)]
        elif isinstance(found, cst.For):
            out += [(n, found.iter) for n in names_in(found.target)]
    return out


def _pure_helper(fn: cst.FunctionDef, helpers: dict[str, cst.FunctionDef], depth: int = 0) -> bool:
    """Whether a @triton.jit helper acts on each element alone: no loop, branch, subscript, access,
    reduction, scan, tile factory or program id (Liger's `silu`, a `_gelu(x)`)."""
    if depth > 3 or m.findall(fn.body, m.For() | m.While() | m.If() | m.Subscript()):
        return False
    for call in m.findall(fn.body, m.Call()):
        assert isinstance(call, cst.Call)
        name, last = _call_name(call)
        if _is_tl(name) and (last in _REDUCE | _SCAN | _ACCESS | _REFUSED | _HINTS
                             or last in ("arange", "zeros", "full", "program_id")):
            return False
        if name in helpers and not (name != fn.name.value and _pure_helper(helpers[name], helpers, depth + 1)):
            return False
    return True


def _analyse(fn: cst.FunctionDef, helpers: dict[str, cst.FunctionDef], outside: set[str]) -> _Kernel:
    """The kernel read for the rewrite; raises _Decline with why not. `outside`: the module-level names
    that are neither Triton's language nor a @triton.jit helper seen here (imports, `f = triton.jit(g)`):
    what they do to a tile is unknown."""
    if m.findall(fn.body, m.Subscript() | m.Return() | m.Lambda() | m.GeneratorExp() | m.ListComp()):
        raise _Decline("subscript, return or comprehension")
    calls = [c for c in m.findall(fn.body, m.Call()) if isinstance(c, cst.Call)]
    aranges = [c for c in calls if dotted(c.func) == "tl.arange"]
    pids = [c for c in calls if dotted(c.func) == "tl.program_id"]
    if len(aranges) > 1 or not any(program_axis(c) == 0 or _keyword_axis(c) == 0 for c in pids):
        raise _Decline("not one row per program with one lane axis")
    if any(program_axis(c) is None and _keyword_axis(c) is None for c in pids):
        raise _Decline("a program id whose axis is not a literal")
    lanes = aranges[0] if aranges else None
    if lanes is not None and not (len(lanes.args) == 2 and m.matches(lanes.args[0].value, m.Integer("0"))
                                  and isinstance(lanes.args[1].value, cst.Name)):
        raise _Decline("the lane axis is not tl.arange(0, BLOCK)")
    block = cst.ensure_type(lanes.args[1].value, cst.Name).value if lanes is not None else None
    for call in calls:
        name, last = _call_name(call)
        if _is_tl(name) and last in _REFUSED:
            raise _Decline(f"tl.{last}")
        if name in helpers and not _pure_helper(helpers[name], helpers):
            raise _Decline(f"helper {name} is not elementwise")
        if not _is_tl(name) and isinstance(call.func, cst.Attribute) and last in _REDUCE | _SCAN:
            raise _Decline("a reduction written as a method")
        if _is_tl(name) and last in ("zeros", "full") and not _lane_shape(call, block):
            raise _Decline("a tile factory of another shape than [BLOCK]")
        if isinstance(call.func, cst.Attribute) and not _is_tl(name) and last in _REFUSED:
            raise _Decline(f"a layout change written as a method (.{last})")
        positional = sum(1 for a in call.args if a.keyword is None)
        if _is_tl(name) and last in _REDUCE and positional > (3 if last == "reduce" else 2):
            raise _Decline("a reduction's options given by position")
    kernel = _Kernel(fn, lanes, block, None)
    dims = _Dims(fn, lanes, helpers)
    kernel.dims = dims.solve()
    for call in calls:
        name, last = _call_name(call)
        if name.split(".")[0] in outside and any(dims.of(a.value) for a in call.args):
            raise _Decline(f"{name} is not a function the rewrite can read")
        if _is_tl(name) and last == "full" and any(dims.of(a.value) for a in call.args[1:]):
            raise _Decline("a tile filled with a row-dependent value")
    _check_control(fn, dims)
    _check_accesses(calls, dims)
    for call in calls:
        name, last = _call_name(call)
        if _is_tl(name) and last in _HINTS and call.args and ROW in dims.of(call.args[0].value):
            raise _Decline("a hint on a row-dependent value")
    kernel.extent = _extent(fn, kernel, calls, dims)
    return kernel


def _lane_shape(call: cst.Call, block: str | None) -> bool:
    """Whether a tl.zeros / tl.full call's shape is `[BLOCK]` or `(BLOCK,)`."""
    shape = call.args[0].value if call.args else None
    if block is None or not isinstance(shape, (cst.List, cst.Tuple)) or len(shape.elements) != 1:
        return False
    return m.matches(shape.elements[0].value, m.Name(block))


def _check_control(fn: cst.FunctionDef, dims: _Dims) -> None:
    """Branches, loop bounds and conditional expressions must not read row-dependent values (they would
    become tensors), and every plain assignment of a name assigned more than once must give it the same
    dimensions: a loop-carried `acc = 0.0` that the loop makes a row's column (`acc += tl.sum(x)`) would
    change type between iterations. (An augmented assignment keeps its target's dimensions.)"""
    for node in m.findall(fn.body, m.If() | m.While() | m.IfExp()):
        assert isinstance(node, (cst.If, cst.While, cst.IfExp))
        if dims.of(node.test):
            raise _Decline("a branch on a row-dependent value")
    for loop in m.findall(fn.body, m.For()):
        if dims.of(cst.ensure_type(loop, cst.For).iter):
            raise _Decline("a loop bound that depends on the row")
    plain = [(n, v) for node in m.findall(fn.body, m.Assign() | m.AnnAssign())
             for n, v in _bindings(cst.SimpleStatementLine([cst.ensure_type(node, (cst.Assign, cst.AnnAssign))]))]  # type: ignore[arg-type]
    counts: dict[str, int] = {}
    for name, _ in _bindings(fn.body):
        counts[name] = counts.get(name, 0) + 1
    for name, value in plain:
        if counts[name] > 1 and dims.of(value) != dims.names.get(name, frozenset()):
            raise _Decline(f"{name} changes dimensions between its assignments")


def _check_accesses(calls: list[cst.Call], dims: _Dims) -> None:
    """An access whose pointer does not depend on the row must not take a row-dependent value or mask:
    Triton broadcasts those to the pointer's shape, not the other way."""
    for call in calls:
        name, last = _call_name(call)
        if not (_is_tl(name) and last in _ACCESS) or not call.args:
            continue
        pointer = dims.of(call.args[0].value)
        others = frozenset().union(*(dims.of(a.value) for a in call.args[1:])) if len(call.args) > 1 else frozenset()
        if not others <= pointer:
            raise _Decline(f"tl.{last} with a pointer narrower than its value or mask")
        if last.startswith("atomic") and ROW not in pointer:
            raise _Decline("an atomic once per program (a counter) would count programs, not rows")


def _extent(fn: cst.FunctionDef, kernel: _Kernel, calls: list[cst.Call], dims: _Dims) -> str | None:
    """The parameter E the lane masks compare with, when the lane block can be fitted to it: BLOCK is a
    constexpr used only in the arange, a `tl.program_id(k) * BLOCK` start (k > 0) and tile shapes, and
    every access through the lanes is masked."""
    block = kernel.block
    params = {p.name.value: p for p in fn.params.params}
    annotation = params[block].annotation if block is not None and block in params else None
    if block is None or annotation is None or not dotted(annotation.annotation).endswith("constexpr"):
        return None
    uses = [n for n in m.findall(fn.body, m.Name(block))]
    allowed = {id(kernel.lanes.args[1].value)} if kernel.lanes is not None else set()
    for call in calls:
        name, last = _call_name(call)
        if _is_tl(name) and last in ("zeros", "full") and call.args:
            allowed |= {id(n) for n in m.findall(call.args[0].value, m.Name(block))}
    for product in m.findall(fn.body, m.BinaryOperation(operator=m.Multiply())):
        assert isinstance(product, cst.BinaryOperation)
        for side, other in ((product.left, product.right), (product.right, product.left)):
            axis = program_axis(other) if isinstance(other, cst.Call) else None
            if m.matches(side, m.Name(block)) and axis is not None and axis > 0:
                allowed.add(id(side))
    if any(id(n) not in allowed for n in uses):
        return None
    if any(_is_tl(name) and last in _REDUCE | _SCAN for name, last in map(_call_name, calls)):
        return None  # masked lanes may reach a reduction (other=0.0 in a max): the written block is part of the result
    lanes = _lane_names(fn, kernel)
    once = _single_top_level(fn)
    extents: set[str] = set()
    for call in calls:
        name, last = _call_name(call)
        if not (_is_tl(name) and last in _ACCESS and call.args and LANE in dims.of(call.args[0].value)):
            continue
        at = _mask_index(call)
        if at is None:
            return None  # an unmasked lane access relies on the block being the written one
        bounds = {_lane_bound(term, lanes, params) for term in _conjuncts(call.args[at].value, once)}
        bounds.discard(None)
        if not bounds:
            return None  # a mask that does not bound the lanes themselves (`src = lanes - 1`, `iw = ow // 2`)
        extents |= bounds  # type: ignore[arg-type]
    return next(iter(extents)) if len(extents) == 1 else None


def _lane_names(fn: cst.FunctionDef, kernel: _Kernel) -> set[str]:
    """Names bound once at the kernel's top to the lanes themselves: `tl.arange(0, BLOCK)` or
    `tl.program_id(k) * BLOCK + tl.arange(0, BLOCK)` (k > 0)."""
    out = set()
    for name, value in _single_top_level(fn).items():
        if value is kernel.lanes:
            out.add(name)
            continue
        parts = start_plus_arange(value)
        if parts is None or not (isinstance(value, cst.BinaryOperation)
                                 and any(side is kernel.lanes for side in (value.left, value.right))):
            continue
        start = parts[0]
        if isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Multiply) and any(
                m.matches(a, m.Name(kernel.block or "")) and isinstance(b, cst.Call) and (program_axis(b) or 0) > 0
                for a, b in ((start.left, start.right), (start.right, start.left))):
            out.add(name)
    return out


def _single_top_level(fn: cst.FunctionDef) -> dict[str, cst.BaseExpression]:
    """Names the kernel binds exactly once, by a plain assignment at its top level, and their values."""
    counts: dict[str, int] = {}
    for name, _ in _bindings(fn.body):
        counts[name] = counts.get(name, 0) + 1
    out = {}
    for stmt in fn.body.body:
        assign = simple_assign(stmt)
        if assign is not None and counts.get(assign[0]) == 1:
            out[assign[0]] = assign[1]
    return out


def _conjuncts(mask: cst.BaseExpression, once: dict[str, cst.BaseExpression], depth: int = 0) -> list[cst.BaseExpression]:
    """The terms `mask` is the `&` of, through names bound once (`mask = cols < N` then `mask & ok`)."""
    if isinstance(mask, cst.BinaryOperation) and isinstance(mask.operator, cst.BitAnd):
        return _conjuncts(mask.left, once, depth) + _conjuncts(mask.right, once, depth)
    if isinstance(mask, cst.Name) and mask.value in once and depth < 8:
        return _conjuncts(once[mask.value], once, depth + 1)
    return [mask]


def _lane_bound(term: cst.BaseExpression, lanes: set[str], params: dict[str, cst.Param]) -> str | None:
    """E of a term `lanes < E`, E a parameter of the kernel."""
    if isinstance(term, cst.Comparison) and len(term.comparisons) == 1 \
            and isinstance(term.comparisons[0].operator, cst.LessThan) and isinstance(term.left, cst.Name) \
            and term.left.value in lanes and isinstance(term.comparisons[0].comparator, cst.Name) \
            and term.comparisons[0].comparator.value in params:
        return term.comparisons[0].comparator.value
    return None


def _mask_index(call: cst.Call) -> int | None:
    _, last = _call_name(call)
    if last in ("load", "store"):
        return mask_argument(call)
    keyword = next((i for i, a in enumerate(call.args) if a.keyword is not None and a.keyword.value == "mask"), None)
    if keyword is not None:
        return keyword
    return 2 if len(call.args) > 2 and call.args[2].keyword is None else None


class _RowsKernel(cst.CSTTransformer):
    """The kernel's body rewritten for a [ROWS, BLOCK] program (module docstring): each call is judged on
    the original tree (identity, dimensions) and rebuilt from its updated form, so nested rewrites (a
    masked load inside a reduction) compose."""

    def __init__(self, kernel: _Kernel) -> None:
        self.kernel = kernel
        self.dims = _Dims(kernel.fn, kernel.lanes, {})
        self.dims.names = kernel.dims

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, last = _call_name(original)
        if name == "tl.program_id" and (program_axis(original) == 0 or _keyword_axis(original) == 0):
            return cst.Name(_ROW)
        if original is self.kernel.lanes:
            return cst.Subscript(updated, [cst.SubscriptElement(cst.Index(cst.Name("None"))),
                                           cst.SubscriptElement(cst.Slice(None, None))])
        if not _is_tl(name):
            return updated
        if last in ("zeros", "full"):
            shape = cst.parse_expression(f"[{_ROWS}, {self.kernel.block}]")
            return updated.with_changes(args=[updated.args[0].with_changes(value=shape), *updated.args[1:]])
        if last in _REDUCE | _SCAN:
            # A row's reduction reduces axis 1 of the tile, keeping a [ROWS, 1] column; a value that does not
            # depend on the row is a [1, BLOCK] tile, reduced whole (axis None) to the scalar it was.
            whole = last in _REDUCE and ROW not in self.dims.of(original.args[0].value)
            axis: cst.BaseExpression = cst.Name("None") if whole else cst.Integer("1")
            at, _ = _axis_argument(updated, 1)
            args = list(updated.args)
            if at is None:
                new = with_keywords(updated, {"axis": axis})
            else:
                args[at] = args[at].with_changes(value=axis)
                new = updated.with_changes(args=args)
            if last not in _REDUCE or whole:
                return new
            keep = next((i for i, a in enumerate(new.args) if a.keyword is not None and a.keyword.value == "keep_dims"), None)
            if keep is None:
                return with_keywords(new, {"keep_dims": cst.Name("True")})
            args = list(new.args)
            args[keep] = args[keep].with_changes(value=cst.Name("True"))
            return new.with_changes(args=args)
        if last in _HINTS and len(updated.args) > 1 and self.dims.of(original.args[0].value) == {LANE}:
            args = list(updated.args)
            args[1] = args[1].with_changes(value=cst.parse_expression(f"[1, {code(args[1].value)}]"))
            return updated.with_changes(args=args)
        if last in _ACCESS and original.args and ROW in self.dims.of(original.args[0].value):
            at = _mask_index(updated)
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
    module = cst.parse_module(source)
    target = target_launch(module, context)
    if target is None:
        return []
    name, call = target
    helpers = jit_functions(module)
    fn = helpers[name]
    try:
        kernel = _analyse(fn, helpers, _outside_names(module) - set(helpers))
    except _Decline:
        return []
    axes = launch_grid_axes(module, call)
    if not axes or any(a.star for a in call.args):
        return []
    bound = _grid_tuple_name(module, call)
    if bound is not None:
        # A tuple bound before the launch holds the row count of that moment (a reshape may come between):
        # read it from the tuple, not by evaluating its expression again.
        axes = [cst.parse_expression(f"{bound}[0]"), *([cst.parse_expression(f"{bound}[{i}]") for i in range(1, len(axes))])]
    arguments = launch_arguments(fn, call)
    block = arguments.get(kernel.block) if kernel.block is not None else None
    extent = arguments.get(kernel.extent) if kernel.extent is not None else None
    fitted = block is not None and extent is not None and _repeatable(block.value) and _repeatable(extent.value)
    rewritten = _RowsKernel(kernel).rewrite()
    plans: list[tuple[_Fit, dict[str, Any]]]
    if fitted and block is not None and extent is not None:
        written = code(block.value)
        plans = [(_Fit(block, extent.value, f"max(1, min({f} * {written}, max({written}, {_MAX_TILE})) // kb_row_block)"),
                  {"lanes": "fitted to the row", "tile": f"{f}x the written tile"}) for f in _TILE_FACTORS]
    else:
        known = block is not None and _repeatable(block.value)
        counts = _ROW_COUNTS if known or kernel.block is None else _ROW_COUNTS[:2]  # a tuned block may be large
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


def _grid_tuple_name(module: cst.Module, call: cst.Call) -> str | None:
    """The name a launch's grid is, where the launching function binds it to a tuple (not a lambda, whose
    body Triton evaluates at the launch anyway)."""
    index = call.func.slice[0].slice if isinstance(call.func, cst.Subscript) else None
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Name)):
        return None
    name = index.value.value
    values = [a.value for a in m.findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name(name))]))
              if isinstance(a, cst.Assign)]
    return name if values and all(isinstance(v, cst.Tuple) for v in values) else None


register("rows-per-program")(rows_per_program)
