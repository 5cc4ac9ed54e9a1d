"""How a row-per-program kernel reads for the rows-per-program rewrite (`rows.py`): which values vary
along the rows and along the lanes once a program holds several rows (`Dims`), what the rewrite cannot
carry over (`Decline`, with why), and whether the lanes' block can be fitted to the row (`RowKernel.extent`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import dotted, mask_argument, program_axis, simple_assign, start_plus_arange
from diagnose.rewriters.blocks import assigned_names, conjuncts, infinity_sign, names_in, number

__all__ = ["ACCESS", "HINTS", "LANE", "REDUCE", "REFUSED", "ROW", "SCAN", "Decline", "Dims", "RowKernel", "axis_argument",
           "call_name", "is_tl", "literal_kind", "program_id_axis", "read_row_kernel"]

ROW, LANE = "row", "lane"  # what a value varies along once the program holds several rows
REDUCE = frozenset({"sum", "max", "min", "argmax", "argmin", "reduce", "xor_sum"})
SCAN = frozenset({"cumsum", "cumprod", "associative_scan"})
ACCESS = frozenset({"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or",
                    "atomic_xor", "atomic_xchg"})
HINTS = frozenset({"multiple_of", "max_contiguous", "max_constancy"})
# Python builtins a kernel may call on a value: triton compiles min/max/abs to tl ops, the interpreter does not.
_BUILTINS = frozenset({"min", "max", "abs", "round", "pow", "sum", "int", "float", "bool", "divmod"})
# tl calls whose meaning depends on the tile's rank or the grid, which the rewrite cannot carry over.
REFUSED = frozenset({"dot", "dot_scaled", "reshape", "view", "trans", "permute", "broadcast_to", "expand_dims", "join",
                     "split", "sort", "flip", "histogram", "gather", "ravel", "interleave", "num_programs",
                     "make_block_ptr", "advance", "make_tensor_descriptor", "topk", "atomic_cas",
                     "tensor_descriptor", "load_tensor_descriptor", "store_tensor_descriptor"})


@dataclass
class RowKernel:
    """A kernel read for the rewrite: the lane arange (None: one element per row), its block, the extent
    parameter its lane masks bound the lanes by (None: the block cannot be fitted), and the dimensions
    of its values."""
    fn: cst.FunctionDef
    lanes: cst.Call | None
    block: str | None
    extent: str | None
    dims: Dims
    # Early exits for rows past the end (`if row >= n_rows: return`, at the top level): with several rows a
    # program they become a mask on every access after them (`rows.py`).
    guards: tuple[cst.If, ...] = ()
    # Scalar accumulators a row's reduction adds to (`total = 0.0` ... `total += tl.sum(x)`): their first
    # value becomes a [ROWS, 1] column of it (`rows.py`).
    widened: tuple[cst.Assign, ...] = ()


class Decline(Exception):
    """A kernel a row rewrite (several rows per program, a row in chunks) cannot carry over soundly; the
    message says why."""


def call_name(call: cst.Call) -> tuple[str, str]:
    """(dotted name, last part) of a call's function."""
    name = dotted(call.func)
    return name, name.rsplit(".", 1)[-1]


def is_tl(name: str) -> bool:
    """Whether a dotted call name is Triton's language (`tl.sum`, `triton.language.sum`)."""
    return name.startswith(("tl.", "triton.language."))


def axis_argument(call: cst.Call, position: int) -> tuple[int | None, cst.Arg | None]:
    """Where a reduction's axis is given (index in args), and the argument; (None, None) when omitted."""
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == "axis":
            return i, a
    if len(call.args) > position and call.args[position].keyword is None:
        return position, call.args[position]
    return None, None


class Dims:
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
        name, last = call_name(call)
        args = frozenset().union(*(self.of(a.value) for a in call.args)) if call.args else frozenset()
        if call is self.lanes:
            return frozenset({LANE})
        if program_id_axis(call) == 0:
            return frozenset({ROW})
        if is_tl(name) and last in ("zeros", "full"):
            return frozenset({ROW, LANE})
        if is_tl(name) and last in REDUCE:
            return self.of(call.args[0].value) - {LANE} if call.args else frozenset()
        if is_tl(name) and last == "load":
            return self.of(call.args[0].value) if call.args else frozenset()
        if isinstance(call.func, cst.Attribute) and not is_tl(name):
            return self.of(call.func.value) | args  # a tensor's method: x.to(...)
        return args


def program_id_axis(call: cst.Call) -> int | None:
    """The axis of `tl.program_id(<literal>)` or `tl.program_id(axis=<literal>)`, else None."""
    if dotted(call.func) != "tl.program_id":
        return None
    axis = next((a for a in call.args if a.keyword is not None and a.keyword.value == "axis"), None)
    if axis is None:
        return program_axis(call)
    return int(axis.value.evaluated_value) if isinstance(axis.value, cst.Integer) else None


