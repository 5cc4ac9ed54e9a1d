"""Loops over blocks, read and rewritten: what the loop-bound rewrites (peel, causal) share.

A loop over a dimension in blocks is `for k in range(0, K, BLOCK)` over `k + tl.arange(0, BLOCK)`, or
the counter form `for k in range(0, tl.cdiv(K, BLOCK))` over `k * BLOCK + tl.arange(0, BLOCK)`. Its
block of indices may be spelled inline or bound to a name in the body; masks are comparisons joined
by `&`, inline or named. `BlockLoop` reads those from the syntax tree; `DropTrueTerms` removes from
tl.load / tl.store masks and tl.where conditions the terms a predicate proves true.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import PositionProvider

from diagnose.rewriters.base import dotted, is_jit, mask_argument, simple_assign, start_plus_arange

__all__ = ["PIPELINE_KEYWORDS", "BlockLoop", "DropTrueTerms", "FlatAccess", "KernelLoops", "arange_width", "assigned_names", "bare", "block_loop", "calls_in", "code", "conjuncts", "derived_names",
           "enclosing_function", "flat_access", "fresh_name", "infinity_sign", "is_broadcast", "kernel_aranges", "local_definitions", "mask_like", "names_in", "number", "numel_of", "ordered", "plain_assignments", "pointer_roots", "reaching_literal", "reaching_value", "reduced", "single_assigns", "trips_by_position", "with_range"]

CODE_MODULE = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    return CODE_MODULE.code_for_node(node)


def number(node: cst.BaseExpression) -> float | None:
    """The value of a numeric literal, signed or not (`2`, `-0.5`); None for anything else."""
    sign = 1.0
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        sign, node = -1.0, node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return sign * float(node.evaluated_value)
    return None


# Kernels' spellings of infinity, by sign (quotes and spaces normalized away).
_INFINITIES = {'float("inf")': 1, 'float("-inf")': -1, "math.inf": 1, "tl.inf": 1}


def infinity_sign(node: cst.BaseExpression) -> int | None:
    """+1 for +inf, -1 for -inf as kernels spell them (`-float("inf")`, `float('-inf')`, `-math.inf`),
    None for anything else."""
    text = code(node).replace(" ", "").replace("'", '"')
    sign = -1 if text.startswith("-") else 1
    core = _INFINITIES.get(text[1:] if sign < 0 else text)
    return None if core is None else sign * core


def is_broadcast(node: cst.Subscript) -> bool:
    """`x[None, :]`, `x[:, None]`, `x[None]`: a view of the whole value, no indexing."""
    return all(isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None and e.slice.step is None
               or isinstance(e.slice, cst.Index) and m.matches(e.slice.value, m.Name("None")) for e in node.slice)


def bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """`x` of `(x)`, `x[None, :]`, `x[:, None]`: broadcasting does not change which values a block takes."""
    while True:
        if isinstance(node, cst.Subscript) and is_broadcast(node):
            node = node.value
        elif node.lpar:
            node = node.with_changes(lpar=[], rpar=[])
        else:
            return node


def ordered(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression, bool] | None:
    """(lesser, greater, strict) of a single comparison `a < b`, `a <= b`, `b > a`, `b >= a`; else None."""
    if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
        return None
    op, right = node.comparisons[0].operator, node.comparisons[0].comparator
    if isinstance(op, (cst.LessThan, cst.LessThanEqual)):
        return node.left, right, isinstance(op, cst.LessThan)
    if isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
        return right, node.left, isinstance(op, cst.GreaterThan)
    return None


class KernelLoops(cst.CSTTransformer):
    """Base of the loop rewrites: `kernel()` is the @triton.jit function being visited (None outside
    one) with the names it binds to `tl.arange(0, W)`; a subclass rewrites in `leave_For`."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self._stack: list[tuple[cst.FunctionDef, dict[str, str]]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.append((node, kernel_aranges(node) if is_jit(node) else {}))

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self._stack.pop()
        return updated

    def kernel(self) -> tuple[cst.FunctionDef, dict[str, str]] | None:
        return self._stack[-1] if self._stack and is_jit(self._stack[-1][0]) else None

    def line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line


