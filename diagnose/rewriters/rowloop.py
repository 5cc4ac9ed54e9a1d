"""Loop a whole-row tile in chunks (issue 27, families 1 and 5; pattern chunked-row-loop, for L3's
`spills.registers`): a row-per-program kernel that loads its whole row as one tile,
`cols = tl.arange(0, BLOCK)` with BLOCK the row's next power of two, and reduces it. Our cross entropy
holds 32,768 fp32 columns on 4 warps, 256 values a thread: ptxas spills them, and on the H200 its
widest rows ran at 0.70 of the copy rate while its 1,024-column rows ran at 0.82. No launch knob helps
(8 or 16 warps cost its narrow rows 18-45%). The engineer's fix is the one Triton's layer-norm tutorial
is written in: a loop over chunks of the row, each reduction carried across them.

The kernel's straight-line body is read as three kinds of statements (after every reduction that sits
inside a tile expression or inside another reduction's operand is first bound to a name of its own):

- *lane* statements compute a tile from the columns (`x = tl.load(...)`, `mask = cols < n`);
- *scalar* statements compute what does not vary along the row, reductions of tiles included
  (`m = tl.max(x, axis=0)`, `lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))`, a scalar load or store);
- *tile stores* write a tile (`tl.store(out + cols, y, mask=mask)`).

Each reduction (`tl.sum`, `tl.max`, `tl.min` over the 1-D tile) is computed by a loop over chunks of
_KB_CHUNK columns that recomputes the lane statements its operand needs and accumulates the chunk's
reduction; reductions whose scalar inputs are all known at the same point share one loop. The first chunk
is peeled (its names take a `_c0` suffix), so each accumulator starts as the reduction of a chunk, with
the type the kernel's own expression gives it. The tile stores run last, in one more loop over the chunks.
The chunks cover [0, BLOCK) exactly (both are powers of two and _KB_CHUNK = min(C, BLOCK) at launch), so
every lane the whole tile held, masked ones included, is reduced and stored as before; only the order of
the additions changes. Rows of BLOCK <= C compile the kernel as written (`if BLOCK <= _KB_CHUNK:` on two
constexprs keeps one branch) and launch at its own num_warps: a narrow row neither re-reads its tile for
the stores nor pays for a loop.

A scan in a tile statement (`y = tl.cumsum(x, 0)`, `tl.cumprod`) is computed chunk by chunk in whatever
loop needs it, joined to the prefix the earlier chunks carried (`tl.cumsum(x, 0) + carry`, `* carry`
for a product), the carry then read off the chunk's last lane: the "cumulative ops with block carry" of
the issue, and a kernel that only scans (our cumsum) is taken as one that reduces.

A sum of `exp(x - m)` (or `exp2((x - m) * c)`, any scale that is a scalar) whose `m` is the max of the
same `x` joins that max's loop as an online sum (Milakov and Gimelshein's online softmax normalizer): when
a chunk raises the running max, the sum so far is rescaled by `exp(m_old - m_new)`. A log-sum-exp then
reads the row once instead of twice. A running max that is still -inf (every column so far -inf) takes
0 as its reference, so a leading run of -inf columns adds 0 rather than NaN; the one difference from the
whole tile is a row that is -inf throughout, whose normalizer is then 0 (a log-sum-exp of -inf) where the
whole tile's exp(-inf - (-inf)) gave NaN.

It declines what it cannot loop soundly: any control flow (`if`, `for`, `while`, `return`), a subscript,
a second `tl.arange`, BLOCK used anywhere else (a `tl.zeros([BLOCK])`), a reduction other than
sum / max / min or with options beyond its axis and dtype (`return_indices`, `keep_dims`), a scan
outside a tile's plain assignment, reversed, or of a scan, dots, atomics,
layout changes, calls it cannot show to be elementwise (`tl.softmax`, `tl.reduce_or`), a tile statement
that is neither an assignment nor a store (`tl.device_print(x)`), a tile store before a reduction, a
scalar load or store between two tile stores, and a launch that does not pass BLOCK by name or position.
Since loads run again in later loops, it also declines a scalar store into a buffer the row is loaded
from before the row is read again, and tile stores that address the row otherwise than its tile loads
(written back in place in reversed order, each chunk would read columns a previous one wrote), and a
launch handing views of one host tensor to a stored and a loaded parameter (`aliasing`). The
columns may start at a row offset (`offs = row * n + tl.arange(0, BLOCK)`). A review's 36 probe kernels,
run on the interpreter against the kernels as written, found seven defects in the first version; six are
fixed (tests beside the others), the seventh is the -inf row above.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.aliasing import launch_aliases
from diagnose.rewriters.base import (
    TRITON_DEFAULT_KNOBS,
    ReplaceNodes,
    Variant,
    autotune_decorated,
    docstring_lines,
    dotted,
    is_jit,
    jit_functions,
    launch_arguments,
    only_launch,
    register,
    with_keywords,
    with_parameters,
)
from diagnose.rewriters.blocks import bare, code
from diagnose.rewriters.rowloopread import (
    REDUCTIONS,
    SCANS,
    Decline,
    Group,
    RowLoop,
    columns_arange,
    lane_closure,
    read_kernel,
    scan_of,
)
from diagnose.rewriters.rowsplit import triton_imports

__all__ = ["chunk_row_loop"]

# (columns per chunk, num_warps for a chunked row): chunks of 8-32 fp32 values a thread.
_VARIANTS = ((2048, 4), (4096, 8), (8192, 8))
_CHUNK = "_KB_CHUNK"


class _BareArguments(cst.CSTTransformer):
    """A call's arguments without the parentheses a written-out name brought (`tl.exp((a - b))`)."""

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(value=bare(updated.value))