def _bindings(node: cst.CSTNode, plain: bool = False) -> list[tuple[str, cst.BaseExpression]]:
    """(name, value) of every assignment under `node`; an augmented one binds its value (which joins the
    name's), a loop target binds its iterable. `plain`: only `name = value` (and annotated) assignments."""
    out: list[tuple[str, cst.BaseExpression]] = []
    kinds = m.Assign() | m.AnnAssign() if plain else m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()
    for found in m.findall(node, kinds):
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
        name, last = call_name(call)
        if is_tl(name) and (last in REDUCE | SCAN | ACCESS | REFUSED | HINTS
                             or last in ("arange", "zeros", "full", "program_id")):
            return False
        if name in helpers and not (name != fn.name.value and _pure_helper(helpers[name], helpers, depth + 1)):
            return False
    return True


def read_row_kernel(fn: cst.FunctionDef, helpers: dict[str, cst.FunctionDef], outside: set[str]) -> RowKernel:
    """The kernel read for the rewrite; raises Decline with why not. `outside`: the module-level names
    that are neither Triton's language nor a @triton.jit helper seen here (imports, `f = triton.jit(g)`):
    what they do to a tile is unknown."""
    guards = [st for st in fn.body.body if _is_guard(st)]
    exits = {id(cst.ensure_type(g.body.body[0], cst.SimpleStatementLine).body[0]) for g in guards}
    if m.findall(fn.body, m.Subscript() | m.Lambda() | m.GeneratorExp() | m.ListComp()) or any(
            id(r) not in exits for r in m.findall(fn.body, m.Return())):
        raise Decline("subscript, return or comprehension")
    calls = [c for c in m.findall(fn.body, m.Call()) if isinstance(c, cst.Call)]
    aranges = [c for c in calls if dotted(c.func) == "tl.arange"]
    pids = [c for c in calls if dotted(c.func) == "tl.program_id"]
    if len(aranges) > 1 or not any(program_id_axis(c) == 0 for c in pids):
        raise Decline("not one row per program with one lane axis")
    if any(program_id_axis(c) is None for c in pids):
        raise Decline("a program id whose axis is not a literal")
    lanes = aranges[0] if aranges else None
    if lanes is not None and not (len(lanes.args) == 2 and m.matches(lanes.args[0].value, m.Integer("0"))
                                  and isinstance(lanes.args[1].value, cst.Name)):
        raise Decline("the lane axis is not tl.arange(0, BLOCK)")
    block = cst.ensure_type(lanes.args[1].value, cst.Name).value if lanes is not None else None
    for call in calls:
        name, last = call_name(call)
        if is_tl(name) and last in REFUSED:
            raise Decline(f"tl.{last}")
        if name in helpers and not _pure_helper(helpers[name], helpers):
            raise Decline(f"helper {name} is not elementwise")
        if not is_tl(name) and isinstance(call.func, cst.Attribute) and last in REDUCE | SCAN:
            raise Decline("a reduction written as a method")
        if is_tl(name) and last in ("zeros", "full") and not _lane_shape(call, block):
            raise Decline("a tile factory of another shape than [BLOCK]")
        if isinstance(call.func, cst.Attribute) and not is_tl(name) and last in REFUSED:
            raise Decline(f"a layout change written as a method (.{last})")
        positional = sum(1 for a in call.args if a.keyword is None)
        if is_tl(name) and last in REDUCE and positional > (3 if last == "reduce" else 2):
            raise Decline("a reduction's options given by position")
    dims = Dims(fn, lanes, helpers)
    dims.solve()
    for call in calls:
        name, last = call_name(call)
        if name.split(".")[0] in outside and any(dims.of(a.value) for a in call.args):
            raise Decline(f"{name} is not a function the rewrite can read")
        if is_tl(name) and last == "full" and any(dims.of(a.value) for a in call.args[1:]):
            raise Decline("a tile filled with a row-dependent value")
        if is_tl(name) and last in HINTS and call.args and ROW in dims.of(call.args[0].value):
            raise Decline("a hint on a row-dependent value")
        if isinstance(call.func, cst.Name) and call.func.value in _BUILTINS and name not in helpers \
                and any(ROW in dims.of(a.value) for a in call.args):
            # compiled, `min(col, n - 1)` is tl.minimum; the interpreter, which judges, runs Python's own on a tile
            raise Decline(f"Python's {name} on a row-dependent value")
    row_guards = _row_guards(fn, guards, dims)
    widened = _check_control(fn, dims, row_guards)
    _check_accesses(calls, dims)
    kernel = RowKernel(fn, lanes, block, None, dims, tuple(row_guards), tuple(widened))
    kernel.extent = _extent(fn, kernel, calls)
    return kernel


