"""How a row-per-program kernel whose tile is its whole row reads for the chunked-row-loop rewrite
(`rowloop.py`): its straight-line statements as lane statements (tiles), scalar statements (reductions
included) and tile stores, each name read resolved to the statement that assigned it; its reductions,
the loops they share, and the sums that can ride along their max as online sums."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import ReplaceNodes, docstring_lines, dotted
from diagnose.rewriters.blocks import bare, code
from diagnose.rewriters.rowread import Decline
from diagnose.rewriters.rowsplit import elementwise_call

__all__ = ["REDUCTIONS", "SCANS", "Decline", "Group", "Online", "Reduction", "RowLoop", "Statement", "columns_arange",
           "is_arange", "lane_closure", "names_read", "read_kernel", "scan_of"]

REDUCTIONS = {"sum": "", "max": "tl.maximum", "min": "tl.minimum"}
_EXPONENTIALS = frozenset({"tl.exp", "tl.exp2", "tl.math.exp", "tl.math.exp2"})


def reduction_of(node: cst.CSTNode) -> str | None:
    """'sum' / 'max' / 'min' for `tl.sum(t)`, `tl.max(t, 0)`, `tl.min(t, axis=0)`; None for other nodes."""
    if not isinstance(node, cst.Call):
        return None
    name = dotted(node.func)
    if not name.startswith("tl.") or name[3:] not in REDUCTIONS:
        return None
    return name[3:]


SCANS = {"cumsum": "+", "cumprod": "*"}  # how a scan's carry joins the next chunk's scan


def scan_of(node: cst.CSTNode) -> str | None:
    """'cumsum' / 'cumprod' for `tl.cumsum(t, 0)`, `tl.cumprod(t, axis=0)`; None for other nodes."""
    if not isinstance(node, cst.Call):
        return None
    name = dotted(node.func)
    return name[3:] if name.startswith("tl.") and name[3:] in SCANS else None


def _check_scan(call: cst.Call) -> None:
    if not call.args or call.args[0].keyword is not None:
        raise Decline("a scan whose operand is not its first argument")
    for i, arg in enumerate(call.args[1:]):
        keyword = arg.keyword.value if arg.keyword is not None else ("axis" if i == 0 else "")
        if keyword != "axis" or code(arg.value).replace(" ", "") not in ("0", "-1"):
            raise Decline("a scan with options besides the row's axis (`reverse`)")


def _check_reduction(call: cst.Call) -> None:
    if not call.args or call.args[0].keyword is not None:
        raise Decline("a reduction whose operand is not its first argument")
    for i, arg in enumerate(call.args[1:]):
        keyword = arg.keyword.value if arg.keyword is not None else ("axis" if i == 0 else "")
        if keyword == "axis":
            if code(arg.value).replace(" ", "") not in ("0", "-1", "None"):
                raise Decline("a reduction over an axis other than the row's")
        elif keyword != "dtype":
            raise Decline("a reduction with options besides its axis and dtype")


class _Uses(cst.CSTVisitor):
    """Names an expression reads, in order: not attribute names (`tl.float32`) nor keywords (`mask=`), and,
    with `skip_reductions`, not inside reduction calls."""

    def __init__(self, skip_reductions: bool) -> None:
        self.skip = skip_reductions
        self.found: list[cst.Name] = []

    def visit_Call(self, node: cst.Call) -> bool:
        return not (self.skip and reduction_of(node) is not None)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)


def names_read(node: cst.CSTNode, skip_reductions: bool = False) -> list[cst.Name]:
    visitor = _Uses(skip_reductions)
    node.visit(visitor)
    return visitor.found


@dataclass
class Statement:
    node: cst.SimpleStatementLine
    target: str | None  # the name it assigns
    value: cst.BaseExpression  # what it computes (an assignment's value, a store's call)
    kind: str = "scalar"  # "lane", "scalar" or "store"
    defs: dict[str, int] = field(default_factory=dict)  # each name it reads -> the statement that assigned it (-1: none)


@dataclass(frozen=True)
class Online:
    """A sum of `exp(x - m)` carried beside the max `m` of the same `x`."""

    max: int  # the max's reduction
    rescale: cst.BaseExpression  # the sum's operand written out through its lane statements, `x - m` in it ...
    difference: cst.BinaryOperation  # ... this node, which the loop replaces by `m_old - m_new`


@dataclass
class Reduction:
    at: int  # its statement
    call: cst.Call
    op: str
    lanes: set[int]  # the lane statements its operand needs
    scalars: set[tuple[str, int]]  # the scalar values they and it read: (name, assigning statement)
    online: Online | None = None  # for a sum carried beside its max


@dataclass
class Group:
    at: int  # the statement its loop goes before
    members: list[int]  # reductions, in program order


def _statement(line: cst.CSTNode) -> Statement:
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        raise Decline("control flow or several statements on a line")
    small = line.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return Statement(line, small.targets[0].target.value, small.value)
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
        return Statement(line, small.target.value, small.value)
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return Statement(line, None, small.value)
    raise Decline(f"a statement the loop cannot carry ({type(small).__name__})")


def is_arange(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "tl.arange"


def columns_arange(node: cst.BaseExpression) -> cst.Call | None:
    """The `tl.arange(0, BLOCK)` of the columns' value `tl.arange(0, BLOCK)`, `S + tl.arange(0, BLOCK)` or
    `tl.arange(0, BLOCK) + S`."""
    if is_arange(node):
        return cst.ensure_type(node, cst.Call)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        found = [side for side in (node.left, node.right) if is_arange(side)]
        return cst.ensure_type(found[0], cst.Call) if len(found) == 1 else None
    return None


def _is_columns(node: cst.BaseExpression) -> bool:
    return columns_arange(node) is not None


def _reductions_in(node: cst.CSTNode) -> list[cst.Call]:
    return [cst.ensure_type(c, cst.Call) for c in m.findall(node, m.Call()) if reduction_of(c) is not None]


def _first_to_hoist(statements: list[Statement]) -> tuple[int, cst.Call] | None:
    """The first reduction that sits in a tile expression or in another reduction's operand, innermost
    first, with its statement."""
    lanes: set[str] = set()
    for i, st in enumerate(statements):
        outside = {n.value for n in names_read(st.value, skip_reductions=True)}
        if isinstance(st.node.body[0], cst.AugAssign):
            outside.add(st.target or "")  # `x -= tl.max(x, 0)` reads x too
        tile = _is_columns(st.value) or bool(outside & lanes)
        calls = _reductions_in(st.value)
        for call in calls:
            if any(c is not call for c in _reductions_in(call)):
                continue  # the reductions in its operand go first
            inside = any(c is not call and any(x is call for x in _reductions_in(c)) for c in calls)
            if tile or inside:
                return i, call
        if st.target is not None:
            lanes = lanes | {st.target} if tile else lanes - {st.target}
    return None


def _hoisted(statements: list[Statement]) -> list[Statement]:
    """The statements with every reduction that sits in a tile expression (`y = x - tl.max(x, 0)`) or in
    another reduction's operand bound first to a name of its own (`_kb_red0 = tl.max(x, 0)`): afterwards
    reductions appear only in scalar statements, none inside another."""
    out, count = list(statements), 0
    while (found := _first_to_hoist(out)) is not None:
        i, call = found
        name = f"_kb_red{count}"
        count += 1
        rest = cst.ensure_type(out[i].node.visit(ReplaceNodes({id(call): cst.Name(name)})), cst.SimpleStatementLine)
        bound = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], call)])
        out[i:i + 1] = [_statement(bound), _statement(rest)]
    return out


def _classify(statements: list[Statement]) -> None:
    """Each statement's kind and, for each name it reads, the statement whose value it reads."""
    last: dict[str, int] = {}
    for i, st in enumerate(statements):
        small = st.node.body[0]
        reads = names_read(st.value) + ([cst.ensure_type(small.target, cst.Name)] if isinstance(small, cst.AugAssign) else [])
        st.defs = {n.value: last.get(n.value, -1) for n in reads}
        outside = {n.value for n in names_read(st.value, skip_reductions=True)}
        if isinstance(small, cst.AugAssign):
            outside.add(st.target or "")
        tile = _is_columns(st.value) or any(st.defs.get(n, -1) >= 0 and statements[st.defs[n]].kind == "lane"
                                            for n in outside)
        if st.target is None:
            if tile and dotted(cst.ensure_type(st.value, cst.Call).func) != "tl.store":
                raise Decline(f"a tile statement that is neither an assignment nor a store ({dotted(st.value.func)})"
                              if isinstance(st.value, cst.Call) else "a tile statement that is not a store")
            st.kind = "store" if tile else "scalar"
            continue
        st.kind = "lane" if tile else "scalar"
        if isinstance(small, cst.AugAssign) and st.defs[st.target] >= 0 \
                and statements[st.defs[st.target]].kind != st.kind:
            raise Decline(f"`{st.target}` changes from a scalar to a tile")
        if isinstance(small, cst.AugAssign) and st.defs[st.target] < 0 and st.kind == "lane":
            # a parameter's own value made a tile (`X += offs`): each chunk's loop would need X as passed
            raise Decline(f"`{st.target}`, a parameter, becomes a tile")
        last[st.target] = i