class _Rename(cst.CSTTransformer):
    """Names renamed by a map; attribute names and keywords left alone."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.names.get(updated.value, updated.value))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


class _Writer:
    """The kernel's new body: scalar statements where they were, each loop before the statement of its
    first reduction, the tile stores' loop where the last tile store was."""

    def __init__(self, plan: RowLoop) -> None:
        self.plan = plan
        taken = {cst.ensure_type(n, cst.Name).value for n in m.findall(plan.fn, m.Name())}
        lane_names = {st.target for st in plan.statements if st.kind == "lane" and st.target}
        top = {p.name.value for p in plan.fn.params.params} | {
            st.target for st in plan.statements if st.kind == "scalar" and st.target}
        self.first = {n: self._fresh(f"{n}_c0", taken) for n in sorted(lane_names)}
        self.looped = {n: (self._fresh(f"{n}_kb", taken) if n in top else n) for n in sorted(lane_names)}
        self.fused = {r.online.max for r in plan.reductions if r.online is not None}
        self.scan_index = {id(c): k for k, c in enumerate(c for j in sorted(plan.scans) for c in plan.scans[j])}

    @staticmethod
    def _fresh(name: str, taken: set[str]) -> str:
        while name in taken:
            name += "_kb"
        taken.add(name)
        return name

    def _reads(self, at: int, names: dict[str, str], refs: dict[int, str]) -> dict[str, str]:
        """How statement `at`'s names read in a pass: tiles as `names` has them, values assigned at a
        statement in `refs` (an online max's m) as the name given there, the rest as written."""
        out = {}
        for n, d in self.plan.statements[at].defs.items():
            if d in refs:
                out[n] = refs[d]
            elif d >= 0 and self.plan.statements[d].kind == "lane":
                out[n] = names[n]
        return out

    def _lane_lines(self, j: int, names: dict[str, str], start: str | None, refs: dict[int, str], first: bool
                    ) -> list[cst.SimpleStatementLine]:
        """Lane statement `j` with its tile names as `names` has them; the columns start at `start`. Each scan
        in it is computed first, joined to the prefix the earlier chunks carried (none in the `first`
        chunk), and the prefix then taken from its last lane."""
        st = self.plan.statements[j]
        small = st.node.body[0]
        replace: dict[int, cst.BaseExpression] = {}
        arange = columns_arange(st.value)
        if arange is not None:  # the columns: this chunk's
            chunk = cst.parse_expression(f"{start} + tl.arange(0, {_CHUNK})" if start else f"tl.arange(0, {_CHUNK})")
            if start and arange is not st.value:  # `S + (start + tl.arange(...))`
                chunk = chunk.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            replace[id(arange)] = chunk
        reads = _Rename(self._reads(j, names, refs))
        before, after = [], []
        for call in self.plan.scans.get(j, []):
            k = self.scan_index[id(call)]
            scan, carry = f"_kb_scan{k}", f"_kb_carry{k}"
            value = code(_expression(call.visit(reads)))
            before.append(_line(f"{scan} = {value}" + ("" if first else f" {SCANS[scan_of(call) or '']} {carry}")))
            after.append(_line(f"{carry} = tl.sum(tl.where(tl.arange(0, {_CHUNK}) == {_CHUNK} - 1, {scan}, 0), axis=0)"
                               "  # the prefix so far: the last lane's"))
            replace[id(call)] = cst.Name(scan)
        if replace:
            small = cst.ensure_type(small.visit(ReplaceNodes(replace)), type(small))
        new = cst.ensure_type(small.visit(reads), type(small))
        if st.target is not None:
            target = cst.Name(names[st.target])
            new = new.with_changes(targets=[cst.AssignTarget(target)]) if isinstance(new, cst.Assign) \
                else new.with_changes(target=target)
        return [*before, st.node.with_changes(body=[new], leading_lines=[]), *after]

    def _accumulate(self, k: int, names: dict[str, str], refs: dict[int, str], first: bool
                    ) -> list[cst.SimpleStatementLine]:
        r = self.plan.reductions[k]
        acc = f"_kb_acc{k}"
        call = code(_expression(r.call.visit(_Rename(self._reads(r.at, names, refs)))))
        if r.online is not None:
            mx, diff = r.online.max, r.online.difference
            if first:
                return [_line(f"{acc} = {call}")]
            moved = cst.parse_expression(f"_kb_acc{mx} - _kb_m{mx}").with_changes(lpar=diff.lpar, rpar=diff.rpar)
            rescale = code(_expression(_expression(r.online.rescale.visit(ReplaceNodes({id(diff): moved}))).visit(_BareArguments())))
            return [_line(f"{acc} = {acc} * {rescale} + {call}")]
        if k in self.fused:
            value = call if first else f"tl.maximum({acc}, {call})"
            new = acc if first else f"_kb_new{k}"
            return [_line(f"{new} = {value}"),
                    _line(f'_kb_m{k} = tl.where({new} == float("-inf"), 0.0, {new})  # -inf so far: 0 as the reference')]
        if first:
            return [_line(f"{acc} = {call}")]
        combine = REDUCTIONS[r.op]
        return [_line(f"{acc} = {combine}({acc}, {call})" if combine else f"{acc} = {acc} + {call}")]

    def _pass(self, lanes: set[int], at: dict[int, list[int]], names: dict[str, str], start: str | None,
              refs: dict[int, str], first: bool) -> list[cst.SimpleStatementLine]:
        out: list[cst.SimpleStatementLine] = []
        for j in sorted(lanes | set(at)):
            if j in lanes:
                out += self._lane_lines(j, names, start, refs, first)
            for k in at.get(j, []):
                out += self._accumulate(k, names, refs, first)
        return out

    def _loop(self, start: str, body: list[cst.SimpleStatementLine]) -> cst.For:
        return cst.For(target=cst.Name("_kb_start"), iter=cst.parse_expression(f"range({start}, {self.plan.block}, {_CHUNK})"),
                       body=cst.IndentedBlock(body))

    def group(self, group: Group) -> list[cst.BaseStatement]:
        members = [self.plan.reductions[k] for k in group.members]
        lanes = set().union(*(r.lanes for r in members))
        at: dict[int, list[int]] = {}
        for k in group.members:
            at.setdefault(self.plan.reductions[k].at, []).append(k)
        refs = {self.plan.reductions[k].at: f"_kb_m{k}" for k in group.members if k in self.fused}
        peel = self._pass(lanes, at, self.first, None, refs, first=True)
        body = self._pass(lanes, at, self.looped, "_kb_start", refs, first=False)
        body += [_line(f"_kb_acc{k} = _kb_new{k}") for k in group.members if k in self.fused]
        peel[0] = peel[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            f"# the row in chunks of {_CHUNK} columns, each reduction carried across them: the first chunk, then the rest"))])
        return [*peel, self._loop(_CHUNK, body)]

    def stores(self) -> list[cst.BaseStatement]:
        """The tile stores' loop; with a scan among what they store, its first chunk peeled (the carry starts
        there)."""
        stores = self.plan.stores
        lanes = set().union(*(lane_closure(self.plan.statements, i, self.plan.statements[i].value) for i in stores))

        def chunk(names: dict[str, str], start: str | None, first: bool) -> list[cst.SimpleStatementLine]:
            out: list[cst.SimpleStatementLine] = []
            for j in sorted(lanes | set(stores)):
                out += self._lane_lines(j, names, start, {}, first) if j in lanes else [self._store_line(j, names)]
            return out

        said = cst.EmptyLine(comment=cst.Comment("# the tiles it stores, chunk by chunk"))
        if not any(j in self.plan.scans for j in lanes):
            return [self._loop("0", chunk(self.looped, "_kb_start", False)).with_changes(leading_lines=[said])]
        peel = chunk(self.first, None, True)
        peel[0] = peel[0].with_changes(leading_lines=[said])
        return [*peel, self._loop(_CHUNK, chunk(self.looped, "_kb_start", False))]

    def _store_line(self, j: int, names: dict[str, str]) -> cst.SimpleStatementLine:
        st = self.plan.statements[j]
        reads = self._reads(j, names, {})
        small = st.node.body[0].visit(_Rename(reads))
        assert isinstance(small, cst.BaseSmallStatement)
        return st.node.with_changes(body=[small], leading_lines=[])

    def body(self) -> list[cst.BaseStatement]:
        """`if BLOCK <= _KB_CHUNK:` the body as written (a row of one chunk compiles the kernel it had; both
        are constexprs, so Triton keeps one branch), `else:` the loops."""
        plan = self.plan
        written = [st for st in plan.fn.body.body if isinstance(st, cst.BaseStatement)]
        doc = docstring_lines(written)
        accumulators: dict[int, cst.BaseExpression] = {id(r.call): cst.Name(f"_kb_acc{k}") for k, r in enumerate(plan.reductions)}
        chunked: list[cst.BaseStatement] = []
        for i, st in enumerate(plan.statements):
            for group in plan.groups:
                if group.at == i:
                    chunked += self.group(group)
            if plan.stores and i == plan.stores[-1]:
                chunked += self.stores()
            if st.kind == "scalar":
                chunked.append(cst.ensure_type(st.node.visit(ReplaceNodes(accumulators)), cst.SimpleStatementLine))
        branch = cst.If(test=cst.parse_expression(f"{plan.block} <= {_CHUNK}"), body=cst.IndentedBlock(written[doc:]),
                        orelse=cst.Else(cst.IndentedBlock(chunked)), leading_lines=[cst.EmptyLine(comment=cst.Comment(
                            "# a row of one chunk: the kernel as written; a wider one in chunks (chunked-row-loop)"))])
        return [*written[:doc], branch]


