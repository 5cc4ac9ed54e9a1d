"""`kb ir trace` on a terminal: the steps that changed the op, then where it first and last shows."""

from __future__ import annotations

import click

from indexer.ir import describe_config
from indexer.ir_trace import OpTrace

__all__ = ["echo_trace"]

_MILESTONE = {"from-start": "present from the start: {pass_} received it{of}", "first": "first present after: {pass_}{of}",
              "last": "last present after: {pass_} in {kernel}"}


def echo_trace(found: OpTrace, show_all: bool) -> None:
    if found.layouts:
        _echo_layouts(found)
        return
    rows = found.steps
    for k in sorted(found.kernels_with_op & set(found.configs)):
        click.echo(f"{k} compiled with {describe_config(found.configs[k])}")
    width = max([len("kernel"), *(len(r.kernel) for r in rows)])
    click.echo(f"{'kernel':<{width}} {'step':>4} {'pass or stage':<45} {'before':>6} {'after':>6}")
    for r in rows:
        if show_all or r.change or r.new_ir or r.replaced:
            at = f"  at {', '.join(r.introduced_at[:4])}" if r.introduced_at and r.lines_added else ""
            after = "?" if r.after is None else r.after
            before = "-" if r.before is None else r.before
            change = ("first snapshot" if r.new_ir and r.step == 1 else "new in this IR" if r.new_ir else
                      f"{r.change:+d}: +{r.lines_added}/-{r.lines_removed} lines" if r.replaced
                      else f"{r.change:+d}")
            # The left-out passes go last: in the pass column they would push every column after it.
            left_out = f"  + left out: {', '.join(r.also_left_out)}" if r.also_left_out else ""
            click.echo(f"{r.kernel:<{width}} {r.step:>4} {r.pass_name:<45} {before:>6} {after:>6} "
                       f"({change}){at}  [{r.cite}]{left_out}")
    several = len(found.by_kernel()) > 1
    for m in found.milestones():
        of = f" in {m.kernel}" if several else ""
        click.echo(_MILESTONE[m.kind].format(pass_=m.pass_name, of=of, kernel=m.kernel) + f" [{m.cite}]")
    absent = found.absent_compiles()
    if absent:
        click.echo("not in any snapshot of: " + ", ".join(
            k + (f" ({describe_config(found.configs[k])})" if k in found.configs else "") for k in absent))
    if any(r.also_left_out for r in rows):
        click.echo("malformed sections were left out (see `kb index ir`): a change marked with them may be theirs")


def _echo_layouts(found: OpTrace) -> None:
    width = max(len("kernel"), *(len(e.kernel) for e in found.layouts))
    click.echo(f"{'kernel':<{width}} {'step':>4} {'pass or stage':<45} layout")
    for e in found.layouts:
        where = {"present": "in the first snapshot", "appears": "first seen after it"}.get(e.event, "gone after it")
        click.echo(f"{e.kernel:<{width}} {e.step:>4} {e.pass_name:<45} {e.layout} ({where})  [{e.cite}]")