def lane_closure(statements: list[Statement], at: int, node: cst.CSTNode) -> set[int]:
    """The lane statements `node` (read at statement `at`) needs, through the lane statements they read."""
    todo = [statements[at].defs.get(n.value, -1) for n in names_read(node)]
    seen: set[int] = set()
    while todo:
        j = todo.pop()
        if j < 0 or j in seen or statements[j].kind != "lane":
            continue
        seen.add(j)
        todo += list(statements[j].defs.values())
    return seen


def _scalar_reads(statements: list[Statement], at: int, node: cst.CSTNode, lanes: set[int]) -> set[tuple[str, int]]:
    """The scalar values (name, assigning statement; -1 for a parameter's or a global's own value) that
    `node` at statement `at` and the lane statements `lanes` read."""
    reads = {(n.value, statements[at].defs.get(n.value, -1)) for n in names_read(node)}
    for j in lanes:
        reads |= set(statements[j].defs.items())
    return {(n, d) for n, d in reads if d < 0 or statements[d].kind != "lane"}


def _visible(statements: list[Statement], reads: set[tuple[str, int]], at: int) -> bool:
    """Whether each value in `reads` is what its name holds just before statement `at`."""
    return all(d < at and not any(statements[k].target == n and statements[k].kind != "lane" for k in range(d + 1, at))
               for n, d in reads)


