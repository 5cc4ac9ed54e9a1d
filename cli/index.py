"""`kb index patterns|compiler|ir` and `kb releases list|diff|drop`: building the KB and its releases."""

from __future__ import annotations

import collections
import functools
import json
from pathlib import Path

import click

from cli.app import main
from cli.options import json_option, open_home, progress_bar, stage_progress, user_errors
from harness.errors import UserFacingError


@main.group()
def index() -> None:
    """Build the knowledge base: the pattern catalog, compiler sources."""


@index.command("patterns")
@click.option("--catalog", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Pattern directory (default: corpora/patterns of this checkout).")
@click.pass_context
@user_errors
def index_patterns_cmd(ctx: click.Context, catalog: Path | None) -> None:
    """Validate and index the pattern catalog."""
    from indexer.patterns import index_patterns
    from kb.embed import embedder_for
    from kb.patterns import load_catalog

    load_catalog(catalog)  # validate before taking the lock or touching a store
    home = open_home(ctx, create=True)
    with home.lock(write=True):
        manifest = index_patterns(home, embedder_for(home), catalog)
    click.echo(f"indexed {manifest.count} patterns into {home.root} ({manifest.collection})")


@index.command("compiler")
@click.option("--installed", is_flag=True, help="Index the installed triton wheel's compiler files.")
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Index a compiler source checkout instead.")
@click.option("--release", default=None, help="Release name for --source (e.g. triton-ascend-3.2.0).")
@click.option("--corpus", default="compiler", show_default=True, help="Corpus name to index into.")
@click.pass_context
@user_errors
def index_compiler_cmd(ctx: click.Context, installed: bool, source: Path | None, release: str | None,
                       corpus: str) -> None:
    """Index compiler sources: pass definitions, headers, pipelines."""
    if installed == (source is not None):
        raise UserFacingError("give exactly one of --installed or --source DIR", "e.g. kb index compiler --installed")
    if source is not None and not release:
        raise UserFacingError("--source needs --release NAME", "e.g. --release triton-ascend-3.2.0")
    from indexer.compiler import index_compiler_tree, index_installed_triton
    from kb.embed import embedder_for

    home = open_home(ctx, create=True)
    # Queries keep answering from the previous index while this one parses and embeds; the write
    # lock is held only to store and publish.
    with home.build_lock(), progress_bar("indexing") as bar:
        progress = stage_progress(bar)
        embedder = embedder_for(home)
        publish_lock = functools.partial(home.lock, write=True)
        if installed:
            manifest, report = index_installed_triton(home, embedder, progress, publish_lock=publish_lock)
        else:
            assert source is not None and release is not None  # checked above
            manifest, report = index_compiler_tree(home, embedder, source, release, corpus=corpus, progress=progress,
                                                   source={"kind": "checkout", "path": str(source.resolve())},
                                                   publish_lock=publish_lock)
    click.echo(f"indexed {manifest.corpus}@{manifest.release}: {sum(report.files_indexed.values())} files "
               f"({dict(report.files_indexed)}), {report.chunks} chunks, {report.symbols} symbols, "
               f"{report.passes} passes, {report.links} links")
    click.echo(f"work done: {report.files_parsed} files parsed, {report.files_reused} from the parse cache; "
               f"{report.texts_new} texts embedded, {report.texts_to_embed - report.texts_new} from the embedding cache")
    skipped = ", ".join(f"{n} {why}" for why, n in report.files_skipped.most_common())
    if skipped:
        click.echo(f"skipped: {skipped}")
    for note in report.notes:
        click.echo(f"note: {note}")


@index.command("ir")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", default=None, help="Name to index it under (default: the file or directory name).")
@click.pass_context
@user_errors
def index_ir_cmd(ctx: click.Context, path: Path, name: str | None) -> None:
    """Index an IR dump: what each pass changed, searchable (`kb search --corpus ir`) and traceable (`kb ir trace`).

    PATH is an MLIR_ENABLE_DUMP stream, a TRITON_DUMP_DIR / TRITON_KERNEL_DUMP directory, a
    triton-ascend TRITON_DEBUG directory (kernel.ttir.mlir, kernel.ttadapter.mlir, kernel.mlir) or
    bishengir --mlir-print-ir-after-all output.
    """
    from indexer.ir import describe_config, index_ir_dump
    from kb.embed import embedder_for
    from kb.index import load_manifest
    from kb.releases import IR_CORPUS, name_from

    name = name if name is not None else name_from(path.resolve().stem if path.is_file() else path.resolve().name)
    home = open_home(ctx, create=True)
    earlier = load_manifest(home, IR_CORPUS, name)
    # As for source: queries keep answering while the dump is read and embedded.
    with home.build_lock(), progress_bar("indexing") as bar:
        progress = stage_progress(bar)
        manifest, dump, steps = index_ir_dump(home, embedder_for(home), path, name, progress,
                                              publish_lock=functools.partial(home.lock, write=True))
    kernels = sorted({s.kernel for s in steps})
    click.echo(f"indexed ir@{name}: {len(steps)} snapshot{'s' * (len(steps) != 1)} of {len(kernels)} "
               f"kernel{'s' * (len(kernels) != 1)}, {manifest.count} that changed the IR")
    if earlier is not None:
        click.echo(f"replaced the earlier ir@{name} (from {earlier.source.get('path', '?')}); "
                   "give --name to keep dumps side by side")
    for kernel in kernels:
        if kernel in dump.configs:
            click.echo(f"  {kernel}: {describe_config(dump.configs[kernel])}")
    for note in dump.notes:
        click.echo(f"note: {note}")
    for problem in dump.problems:
        click.echo(f"malformed (left out): {problem}")
    if len(dump.skipped) <= 5:
        for skipped in dump.skipped:
            click.echo(f"skipped: {skipped}")
    else:  # a cache directory holds a cubin, a .source and a group JSON per compile: count them
        reasons = collections.Counter(s.split(": ", 1)[1] for s in dump.skipped)
        click.echo(f"skipped {len(dump.skipped)} files: " + ", ".join(f"{n} {why}" for why, n in reasons.most_common()))


# ---------------------------------------------------------------------------------------------- releases
@main.group()
def releases() -> None:
    """Indexed releases: list, compare, drop."""


@releases.command("list")
@json_option()
@click.pass_context
@user_errors
def releases_list(ctx: click.Context, as_json: bool) -> None:
    """Every indexed release with its corpora, files, symbols, passes and links."""
    import datetime

    from kb.releases import list_releases
    from kb.retrieve import installed_triton_release

    home = open_home(ctx)
    with home.lock(write=False):
        infos = list_releases(home)
    if as_json:
        click.echo(json.dumps([i.__dict__ for i in infos], indent=1))
        return
    if not infos:
        click.echo("no releases indexed: kb index compiler --installed | --source DIR --release NAME")
        return
    installed = installed_triton_release()
    for i in infos:
        when = datetime.datetime.fromtimestamp(i.created).strftime("%Y-%m-%d %H:%M") if i.created else "-"
        corpora = ", ".join(f"{c} {n} chunks" for c, n in i.corpora.items()) or "no vector index"
        mark = "  (installed triton)" if i.name == installed else ""
        click.echo(f"{i.name}{mark}: {corpora}; {i.files} files, {i.symbols} symbols, {i.passes} passes, "
                   f"{i.links} links; indexed {when}" + (f" from {i.source}" if i.source else ""))
        if i.interrupted:
            click.echo(f"  the last index stopped after publishing its chunks and before its symbols: {i.interrupted}")


@releases.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--limit", default=20, show_default=True, help="Names shown per category (all with --json).")
@json_option()
@click.pass_context
@user_errors
def releases_diff(ctx: click.Context, a: str, b: str, limit: int, as_json: bool) -> None:
    """What changed from release A to B: files, passes and definitions added, removed, changed, and
    files renamed (same content) with the definitions that moved with them."""
    from kb.releases import diff_releases

    home = open_home(ctx)
    with home.lock(write=False):
        diff = diff_releases(home, a, b)
    if as_json:
        click.echo(diff.to_json())
        return
    click.echo(f"{a} -> {b}")
    for title, section in (("files", diff.files), ("passes", diff.passes), ("definitions", diff.symbols)):
        counts = ", ".join(f"{len(v)} {k}" for k, v in section.items())
        click.echo(f"{title}: {counts}")
        for change, names in section.items():
            for n in names[:limit]:
                mark = {"added": "+", "removed": "-", "renamed": ">", "moved": ">"}.get(change, "~")
                click.echo(f"  {mark} {n}")
            if len(names) > limit:
                click.echo(f"  ... {len(names) - limit} more {change} (--json for all)")


@releases.command("drop")
@click.argument("name")
@click.pass_context
@user_errors
def releases_drop(ctx: click.Context, name: str) -> None:
    """Drop every index of release NAME and its symbols."""
    from kb.releases import drop_release

    home = open_home(ctx)
    with home.lock(write=True):
        dropped = drop_release(home, name)
    click.echo(f"dropped {name}" + (f" ({', '.join(dropped)})" if dropped else " (symbols only)"))


