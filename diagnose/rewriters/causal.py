"""Causal loop bounds: an attention key loop stops at the diagonal, and the blocks wholly below it run
without the causal mask.

A causal attention kernel written as `for start_n in range(0, seq, BLOCK_N)` with the scores masked by
`tl.where(rm[:, None] >= rn[None, :], s, -inf)` visits every key block although the blocks past its
rows' diagonal are masked out entirely: half the work of a square problem. With the online-softmax
update those blocks change nothing (every score -inf: p = exp(-inf - m) = 0, the running max and with it
alpha = exp(m_old - m_new) = 1 unchanged), so stopping at the diagonal gives the same result bit for
bit. The blocks wholly below the diagonal (every key before every row) need no causal term either.

    for start_n in range(0, start_m // BLOCK_N * BLOCK_N, BLOCK_N):                   # below: unmasked
        ...                                                                           # causal term dropped
    for start_n in range(start_m // BLOCK_N * BLOCK_N, tl.minimum(seq, start_m + BLOCK_M), BLOCK_N):
        ...                                                                           # the diagonal, as written

A sliding window (`rows - keys < W`, or the same rearranged: `keys > rows - W`, `rows < keys + W`, `<=`)
masks every key block before the window of the block's first row: the loop starts at the block of its
first key, `tl.maximum(S - W + 1, 0) // BLOCK_N * BLOCK_N`. Split, the blocks on the window's edge run as
written, those every row of the block sees whole (from the last row's first key, rounded up to a block,
to the diagonal) without the window and causal terms, and the diagonal blocks as written. Skipping leading
blocks assumes what a windowed kernel that visits them must already do: a row whose keys so far are all
-inf leaves the running state as it found it (a 0 reference for the exponentials while the max is -inf).

Preconditions, checked on the syntax tree: the loop walks its dimension in blocks from 0 (blocks.py);
a causal term compares the loop's block with the program's row block `S + tl.arange(0, BLOCK_M)` (S
built from program ids and constants), `rows >= keys` or `rows > keys`; the terms appear only as
conjuncts (`&`) of the condition of `tl.where(cond, x, -inf)`, inline or through a name; the masked scores are used only by
`tl.max(s, ...)` and by `tl.exp(s - m)` / `tl.exp2(s - m)` (so an all -inf block adds exp(-inf) = 0),
and are not carried out of the loop. The judge checks the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper

from diagnose.rewriters.base import Variant, dotted, register, simple_assign, start_plus_arange
from diagnose.rewriters.blocks import (
    BlockLoop,
    DropTrueTerms,
    KernelLoops,
    assigned_names,
    bare,
    block_loop,
    calls_in,
    code,
    conjuncts,
    infinity_sign,
    names_in,
    ordered,
    single_assigns,
    with_range,
)

__all__ = ["CausalLoop", "causal_loop_bounds", "causal_loops"]

_EXP = {"tl.exp", "tl.exp2", "tl.math.exp", "tl.math.exp2", "libdevice.exp", "libdevice.exp2"}
_INDEX_CALLS = {"tl.program_id", "tl.num_programs"}


@dataclass(frozen=True)
class CausalLoop:
    """A key loop the rewrite bounds: its line, the causal terms its below-diagonal blocks drop, and as
    written: the loop's bound and step, the row block's start S and width (what a launch's values turn
    into the blocks skipped)."""

    line: int
    terms: int
    bound: str = ""
    step: str = ""
    rows_start: str = ""
    rows_width: str = ""
    window: str = ""  # the first key a sliding window lets the row block's first row see ("" without one)
    causal: bool = True  # a causal term bounds the loop's end


@dataclass
class _Causal:
    loop: BlockLoop
    in_loop: set[str]  # the loop's variable, the names its body assigns and those the kernel assigns twice:
    #                    no row start or window may read them
    rows: dict[str, tuple[str, str]]  # names bound to a row block -> (its start S, its width BLOCK_M)
    names: set[str]  # names the loop body binds to a causal or window term
    scalars: dict[str, cst.BaseExpression] = field(default_factory=dict)  # names bound once before the loop
    params: set[str] = field(default_factory=set)  # the kernel's parameters
    named: dict[str, tuple[bool, str, str, str]] = field(default_factory=dict)  # name -> (causal, low, S, BLOCK_M)
    start: str = ""  # S and BLOCK_M of the row block the terms compare with
    width: str = ""
    causal: bool = False  # a causal term was seen: the loop ends at the diagonal
    low: str = ""  # a window term was seen: the first key the block's first row sees, as an expression

    def _row_block(self, node: cst.BaseExpression) -> tuple[str, str] | None:
        node = bare(node)
        if isinstance(node, cst.Name):
            return self.rows.get(node.value)
        return _row_block(node, self.in_loop)

    def _same_rows(self, row: tuple[str, str]) -> bool:
        if not self.start:
            self.start, self.width = row
        return row == (self.start, self.width)

    def is_causal_term(self, node: cst.BaseExpression) -> bool:
        """`rows >= keys`, `rows > keys` (or mirrored), or a sliding window's `rows - keys < W` (`<=`, or any
        arrangement of the same: `keys > rows - W`, `rows < keys + W`), for the row block this loop's terms
        all use."""
        node = bare(node)
        if isinstance(node, cst.Name):
            return node.value in self.names and self._use_named(node.value)
        sides = ordered(node)
        if sides is None:
            return False
        keys, rows, _ = sides  # keys <= rows, or keys < rows
        row = self._row_block(rows)
        if row is not None and self.loop.is_block(keys):
            same = self._same_rows(row)
            self.causal = self.causal or same
            return same
        return self._is_window_term(*sides)

    def read_named(self, name: str, value: cst.BaseExpression) -> bool:
        """Whether the loop's binding `name = value` is a causal or window term, read without taking its
        bounds: only a term the select uses bounds the loop (an unused `near = rows - keys < 2` must not)."""
        kept = (self.causal, self.low, self.start, self.width)
        self.causal, self.low = False, ""
        found = self.is_causal_term(value)
        if found:
            self.named[name] = (self.causal, self.low, self.start, self.width)
        self.causal, self.low, self.start, self.width = kept
        return found

    def _use_named(self, name: str) -> bool:
        causal, low, start, width = self.named.get(name, (False, "", "", ""))
        if not self._same_rows((start, width)) or (low and self.low and low != self.low):
            return False
        self.causal, self.low = self.causal or causal, low or self.low
        return True

    def _fixed(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """Whether `node` is one integer for the whole loop: literals, parameters and names bound once before
        the loop to such values, program ids; no tile (a per-row window) and no float (a loop bound)."""
        node = bare(node) if depth == 0 else node
        if isinstance(node, cst.Integer):
            return True
        if isinstance(node, cst.Name):
            if node.value in self.in_loop:
                return False
            if node.value in self.scalars:
                return depth < 8 and self._fixed(self.scalars[node.value], depth + 1)
            return node.value in self.params
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply,
                                                                                   cst.FloorDivide)):
            return self._fixed(node.left, depth + 1) and self._fixed(node.right, depth + 1)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            return self._fixed(node.expression, depth + 1)
        return isinstance(node, cst.Call) and dotted(node.func) in _INDEX_CALLS and not node.lpar

    def _is_window_term(self, lesser: cst.BaseExpression, greater: cst.BaseExpression, strict: bool) -> bool:
        """`lesser < greater` (or `<=`) reads `keys > rows - W` (`>=`) once both sides are moved to one:
        the keys a row r sees start at r - W + 1 (r - W)."""
        big, small = self._linear(greater), self._linear(lesser)
        if big is None or small is None:
            return False
        rows, keys, terms = big[0] - small[0], big[1] - small[1], big[2] + [(-s, t) for s, t in small[2]]
        if (rows, keys) != (-1, 1) or not terms or not self.start:
            return False
        window = " ".join(f"{'-' if s < 0 else '+'} {t}" for s, t in terms).removeprefix("+ ")
        start = self.start if _atomic(self.start) else f"({self.start})"
        low = f"{start} - ({window})" + (" + 1" if strict else "")
        if self.low and self.low != low:
            return False
        self.low = low
        return True

    def _linear(self, node: cst.BaseExpression) -> tuple[int, int, list[tuple[int, str]]] | None:
        """`node` as (coefficient of the rows, of the keys, signed terms that do neither): sums and
        differences of the row block, the loop's key block and values fixed for the loop."""
        node = bare(node)
        if self.loop.is_block(node):
            return 0, 1, []
        row = self._row_block(node)
        if row is not None:
            return (1, 0, []) if self._same_rows(row) else None
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
            left, right = self._linear(node.left), self._linear(node.right)
            if left is None or right is None:
                return None
            sign = 1 if isinstance(node.operator, cst.Add) else -1
            return left[0] + sign * right[0], left[1] + sign * right[1], left[2] + [(sign * s, t) for s, t in right[2]]
        return (0, 0, [(1, code(node))]) if self._fixed(node) else None