def calls_in(node: cst.CSTNode, name: str | None = None) -> list[cst.Call]:
    """The calls under `node` (to `name` as `dotted` spells it, when given), in source order."""
    return [c for c in m.findall(node, m.Call()) if isinstance(c, cst.Call) and (name is None or dotted(c.func) == name)]


def arange_width(node: cst.BaseExpression) -> str | None:
    """W of `tl.arange(0, W)`."""
    if (isinstance(node, cst.Call) and dotted(node.func) == "tl.arange" and len(node.args) == 2
            and m.matches(node.args[0].value, m.Integer("0"))):
        return code(node.args[1].value)
    return None


def assigned_names(body: cst.CSTNode) -> dict[str, int]:
    """Name -> how many times the block assigns it (augmented assignments and loop targets count)."""
    counts: dict[str, int] = {}

    class Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            for name in names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            for name in names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            for name in names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

        def visit_For(self, node: cst.For) -> None:
            for name in names_in(node.target):
                counts[name] = counts.get(name, 0) + 1

    body.visit(Visitor())
    return counts


def kept_at_launch(fn: cst.FunctionDef) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement]] | None:
    """For a kernel made a loop over its tiles: statements that save, before the loop, the parameters its
    body moves (Liger's `a += program_id * stride`, fla's `T = eos - bos`), and statements that restore them
    at the top of each tile, so that no tile starts from the previous one's values. None where a moved
    parameter is a constexpr: it cannot be a loop-carried value at all."""
    params = {q.name.value: q for q in fn.params.params}
    moved = [name for name in assigned_names(fn.body) if name in params]
    if any((note := params[n].annotation) is not None and "constexpr" in code(note.annotation) for n in moved):
        return None
    return ([cst.parse_statement(f"_kb_{name}_at_launch = {name}") for name in moved],
            [cst.parse_statement(f"{name} = _kb_{name}_at_launch") for name in moved])


def fresh_name(name: str, taken: set[str]) -> str:
    """`name`, underscores added until it is not in `taken` (the module's names), and now taken."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def local_definitions(fn: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """Every value each local is given in the kernel (`=`, `+=`, ...), at any depth."""
    out: dict[str, list[cst.BaseExpression]] = {}
    for node in m.findall(fn, m.Assign() | m.AugAssign()):
        if isinstance(node, cst.Assign):
            targets, value = [t.target for t in node.targets], node.value
        else:
            augmented = cst.ensure_type(node, cst.AugAssign)
            targets, value = [augmented.target], augmented.value
        for target in targets:
            if isinstance(target, cst.Name):
                out.setdefault(target.value, []).append(value)
    return out


def plain_assignments(fn: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """Every value each local is bound to by a plain `name = value` in the kernel, at any depth (not `+=`,
    which moves a pointer from the same root)."""
    out: dict[str, list[cst.BaseExpression]] = {}
    for node in m.findall(fn, m.Assign()):
        assign = cst.ensure_type(node, cst.Assign)
        for target in assign.targets:
            if isinstance(target.target, cst.Name):
                out.setdefault(target.target.value, []).append(assign.value)
    return out


def pointer_roots(address: cst.BaseExpression, assigned: Mapping[str, list[cst.BaseExpression]],
                  hops: int = 8) -> set[str]:
    """The pointers an address starts from: the leftmost term of `H + (t - 1) * D + cols`, as written, and
    followed through the kernel's plain assignments (`p_cur = h_ptr + D + cols` starts from `h_ptr` too)."""
    while isinstance(address, cst.BinaryOperation) and isinstance(address.operator, (cst.Add, cst.Subtract)):
        address = address.left
    name = code(address)
    if hops and isinstance(address, cst.Name) and address.value in assigned:
        return {name} | {r for value in assigned[address.value] for r in pointer_roots(value, assigned, hops - 1)}
    return {name}


def names_in(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

    node.visit(Visitor())
    return found


def reaching_literal(name: str, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]
                     ) -> tuple[int, cst.FunctionDef | None] | None:
    """The integer literal `name` holds where `node` runs (`reaching_value`), with the function that
    assigns it (None: the module)."""
    reaching = reaching_value(name, node, parents)
    if reaching is None or not isinstance(reaching[0], cst.Integer):
        return None
    return int(reaching[0].value), reaching[1]


