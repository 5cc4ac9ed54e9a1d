"""Reading the KB: `kb search`, `kb symbols`, `kb ir trace`, `kb patterns list|show`, `kb status`."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from cli.app import main
from cli.options import json_option, open_home, user_errors
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from kb.home import KBHome


@main.command()
@click.argument("query")
@click.option("--corpus", default="compiler", show_default=True, help="patterns or compiler (or a --corpus you indexed).")
@click.option("--release", default=None, help="Release to search (default: the installed triton's, else newest).")
@click.option("-k", "k", default=5, show_default=True, type=click.IntRange(1), help="Number of hits.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), default="hybrid", show_default=True)
@json_option("Print JSON.")
@click.pass_context
@user_errors
def search(ctx: click.Context, query: str, corpus: str, release: str | None, k: int, mode: str, as_json: bool) -> None:
    """Search the KB: exact symbol hits first for names; for sentences BM25 + vectors fused by score, with symbol hits joining by rank."""
    home = open_home(ctx, build_hint="`kb index ir PATH --name NAME`" if corpus == "ir" else None)
    searcher, hits = search_hits(home, query, corpus, release, k, mode)
    if as_json:
        click.echo(json.dumps([h.__dict__ for h in hits], indent=2))
        return
    if release is None:
        from kb.index import list_manifests
        from kb.retrieve import installed_triton_release

        indexed = sum(m.corpus == corpus for m in list_manifests(home))
        if indexed > 1:  # say which one was chosen for the user
            why = ("the installed triton's" if searcher.release == installed_triton_release()
                   else f"the newest of {indexed}")
            click.echo(f"searching {corpus}@{searcher.release} ({why}; choose with --release)")
    for rank, h in enumerate(hits, 1):
        m = h.metadata
        click.echo(f"{rank}. {h.cite()}  {m.get('symbol') or m.get('pattern_id', '')}  [{h.via}]")
        snippet = " ".join(h.cited_text().split())[:160]
        click.echo(f"   {snippet}")
    if not hits:
        click.echo("no hits")


# ---------------------------------------------------------------------------------------------- symbols
@main.command()
@click.argument("name")
@click.option("--release", default=None, help="Only this release (default: all).")
@click.option("--refs", "max_refs", default=10, show_default=True, type=click.IntRange(0),
              help="References to list per symbol.")
@json_option()
@click.pass_context
@user_errors
def symbols(ctx: click.Context, name: str, release: str | None, max_refs: int, as_json: bool) -> None:
    """Show a symbol: definitions, pass record, references and cross-layer links.

    NAME is a function, class, pass argument or def name, op (`ttg.convert_layout`), pipeline call
    (`passes.ttgpuir.add_coalesce`) or a diagnostic message as printed (`"vectorization fails"`).
    """
    from cli.views.symbols import render

    view = symbol_view(open_home(ctx), name, release, max_refs)
    click.echo(view.to_json() if as_json else render(view))


def search_hits(home: KBHome, query: str, corpus: str, release: str | None, k: int, mode: str) -> tuple[Any, list[Any]]:
    """`kb search`'s answer (and `kb mcp`'s search tool's): the searcher (its release) and its hits."""
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    if not query.strip():
        raise UserFacingError("the query is empty",
                              'ask a question or name a symbol, e.g. kb search "tritongpu-coalesce"')
    with home.lock(write=False):
        searcher = Searcher(home, corpus, release)
        store = SymbolStore(home.symbols_db) if home.symbols_db.exists() else None
        try:
            hits = searcher.answer(query, k=k, mode=mode, store=store)
        finally:
            if store is not None:
                store.close()
    return searcher, hits


def symbol_view(home: KBHome, name: str, release: str | None, max_refs: int) -> Any:
    """`kb symbols`'s view of a symbol (and `kb mcp`'s symbols tool's); a half-published release the
    answer draws on, an unindexed release or an unknown name is one line."""
    from cli.views.symbols import describe
    from kb.index import list_manifests
    from kb.releases import check_published
    from kb.symbols import SymbolStore

    with home.lock(write=False):
        store = SymbolStore(home.symbols_db)
        try:
            manifests = list_manifests(home)
            check_published(store, [m for m in manifests if m.release == release])
            known = store.releases()
            if release and release not in known:
                raise UserFacingError(
                    f"release {release!r} is not indexed (known: {', '.join(sorted(known)) or 'none'})",
                    "see `kb releases list`")
            view = describe(store, name, release, max_refs)
            if not release:  # only a release the answer draws on is refused when half-published
                answering = {x.release for xs in (view.passes, view.definitions, view.diagnostics, view.references,
                                                  view.links) for x in xs}
                check_published(store, [m for m in manifests if m.release in answering])
        finally:
            store.close()
    if not view.found:
        raise UserFacingError(f"no symbol {name!r}" + (f" in release {release}" if release else "")
                              + (f" (similar: {', '.join(view.similar)})" if view.similar else ""),
                              "check the spelling, or `kb releases list` for what is indexed")
    return view


# ---------------------------------------------------------------------------------------------- ir
@main.group()
def ir() -> None:
    """Indexed IR dumps."""


@ir.command("trace")
@click.argument("name")
@click.argument("op")
@click.option("--kernel", default=None, help="Only this kernel of the dump.")
@click.option("--all", "show_all", is_flag=True, help="Show every step, not only those that changed OP.")
@json_option()
@click.pass_context
@user_errors
def ir_trace(ctx: click.Context, name: str, op: str, kernel: str | None, show_all: bool, as_json: bool) -> None:
    """How the count of ops matching OP evolves pass by pass in dump NAME: which pass introduced
    it, which removed it. OP matches by substring (`convert_layout`, `ld.global.v4`, `load <4 x`).
    A layout (`#mma`, `nvidia_mma`, `dot_op`) shows the steps after which it first appears or vanishes."""
    from cli.views.ir_trace import echo_trace
    from indexer.ir import load_timeline
    from indexer.ir_trace import trace

    home = open_home(ctx, build_hint="`kb index ir PATH --name NAME`")
    with home.lock(write=False):
        timeline = load_timeline(home, name)
    found = trace(timeline, op, kernel, name)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in (found.layouts or found.steps)], indent=1))
        return
    echo_trace(found, show_all)