def _lane_free(statements: list[Statement], at: int, node: cst.CSTNode) -> bool:
    return not lane_closure(statements, at, node)


def _follow(statements: list[Statement], at: int, node: cst.BaseExpression
            ) -> tuple[int, cst.BaseExpression] | None:
    """A lane name's value, written in the statement that assigns it (a plain assignment); None otherwise."""
    if not isinstance(node, cst.Name):
        return None
    j = statements[at].defs.get(node.value, -1)
    if j < 0 or statements[j].kind != "lane" or not isinstance(statements[j].node.body[0], cst.Assign):
        return None
    return j, statements[j].value


def _exp_of_difference(statements: list[Statement], at: int, node: cst.BaseExpression, stage: str = "exp"
                       ) -> tuple[cst.BaseExpression, cst.BinaryOperation, int, int, cst.BaseExpression] | None:
    """Where `node` (read at statement `at`) is `exp(x - m)` / `exp2(x - m)`, the difference scaled or not
    by a scalar (`(x - m) * c`, `c * (x - m)`, `(x - m) / c`), through lane names (`num = tl.exp(x)` after
    `x = x - m`): (the expression written out, `x - m` in it, the statement assigning m, the statement
    where `x` is read, `x`). Those are the forms whose sum rescales by the same function of a moved m."""
    followed = _follow(statements, at, node)
    if followed is not None:
        found = _exp_of_difference(statements, followed[0], followed[1], stage)
        if found is None:
            return None
        wrapped = _parenthesized(found[0])  # a difference met here is the node the tree holds
        return (wrapped, wrapped if found[0] is found[1] else found[1], *found[2:])  # type: ignore[return-value]
    if stage == "exp":
        if not isinstance(node, cst.Call) or dotted(node.func) not in _EXPONENTIALS or len(node.args) != 1 \
                or node.args[0].keyword is not None:
            return None
        found = _exp_of_difference(statements, at, node.args[0].value, "scaled")
        return None if found is None else (node.with_changes(args=[node.args[0].with_changes(value=found[0])]),
                                           *found[1:])
    if stage == "scaled" and isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
        sides = [("left", node.left, node.right)]
        if isinstance(node.operator, cst.Multiply):
            sides.append(("right", node.right, node.left))
        for side, inner, scale in sides:
            if not _lane_free(statements, at, scale):
                continue
            found = _exp_of_difference(statements, at, inner, "difference")
            if found is not None:
                return (node.with_changes(**{side: found[0]}), *found[1:])
        return None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract) \
            and isinstance(node.right, cst.Name) and statements[at].defs.get(node.right.value, -1) >= 0:
        return node, node, statements[at].defs[node.right.value], at, node.left
    return None


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node if getattr(node, "lpar", None) or isinstance(node, (cst.Name, cst.Call)) \
        else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _reductions(statements: list[Statement]) -> list[Reduction]:
    out = []
    for i, st in enumerate(statements):
        if st.kind != "scalar":
            continue
        for call in _reductions_in(st.value):
            op = reduction_of(call) or ""
            _check_reduction(call)
            operand = call.args[0].value
            lanes = lane_closure(statements, i, operand)
            if not lanes:
                raise Decline("a reduction of a value that does not vary along the row")
            out.append(Reduction(i, call, op, lanes, _scalar_reads(statements, i, operand, lanes)))
    return out


