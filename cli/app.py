"""The `kb` group itself: the options every command sees (--home, --version). The commands register
on it from their own modules (cli/__init__.py imports them)."""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kernel-kb", prog_name="kb")
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="KB home directory (default: $KB_HOME, else the per-user data directory).")
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """kernel-kb: why is this Triton kernel slow, answered from the compiler's own evidence."""
    ctx.ensure_object(dict)
    ctx.obj["home"] = home