def _expression(node: cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]) -> cst.BaseExpression:
    assert isinstance(node, cst.BaseExpression)
    return node


def _line(code: str) -> cst.SimpleStatementLine:
    return cst.ensure_type(cst.parse_statement(code + "\n"), cst.SimpleStatementLine)


class _ChunkLaunch(cst.CSTTransformer):
    """`K[grid](..., BLOCK=B, ...)` -> `kb_block = B`, then `K[grid](..., BLOCK=kb_block, ...,
    _KB_CHUNK=min(C, kb_block), num_warps=W if kb_block > C else <as it was>)`: a row that fits one chunk
    launches as before."""

    def __init__(self, launches: dict[int, tuple[int, bool]], columns: int, warps: int) -> None:
        self.launches, self.columns, self.warps = launches, columns, warps
        self.done = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        small = original.body[0] if len(original.body) == 1 else None
        if not isinstance(small, cst.Expr) or id(small.value) not in self.launches:
            return updated
        position, autotuned = self.launches[id(small.value)]
        call = cst.ensure_type(cst.ensure_type(updated.body[0], cst.Expr).value, cst.Call)
        args = list(call.args)
        block = args[position].value
        args[position] = args[position].with_changes(value=cst.Name("kb_block"))
        chunked = f"{self.warps} if kb_block > {self.columns} else"
        extra: dict[str, cst.BaseExpression] = {_CHUNK: cst.parse_expression(f"min({self.columns}, kb_block)")}
        warps = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "num_warps"), None)
        if warps is not None:
            kept = code(args[warps].value)
            args[warps] = args[warps].with_changes(value=cst.parse_expression(f"{chunked} ({kept})"))
        elif not autotuned and self.warps != TRITON_DEFAULT_KNOBS["num_warps"] and not any(a.star == "**" for a in args):
            extra["num_warps"] = cst.parse_expression(f"{chunked} {TRITON_DEFAULT_KNOBS['num_warps']}")
        made = with_keywords(call.with_changes(args=args), extra)
        self.done += 1
        head = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name("kb_block"))], block)],
                                       leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([head, updated.with_changes(body=[cst.Expr(made)], leading_lines=[])])


