"""The `kb` command line. Heavy layers (torch, triton, chromadb, llama-index) are imported inside
commands, so `kb --help` stays instant."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness.errors import UserFacingError

__all__ = ["main"]


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input becomes one line on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserFacingError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: the KB is unchanged where the step did not finish", err=True)
            sys.exit(130)

    return wrapper


def _home(ctx: click.Context, create: bool = False) -> Any:
    from kb.home import KBHome

    home = KBHome.resolve(ctx.obj.get("home"))
    if create:
        return home.ensure()
    home.validate()
    return home


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="KB home directory (default: $KB_HOME, else the per-user data directory).")
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """kernel-kb: why is this Triton kernel slow, answered from the compiler's own evidence."""
    ctx.ensure_object(dict)
    ctx.obj["home"] = home


# ---------------------------------------------------------------------------------------------- index
@main.group()
def index() -> None:
    """Build the knowledge base: the pattern catalog, compiler sources."""


def _progress_bar(description: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(description + " {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False)


@index.command("patterns")
@click.option("--catalog", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Pattern directory (default: corpora/patterns of this checkout).")
@click.pass_context
@_user_errors
def index_patterns_cmd(ctx: click.Context, catalog: Path | None) -> None:
    """Validate and index the pattern catalog."""
    from indexer.patterns import index_patterns
    from kb.embed import OfflineEmbedding
    from kb.patterns import load_catalog

    load_catalog(catalog)  # validate before taking the lock or touching a store
    home = _home(ctx, create=True)
    with home.lock(write=True):
        manifest = index_patterns(home, OfflineEmbedding(cache_path=home.embed_cache_db), catalog)
    click.echo(f"indexed {manifest.count} patterns into {home.root} ({manifest.collection})")


@index.command("compiler")
@click.option("--installed", is_flag=True, help="Index the installed triton wheel's compiler files.")
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Index a compiler source checkout instead.")
@click.option("--release", default=None, help="Release name for --source (e.g. triton-ascend-3.2.0).")
@click.option("--corpus", default="compiler", show_default=True, help="Corpus name to index into.")
@click.pass_context
@_user_errors
def index_compiler_cmd(ctx: click.Context, installed: bool, source: Path | None, release: str | None,
                       corpus: str) -> None:
    """Index compiler sources: pass definitions, headers, pipelines."""
    if installed == (source is not None):
        raise UserFacingError("give exactly one of --installed or --source DIR", "e.g. kb index compiler --installed")
    if source is not None and not release:
        raise UserFacingError("--source needs --release NAME", "e.g. --release triton-ascend-3.2.0")
    from indexer.compiler import index_compiler_tree, index_installed_triton
    from kb.embed import OfflineEmbedding

    home = _home(ctx, create=True)
    with home.lock(write=True), _progress_bar("indexing") as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        embedder = OfflineEmbedding(cache_path=home.embed_cache_db)
        if installed:
            manifest, report = index_installed_triton(home, embedder, progress)
        else:
            manifest, report = index_compiler_tree(home, embedder, source, release, corpus=corpus, progress=progress,
                                                   source={"kind": "checkout", "path": str(source)})
    click.echo(f"indexed {manifest.corpus}@{manifest.release}: {sum(report.files_indexed.values())} files "
               f"({dict(report.files_indexed)}), {report.chunks} chunks, {report.symbols} symbols, "
               f"{report.passes} passes, {report.links} pipeline links")
    skipped = ", ".join(f"{n} {why}" for why, n in report.files_skipped.most_common())
    if skipped:
        click.echo(f"skipped: {skipped}")
    for note in report.notes:
        click.echo(f"note: {note}")


# ---------------------------------------------------------------------------------------------- search
@main.command()
@click.argument("query")
@click.option("--corpus", default="compiler", show_default=True, help="patterns or compiler (or a --corpus you indexed).")
@click.option("--release", default=None, help="Release to search (default: the installed triton's, else newest).")
@click.option("-k", "k", default=5, show_default=True, help="Number of hits.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), default="hybrid", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_user_errors
def search(ctx: click.Context, query: str, corpus: str, release: str | None, k: int, mode: str, as_json: bool) -> None:
    """Search the KB: exact symbol hits first, then BM25 + vectors fused by reciprocal rank."""
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    home = _home(ctx)
    with home.lock(write=False):
        searcher = Searcher(home, corpus, release)
        hits = []
        if mode == "hybrid" and home.symbols_db.exists():
            store = SymbolStore(home.symbols_db)
            hits = searcher.symbol_hits(query, store)
            store.close()
        seen = {h.id for h in hits}
        hits += [h for h in searcher.search(query, k=k, mode=mode) if h.id not in seen]
        hits = hits[:k]
    if as_json:
        click.echo(json.dumps([h.__dict__ for h in hits], indent=2))
        return
    for rank, h in enumerate(hits, 1):
        m = h.metadata
        click.echo(f"{rank}. {h.cite()}  {m.get('symbol') or m.get('pattern_id', '')}  [{h.via}]")
        snippet = " ".join(h.text.split())[:160]
        click.echo(f"   {snippet}")
    if not hits:
        click.echo("no hits")


# ---------------------------------------------------------------------------------------------- why
@main.command()
@click.argument("question")
@click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
              help="Python file with the @triton.jit kernel and its launch wrapper.")
@click.option("--call", default=None, help='Expression that launches it, e.g. "scale(torch.randn(1000003), 2.0)".')
@click.option("--task", "task_file", type=click.Path(dir_okay=False), default=None,
              help="A task file (entry, inputs, cases); its first case is compiled.")
@click.option("--target", default=None, help="Compile target, e.g. cuda:90 (default: the GPU present, else cuda:90).")
@click.option("--release", default=None, help="Compiler release to cite (default: the installed triton's).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.pass_context
@_user_errors
def why(ctx: click.Context, question: str, kernel_file: str | None, call: str | None, task_file: str | None,
        target: str | None, release: str | None, as_json: bool) -> None:
    """Answer QUESTION about a kernel from compiler evidence (IR, remarks, ptxas, compiler source)."""
    if task_file is None and (kernel_file is None or call is None):
        raise UserFacingError("give --kernel FILE with --call EXPR, or --task FILE",
                              'e.g. --kernel k.py --call "scale(torch.randn(1000003), 2.0)"')
    from diagnose.engine import question_topics
    from kb.home import KBHome

    question_topics(question)  # reject unanswerable questions before compiling anything
    home = KBHome.resolve(ctx.obj.get("home"))
    kb_home = None
    if home.root.exists():  # an existing home must be a sound one; a missing one means "answer from IR only"
        home.validate()
        kb_home = home
    cache = kb_home.compile_cache if kb_home else None
    from harness.capture import capture_call
    from harness.task import capture_task

    if task_file is not None:
        artifacts = capture_task(task_file, target=target, cache_dir=cache)
    else:
        artifacts = capture_call(kernel_file, call, target=target, cache_dir=cache)
    from diagnose.engine import why as answer_why
    from diagnose.render import to_json, to_markdown

    if kb_home is not None:
        with kb_home.lock(write=False):
            answer = answer_why(question, artifacts, kb_home, release)
    else:
        answer = answer_why(question, artifacts, None, release)
    if as_json:
        click.echo(to_json(answer))
    else:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(to_markdown(answer))) if sys.stdout.isatty() else click.echo(to_markdown(answer))


# ---------------------------------------------------------------------------------------------- status
@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """What the KB holds: indexes per corpus and release, symbol counts, where it lives."""
    from kb.index import list_manifests
    from kb.retrieve import installed_triton_release
    from kb.symbols import SymbolStore

    home = _home(ctx)
    with home.lock(write=False):
        manifests = list_manifests(home)
        store = SymbolStore(home.symbols_db)
        counts = {r: store.count(r) for r in store.releases()}
        store.close()
    import os

    info = {
        "home": str(home.root),
        "vector_store": os.environ.get("KB_CHROMA_URL") or str(home.chroma_dir),
        "installed_triton": installed_triton_release(),
        "indexes": [{"corpus": m.corpus, "release": m.release, "chunks": m.count, "collection": m.collection}
                    for m in manifests],
        "symbols": counts,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"KB home: {info['home']}\nvector store: {info['vector_store']}\n"
               f"installed triton: {info['installed_triton']}")
    for m in info["indexes"]:
        click.echo(f"  {m['corpus']}@{m['release']}: {m['chunks']} chunks")
    for release, c in counts.items():
        click.echo(f"  symbols@{release}: {c['symbols']} symbols, {c['passes']} passes, {c['links']} links")
    if not manifests:
        click.echo("  (empty: run `kb index patterns` and `kb index compiler --installed`)")


if __name__ == "__main__":
    main()
