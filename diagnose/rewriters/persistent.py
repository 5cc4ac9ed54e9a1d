"""Persistent launch: a 1-D grid becomes a loop over its tiles on at most 1, 2 or 4 programs per SM.
The grid may be written as the launch's literal `(G,)` or as a name bound to `(G,)` or to
`lambda meta: (G,)` (`base.launch_grid`); every launch of the kernel must be one of those. A dot kernel
on a 2-D grid of output tiles gets the persistent tensor-descriptor form instead (`persistent_dot`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import Variant, dotted, is_jit, jit_functions, launch_grid, register, sm_count_statement
from diagnose.rewriters.blocks import fresh_name, kept_at_launch, names_in
from diagnose.rewriters.persistent_dot import persistent_tma_dot


class _ProgramIdToTile(cst.CSTTransformer):
    def __init__(self, tile: str) -> None:
        self.tile = tile

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if dotted(updated.func) == "tl.program_id" and len(updated.args) == 1 and m.matches(
                updated.args[0].value, m.Integer("0")):
            return cst.Name(self.tile)
        return updated


class _Persistent(cst.CSTTransformer):
    """A kernel launched on a 1-D grid `(G,)` becomes a loop over its G tiles, `tl.num_programs(0)`
    apart, launched on at most `PROGRAMS_PER_SM` programs per SM: one wave, no tail, no relaunch."""

    def __init__(self, per_sm: int) -> None:
        self.per_sm = per_sm
        self.kernel: str | None = None
        self.grids: list[cst.BaseExpression] = []  # G of each of its launches, in source order
        self.jit: dict[str, cst.FunctionDef] = {}
        self.changed = 0

    def visit_Module(self, node: cst.Module) -> None:
        # Names of the rewrite's own, none the module uses already (a kernel's `tile = tl.load(...)`, a
        # module-level `sm_count` the wrapper reads)
        taken = names_in(node)
        self.tile, self.n_tiles, self.sm_count = (fresh_name(n, taken) for n in ("tile", "n_tiles", "sm_count"))
        # The kernel to convert: every launch of it on a 1-D grid (a literal 1-tuple, or a name bound to
        # one or to `lambda meta: (G,)`), no parameter with a default (n_tiles is appended after them).
        jit = self.jit = jit_functions(node)
        launches = [cst.ensure_type(c, cst.Call) for c in m.findall(node, m.Call(func=m.Subscript()))]
        # Launches per statement, counted once (per kernel it was a walk of the module: seconds on fla's abc/chunk.py).
        per_line = [Counter(dotted(c.func.value) for c in m.findall(line, m.Call(func=m.Subscript(value=m.Name()))))  # type: ignore[attr-defined]
                    for line in m.findall(node, m.SimpleStatementLine())]
        for name in dict.fromkeys(dotted(c.func.value) for c in launches if dotted(c.func.value) in jit):  # type: ignore[attr-defined]
            grids = [launch_grid(node, c) for c in launches if dotted(c.func.value) == name]  # type: ignore[attr-defined]
            shared = any(counts[name] > 1 for counts in per_line)  # two launches in one statement
            if all(g is not None for g in grids) and not shared \
                    and not any(p.default is not None for p in jit[name].params.params):
                self.kernel, self.grids = name, [g for g in grids if g is not None]
                return

    def _helpers_read_the_grid(self, kernel: cst.FunctionDef) -> bool:
        """Whether a jit function the kernel calls (directly) reads tl.program_id or tl.num_programs."""
        called = {dotted(cst.ensure_type(c, cst.Call).func) for c in m.findall(kernel, m.Call())}
        return any(m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("program_id") | m.Name("num_programs"))))
                   for name, fn in self.jit.items() if name in called and name != kernel.name.value)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if self.kernel is None:
            return updated
        if is_jit(original) and original.name.value == self.kernel:
            if m.findall(original, m.Call(func=m.Attribute(attr=m.Name("program_id")),
                                          args=[m.Arg(value=~m.Integer("0"))])) or m.findall(original, m.Return()) \
                    or m.findall(original, m.Call(func=m.Attribute(attr=m.Name("num_programs")))) \
                    or self._helpers_read_the_grid(original) or _waits_on_other_programs(original) \
                    or any(dotted(cst.ensure_type(c, cst.Call).func).endswith("program_id")
                           and dotted(cst.ensure_type(c, cst.Call).func) != "tl.program_id"
                           for c in m.findall(original, m.Call())):
                # a 2-D or early-returning kernel, or one that reads the grid where the loop cannot rename it
                # (a grid-stride loop over num_programs, a helper's own program_id, `triton.language.program_id`
                # spelled out, which the loop would not rename): not this rewrite
                self.kernel = None
                return updated
            kept = kept_at_launch(original)
            if kept is None:
                self.kernel = None
                return updated
            saved, restored = kept
            body = restored + [st.visit(_ProgramIdToTile(self.tile)) for st in updated.body.body]
            loop = cst.For(target=cst.Name(self.tile), iter=cst.parse_expression(
                f"tl.range(tl.program_id(0), {self.n_tiles}, tl.num_programs(0))"), body=cst.IndentedBlock(body=body),  # type: ignore[arg-type]
                leading_lines=[cst.EmptyLine(comment=cst.Comment(
                    "# persistent: each program walks the tiles num_programs apart"))])
            signature = updated.params.with_changes(params=[*updated.params.params, cst.Param(cst.Name(self.n_tiles))])
            self.changed += 1
            return updated.with_changes(params=signature, body=updated.body.with_changes(body=[*saved, loop]))
        return updated.with_changes(body=updated.body.visit(
            _PersistentLaunch(self.kernel, self.per_sm, self.grids, self.n_tiles, self.sm_count)))


def _waits_on_other_programs(kernel: cst.FunctionDef) -> bool:
    """A compare-and-swap, an exchange or a volatile load: the kernel may spin until another program
    writes. With several tiles a program, a tile waiting on one a later pass of the same program owns
    never ends."""
    sync = m.Call(func=m.Attribute(attr=m.Name("atomic_cas") | m.Name("atomic_xchg")))
    volatile = m.Call(func=m.Attribute(attr=m.Name("load")), args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("volatile"),
                                                                                        value=~m.Name("False")),
                                                                   m.ZeroOrMore()])
    return bool(m.findall(kernel, sync) or m.findall(kernel, volatile))


class _PersistentLaunch(cst.CSTTransformer):
    def __init__(self, kernel: str, per_sm: int, grids: list[cst.BaseExpression], n_tiles: str, sm_count: str) -> None:
        self.kernel, self.per_sm, self.grids = kernel, per_sm, grids  # the grids are taken in source order
        self.n_tiles, self.sm_count = n_tiles, sm_count

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        calls = m.findall(updated, m.Call(func=m.Subscript(value=m.Name(self.kernel))))
        if not calls or m.findall(calls[0], m.Arg(keyword=m.Name(self.n_tiles))):
            return updated  # none, or a launch an inner function's visit already converted
        call = calls[0]
        grid = self.grids.pop(0)  # visit_Module resolved every launch of this kernel
        tiles = cst.parse_statement(f"{self.n_tiles} = 0").with_changes(
            body=[cst.Assign([cst.AssignTarget(cst.Name(self.n_tiles))], grid)])
        # Without a GPU (the interpreter judge) 4 SMs, so each program walks several tiles there too: with
        # one tile a program, what depends on the loop was never checked.
        sms = sm_count_statement("4", self.sm_count)
        programs = cst.parse_expression(f"(min({self.n_tiles}, {self.per_sm} * {self.sm_count}),)")
        new_call = call.with_changes(
            func=call.func.with_changes(slice=[cst.SubscriptElement(cst.Index(programs))]),  # type: ignore[attr-defined]
            args=[*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),  # type: ignore[attr-defined]
                  cst.Arg(keyword=cst.Name(self.n_tiles), value=cst.Name(self.n_tiles),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])
        return cst.FlattenSentinel([tiles, sms, updated.deep_replace(call, new_call)])  # type: ignore[arg-type]


def persistent_launch(source: str, context: dict[str, Any]) -> list[Variant]:
    out = []
    for per_sm in (1, 2, 4):
        t = _Persistent(per_sm)
        new = cst.parse_module(source).visit(t)
        if t.changed:
            out.append(Variant({"programs_per_sm": per_sm}, new.code))
    return out + persistent_tma_dot(source)


register("persistent-kernel")(persistent_launch)