def _row_block(value: cst.BaseExpression, in_loop: set[str]) -> tuple[str, str] | None:
    """(S, BLOCK_M) of `S + tl.arange(0, BLOCK_M)` where S is built from program ids, constants and names
    the loop does not assign; no other calls."""
    split = start_plus_arange(bare(value))
    if split is None or not {dotted(c.func) for c in calls_in(split[0])} <= _INDEX_CALLS \
            or names_in(split[0]) & in_loop:
        return None
    return code(bare(split[0])), code(split[1])


def _row_blocks(kernel: cst.FunctionDef, in_loop: set[str]) -> dict[str, tuple[str, str]]:
    """Names the kernel binds once, outside the loop, to a row block."""
    out = {}
    for name, value in single_assigns(kernel.body).items():
        row = _row_block(value, in_loop) if name not in in_loop else None
        if row is not None:
            out[name] = row
    return out


def _masked_scores_are_softmax_only(body: cst.BaseSuite, causal: _Causal) -> bool:
    """Every causal term sits in `t = tl.where(cond, x, -inf)`, and every later use of t in the body is
    `tl.max(t, ...)` or `exp(t - m)`."""
    statements = list(body.body) if isinstance(body, cst.IndentedBlock) else []
    terms_seen = 0
    for i, statement in enumerate(statements):
        wheres = calls_in(statement, "tl.where")
        uses = _causal_uses(statement, causal)
        if not uses:
            continue
        target = _where_target(statement)
        if target is None or len(wheres) != 1 or uses != _causal_uses(wheres[0].args[0].value, causal):
            return False  # a causal term outside one tl.where's condition
        where = wheres[0]
        assert isinstance(where, cst.Call)
        if len(where.args) != 3 or infinity_sign(where.args[2].value) != -1:
            return False
        if sum(1 for leaf in conjuncts(where.args[0].value) if causal.is_causal_term(leaf)) != uses:
            return False  # a term under `|` or `~` does not mask its blocks whole
        terms_seen += uses
        later = cst.IndentedBlock(body=statements[i + 1:])
        total = len(m.findall(later, m.Name(target)))
        maxes = len(m.findall(later, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("max")),
                                            args=[m.Arg(value=m.Name(target)), m.ZeroOrMore()])))
        exps = sum(1 for c in calls_in(later) if dotted(c.func) in _EXP
                   and c.args and m.matches(c.args[0].value, m.BinaryOperation(left=m.Name(target), operator=m.Subtract())))
        if total != maxes + exps:
            return False
    return terms_seen > 0