def reaching_value(name: str, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]
                   ) -> tuple[cst.BaseExpression, cst.FunctionDef | None] | None:
    """The value `name` holds where `node` runs, when one plain `name = value` before it in the same
    function (or at the module's top level) is the only assignment that can reach it, with the function
    that holds it (None: the module); None otherwise: a parameter, an assignment in a branch or in a
    loop between them, a tuple unpacked. `parents`: libcst's ParentNodeProvider."""
    child, loops = node, []
    while child in parents:
        parent = parents[child]
        if isinstance(parent, (cst.For, cst.While)) and child is parent.body:
            loops.append(parent)  # a later iteration may see an assignment below the node
        if isinstance(parent, cst.FunctionDef) and name in {p.name.value for p in
                                                          (*parent.params.params, *parent.params.kwonly_params)}:
            return None
        if isinstance(parent, (cst.IndentedBlock, cst.Module)):
            for stmt in reversed(parent.body[:parent.body.index(child)]):
                assign = m.findall(stmt, m.Assign(targets=[m.AssignTarget(target=m.Name(name))]))
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and assign \
                        and stmt.body[0] is assign[0]:
                    if any(name in assigned_names(loop.body) for loop in loops):
                        return None  # the loops between them assign it after the node: a later iteration sees that
                    return assign[0].value, enclosing_function(stmt, parents)  # type: ignore[attr-defined]
                if name in assigned_names(stmt):
                    return None
        child = parent
    return None