def _lane_shape(call: cst.Call, block: str | None) -> bool:
    """Whether a tl.zeros / tl.full call's shape is `[BLOCK]` or `(BLOCK,)`."""
    shape = call.args[0].value if call.args else None
    if block is None or not isinstance(shape, (cst.List, cst.Tuple)) or len(shape.elements) != 1:
        return False
    return m.matches(shape.elements[0].value, m.Name(block))


def _is_guard(statement: cst.CSTNode) -> TypeGuard[cst.If]:
    """`if C: return` alone, no else."""
    return isinstance(statement, cst.If) and statement.orelse is None and len(statement.body.body) == 1 and \
        m.matches(statement.body.body[0], m.SimpleStatementLine(body=[m.Return(value=None)]))


def _row_guards(fn: cst.FunctionDef, guards: list[cst.If], dims: Dims) -> list[cst.If]:
    """The early exits whose test depends on the row (a scalar test stays a branch of the whole program).
    After the first, every store and atomic must depend on the row too: a store of the program's that the
    exit skipped for one row would run for the others."""
    row = [g for g in guards if dims.of(g.test)]
    if any(LANE in dims.of(g.test) for g in row):
        raise Decline("an early return on lane values")
    if row:
        after = fn.body.body[fn.body.body.index(row[0]) + 1:]
        for call in (c for st in after for c in m.findall(st, m.Call()) if isinstance(c, cst.Call)):
            name, last = call_name(call)
            if is_tl(name) and last in ACCESS and last != "load" and call.args \
                    and ROW not in dims.of(call.args[0].value):
                raise Decline(f"tl.{last} of the whole program after an early return of a row")
    return row


def literal_kind(value: cst.BaseExpression) -> str | None:
    """"float" or "int" for a number literal (signed, or an infinity as kernels spell it), else None."""
    if infinity_sign(value) is not None:
        return "float"
    if number(value) is None:
        return None
    unsigned = value.expression if isinstance(value, cst.UnaryOperation) else value
    return "int" if isinstance(unsigned, cst.Integer) else "float"


def _check_control(fn: cst.FunctionDef, dims: Dims, guards: list[cst.If]) -> list[cst.Assign]:
    """Branches, loop bounds and conditional expressions must not read row-dependent values (they would
    become tensors; early exits of a row, `guards`, become masks), and every plain assignment of a name
    assigned more than once must give it the same dimensions: a loop-carried `acc = 0.0` that the loop
    makes a row's column (`acc += tl.sum(x)`) would change type between iterations. (An augmented
    assignment keeps its target's dimensions.)"""
    for node in m.findall(fn.body, m.If() | m.While() | m.IfExp()):
        assert isinstance(node, (cst.If, cst.While, cst.IfExp))
        if any(node is g for g in guards):
            continue
        if dims.of(node.test):
            raise Decline("a branch on a row-dependent value")
    for loop in m.findall(fn.body, m.For()):
        if dims.of(cst.ensure_type(loop, cst.For).iter):
            raise Decline("a loop bound that depends on the row")
    counts = assigned_names(fn.body)
    # A scalar accumulator's first value, a number at the top level, can start the column it becomes.
    firsts = {id(a): a for st in fn.body.body if isinstance(st, cst.SimpleStatementLine)
              for a in st.body if isinstance(a, cst.Assign) and len(a.targets) == 1
              and isinstance(a.targets[0].target, cst.Name) and literal_kind(a.value) is not None}
    widened = []
    for name, value in _bindings(fn.body, plain=True):
        if counts[name] > 1 and dims.of(value) != dims.names.get(name, frozenset()):
            first = next((a for a in firsts.values() if a.value is value), None)
            if first is None or dims.names.get(name) != frozenset({ROW}):
                raise Decline(f"{name} changes dimensions between its assignments")
            widened.append(first)
    # A parameter has no plain assignment to compare with: one that a loop or a branch grows into a
    # tile (`total += tl.sum(x)`, total a float argument) would change type there (Triton refuses a
    # loop-carried or branch value whose type changes; the interpreter does not), unless straight-line
    # code made it that shape before (`x_ptr += col`).
    params = {p.name.value for p in fn.params.params}
    straight = [st for st in fn.body.body if isinstance(st, cst.SimpleStatementLine)]
    shaped: dict[str, frozenset[str]] = {}
    for st in straight:
        for aug in m.findall(st, m.AugAssign(target=m.Name())):
            assert isinstance(aug, cst.AugAssign) and isinstance(aug.target, cst.Name)
            shaped[aug.target.value] = shaped.get(aug.target.value, frozenset()) | dims.of(aug.value)
    for block in m.findall(fn.body, m.For() | m.While() | m.If()):
        for aug in m.findall(block, m.AugAssign(target=m.Name())):  # bodies and else branches alike
            assert isinstance(aug, cst.AugAssign) and isinstance(aug.target, cst.Name)
            name = aug.target.value
            if name in params and not dims.of(aug.value) <= shaped.get(name, frozenset()):
                raise Decline(f"parameter {name} becomes a tile inside a loop or branch")
    return widened


