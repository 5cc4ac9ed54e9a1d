"""`kb mcp`: serve the KB to agent hosts over MCP (stdio). The server itself is cli/mcp_server.py,
imported only here, when the command runs."""

from __future__ import annotations

import click

from cli.app import main
from cli.options import user_errors

__all__ = ["mcp"]


@main.command("mcp")
@click.pass_context
@user_errors
def mcp(ctx: click.Context) -> None:
    """Serve why, diagnose, search, symbols, run, optimize_round and rounds to an agent host over MCP (stdio)."""
    from cli.mcp_server import build_server

    build_server(ctx.obj.get("home")).run("stdio")