def numel_of(node: cst.BaseExpression, tensor: str, at: cst.CSTNode,
             parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether `node` is `tensor`'s element count where `at` runs: `T.numel()`, or a name bound to it, or
    to `X.numel()` where T is a new tensor like X."""
    if isinstance(node, cst.Name):
        reaching = reaching_value(node.value, at, parents)
        if reaching is None:
            return False
        node = reaching[0]
    if not m.matches(node, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("numel")), args=[])):
        return False
    counted = cst.ensure_type(cst.ensure_type(cst.ensure_type(node, cst.Call).func, cst.Attribute).value, cst.Name).value
    if counted == tensor:
        return True
    made = reaching_value(tensor, at, parents)
    return made is not None and isinstance(made[0], cst.Call) and dotted(made[0].func) in (
        "torch.empty_like", "torch.zeros_like") and bool(made[0].args) and m.matches(made[0].args[0].value,
                                                                                      m.Name(counted))


@dataclass(frozen=True)
class FlatAccess:
    """A tl.load / tl.store of one flat block: `POINTER + OFFS`, OFFS `tl.program_id(0) * BLOCK +
    tl.arange(0, BLOCK)` (through names the kernel assigns once), under the mask `OFFS < N` (N a name). The
    expressions are as written at the access, before any name is followed."""

    pointer: cst.BaseExpression
    offsets: cst.BaseExpression
    block: cst.BaseExpression
    mask: cst.BaseExpression
    bound: str  # N


def flat_access(kernel: cst.FunctionDef, access: cst.Call) -> FlatAccess | None:
    """`access` read as the kernel's access of one flat block (`FlatAccess`), else None (another address, no
    mask, or a mask of another shape)."""
    assigned = plain_assignments(kernel)

    def value(node: cst.BaseExpression) -> cst.BaseExpression:
        while isinstance(node, cst.Name) and len(assigned.get(node.value, [])) == 1:
            node = assigned[node.value][0]
        return node

    address = access.args[0].value if access.args else None
    if not (isinstance(address, cst.BinaryOperation) and isinstance(address.operator, cst.Add)):
        return None
    offsets = value(address.right)
    parts = start_plus_arange(offsets)
    if parts is None:
        return None
    start, block = value(parts[0]), parts[1]
    if not (isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Multiply)
            and any(m.matches(value(s), m.Call(func=m.Attribute(attr=m.Name("program_id")),
                                               args=[m.Arg(value=m.Integer("0"))]))
                    for s in (start.left, start.right))
            and any(s.deep_equals(block) for s in (start.left, start.right))):
        return None
    where = mask_argument(access)
    if where is None:
        return None
    mask = value(access.args[where].value)
    if not (isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1
            and isinstance(mask.comparisons[0].operator, cst.LessThan) and value(mask.left).deep_equals(offsets)
            and isinstance(mask.comparisons[0].comparator, cst.Name)):
        return None
    return FlatAccess(address.left, address.right, block, access.args[where].value, mask.comparisons[0].comparator.value)


def enclosing_function(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> cst.FunctionDef | None:
    """The innermost function holding `node` (None: the module's top level)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.FunctionDef):
            return node
    return None


def derived_names(expr: cst.BaseExpression, fn: cst.FunctionDef) -> set[str]:
    """The names `expr` reads, and those they are computed from through `fn`'s top-level plain
    assignments (`out_ptrs = Out + rows` before `tl.store(out_ptrs, ...)` gives out_ptrs, Out, rows)."""
    assigned: dict[str, set[str]] = {}
    for st in fn.body.body:
        assign = simple_assign(st)
        if assign is not None:
            assigned.setdefault(assign[0], set()).update(names_in(assign[1]))
    seen: set[str] = set()
    todo = names_in(expr)
    while todo:
        name = todo.pop()
        seen.add(name)
        todo |= assigned.get(name, set()) - seen
    return seen


def single_assigns(block: cst.CSTNode) -> dict[str, cst.BaseExpression]:
    """Names the block assigns exactly once, with a plain `name = value`, and their values."""
    counts = assigned_names(block)
    out: dict[str, cst.BaseExpression] = {}
    for node in m.findall(block, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        assert isinstance(node, cst.Assign)
        name = node.targets[0].target
        assert isinstance(name, cst.Name)
        if counts.get(name.value) == 1:
            out[name.value] = node.value
    return out


@dataclass
class BlockLoop:
    """What makes a loop's boundary terms decidable: its variable, its bound B, its block width W."""

    var: str
    bound: cst.BaseExpression
    width: str
    counter: bool  # range(0, cdiv(B, W)): the block starts at var * W
    aranges: set[str]  # names bound to tl.arange(0, W) in the kernel
    blocks: set[str] = field(default_factory=set)  # names the body binds to the loop's block of indices
    true_names: set[str] = field(default_factory=set)  # names the body binds to a mask true in full blocks
    masks: set[str] = field(default_factory=set)  # names the kernel binds once to comparisons joined by `&`

    def _is_arange(self, node: cst.BaseExpression) -> bool:
        node = bare(node)
        return (isinstance(node, cst.Name) and node.value in self.aranges) or arange_width(node) == self.width

    def _is_start(self, node: cst.BaseExpression) -> bool:
        node = bare(node)
        if not self.counter:
            return m.matches(node, m.Name(self.var))
        return (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply)
                and {code(bare(node.left)), code(bare(node.right))} == {self.var, self.width})

    def is_block(self, node: cst.BaseExpression) -> bool:
        """Whether `node` is the loop's block of indices: start + arange(0, W), or a name bound to it."""
        node = bare(node)
        if isinstance(node, cst.Name):
            return node.value in self.blocks
        return (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)
                and (self._is_start(node.left) and self._is_arange(node.right)
                     or self._is_arange(node.left) and self._is_start(node.right)))

    def is_true_term(self, node: cst.BaseExpression) -> bool:
        """Whether a mask term holds for every lane of every full iteration."""
        node = bare(node)
        if isinstance(node, cst.Name):
            return node.value in self.true_names
        sides = ordered(node)
        if sides is None or not sides[2]:
            return False
        small, big, _ = sides
        bound = code(bare(self.bound))
        if self.is_block(small) and code(bare(big)) == bound:
            return True
        # counter form, the tutorial's spelling: offs_k < K - k * BLOCK_K
        big = bare(big)
        return (self.counter and self._is_arange(small) and isinstance(big, cst.BinaryOperation)
                and isinstance(big.operator, cst.Subtract) and code(bare(big.left)) == bound
                and self._is_start(big.right))

    def reduced(self, mask: cst.BaseExpression) -> cst.BaseExpression | None:
        """`mask` without its terms that hold in full iterations; None when nothing is left."""
        return reduced(mask, self.is_true_term)