def _check_accesses(calls: list[cst.Call], dims: Dims) -> None:
    """An access whose pointer does not depend on the row must not take a row-dependent value or mask:
    Triton broadcasts those to the pointer's shape, not the other way."""
    for call in calls:
        name, last = call_name(call)
        if not (is_tl(name) and last in ACCESS) or not call.args:
            continue
        pointer = dims.of(call.args[0].value)
        others = frozenset().union(*(dims.of(a.value) for a in call.args[1:])) if len(call.args) > 1 else frozenset()
        if not others <= pointer:
            raise Decline(f"tl.{last} with a pointer narrower than its value or mask")
        if last.startswith("atomic") and ROW not in pointer:
            raise Decline("an atomic once per program (a counter) would count programs, not rows")


def _extent(fn: cst.FunctionDef, kernel: RowKernel, calls: list[cst.Call]) -> str | None:
    """The parameter E the lanes' masks bound them by, when the lane block can be fitted to it: BLOCK is a
    constexpr used only in the arange, a `tl.program_id(k) * BLOCK` start (k > 0) and tile shapes; nothing
    reduces or scans; and every access through the lanes has a mask term `lanes < E`, one E for all."""
    block, dims = kernel.block, kernel.dims
    params = {p.name.value: p for p in fn.params.params}
    annotation = params[block].annotation if block is not None and block in params else None
    if block is None or annotation is None or not dotted(annotation.annotation).endswith("constexpr"):
        return None
    uses = [n for n in m.findall(fn.body, m.Name(block))]
    allowed = {id(kernel.lanes.args[1].value)} if kernel.lanes is not None else set()
    for call in calls:
        name, last = call_name(call)
        if is_tl(name) and last in ("zeros", "full") and call.args:
            allowed |= {id(n) for n in m.findall(call.args[0].value, m.Name(block))}
    for product in m.findall(fn.body, m.BinaryOperation(operator=m.Multiply())):
        assert isinstance(product, cst.BinaryOperation)
        for side, other in ((product.left, product.right), (product.right, product.left)):
            axis = program_axis(other) if isinstance(other, cst.Call) else None
            if m.matches(side, m.Name(block)) and axis is not None and axis > 0:
                allowed.add(id(side))
    if any(id(n) not in allowed for n in uses):
        return None
    if any(is_tl(name) and last in REDUCE | SCAN for name, last in map(call_name, calls)):
        return None  # masked lanes may reach a reduction (other=0.0 in a max): the written block is part of the result
    reassigned = set(assigned_names(fn.body))
    once = _single_top_level(fn)
    lanes = _lane_names(once, kernel)
    extents: set[str] = set()
    for call in calls:
        name, last = call_name(call)
        if not (is_tl(name) and last in ACCESS and call.args and LANE in dims.of(call.args[0].value)):
            continue
        at = mask_argument(call)
        if at is None:
            return None  # an unmasked lane access relies on the block being the written one
        bounds = {_lane_bound(term, lanes, params) for term in conjuncts(call.args[at].value, once)}
        bounds.discard(None)
        if bounds & reassigned:
            return None  # `half = half * 2` before `cols < half`: the launch's value is not the extent
        if not bounds:
            return None  # a mask that does not bound the lanes themselves (`src = lanes - 1`, `iw = ow // 2`)
        extents |= bounds  # type: ignore[arg-type]
    return next(iter(extents)) if len(extents) == 1 else None


def _lane_names(once: dict[str, cst.BaseExpression], kernel: RowKernel) -> set[str]:
    """Names among `once` (bound once at the kernel's top) bound to the lanes themselves:
    `tl.arange(0, BLOCK)` or `tl.program_id(k) * BLOCK + tl.arange(0, BLOCK)` (k > 0)."""
    out = set()
    for name, value in once.items():
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
    counts = assigned_names(fn.body)
    out = {}
    for stmt in fn.body.body:
        assign = simple_assign(stmt)
        if assign is not None and counts.get(assign[0]) == 1:
            out[assign[0]] = assign[1]
    return out


def _lane_bound(term: cst.BaseExpression, lanes: set[str], params: dict[str, cst.Param]) -> str | None:
    """E of a term `lanes < E`, E a parameter of the kernel."""
    if isinstance(term, cst.Comparison) and len(term.comparisons) == 1 \
            and isinstance(term.comparisons[0].operator, cst.LessThan) and isinstance(term.left, cst.Name) \
            and term.left.value in lanes and isinstance(term.comparisons[0].comparator, cst.Name) \
            and term.comparisons[0].comparator.value in params:
        return term.comparisons[0].comparator.value
    return None