def _online_max(statements: list[Statement], reductions: list[Reduction], r: Reduction) -> Online | None:
    """For a sum of `exp(x - m)` whose `m` is bound to the max of the same `x`, that pairing; the lane
    statements the sum needs read m only there."""
    found = _exp_of_difference(statements, r.at, r.call.args[0].value) if r.op == "sum" else None
    if found is None:
        return None
    rescale, diff, at, where, x = found
    k = next((k for k, q in enumerate(reductions) if q.at == at and q.op == "max" and q.call is statements[at].value), None)
    if k is None or not isinstance(statements[at].node.body[0], cst.Assign):  # `m += tl.max(x)` is not the max
        return None
    reads = [statements[r.at].defs.get(n.value) for n in names_read(r.call.args[0].value)]
    reads += [d for j in r.lanes for n, d in statements[j].defs.items()]
    if reads.count(at) != 1:
        return None
    mx = reductions[k]
    operand = mx.call.args[0].value
    if isinstance(x, cst.Name) and isinstance(operand, cst.Name):
        same = statements[where].defs.get(x.value) == statements[mx.at].defs.get(operand.value)
    else:
        same = x.deep_equals(operand) and all(statements[where].defs.get(n.value) == statements[mx.at].defs.get(n.value)
                                              for n in names_read(x))
    return Online(k, rescale, diff) if same else None


def _groups(statements: list[Statement], reductions: list[Reduction]) -> list[Group]:
    """The loops: each reduction joins the first loop where all it reads is known (an online sum, its max's
    loop), else starts one just before its statement."""
    groups: list[Group] = []
    home: dict[int, Group] = {}
    for i, r in enumerate(reductions):
        online = _online_max(statements, reductions, r)
        if online is not None:
            group = home[online.max]
            reads = {(n, d) for n, d in r.scalars if d != reductions[online.max].at}
            if _visible(statements, reads, group.at):
                r.online = online
                group.members.append(i)
                home[i] = group
                continue
        group_found = next((g for g in groups if _visible(statements, r.scalars, g.at)), None)
        if group_found is None:
            # where what it reads still holds: its own statement, else the latest point before it (a value
            # its lane statements read was reassigned after they read it)
            at = next((p for p in range(r.at, -1, -1) if _visible(statements, r.scalars, p)), None)
            if at is None:
                raise Decline("no point in the kernel where everything a reduction reads holds at once")
            group_found = Group(at, [])
            groups.append(group_found)
        group_found.members.append(i)
        home[i] = group_found
    return groups


def _accesses(statements: list[Statement], name: str) -> list[tuple[int, cst.Call]]:
    return [(i, cst.ensure_type(c, cst.Call)) for i, st in enumerate(statements)
            for c in m.findall(st.value, m.Call()) if dotted(cst.ensure_type(c, cst.Call).func) == f"tl.{name}"]