# tl.range's keywords that schedule the loop without changing its trips.
PIPELINE_KEYWORDS = frozenset({"num_stages", "loop_unroll_factor", "disallow_acc_multi_buffer", "flatten",
                                "warp_specialize", "disable_licm"})


def trips_by_position(call: cst.Call) -> bool:
    """Whether a `range` / `tl.range` call's keywords are only `PIPELINE_KEYWORDS`: its start, end and step are
    the positions (`step=` or tl.range's `arg1=` by keyword would not be)."""
    return all(a.keyword is None or a.keyword.value in PIPELINE_KEYWORDS for a in call.args)


def block_loop(loop: cst.For, kernel: cst.FunctionDef, aranges: dict[str, str]) -> BlockLoop | None:
    """The loop's shape when its boundary terms are decidable (see the module's docstring), else None."""
    if not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Call):
        return None
    if dotted(loop.iter.func) not in ("range", "tl.range") or m.findall(loop.body, m.For() | m.While()):
        return None
    if not trips_by_position(loop.iter):
        return None  # `step=` (or tl.range's `arg1=`) by keyword: the trips are not what the positions say
    positional = [a.value for a in loop.iter.args if a.keyword is None]
    var = loop.target.value
    if len(positional) == 3 and m.matches(positional[0], m.Integer("0")):
        bound, width, counter = positional[1], code(positional[2]), False
    elif len(positional) in (1, 2) and (len(positional) == 1 or m.matches(positional[0], m.Integer("0"))):
        trips = positional[-1]
        if not (isinstance(trips, cst.Call) and dotted(trips.func) in ("tl.cdiv", "triton.cdiv") and len(trips.args) == 2):
            return None
        bound, width, counter = trips.args[0].value, code(trips.args[1].value), True
    else:
        return None
    assigned = assigned_names(loop.body)
    if var in assigned or names_in(bound) & set(assigned) or width in assigned:
        return None
    shape = BlockLoop(var, bound, width, counter, {name for name, w in aranges.items() if w == width})
    for name, value in single_assigns(kernel.body).items():
        if mask_like(value, shape.masks):
            shape.masks.add(name)
    singles = single_assigns(loop.body)
    in_kernel = assigned_names(kernel.body)
    for name, value in singles.items():  # in source order, so a mask may name a block bound before it
        if name in aranges or in_kernel.get(name) != 1:
            continue  # bound before the loop too: its first iteration would read that value
        if shape.is_block(value):
            shape.blocks.add(name)
        elif shape.reduced(value) is None:
            shape.true_names.add(name)
    return shape


def kernel_aranges(kernel: cst.FunctionDef) -> dict[str, str]:
    """Names the kernel binds once to tl.arange(0, W), with W as written."""
    out: dict[str, str] = {}
    for name, value in single_assigns(kernel.body).items():
        width = arange_width(value)
        if width is not None:
            out[name] = width
    return out


def conjuncts(node: cst.BaseExpression, once: Mapping[str, cst.BaseExpression] | None = None,
              depth: int = 0) -> list[cst.BaseExpression]:
    """The terms a condition joins with `&`, parentheses aside, and through the names `once` binds
    (`mask = cols < N` then `mask & ok`)."""
    inner = bare(node)
    if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.BitAnd):
        return conjuncts(inner.left, once, depth) + conjuncts(inner.right, once, depth)
    if once is not None and isinstance(inner, cst.Name) and inner.value in once and depth < 8:
        return conjuncts(once[inner.value], once, depth + 1)
    return [node]


def reduced(mask: cst.BaseExpression, is_true: Callable[[cst.BaseExpression], bool]) -> cst.BaseExpression | None:
    """`mask` (terms joined by `&`) without the terms `is_true` proves; None when nothing is left; `mask`
    itself when nothing goes."""
    node = bare(mask)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd):
        left, right = reduced(node.left, is_true), reduced(node.right, is_true)
        if left is None or right is None:
            return right if left is None else left
        if left is node.left and right is node.right:
            return mask
        return cst.BinaryOperation(left=left, operator=node.operator, right=right, lpar=mask.lpar, rpar=mask.rpar)
    return None if is_true(mask) else mask