def chunk_row_loop(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    imported = triton_imports(module)
    launched = set(context.get("launched") or {})
    helpers = jit_functions(module)
    kernels: dict[str, cst.FunctionDef] = {}
    launches: dict[int, tuple[int, bool]] = {}
    online: list[str] = []
    for name, fn in helpers.items():
        if launched and name not in launched:
            continue
        found = only_launch(module, name)
        if found is None:
            continue
        try:
            plan = read_kernel(fn, imported, helpers)
        except Decline:
            continue
        call = found[1]
        if launch_aliases(fn, call, found[0]):
            continue  # `kernel[grid](buf, buf[:, 1:])`: a chunk's stores land where a later chunk loads
        bound = launch_arguments(fn, call).get(plan.block)
        names = {cst.ensure_type(n, cst.Name).value for n in m.findall(found[0], m.Name())}
        if bound is None or bound.star or "kb_block" in names:
            continue
        position = next(i for i, a in enumerate(call.args) if a is bound)
        launches[id(call)] = (position, autotune_decorated(fn))
        body = _Writer(plan).body()
        # after every parameter, with a default: a launch passing a defaulted parameter by position still binds it
        kernels[name] = with_parameters(fn, [_CHUNK], {_CHUNK}, default="1").with_changes(body=fn.body.with_changes(body=body))
        online += [f"{name}: {dotted(plan.reductions[r.online.max].call.func)} + {dotted(r.call.func)}"
                   for r in plan.reductions if r.online is not None]
    if not kernels:
        return []
    rewritten = module.with_changes(body=[kernels.get(n.name.value, n) if isinstance(n, cst.FunctionDef) and is_jit(n)
                                          else n for n in module.body])
    out = []
    for columns, warps in _VARIANTS:
        launch = _ChunkLaunch(launches, columns, warps)
        new = rewritten.visit(launch)
        if launch.done == len(launches):
            out.append(Variant({"loop": "the row in chunks, reductions and scans carried", "chunk": columns, "num_warps": warps,
                                "online": online, "kernels": sorted(kernels)}, new.code))
    return out


register("chunked-row-loop")(chunk_row_loop)