def _causal_uses(node: cst.CSTNode, causal: _Causal) -> int:
    found = 0

    class Visitor(cst.CSTVisitor):
        def visit_Comparison(self, comparison: cst.Comparison) -> bool:
            nonlocal found
            found += int(causal.is_causal_term(comparison))
            return False

        def visit_Name(self, name: cst.Name) -> None:
            nonlocal found
            found += int(name.value in causal.names)

    node.visit(Visitor())
    return found


def _where_target(statement: cst.CSTNode) -> str | None:
    """t of a statement `t = tl.where(...)`."""
    assign = simple_assign(statement)
    if assign is None or not isinstance(assign[1], cst.Call) or dotted(assign[1].func) != "tl.where":
        return None
    return assign[0]


def _causal_of(loop_node: cst.For, kernel: cst.FunctionDef, aranges: dict[str, str]) -> _Causal | None:
    loop = block_loop(loop_node, kernel, aranges)
    if loop is None or loop.counter:
        return None
    counts = assigned_names(kernel.body)
    in_loop = set(assigned_names(loop_node.body)) | {loop.var} | {n for n, c in counts.items() if c > 1}
    if any(dotted(c.func).rsplit(".", 1)[-1] == "store" or "atomic" in dotted(c.func) for c in calls_in(loop_node.body)):
        return None  # what a skipped block would have written
    scalars = {n: v for n, v in single_assigns(kernel.body).items() if n not in in_loop}
    causal = _Causal(loop, in_loop, _row_blocks(kernel, in_loop), set(), scalars,
                     {p.name.value for p in kernel.params.params})
    for name, value in single_assigns(loop_node.body).items():
        if counts.get(name) == 1 and causal.read_named(name, value):
            causal.names.add(name)
    # a named causal mask is used in the tl.where only; the binding itself is no use
    body = loop_node.body.visit(_Unbind(causal.names))
    assert isinstance(body, cst.BaseSuite)
    if not _masked_scores_are_softmax_only(body, causal) or not causal.start:
        return None
    scores = {_where_target(s) for s in (body.body if isinstance(body, cst.IndentedBlock) else [])} - {None}
    in_body = assigned_names(loop_node.body)
    if any(counts.get(t, 0) > in_body.get(t, 0) for t in scores if t):
        return None  # the masked scores are carried in from before the loop
    carried = {n for n, c in in_body.items() if counts.get(n, 0) > c}
    if not carried <= _derived({t for t in scores if t}, loop_node.body):
        return None  # a value carried across blocks that the skipped blocks would change without their scores
    return causal


