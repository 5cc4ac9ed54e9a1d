"""An op or a layout followed pass by pass through an indexed IR dump (`kb ir trace`): which pass
introduced it, which removed it, where it first and last shows, per kernel and per compile."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from harness.errors import UserFacingError
from harness.ir import kernel_base
from indexer.ir import StepChange, Timeline

__all__ = ["LayoutEvent", "Milestone", "OpStep", "OpTrace", "trace"]


@dataclass(frozen=True)
class OpStep:
    """One step of one kernel's pipeline, counted for the ops matching the traced name. Steps are
    numbered from 1, as search results number them ("IR pass 2/3")."""

    step: int
    kernel: str
    pass_name: str
    name: str
    before: int | None  # None: a stage in another IR language, not compared with the one before
    after: int | None  # None: unknown (the last pass of a "Before" stream)
    change: int
    lines_added: int
    lines_removed: int
    introduced_at: list[str]
    cite: str
    also_left_out: list[str]
    config: dict[str, object] | None

    @property
    def new_ir(self) -> bool:
        """Present in a stage of another IR language (ttgir -> llir): new in that IR, not added by a pass."""
        return self.before is None and bool(self.after)

    @property
    def replaced(self) -> bool:
        """Lines of the op both added and removed: the pass replaced some (a convert_layout to #mma for
        one to #dot_op), which a count alone does not show."""
        return bool(self.lines_added and self.lines_removed)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kernel": self.kernel, "pass": self.pass_name, "name": self.name,
                "before": self.before, "after": self.after, "change": self.change, "lines_added": self.lines_added,
                "lines_removed": self.lines_removed, "introduced_at": self.introduced_at, "cite": self.cite,
                "also_left_out": self.also_left_out, "config": self.config}


@dataclass(frozen=True)
class LayoutEvent:
    """A layout kind present in a kernel's first snapshot, first seen after a step, or gone after it."""

    step: int
    kernel: str
    pass_name: str
    name: str
    layout: str
    event: str  # present | appears | vanishes
    cite: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kernel": self.kernel, "pass": self.pass_name, "name": self.name,
                "layout": self.layout, "event": self.event, "cite": self.cite}


@dataclass(frozen=True)
class Milestone:
    """Where the op shows first in a kernel (`present from the start` or `first present after`), or was
    last seen when it is gone at the end with no step removing it (it went with a change of IR language)."""

    kind: str  # from-start | first | last
    kernel: str
    pass_name: str
    cite: str


@dataclass
class OpTrace:
    """What `trace` found: the op's steps, or (for a layout) its events; never both."""

    steps: list[OpStep] = field(default_factory=list)
    layouts: list[LayoutEvent] = field(default_factory=list)
    kernels_with_op: set[str] = field(default_factory=set)
    configs: dict[str, dict[str, object]] = field(default_factory=dict)

    def by_kernel(self) -> dict[str, list[OpStep]]:
        grouped: dict[str, list[OpStep]] = {}
        for step in self.steps:
            grouped.setdefault(step.kernel, []).append(step)
        return grouped

    def milestones(self) -> list[Milestone]:
        """Each kernel (and each compile of one) has its own pipeline: where the op first shows is per kernel."""
        found = []
        for kernel, steps in self.by_kernel().items():
            first = next((s for s in steps if s.before or s.after), None)
            if first is not None:
                found.append(Milestone("from-start" if first.before else "first", kernel, first.pass_name, first.cite))
            final = steps[-1]  # its `after` is unknown (None) for the last pass of a "Before" stream
            gone = final.after == 0 or (final.after is None and final.before == 0)
            if gone and not any(s.change < 0 for s in steps):
                last = next((s for s in reversed(steps) if s.after), None)
                if last is not None:
                    found.append(Milestone("last", kernel, last.pass_name, last.cite))
        return found

    def absent_compiles(self) -> list[str]:
        """Compiles without the op of a kernel that has it in another compile: which compile of an
        autotuned kernel lacks the vectorized load is half the answer; other kernels lacking it are not news."""
        bases_with_op = {kernel_base(k) for k in self.kernels_with_op}
        return [k for k in self.by_kernel() if k not in self.kernels_with_op and kernel_base(k) in bases_with_op]