def _written_out(statements: list[Statement], at: int, node: cst.BaseExpression, lanes_only: bool = True,
                 depth: int = 0) -> cst.BaseExpression:
    """`node` (read at statement `at`) with the names plain assignments give it replaced by their values
    (only tile names with `lanes_only`), for comparing addresses."""
    values: dict[int, cst.BaseExpression] = {}
    for n in names_read(node) if depth < 8 else []:
        d = statements[at].defs.get(n.value, -1)
        if d >= 0 and (statements[d].kind == "lane" or not lanes_only) \
                and isinstance(statements[d].node.body[0], cst.Assign):
            values[id(n)] = _written_out(statements, d, statements[d].value, lanes_only, depth + 1).with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    new = node.visit(ReplaceNodes(values)) if values else node
    assert isinstance(new, cst.BaseExpression)
    return new


def _summands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    node = bare(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return _summands(node.left) + _summands(node.right)
    return [node]


def _lane_part(statements: list[Statement], at: int, pointer: cst.BaseExpression) -> str:
    """The summands of a pointer that vary along the row, written out with what does not vary as `_` and
    strides dropped (`tl.arange(0, BLOCK)` of `x_ptr + row * stride + cols * stride_col`): which column
    each lane addresses, whatever the buffer's strides."""
    terms = _summands(_written_out(statements, at, pointer))
    return " + ".join(sorted(_skeleton(t) for t in terms if _has_arange(t)))


def _has_arange(node: cst.CSTNode) -> bool:
    return any(is_arange(cst.ensure_type(c, cst.Call)) for c in m.findall(node, m.Call()))


def _skeleton(node: cst.BaseExpression) -> str:
    node = bare(node)
    if not _has_arange(node):
        return "_"
    if isinstance(node, cst.BinaryOperation):
        left, right = _skeleton(node.left), _skeleton(node.right)
        if isinstance(node.operator, cst.Multiply) and "_" in (left, right):
            return right if left == "_" else left  # times a stride: the same column
        return f"({left} {code(node.operator).strip()} {right})"
    return code(node)


def _bases(statements: list[Statement], at: int, pointer: cst.BaseExpression) -> set[str]:
    """The bare names a pointer's sum adds once its assigned names are written out (`x_ptr` of
    `x_ptr + row * stride + cols`): its base pointer, among offsets that are names."""
    return {t.value for t in _summands(_written_out(statements, at, pointer, lanes_only=False)) if isinstance(t, cst.Name)}


def _check_memory_order(statements: list[Statement], reductions: list[Reduction], stores: list[int]) -> None:
    """Loads run again in later loops, and the tile stores chunk by chunk after them: decline where that
    could read what the kernel wrote. A scalar store into a buffer the row is loaded from must come after
    every loop; tile loads and stores in the last loop must address the row the same way (in place, each
    chunk then reads its own columns before it writes them)."""
    loads = [(i, c) for i, c in _accesses(statements, "load") if statements[i].kind == "lane"]
    bases = set().union(*(_bases(statements, i, c.args[0].value) for i, c in loads))
    last = max([i for i, _ in loads] + [r.at for r in reductions] + stores)
    for i, call in _accesses(statements, "store"):
        if statements[i].kind == "scalar" and i < last and _bases(statements, i, call.args[0].value) & bases:
            raise Decline("a scalar store into the buffer the row is loaded from, before the row is read again")
    if stores and len({_lane_part(statements, i, c.args[0].value) for i, c in loads + _accesses(statements, "store")
                       if statements[i].kind != "scalar"}) != 1:
        raise Decline("the tile loads and stores do not address the row's columns the same way")


@dataclass
class RowLoop:
    """A kernel's rewrite: its statements (reductions bound), reductions, loops and tile stores."""

    fn: cst.FunctionDef
    block: str  # the constexpr of the whole row's tile
    statements: list[Statement]
    reductions: list[Reduction]
    groups: list[Group]
    stores: list[int]
    scans: dict[int, list[cst.Call]] = field(default_factory=dict)  # by lane statement


def read_kernel(fn: cst.FunctionDef, imported: Mapping[str, str], helpers: dict[str, cst.FunctionDef]) -> RowLoop:
    """How `fn` loops over its row in chunks; raises Decline with the reason it cannot."""
    aranges = [c for c in m.findall(fn.body, m.Call()) if is_arange(cst.ensure_type(c, cst.Call))]
    if len(aranges) != 1:
        raise Decline("not one `tl.arange`")
    if m.findall(fn.body, m.Subscript()):
        raise Decline("a subscript: the tile is not one row")
    for call in m.findall(fn.body, m.Call()):
        call = cst.ensure_type(call, cst.Call)
        constant = dotted(call.func) in ("float", "int") and all(isinstance(a.value, cst.SimpleString) for a in call.args)
        if reduction_of(call) is None and scan_of(call) is None and not constant \
                and not elementwise_call(call, imported, helpers):
            raise Decline(f"a call it cannot show to be elementwise: {dotted(call.func) or 'an expression'}")
    statements = _hoisted([_statement(line) for line in list(fn.body.body)[docstring_lines(list(fn.body.body)):]])
    cols = next((st for st in statements if columns_arange(st.value) is aranges[0]), None)
    arange = cst.ensure_type(aranges[0], cst.Call)
    if cols is None or len(arange.args) != 2 or not m.matches(arange.args[0].value, m.Integer("0")) \
            or not isinstance(arange.args[1].value, cst.Name):
        raise Decline("the columns are not `cols = tl.arange(0, BLOCK)` (or `S + tl.arange(0, BLOCK)`)")
    block = cst.ensure_type(arange.args[1].value, cst.Name).value
    constexpr = {p.name.value for p in fn.params.params
                 if p.annotation is not None and dotted(p.annotation.annotation).endswith("constexpr")}
    if block not in constexpr or len(m.findall(fn.body, m.Name(block))) != 1:
        raise Decline(f"{block} is not a constexpr used only as the columns' width")
    _classify(statements)
    start = cols.value.visit(ReplaceNodes({id(arange): cst.Integer("0")}))
    if not isinstance(start, cst.BaseExpression) or not _lane_free(statements, statements.index(cols), start):
        raise Decline("the columns' start varies along the row")
    reductions = _reductions(statements)
    scans = _scans(statements)
    if not reductions and not scans:
        raise Decline("nothing reduces or scans the row (an elementwise row is split-row-tile's)")
    stores = [i for i, st in enumerate(statements) if st.kind == "store"]
    if stores and reductions and max(r.at for r in reductions) > stores[0]:
        raise Decline("a tile store before a reduction")
    if stores and any(statements[k].target is None or m.findall(statements[k].value, m.Call(func=m.Attribute(attr=m.Name("load"))))
                      for k in range(stores[0], stores[-1]) if k not in stores):
        raise Decline("a scalar load or store between two tile stores")
    _check_memory_order(statements, reductions, stores)
    if stores:
        lanes = set().union(*(lane_closure(statements, i, statements[i].value) for i in stores))
        reads = set().union(*(_scalar_reads(statements, i, statements[i].value, lanes) for i in stores))
        if not _visible(statements, reads, stores[-1]):
            raise Decline("a value the tile stores read changes between them")
    return RowLoop(fn, block, statements, reductions, _groups(statements, reductions), stores, scans)


def _scans(statements: list[Statement]) -> dict[int, list[cst.Call]]:
    """The scans of each lane statement, which must hold them all: a scan carries its prefix from chunk
    to chunk, which the loops do for the tiles they compute, not inside a reduction's operand or a store."""
    out: dict[int, list[cst.Call]] = {}
    for i, st in enumerate(statements):
        calls = [cst.ensure_type(c, cst.Call) for c in m.findall(st.value, m.Call()) if scan_of(c) is not None]
        if not calls:
            continue
        if st.kind != "lane" or not isinstance(st.node.body[0], cst.Assign):
            raise Decline("a scan outside a tile's plain assignment")
        for call in calls:
            _check_scan(call)
            if any(scan_of(c) is not None or reduction_of(c) is not None for c in m.findall(call.args[0].value, m.Call())):
                raise Decline("a scan of a scan or of a reduction")
        out[i] = calls
    return out