def _derived(roots: set[str], body: cst.BaseSuite) -> set[str]:
    """The names the body computes from `roots` (the masked scores), through its plain and augmented
    assignments: an online softmax's max, exponentials, sums and accumulator."""
    out = set(roots)
    statements = [s for s in (body.body if isinstance(body, cst.IndentedBlock) else [])
                  if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1]
    while True:
        grown = {t.value for s in statements for small in s.body
                 if isinstance(small, (cst.Assign, cst.AugAssign))
                 for t in ([small.targets[0].target] if isinstance(small, cst.Assign) and len(small.targets) == 1
                           else [small.target] if isinstance(small, cst.AugAssign) else [])
                 if isinstance(t, cst.Name) and names_in(small.value) & out}
        if grown <= out:
            return out
        out |= grown


class _Unbind(cst.CSTTransformer):
    """The body without the bindings of the named causal masks (for counting their uses)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        if (len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign)
                and any(m.matches(t.target, m.Name()) and t.target.value in self.names  # type: ignore[attr-defined]
                        for t in updated.body[0].targets)):
            return cst.RemoveFromParent()
        return updated


class _Bound(KernelLoops):
    def __init__(self, split: bool) -> None:
        super().__init__()
        self.split = split
        self.bounded: list[CausalLoop] = []

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        kernel = self.kernel()
        if kernel is None or original.orelse is not None:
            return updated
        causal = _causal_of(original, *kernel)
        if causal is None:
            return updated
        call = original.iter
        assert isinstance(call, cst.Call)
        step = [a.value for a in call.args if a.keyword is None][2]
        bound = code(causal.loop.bound)
        start = causal.start if _atomic(causal.start) else f"({causal.start})"
        end = cst.parse_expression(f"tl.minimum({bound}, {start} + {causal.width})") if causal.causal \
            else causal.loop.bound
        first: cst.BaseExpression = cst.Integer("0")
        if causal.low:
            width = causal.loop.width
            first = cst.parse_expression(f"tl.maximum({causal.low}, 0) // {width} * {width}")
        dropper = DropTrueTerms(causal.is_causal_term, causal.loop.masks | causal.names)
        below_body = original.body.visit(dropper)
        self.bounded.append(CausalLoop(self.line(original), dropper.dropped, bound, causal.loop.width, causal.start,
                                       causal.width, causal.low, causal.causal))
        if not self.split:
            said = ("key blocks before the rows' window" + (" and past their diagonal" if causal.causal else "")
                    if causal.low else "key blocks past the rows' diagonal")
            return with_range(original, first, end, step, f"# {said} are all -inf: they add nothing, so they are skipped")
        assert isinstance(below_body, cst.BaseSuite)
        width = causal.loop.width
        # Every row of the block sees every key of a block from `inside` on (a window's first key for the
        # block's last row, rounded up to a block) and up to `diagonal` (the first row's own block).
        # Capped at the loop's own bound, rounded down to a block: with more queries than keys (top-left
        # causal, N_Q > N_K) the rows' diagonal lies past the last key, and the unmasked loop must not
        # reach past it or into its partial last block (a helper's audit: 0.181 off at N_Q=64, N_K=32).
        diagonal = cst.parse_expression(f"tl.minimum({start} // {width} * {width}, {bound} // {width} * {width})") \
            if causal.causal else end
        loops = []
        if causal.low:
            inside = f"tl.cdiv(tl.maximum({causal.low} + {causal.width} - 1, 0), {width}) * {width}"
            inside = f"tl.minimum({inside}, {code(diagonal)})"  # the diagonal, or the loop's own bound
            loops.append(with_range(original, first, cst.parse_expression(inside), step,
                                    "# key blocks on the window's edge, as written; those before it are all -inf and skipped"))
            interior: cst.BaseExpression = cst.parse_expression(inside)
        else:
            interior = cst.Integer("0")
        said = "every key inside every row's window" if causal.low else "every key precedes every row"
        loops.append(with_range(original.with_changes(body=below_body, leading_lines=[] if loops else original.leading_lines),
                                interior, diagonal, step, f"# key blocks wholly visible: {said}, no mask for it"))
        if causal.causal:
            loops.append(with_range(original.with_changes(leading_lines=[]), diagonal, end, step,
                                    "# the blocks on the diagonal, as written; those past it add nothing and are skipped"))
        return cst.FlattenSentinel(loops)


def _atomic(text: str) -> bool:
    return text.replace("_", "").isalnum()


def _bounded(source: str, split: bool) -> tuple[str, list[CausalLoop]]:
    transformer = _Bound(split)
    new = MetadataWrapper(cst.parse_module(source)).visit(transformer)
    return new.code, transformer.bounded


def causal_loops(source: str) -> list[CausalLoop]:
    """The causal key loops that visit blocks past the diagonal (what L1 reports; the rewrite bounds them)."""
    try:
        return _bounded(source, split=False)[1]
    except cst.ParserSyntaxError:
        return []


def causal_loop_bounds(source: str, context: dict[str, Any]) -> list[Variant]:
    """Two variants: the loop stopped at the diagonal; and that, with the blocks below it unmasked."""
    variants = []
    for split in (False, True):
        new, bounded = _bounded(source, split)
        if bounded and new != source:
            variants.append(Variant({"causal_loops": len(bounded), "below_diagonal_unmasked": split,
                                     "window_start": any(b.window for b in bounded)}, new))
    return variants


register("causal-loop-bounds")(causal_loop_bounds)