class DropTrueTerms(cst.CSTTransformer):
    """Masks without the terms `is_true` proves, in tl.load / tl.store masks, tl.where conditions and
    mask bindings (`masks`: the names bound to comparisons, see `mask_like`); `dropped` counts them. A
    condition or mask with a term that is not boolean is left whole: `True & flags` is not `flags`
    where `flags` holds 2."""

    def __init__(self, is_true: Callable[[cst.BaseExpression], bool], masks: set[str]) -> None:
        self.is_true = is_true
        self.masks = masks
        self.dropped = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted(updated.func)
        if name == "tl.where" and len(updated.args) == 3 and updated.args[0].keyword is None:
            condition = reduced(updated.args[0].value, self.is_true)
            if condition is updated.args[0].value or not mask_like(updated.args[0].value, self.masks):
                return updated
            self.dropped += 1
            if condition is None:
                kept = updated.args[1].value
                return kept.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
                    if isinstance(kept, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp)) else kept
            return updated.with_changes(args=[updated.args[0].with_changes(value=condition), *updated.args[1:]])
        if name not in ("tl.load", "tl.store"):
            return updated
        position = 2 if name == "tl.store" else 1
        args = list(updated.args)
        index = mask_argument(updated)
        if index is None:
            return updated
        mask = reduced(args[index].value, self.is_true)
        if mask is args[index].value or not mask_like(args[index].value, self.masks):
            return updated
        if mask is not None:
            self.dropped += 1
            args[index] = args[index].with_changes(value=mask)
            return updated.with_changes(args=args)
        if index == position and name == "tl.load" and len(args) > position + 1 and args[position + 1].keyword is None:
            return updated  # `other` given by position after the mask: left as written rather than re-spelled
        self.dropped += 1
        gone = {index} | {i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "other"}
        kept_args = [a for i, a in enumerate(args) if i not in gone]
        kept_args[-1] = kept_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=kept_args)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        # `mask = (rm < M) & (rn < N)` bound in the loop: in a full iteration `mask = rm < M`. A binding
        # that becomes wholly true is left as written: its uses are dropped, the compiler removes it.
        value = updated.value
        if not mask_like(value, self.masks):
            return updated
        kept = reduced(value, self.is_true)
        if kept is None or kept is value:
            return updated
        self.dropped += 1
        return updated.with_changes(value=kept)


    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        # `s = tl.where(rn < n, s, -inf)` became `s = s`: nothing left to say
        if (len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign) and len(updated.body[0].targets) == 1
                and m.matches(updated.body[0].value, m.Name()) and m.matches(updated.body[0].targets[0].target, m.Name())
                and updated.body[0].value.value == updated.body[0].targets[0].target.value):  # type: ignore[attr-defined]
            return cst.RemoveFromParent()
        return updated


def mask_like(node: cst.BaseExpression, masks: set[str]) -> bool:
    """Comparisons (or names bound to them) joined by `&`: booleans, so that dropping a true term cannot
    change the value (`x & True` is `x` only for a boolean x)."""
    inner = bare(node)
    if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.BitAnd):
        return mask_like(inner.left, masks) and mask_like(inner.right, masks)
    return isinstance(inner, cst.Comparison) or isinstance(inner, cst.Name) and inner.value in masks


def with_range(loop: cst.For, start: cst.BaseExpression, end: cst.BaseExpression, step: cst.BaseExpression | None,
                comment: str) -> cst.For:
    call = loop.iter
    assert isinstance(call, cst.Call)
    positional = [cst.Arg(start), cst.Arg(end)] + ([cst.Arg(step)] if step is not None else [])
    keywords = [a for a in call.args if a.keyword is not None]
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in positional + keywords]
    return loop.with_changes(iter=call.with_changes(args=args),
                             leading_lines=[*loop.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))])