def trace(timeline: Timeline, op: str, kernel: str | None = None, dump: str = "") -> OpTrace:
    """Ops whose name contains `op`, step by step; or, when no op matches (or `op` starts with `#`), the
    layout kind it names. `kernel` keeps one kernel, every compile of it (scale_kernel#2, scale_kernel@<hash>)."""
    if not op.strip():
        raise UserFacingError("no op given", "name one as printed in the IR, e.g. ttg.convert_layout or tt.load")
    steps = [s for s in timeline.steps if not kernel or kernel in (s.kernel, kernel_base(s.kernel))]
    if kernel and not steps:
        kernels = sorted({s.kernel for s in timeline.steps})
        raise UserFacingError(f"no kernel {kernel!r} in IR dump {dump} (kernels: {', '.join(kernels)})",
                              "give --kernel one of those names, or leave it out")
    rows = [_op_step(s, op, timeline.configs.get(s.kernel)) for s in steps]
    with_op = {r.kernel for r in rows if r.before or r.after or r.change}
    if with_op and not op.startswith("#"):
        return OpTrace(steps=rows, kernels_with_op=with_op, configs=timeline.configs)
    # `#mma`, `nvidia_mma`: a layout is no op; where it comes and goes is recorded per step.
    layouts = _layout_events(steps, op)
    if not layouts:
        raise UserFacingError(f"no op or layout matching {op!r} in any snapshot of {dump}",
                              "use an op name as printed in the IR (ttg.convert_layout, ld.global) or a layout "
                              "(#mma, nvidia_mma, dot_op); a dump indexed before layouts were recorded "
                              "(2026-11-30) needs `kb index ir` again")
    return OpTrace(layouts=layouts, configs=timeline.configs)


def _op_step(s: StepChange, op: str, config: dict[str, object] | None) -> OpStep:
    return OpStep(
        step=s.index + 1, kernel=s.kernel, pass_name=s.pass_arg, name=s.name,
        before=sum(n for o, n in s.counts_before.items() if op in o) if s.compared else None,
        after=sum(n for o, n in s.counts.items() if op in o) if s.after_known else None,
        change=sum(d for o, d in s.delta.items() if op in o),
        lines_added=sum(a for o, (a, _) in s.churn.items() if op in o),
        lines_removed=sum(r for o, (_, r) in s.churn.items() if op in o),
        introduced_at=sorted({w for o, ws in s.introduced_at.items() if op in o for w in ws}),
        cite=f"{s.source}:{s.line}", also_left_out=s.spans_left_out, config=config)


def _layout_events(steps: list[StepChange], wanted: str) -> list[LayoutEvent]:
    """Steps where a layout kind matching `wanted` (`#mma`, `#ttg.dot_op`, `nvidia_mma`) first appears in
    or vanishes from the IR. Aliases are renumbered in every dump, so `#mma` is read as the kind's name."""
    # `#blocked1` is an alias the printer numbered: its kind is `blocked`.
    needle = re.sub(r"\d+$", "", wanted.strip().lstrip("#").rsplit(".", 1)[-1].lower())
    if not needle:
        return []
    kinds = {k for s in steps for k in (*s.layouts_new, *s.layouts_gone, *s.layouts_at_start)}
    # `mma` names nvidia_mma (a word of it) rather than nvmma_shared; a fragment matches only failing that.
    chosen = {k for k in kinds if needle == k.lower() or needle in k.lower().split("_")} or \
        {k for k in kinds if needle in k.lower()}
    events = []
    for s in steps:
        for event, changed in (("present", s.layouts_at_start), ("appears", s.layouts_new),
                               ("vanishes", s.layouts_gone)):
            events += [LayoutEvent(s.index + 1, s.kernel, s.pass_arg, s.name, kind, event, f"{s.source}:{s.line}")
                       for kind in changed if kind in chosen]
    return events