@main.group()
def patterns() -> None:
    """The pattern catalog with its statistics and provenance."""


@patterns.command("list")
@json_option()
@click.pass_context
@user_errors
def patterns_list(ctx: click.Context, as_json: bool) -> None:
    """Every pattern: id, family, risk, wins/tries, curated or learned."""
    from kb.home import KBHome
    from kb.patterns import catalog_for

    home = KBHome.resolve(ctx.obj.get("home"))
    rows = [{"id": p.id, "family": p.family, "risk": p.risk, "backends": list(p.backends),
             "tries": p.stats.get("tries", 0), "wins": p.stats.get("wins", 0),
             "status": p.stats.get("status", ""), "provenance": p.provenance.get("kind", "curated")}
            for p in catalog_for(home if home.root.exists() else None)]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        click.echo(f"{r['id']:<32} {r['family']:<14} {r['risk']:<7} {r['wins']:>3}/{r['tries']:<3} "
                   f"{r['provenance']:<8} {r['status']}")


@patterns.command("show")
@click.argument("pattern_id")
@json_option()
@click.pass_context
@user_errors
def patterns_show(ctx: click.Context, pattern_id: str, as_json: bool) -> None:
    """One pattern with its rewrite, provenance and statistics (where it applied, where it failed)."""
    from kb.home import KBHome
    from kb.patterns import catalog_for

    home = KBHome.resolve(ctx.obj.get("home"))
    found = {p.id: p for p in catalog_for(home if home.root.exists() else None)}
    if pattern_id not in found:
        raise UserFacingError(f"no pattern {pattern_id!r}", "see `kb patterns list`")
    p = found[pattern_id]
    if as_json:
        click.echo(json.dumps(p.to_dict(), indent=1, default=str))
        return
    click.echo(f"{p.id}: {p.title}\n  family {p.family}, backends {', '.join(p.backends)}, risk {p.risk}, "
               f"symptoms {', '.join(p.symptoms) or '-'}\n  provenance: {p.provenance}\n  file: {p.path}")
    s = p.stats
    click.echo(f"  record: {s.get('wins', 0)}/{s.get('tries', 0)} won" + (f", {s['status']}" if s.get("status") else "")
               + (f", speedups {s['speedups']}" if s.get("speedups") else ""))
    for where in s.get("applied", []):
        click.echo(f"    applied: run {where['run']} round {where['round']} ({where['task']}, {where['finding'] or '-'})")
    for where in s.get("failed", []):
        click.echo(f"    failed:  run {where['run']} round {where['round']} ({where['task']}): {where['why']}")
    click.echo(f"  rewrite ({p.rewrite.kind}): {p.rewrite.summary.strip()}")
    if p.unblock:
        click.echo(f"  unblock: {p.unblock}")


# ---------------------------------------------------------------------------------------------- status
@main.command()
@json_option()
@click.pass_context
@user_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """What the KB holds: indexes per corpus and release, symbol counts, where it lives."""
    from kb.index import list_manifests
    from kb.releases import interrupted, reindex_command
    from kb.retrieve import installed_triton_release
    from kb.symbols import SymbolStore

    home = open_home(ctx)
    with home.lock(write=False):
        manifests = list_manifests(home)
        store = SymbolStore(home.symbols_db)
        counts = {r: store.count(r) for r in store.releases()}
        unfinished = {m.key: reindex_command(m) for m in manifests if interrupted(store, m)}
        store.close()
    import os

    unreachable = None
    if os.environ.get("KB_CHROMA_URL"):  # a shared server: say whether it answers, not only where it is
        from kb.vectors import chroma_client

        try:
            chroma_client(home).heartbeat()
        except UserFacingError as exc:
            unreachable = exc.problem
        except Exception as exc:  # noqa: BLE001 - any failure to answer means the same here
            unreachable = f"the chroma server at {os.environ['KB_CHROMA_URL']} does not answer ({type(exc).__name__})"
    indexes = [{"corpus": m.corpus, "release": m.release, "chunks": m.count, "collection": m.collection,
                 **({"interrupted": unfinished[m.key]} if m.key in unfinished else {})} for m in manifests]
    info = {
        "home": str(home.root),
        "vector_store": os.environ.get("KB_CHROMA_URL") or str(home.chroma_dir),
        **({"vector_store_unreachable": unreachable} if unreachable else {}),
        "installed_triton": installed_triton_release(),
        "indexes": indexes,
        "symbols": counts,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        if unreachable:
            sys.exit(1)
        return
    where = str(info["vector_store"]) + (f" (unreachable: {unreachable})" if unreachable else "")
    click.echo(f"KB home: {info['home']}\nvector store: {where}\ninstalled triton: {info['installed_triton']}")
    for m in indexes:
        click.echo(f"  {m['corpus']}@{m['release']}: {m['chunks']} chunks"
                   + (f" (stopped before its symbols; finish it: {m['interrupted']})" if "interrupted" in m else ""))
    for release, c in counts.items():
        click.echo(f"  symbols@{release}: {c['symbols']} symbols, {c['passes']} passes, {c['links']} links")
    if not manifests:
        click.echo("  (empty: run `kb index patterns` and `kb index compiler --installed`)")
    if unreachable:
        sys.exit(1)
