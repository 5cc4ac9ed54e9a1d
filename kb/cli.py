"""The `kb` command line. Heavy layers (torch, triton, chromadb, llama-index) are imported inside
commands, so `kb --help` stays instant."""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import random
import re
import sys
import time
from collections import Counter
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
            click.echo("interrupted: what was already published stays live, and work done is cached; "
                       "run the same command again to resume", err=True)
            sys.exit(130)

    return wrapper


def _timing_window_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--warmup-ms / --rep-ms: the do_bench windows of every kernel-case timing (default: the harness's)."""
    window = click.IntRange(min=1)
    fn = click.option("--rep-ms", "rep_ms", type=window, default=None,
                      help="Measured window of each timing in ms (harness default 300).")(fn)
    return click.option("--warmup-ms", "warmup_ms", type=window, default=None,
                        help="Warm-up of each timing in ms (harness default 200).")(fn)


def _stand_ins(versus: tuple[str, ...]) -> tuple[str, ...]:
    """`--vs` values as the loop takes them: `none` alone means no stand-in."""
    if "none" in versus:
        if len(set(versus)) > 1:
            raise UserFacingError(f"--vs none cannot go with --vs {' --vs '.join(v for v in versus if v != 'none')}",
                                  "give --vs none alone, or only the stand-ins to time")
        return ()
    return tuple(dict.fromkeys(versus))


def _home(ctx: click.Context, create: bool = False, build_hint: str | None = None) -> Any:
    from kb.home import KBHome

    home = KBHome.resolve(ctx.obj.get("home"))
    if create:
        return home.ensure()
    home.validate(*([build_hint] if build_hint else []))
    return home


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kernel-kb", prog_name="kb")
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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Progress goes to stderr: stdout carries results (`--json` must stay parseable).
    return Progress(TextColumn(description + " {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False, console=Console(stderr=True))


def _stage_progress(bar: Any) -> Callable[[str, int, int], None]:
    """A `progress(stage, done, total)` callback drawing one bar per stage (parse, embed, ...).

    Written to a log or a CI job (not a terminal), a rich bar shows only once it is done: there,
    each stage also prints a line at every tenth of its work."""
    tasks: dict[str, Any] = {}
    tenths: dict[str, int] = {}
    started: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
            started[stage] = time.monotonic()
        bar.update(tasks[stage], completed=done)
        if not bar.console.is_terminal and total > 0:
            tenth = done * 10 // total
            if tenth > tenths.get(stage, 0):
                tenths[stage] = tenth
                bar.console.print(f"{stage}: {done}/{total} ({time.monotonic() - started[stage]:.0f} s)",
                                  highlight=False)

    return progress


@index.command("patterns")
@click.option("--catalog", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Pattern directory (default: corpora/patterns of this checkout).")
@click.pass_context
@_user_errors
def index_patterns_cmd(ctx: click.Context, catalog: Path | None) -> None:
    """Validate and index the pattern catalog."""
    from indexer.patterns import index_patterns
    from kb.embed import embedder_for
    from kb.patterns import load_catalog

    load_catalog(catalog)  # validate before taking the lock or touching a store
    home = _home(ctx, create=True)
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
@_user_errors
def index_compiler_cmd(ctx: click.Context, installed: bool, source: Path | None, release: str | None,
                       corpus: str) -> None:
    """Index compiler sources: pass definitions, headers, pipelines."""
    if installed == (source is not None):
        raise UserFacingError("give exactly one of --installed or --source DIR", "e.g. kb index compiler --installed")
    if source is not None and not release:
        raise UserFacingError("--source needs --release NAME", "e.g. --release triton-ascend-3.2.0")
    from indexer.compiler import index_compiler_tree, index_installed_triton
    from kb.embed import embedder_for

    home = _home(ctx, create=True)
    # Queries keep answering from the previous index while this one parses and embeds; the write
    # lock is held only to store and publish.
    with home.build_lock(), _progress_bar("indexing") as bar:
        progress = _stage_progress(bar)
        embedder = embedder_for(home)
        publish_lock = functools.partial(home.lock, write=True)
        if installed:
            manifest, report = index_installed_triton(home, embedder, progress, publish_lock=publish_lock)
        else:
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
@_user_errors
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
    home = _home(ctx, create=True)
    earlier = load_manifest(home, IR_CORPUS, name)
    # As for source: queries keep answering while the dump is read and embedded.
    with home.build_lock(), _progress_bar("indexing") as bar:
        progress = _stage_progress(bar)
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


# ---------------------------------------------------------------------------------------------- search
@main.command()
@click.argument("query")
@click.option("--corpus", default="compiler", show_default=True, help="patterns or compiler (or a --corpus you indexed).")
@click.option("--release", default=None, help="Release to search (default: the installed triton's, else newest).")
@click.option("-k", "k", default=5, show_default=True, type=click.IntRange(1), help="Number of hits.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), default="hybrid", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_user_errors
def search(ctx: click.Context, query: str, corpus: str, release: str | None, k: int, mode: str, as_json: bool) -> None:
    """Search the KB: exact symbol hits first for names; for sentences BM25 + vectors fused by score, with symbol hits joining by rank."""
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    if not query.strip():
        raise UserFacingError("the query is empty",
                              'ask a question or name a symbol, e.g. kb search "tritongpu-coalesce"')
    home = _home(ctx, build_hint="`kb index ir PATH --name NAME`" if corpus == "ir" else None)
    with home.lock(write=False):
        searcher = Searcher(home, corpus, release)
        store = SymbolStore(home.symbols_db) if home.symbols_db.exists() else None
        try:
            hits = searcher.answer(query, k=k, mode=mode, store=store)
        finally:
            if store is not None:
                store.close()
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
        text = h.text
        if m.get("file") and text.startswith((f"// {m['file']}", f"# {m['file']}")):
            text = text.split("\n", 1)[-1]  # the chunk's own "// path symbol" header repeats the line above
        first, last = m.get("chunk_start_line"), m.get("chunk_end_line")
        if isinstance(first, int) and isinstance(last, int) and m.get("start_line", 0) > first:
            # Cited at a definition inside the chunk (see retrieve._pinned): show that, not the chunk's
            # first lines. The source is the chunk's last lines (a lit test's summary leads it).
            lines = text.split("\n")[-(last - first + 1):]
            text = "\n".join(lines[m["start_line"] - first:])
        snippet = " ".join(text.split())[:160]
        click.echo(f"   {snippet}")
    if not hits:
        click.echo("no hits")


# ---------------------------------------------------------------------------------------------- symbols
@main.command()
@click.argument("name")
@click.option("--release", default=None, help="Only this release (default: all).")
@click.option("--refs", "max_refs", default=10, show_default=True, type=click.IntRange(0),
              help="References to list per symbol.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def symbols(ctx: click.Context, name: str, release: str | None, max_refs: int, as_json: bool) -> None:
    """Show a symbol: definitions, pass record, references and cross-layer links.

    NAME is a function, class, pass argument or def name, op (`ttg.convert_layout`), pipeline call
    (`passes.ttgpuir.add_coalesce`) or a diagnostic message as printed (`"vectorization fails"`).
    """
    from kb.index import list_manifests
    from kb.releases import check_published
    from kb.symbols import SymbolStore
    from kb.symbol_view import describe, render

    home = _home(ctx)
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
                answering = {x.release for x in [*view.passes, *view.definitions, *view.diagnostics,
                                                 *view.references, *view.links]}
                check_published(store, [m for m in manifests if m.release in answering])
        finally:
            store.close()
    if not view.found:
        raise UserFacingError(f"no symbol {name!r}" + (f" in release {release}" if release else "")
                              + (f" (similar: {', '.join(view.similar)})" if view.similar else ""),
                              "check the spelling, or `kb releases list` for what is indexed")
    click.echo(view.to_json() if as_json else render(view))


# ---------------------------------------------------------------------------------------------- releases
@main.group()
def releases() -> None:
    """Indexed releases: list, compare, drop."""


@releases.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def releases_list(ctx: click.Context, as_json: bool) -> None:
    """Every indexed release with its corpora, files, symbols, passes and links."""
    import datetime

    from kb.releases import list_releases
    from kb.retrieve import installed_triton_release

    home = _home(ctx)
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
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def releases_diff(ctx: click.Context, a: str, b: str, limit: int, as_json: bool) -> None:
    """What changed from release A to B: files, passes and definitions added, removed, changed, and
    files renamed (same content) with the definitions that moved with them."""
    from kb.releases import diff_releases

    home = _home(ctx)
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
@_user_errors
def releases_drop(ctx: click.Context, name: str) -> None:
    """Drop every index of release NAME and its symbols."""
    from kb.releases import drop_release

    home = _home(ctx)
    with home.lock(write=True):
        dropped = drop_release(home, name)
    click.echo(f"dropped {name}" + (f" ({', '.join(dropped)})" if dropped else " (symbols only)"))


# ---------------------------------------------------------------------------------------------- embedder
@main.group()
def embedder() -> None:
    """Embedding models: tune one on indexed compiler source, list, use, drop."""


@embedder.command("tune")
@click.option("--release", "releases_", multiple=True, required=True,
              help="Indexed release whose source to learn from (repeatable).")
@click.option("--name", required=True, help="Name of the new model (e.g. ascend-v3.2).")
@click.option("--corpus", default="compiler", show_default=True)
@click.option("--epochs", default=1, show_default=True, type=click.IntRange(1, 20))
@click.option("--max-pairs", default=None, type=click.IntRange(64), help="Train on at most this many pairs.")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(2, 512),
              help="Pairs per step; each query's negatives are the batch's other documents.")
@click.option("--learning-rate", default=2e-5, show_default=True, type=click.FloatRange(1e-7, 1e-2))
@click.option("--use/--no-use", "use", default=True, show_default=True,
              help="Build new indexes with it (`kb embedder use` switches later).")
@click.option("--dry-run", is_flag=True, help="Only mine and show the training pairs.")
@click.pass_context
@_user_errors
def embedder_tune(ctx: click.Context, releases_: tuple[str, ...], name: str, corpus: str, epochs: int,
                  max_pairs: int | None, batch_size: int, learning_rate: float, use: bool, dry_run: bool) -> None:
    """Fine-tune the embedder on what indexed compiler source says of itself: each comment or
    docstring with the code below it, each TableGen pass record with the C++ implementing it.

    Existing indexes keep the model that built them; re-index a release to search it with the new one.
    """
    from kb.tune import check_model_name, mine_pairs, save_model, train, use_model

    home = _home(ctx)
    check_model_name(home, name)
    with home.lock(write=False):
        pairs = mine_pairs(home, corpus, list(releases_))
    origins = ", ".join(f"{n} {o}" for o, n in Counter(p.origin for p in pairs).most_common())
    click.echo(f"mined {len(pairs)} training pairs from {', '.join(releases_)} ({origins or 'none'})")
    if dry_run:
        for pair in random.Random(0).sample(pairs, min(3, len(pairs))):
            click.echo(f"\n{pair.file} [{pair.origin}]\n  says: {pair.query[:200]}\n  code: "
                       + pair.document.split("\n", 1)[-1][:200].replace("\n", " | "))
        return
    with _progress_bar("tuning") as bar:
        task = bar.add_task("steps", total=None)

        def progress(step: int, total: int, loss: float) -> None:
            bar.update(task, total=total, completed=step, description=f"steps (loss {loss:.3f})")

        model, info = train(pairs, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                            max_pairs=max_pairs, progress=progress)
    with home.lock(write=True):
        saved = save_model(home, model, name, {**info, "releases": list(releases_), "corpus": corpus})
        if use:
            use_model(home, name)
    click.echo(f"saved {saved.id}: {info['steps']} steps over {info['pairs']} pairs in {info['train_seconds']:.0f} s, "
               f"final loss {info['final_loss']:.3f}")
    if use:
        click.echo("new indexes are built with it; to search a release with it, index it again: "
                   f"kb index compiler --source DIR --release {releases_[0]}")


@embedder.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def embedder_list(ctx: click.Context, as_json: bool) -> None:
    """The embedding models of this home, which one new indexes use, and which indexes each built."""
    from kb.embed import BASE_MODEL, active_model, tuned_models
    from kb.index import list_manifests

    home = _home(ctx)
    with home.lock(write=False):
        models, active, manifests = [BASE_MODEL, *tuned_models(home)], active_model(home), list_manifests(home)
        built = {m.id: [x.key for x in manifests if x.embed_model == m.id] for m in models}
    if as_json:
        click.echo(json.dumps([{"name": m.name, "id": m.id, "active": m == active, "indexes": built[m.id],
                                "info": m.info} for m in models], indent=1))
        return
    for m in models:
        about = (f"; tuned on {m.info.get('pairs')} pairs of {', '.join(m.info.get('releases', []))}"
                 if m.info else "; bundled all-MiniLM-L6-v2")
        click.echo(f"{'*' if m == active else ' '} {m.name}: {m.id}{about}; indexes: {', '.join(built[m.id]) or 'none'}")


@embedder.command("use")
@click.argument("name")
@click.pass_context
@_user_errors
def embedder_use(ctx: click.Context, name: str) -> None:
    """Build new indexes with model NAME ("base" for the bundled one)."""
    from kb.tune import use_model

    home = _home(ctx)
    with home.lock(write=True):
        model = use_model(home, name)
    click.echo(f"new indexes of {home.root} are built with {model.id}")


@embedder.command("drop")
@click.argument("name")
@click.pass_context
@_user_errors
def embedder_drop(ctx: click.Context, name: str) -> None:
    """Remove tuned model NAME (refused while an index uses it)."""
    from kb.tune import drop_model

    home = _home(ctx)
    with home.lock(write=True):
        drop_model(home, name)
    click.echo(f"dropped {name}")


# ---------------------------------------------------------------------------------------------- ir
@main.group()
def ir() -> None:
    """Indexed IR dumps."""


@ir.command("trace")
@click.argument("name")
@click.argument("op")
@click.option("--kernel", default=None, help="Only this kernel of the dump.")
@click.option("--all", "show_all", is_flag=True, help="Show every step, not only those that changed OP.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def ir_trace(ctx: click.Context, name: str, op: str, kernel: str | None, show_all: bool, as_json: bool) -> None:
    """How the count of ops matching OP evolves pass by pass in dump NAME: which pass introduced
    it, which removed it. OP matches by substring (`convert_layout`, `ld.global.v4`, `load <4 x`).
    A layout (`#mma`, `nvidia_mma`, `dot_op`) shows the steps after which it first appears or vanishes."""
    from harness.ir import kernel_base
    from indexer.ir import describe_config, load_timeline

    if not op.strip():
        raise UserFacingError("no op given", "name one as printed in the IR, e.g. ttg.convert_layout or tt.load")
    home = _home(ctx, build_hint="`kb index ir PATH --name NAME`")
    with home.lock(write=False):
        timeline = load_timeline(home, name)
    # `--kernel scale_kernel` means every compile of it: scale_kernel#2, scale_kernel@<cache hash>.
    steps = [s for s in timeline.steps if not kernel or kernel in (s.kernel, kernel_base(s.kernel))]
    rows = []
    for s in steps:  # steps numbered from 1, as search results number them ("IR pass 2/3")
        count = sum(n for o, n in s.counts.items() if op in o)
        before = sum(n for o, n in s.counts_before.items() if op in o)
        delta = sum(d for o, d in s.delta.items() if op in o)
        added = sum(a for o, (a, _) in s.churn.items() if op in o)
        removed = sum(r for o, (_, r) in s.churn.items() if op in o)
        where = sorted({w for o, ws in s.introduced_at.items() if op in o for w in ws})
        rows.append({"step": s.index + 1, "kernel": s.kernel, "pass": s.pass_arg, "name": s.name,
                     "before": before if s.compared else None, "after": count if s.after_known else None,
                     "change": delta, "lines_added": added, "lines_removed": removed, "introduced_at": where,
                     "cite": f"{s.source}:{s.line}",
                     "also_left_out": s.spans_left_out, "config": timeline.configs.get(s.kernel)})
    if kernel and not steps:
        kernels = sorted({s.kernel for s in timeline.steps})
        raise UserFacingError(f"no kernel {kernel!r} in IR dump {name} (kernels: {', '.join(kernels)})",
                              "give --kernel one of those names, or leave it out")
    with_op = {r["kernel"] for r in rows if r["before"] or r["after"] or r["change"]}  # kernels that have it
    if not with_op or op.startswith("#"):
        # `#mma`, `nvidia_mma`: a layout is no op; where it comes and goes is recorded per step.
        layout_rows = _layout_trace(steps, op)
        if layout_rows:
            _echo_layout_trace(layout_rows, as_json)
            return
        raise UserFacingError(f"no op or layout matching {op!r} in any snapshot of {name}",
                              "use an op name as printed in the IR (ttg.convert_layout, ld.global) or a layout "
                              "(#mma, nvidia_mma, dot_op); a dump indexed before layouts were recorded "
                              "(2026-11-30) needs `kb index ir` again")
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for k in sorted(with_op & set(timeline.configs)):
        click.echo(f"{k} compiled with {describe_config(timeline.configs[k])}")
    width = max([len("kernel"), *(len(r["kernel"]) for r in rows)])
    click.echo(f"{'kernel':<{width}} {'step':>4} {'pass or stage':<45} {'before':>6} {'after':>6}")
    for r in rows:
        # A stage in another IR language (ttgir -> llir) is not compared with the one before: ops
        # present there are new in that IR, not added by a pass.
        new_ir = r["before"] is None and bool(r["after"])
        # Lines of OP both added and removed: the pass replaced some (a convert_layout to #mma for one to
        # #dot_op), which a count alone does not show.
        replaced = r["lines_added"] and r["lines_removed"]
        if show_all or r["change"] or new_ir or replaced:
            at = f"  at {', '.join(r['introduced_at'][:4])}" if r["introduced_at"] and r["lines_added"] else ""
            after = "?" if r["after"] is None else r["after"]
            before = "-" if r["before"] is None else r["before"]
            change = ("first snapshot" if new_ir and r["step"] == 1 else "new in this IR" if new_ir else
                      f"{r['change']:+d}: +{r['lines_added']}/-{r['lines_removed']} lines" if replaced
                      else f"{r['change']:+d}")
            # The left-out passes go last: in the pass column they would push every column after it.
            left_out = f"  + left out: {', '.join(r['also_left_out'])}" if r["also_left_out"] else ""
            click.echo(f"{r['kernel']:<{width}} {r['step']:>4} {r['pass']:<45} {before:>6} {after:>6} "
                       f"({change}){at}  [{r['cite']}]{left_out}")
    per_kernel: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per_kernel.setdefault(r["kernel"], []).append(r)
    for kernel_name, kernel_rows in per_kernel.items():
        # Each kernel (and each compile of one) has its own pipeline: where the op first shows is per kernel.
        of_kernel = f" in {kernel_name}" if len(per_kernel) > 1 else ""
        first = next((r for r in kernel_rows if r["before"] or r["after"]), None)
        if first is not None and first["before"]:
            click.echo(f"present from the start: {first['pass']} received it{of_kernel} [{first['cite']}]")
        elif first is not None:
            click.echo(f"first present after: {first['pass']}{of_kernel} [{first['cite']}]")
        # Where it was last seen, when it is gone at the end and no row shows a step removing it (it
        # went with a change of IR language: a TTGIR op at the LLVM IR stage).
        final = kernel_rows[-1]  # its `after` is unknown (None) for the last pass of a "Before" stream
        gone = final["after"] == 0 or (final["after"] is None and final["before"] == 0)
        if gone and not any(r["change"] < 0 for r in kernel_rows):
            last = next((r for r in reversed(kernel_rows) if r["after"]), None)
            if last is not None:
                click.echo(f"last present after: {last['pass']} in {kernel_name} [{last['cite']}]")
    # Which compile of an autotuned kernel lacks the vectorized load is half the answer; other
    # kernels lacking it are not news.
    bases_with_op = {kernel_base(k) for k in with_op}
    absent = [k for k in per_kernel if k not in with_op and kernel_base(k) in bases_with_op]
    if absent:
        click.echo("not in any snapshot of: " + ", ".join(
            k + (f" ({describe_config(timeline.configs[k])})" if k in timeline.configs else "") for k in absent))
    if any(r["also_left_out"] for r in rows):
        click.echo("malformed sections were left out (see `kb index ir`): a change marked with them may be theirs")


def _layout_trace(steps: list[Any], wanted: str) -> list[dict[str, Any]]:
    """Steps where a layout kind matching `wanted` (`#mma`, `#ttg.dot_op`, `nvidia_mma`) first
    appears in or vanishes from the IR. Aliases are renumbered in every dump, so `#mma` is read as
    the kind's name (`nvidia_mma` contains `mma`)."""
    # `#blocked1` is an alias the printer numbered: its kind is `blocked`.
    needle = re.sub(r"\d+$", "", wanted.strip().lstrip("#").rsplit(".", 1)[-1].lower())
    if not needle:
        return []
    kinds = {k for s in steps for k in (*s.layouts_new, *s.layouts_gone, *s.layouts_at_start)}
    # `mma` names nvidia_mma (a word of it) rather than nvmma_shared; a fragment matches only failing that.
    chosen = {k for k in kinds if needle == k.lower() or needle in k.lower().split("_")} or \
        {k for k in kinds if needle in k.lower()}
    rows = []
    for s in steps:
        for event, changed in (("present", s.layouts_at_start), ("appears", s.layouts_new),
                               ("vanishes", s.layouts_gone)):
            rows += [{"step": s.index + 1, "kernel": s.kernel, "pass": s.pass_arg, "name": s.name, "layout": kind,
                      "event": event, "cite": f"{s.source}:{s.line}"} for kind in changed if kind in chosen]
    return rows


def _echo_layout_trace(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    width = max(len("kernel"), *(len(r["kernel"]) for r in rows))
    click.echo(f"{'kernel':<{width}} {'step':>4} {'pass or stage':<45} layout")
    for r in rows:
        where = {"present": "in the first snapshot", "appears": "first seen after it"}.get(r["event"], "gone after it")
        click.echo(f"{r['kernel']:<{width}} {r['step']:>4} {r['pass']:<45} {r['layout']} ({where})  [{r['cite']}]")


# ---------------------------------------------------------------------------------------------- eval
@main.group("eval")
def eval_group() -> None:
    """Measure the KB on gold sets."""


@eval_group.command("retrieval")
@click.option("--queries", "queries_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of gold query files (default: corpora/queries).")
@click.option("--mode", "modes", type=click.Choice(["bm25", "vector", "hybrid"]), multiple=True,
              help="Modes to measure (default: all three).")
@click.option("--json", "as_json", is_flag=True, help="Print the full report (with each query's rank) as JSON.")
@click.pass_context
@_user_errors
def eval_retrieval(ctx: click.Context, queries_dir: Path | None, modes: tuple[str, ...], as_json: bool) -> None:
    """Recall@1/5/10 and MRR per source set and query kind, BM25 vs vectors vs hybrid."""
    from kb.evaluate import MODES, evaluate_retrieval, load_gold_sets

    sets = load_gold_sets(queries_dir)
    home = _home(ctx)
    with home.lock(write=False), _progress_bar("evaluating") as bar:
        task = bar.add_task("queries", total=None)
        report = evaluate_retrieval(home, sets, modes or MODES,
                                    progress=lambda done, total: bar.update(task, completed=done, total=total))
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    # The modes side by side: one row per set and query kind, R@1 R@5 R@10 MRR under each mode.
    shown = [mode for mode in MODES if mode in report["overall"]]

    def cells(m: dict[str, float] | None) -> str:
        if not m:
            return f"{'-':>23}"
        return f"{m['recall@1']:>5.2f} {m['recall@5']:>5.2f} {m['recall@10']:>5.2f} {m['mrr']:>5.2f}"

    click.echo(f"{'':<24} {'':<7} {'':>4}" + "".join(f" | {mode:^23}" for mode in shown))
    click.echo(f"{'set':<24} {'kind':<7} {'n':>4}" + f" | {'R@1':>5} {'R@5':>5} {'R@10':>5} {'MRR':>5}" * len(shown))
    rows = [(label, kind, {mode: per_mode[mode].get(kind) for mode in shown})
            for label, per_mode in [*report["sets"].items(), ("overall", report["overall"])]
            for kind in dict.fromkeys(k for mode in shown for k in per_mode[mode])]
    rows += [(f"split {split}", "all", {mode: per_mode.get(mode) for mode in shown})
             for split, per_mode in report["splits"].items()]
    for label, kind, by_mode in rows:
        n = next((m["n"] for m in by_mode.values() if m), 0)
        if n:
            click.echo(f"{label:<24} {kind:<7} {n:>4}" + "".join(f" | {cells(by_mode[mode])}" for mode in shown))
    for skipped in report["skipped"]:
        click.echo(f"skipped: {skipped}")
    for target in report["unknown_targets"]:
        click.echo(f"expected file not in the index (this question cannot score through it): {target}")


@eval_group.command("diagnosis")
@click.option("--cases", "cases_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Gold cases YAML (default: corpora/diagnosis/cases.yaml).")
@click.option("--only", default=None, help="Comma-separated case ids to run.")
@click.option("--strategy", type=click.Choice(["progressive", "profile-only", "always-deep"]), default="progressive",
              show_default=True)
@click.option("--level-max", type=click.Choice(["L1", "L2", "L3", "L4"]), default="L4", show_default=True)
@click.option("--release", default=None, help="Compiler release(s) for L4 citations, comma-separated.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report (every case's ranking) as JSON.")
@click.pass_context
@_user_errors
def eval_diagnosis(ctx: click.Context, cases_file: Path | None, only: str | None, strategy: str, level_max: str,
                   release: str | None, as_json: bool) -> None:
    """Top-1/top-3 root cause, level accuracy, false positives on healthy kernels, citation validity."""
    from diagnose.evaluate import evaluate_diagnosis, load_cases

    cases = load_cases(cases_file)
    if only:
        wanted = {c.strip() for c in only.split(",")}
        unknown = wanted - {c.id for c in cases}
        if unknown:
            raise UserFacingError(f"no gold case named {', '.join(sorted(unknown))}", "see the ids in the cases file")
        cases = [c for c in cases if c.id in wanted]
    home = _diagnosis_home(ctx)
    with (home.lock(write=False) if home else contextlib.nullcontext()), _progress_bar("diagnosing") as bar:
        task = bar.add_task("cases", total=len(cases))
        report = evaluate_diagnosis(cases, home, release, strategy, level_max,
                                    progress=lambda done, total: bar.update(task, completed=done))
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    click.echo(f"{'case':<24} {'expected':<36} {'top-ranked':<36} {'level':>9} {'s':>6}")
    for o in report["per_case"]:
        got = o["ranked"][0] if o["ranked"] else ("healthy" if not o["error"] else "error")
        mark = "ok " if o["top1"] else "MISS"
        click.echo(f"{o['id']:<24} {o['root_cause']:<36} {got:<36} {o['stopped_at'] or '-':>4}/{o['expected_level']} "
                   f"{o['seconds']:>6.2f} {mark}")

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0%}"

    click.echo(f"\n{report['cases']} cases ({report['defect_cases']} with a defect, {report['healthy_cases']} healthy), "
               f"strategy {strategy}, up to {level_max}")
    click.echo(f"top-1 {pct(report['top1'])}  top-3 {pct(report['top3'])}  level accuracy {pct(report['level_accuracy'])}  "
               f"false positives on healthy {pct(report['false_positive_rate'])}  citation validity "
               f"{pct(report['citation_validity'])} of {report['citations']}  median {report['median_seconds']} s per case")
    for err in report["errors"]:
        click.echo(f"error: {err}")


# ---------------------------------------------------------------------------------------------- why / diagnose
def _diagnosis_home(ctx: click.Context) -> Any:
    """The KB home if one exists (it must then be sound); None means "answer from the kernel and IR only"."""
    from kb.home import KBHome

    home = KBHome.resolve(ctx.obj.get("home"))
    if not home.root.exists():
        return None
    home.validate()
    return home


def _echo_answer(answer: Any, as_json: bool, as_md: bool = False) -> None:
    from diagnose.render import to_json, to_markdown

    if as_json:
        click.echo(to_json(answer))
    elif as_md or not sys.stdout.isatty():
        click.echo(to_markdown(answer))
    else:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(to_markdown(answer)))


def _ascend_dumps(dump_dir: str, kernel_file: str | None) -> list[Any]:
    """The Artifacts of a triton-ascend TRITON_DEBUG dump directory, mapped to `kernel_file`'s lines."""
    from harness.npu import collect_debug_dumps

    if not Path(dump_dir).is_dir():
        raise UserFacingError(f"{dump_dir} is not a directory", "pass the TRITON_DUMP_DIR of a TRITON_DEBUG=1 run")
    arts = collect_debug_dumps(dump_dir, write=False, source_file=str(Path(kernel_file).resolve()) if kernel_file else "")
    if not arts:
        raise UserFacingError(f"{dump_dir} holds no triton-ascend dumps (kernel.ttir.mlir, kernel.ttadapter.mlir)",
                              "run with TRITON_DEBUG=1 and pass TRITON_DUMP_DIR")
    return arts


def _narrate(answer: Any) -> None:
    """With an LLM endpoint configured, a narrative over the evidence; without one, nothing."""
    from diagnose.llm import LLMConfig, narrate

    config = LLMConfig.from_env()
    if config is not None:
        answer.narrative = narrate(answer, config)


@main.command()
@click.argument("question")
@click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
              help="Python file with the @triton.jit kernel and its launch wrapper.")
@click.option("--call", default=None, help='Expression that launches it, e.g. "scale(torch.randn(1000003), 2.0)".')
@click.option("--task", "task_file", type=click.Path(dir_okay=False), default=None,
              help="A task file (entry, inputs, cases); its first case is compiled.")
@click.option("--dump", "dump_dir", type=click.Path(file_okay=False), default=None,
              help="A triton-ascend TRITON_DEBUG dump directory (with --kernel for its source).")
@click.option("--target", default=None, help="Compile target, e.g. cuda:90 (default: the GPU present, else cuda:90).")
@click.option("--release", default=None, help="Compiler release(s) to cite, comma-separated (default: the installed triton's).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.pass_context
@_user_errors
def why(ctx: click.Context, question: str, kernel_file: str | None, call: str | None, task_file: str | None,
        dump_dir: str | None, target: str | None, release: str | None, as_json: bool) -> None:
    """Answer QUESTION about a kernel from compiler evidence (IR, remarks, ptxas, compiler source)."""
    if task_file is None and dump_dir is None and (kernel_file is None or call is None):
        raise UserFacingError("give --kernel FILE with --call EXPR, --task FILE, or --dump DIR [--kernel FILE]",
                              'e.g. --kernel k.py --call "scale(torch.randn(1000003), 2.0)"')
    from diagnose.engine import question_topics

    question_topics(question)  # reject unanswerable questions before compiling anything
    kb_home = _diagnosis_home(ctx)
    cache = kb_home.compile_cache if kb_home else None
    from harness.capture import capture_call
    from harness.task import capture_task

    if dump_dir is not None:
        artifacts = _ascend_dumps(dump_dir, kernel_file)
    elif task_file is not None:
        artifacts = capture_task(task_file, target=target, cache_dir=cache)
    else:
        artifacts = capture_call(kernel_file, call, target=target, cache_dir=cache)
    from diagnose.engine import why as answer_why

    if kb_home is not None:
        with kb_home.lock(write=False):
            answer = answer_why(question, artifacts, kb_home, release)
    else:
        answer = answer_why(question, artifacts, None, release)
    _narrate(answer)
    _echo_answer(answer, as_json)


@main.command()
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
              help="A kernel file from the wild (instead of a task file).")
@click.option("--call", default=None, help="With --kernel: an example call of its launch wrapper.")
@click.option("--dump", "dump_dir", type=click.Path(file_okay=False), default=None,
              help="A triton-ascend TRITON_DEBUG dump directory to diagnose (with --kernel for its source).")
@click.option("--case", "case_index", default=0, show_default=True, help="Which case of the task to compile.")
@click.option("--target", default=None,
              help="cuda:90 (default: the GPU present, else cuda:90), or ascend/npu (needs --dump).")
@click.option("--measurements", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A RunReport JSON from `kb run --json [--profile]` on the device: enables L2.")
@click.option("--level-max", type=click.Choice(["L1", "L2", "L3", "L4"]), default="L4", show_default=True)
@click.option("--strategy", type=click.Choice(["progressive", "profile-only", "always-deep"]), default="progressive",
              show_default=True)
@click.option("--release", default=None, help="Compiler release(s) for L4, comma-separated (default: installed triton's).")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.option("--md", "as_md", is_flag=True, help="Print plain Markdown (the default on a terminal is rendered).")
@click.pass_context
@_user_errors
def diagnose(ctx: click.Context, task_file: str | None, kernel_file: str | None, call: str | None,
             dump_dir: str | None, case_index: int, target: str | None, measurements: str | None, level_max: str,
             strategy: str, release: str | None, as_json: bool, as_md: bool) -> None:
    """Why is this kernel slow? Escalates L1 pattern triage -> L2 profile -> L3 IR -> L4 compiler source."""
    from diagnose.engine import DiagnosisRequest
    from diagnose.engine import diagnose as run_diagnosis
    from harness.measurement import RunReport

    given = [x for x in (task_file, dump_dir, kernel_file and call and "call") if x]
    if len(given) != 1:
        raise UserFacingError("give one of: a TASK file, --kernel FILE --call EXPR, or --dump DIR [--kernel FILE]",
                              'e.g. kb diagnose corpora/operators/softmax/task.py')
    ascend = (target or "").split(":")[0] in ("ascend", "npu")
    if ascend and dump_dir is None:
        raise UserFacingError("--target ascend diagnoses triton-ascend dumps: no NPU compiler is installed here",
                              "run the kernel with TRITON_DEBUG=1 on the NPU machine and pass --dump DIR")
    for path in (task_file, kernel_file):
        if path is not None and not Path(path).is_file():
            raise UserFacingError(f"{path} does not exist", "pass the path of a task or kernel .py file")
    report = None
    if measurements:
        try:
            report = RunReport.from_dict(json.loads(Path(measurements).read_text()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserFacingError(f"{measurements} is not a run report ({type(exc).__name__}: {exc})",
                                  "pass the JSON that `kb run --json` prints") from exc
    kb_home = _diagnosis_home(ctx)
    cache = kb_home.compile_cache if kb_home else None
    source: str | None = kernel_file

    def compile_kernel() -> list[Any]:
        if dump_dir is not None:
            return _ascend_dumps(dump_dir, kernel_file)
        if task_file is not None:
            from harness.task import capture_task

            return capture_task(task_file, case_index, target=target, cache_dir=cache)
        from harness.capture import capture_call

        return capture_call(kernel_file, call, target=target, cache_dir=cache)

    if task_file is not None:
        from harness.task import load_task

        task = load_task(task_file)
        source = task.source_file
    request = DiagnosisRequest(source, compile_kernel, report, "npu" if dump_dir else (target or "cuda:90"))
    if kb_home is not None:
        with kb_home.lock(write=False):
            answer = run_diagnosis(request, kb_home, release, strategy, level_max)
    else:
        answer = run_diagnosis(request, None, release, strategy, level_max)
    _narrate(answer)
    _echo_answer(answer, as_json, as_md)


# ---------------------------------------------------------------------------------------------- run
@main.command("run")
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@click.option("--kernel", "kernel_file", type=click.Path(dir_okay=False), default=None,
              help="A kernel file from the wild (instead of a task file).")
@click.option("--call", default=None, help='With --kernel: an example call, e.g. "add(torch.randn(4096), torch.randn(4096))".')
@click.option("--reference", default=None, help="With --kernel: a PyTorch callable to check against, e.g. torch.add.")
@click.option("--candidate", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A rewritten kernel file to check and time against the task's own kernel.")
@click.option("--candidate-entry", default=None, help="Its launch wrapper (default: the task entry's name).")
@click.option("--backend", type=click.Choice(["auto", "cuda", "interpreter", "npu"]), default="auto", show_default=True,
              help="auto: cuda with an NVIDIA GPU, npu with an Ascend device, else the CPU interpreter.")
@click.option("--cases", default=None, help="Comma-separated case indices (default: all).")
@click.option("--seeds", default=3, show_default=True, help="Fresh random inputs per case.")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds a kernel may take per job.")
@click.option("--no-time", is_flag=True, help="Check correctness only.")
@click.option("--profile", is_flag=True,
              help="Profiler metrics per case: Nsight Compute on cuda (needs ncu), msprof op on npu (needs msprof).")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled"]), multiple=True,
              help="Also time the task's PyTorch version (its `eager`, else its reference) as written (eager) or "
                   "through torch.compile (compiled).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="The run's seed, to replay a report (it records its seed); default: a fresh one from os.urandom.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_user_errors
def run_cmd(task_file: str | None, kernel_file: str | None, call: str | None, reference: str | None,
            candidate: str | None, candidate_entry: str | None, backend: str, cases: str | None, seeds: int,
            timeout_s: float, no_time: bool, profile: bool, versus: tuple[str, ...], seed: int | None,
            as_json: bool) -> None:
    """Check a task's kernel (and a candidate) for correctness, then time it: sandboxed, guarded.

    Exit status 0 when every kernel judged passed, 1 when one was rejected (the baseline included)."""
    from harness.backends import detect_backend
    from harness.run import RunOptions, run_task

    if (task_file is None) == (kernel_file is None):
        raise UserFacingError("give a TASK file, or --kernel FILE with --call EXPR",
                              'e.g. kb run --kernel add.py --call "add(torch.randn(4096), torch.randn(4096))"')
    if kernel_file is not None and call is None:
        raise UserFacingError("--kernel needs --call EXPR, an example call of its launch wrapper",
                              'e.g. --call "add(torch.randn(4096), torch.randn(4096))"')
    for path in (task_file, kernel_file):
        if path is not None and not Path(path).is_file():
            raise UserFacingError(f"{path} does not exist", "pass the path of a task or kernel .py file")
    spec: dict[str, Any] = ({"path": str(Path(task_file).resolve())} if task_file else
                            {"kernel": str(Path(kernel_file).resolve()), "call": call, "reference": reference})
    try:
        indices = [int(c) for c in cases.split(",")] if cases else None
    except ValueError as exc:
        raise UserFacingError(f"--cases {cases!r} is not a list of indices", "e.g. --cases 0,2") from exc
    options = RunOptions(backend=detect_backend() if backend == "auto" else backend, cases=indices,
                         seeds=max(1, seeds), time=not no_time, timeout_s=timeout_s, profile=profile,
                         references=tuple(dict.fromkeys(versus)), seed=seed)
    report = run_task(spec, options, candidate=str(Path(candidate).resolve()) if candidate else None,
                      candidate_entry=candidate_entry)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        from rich.console import Console

        from kb.run_view import render_run

        render_run(report, Console())
    judged = [run for run in (report.run("baseline"), report.run("candidate")) if run is not None]
    if report.failure or not judged or not all(run.correct for run in judged):
        sys.exit(1)


# ---------------------------------------------------------------------------------------------- optimize
def _runs_root(ctx: click.Context) -> Path:
    from kb.home import KBHome

    return KBHome.resolve(ctx.obj.get("home")).runs_dir


def _runs_in(root: Path) -> list[Path]:
    """Optimize run directories directly under `root` (each holds a rounds.sqlite)."""
    return sorted(p.parent for p in root.glob("*/rounds.sqlite")) if root.is_dir() else []


def _runs_of(ctx: click.Context, run: str) -> list[Path]:
    """A run (directory or id), or every run of a bench directory (`kb bench`)."""
    if (Path(run) / "bench.json").is_file():
        from diagnose.bench import bench_runs

        return bench_runs(Path(run))
    return [_run_dir(ctx, run)]


def _run_dir(ctx: click.Context, run: str) -> Path:
    """A run given as a directory, or as a run id under the KB home's runs/."""
    path = Path(run)
    if (path / "rounds.sqlite").is_file():
        return path
    named = _runs_root(ctx) / run
    if (named / "rounds.sqlite").is_file():
        return named
    raise UserFacingError(f"no optimize run {run!r} (neither a run directory nor an id under {_runs_root(ctx)})",
                          "see `kb rounds list`")


@main.command()
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@click.option("--rounds", default=5, show_default=True, help="Rounds to run (a resumed run keeps its own).")
@click.option("--time-budget", "time_budget", type=float, default=None, help="Seconds after which no round starts.")
@click.option("--llm", type=click.Choice(["none", "openai"]), default="none", show_default=True,
              help="openai: also ask an OpenAI-compatible endpoint (KB_LLM_BASE_URL, KB_LLM_MODEL, KB_LLM_API_KEY).")
@click.option("--strategy", type=click.Choice(["progressive", "profile-only", "always-deep"]), default="progressive",
              show_default=True, help="How far each round's diagnosis escalates.")
@click.option("--backend", type=click.Choice(["auto", "cuda", "interpreter", "npu"]), default="auto", show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the run lives (default: runs/<task>-<time> under the KB home).")
@click.option("--resume", "resume_run", default=None, help="Continue a run (its directory or id).")
@click.option("--release", default=None, help="Compiler release(s) for L4 citations.")
@click.option("--stop-after", "stop_after", type=float, default=None,
              help="Seconds from now after which no round starts; the run is left paused, to --resume later.")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled", "none"]), multiple=True, default=("eager",),
              show_default=True, help="PyTorch stand-ins timed beside the initial and best kernels at the end "
                                      "(none: no stand-in).")
@_timing_window_options
@click.option("--check-workers", "check_workers", type=click.IntRange(min=1), default=None,
              help="Processes that check a round's variants side by side (default: a quarter of the cores, at most 4).")
@click.option("--json", "as_json", is_flag=True, help="Print the final report as JSON.")
@click.pass_context
@_user_errors
def optimize(ctx: click.Context, task_file: str | None, rounds: int, time_budget: float | None, llm: str,
             strategy: str, backend: str, run_dir: Path | None, resume_run: str | None, release: str | None,
             stop_after: float | None, versus: tuple[str, ...], warmup_ms: int | None, rep_ms: int | None,
             check_workers: int | None, as_json: bool) -> None:
    """Rounds of diagnose -> rewrite -> validate on a task; every step persisted, resumable."""
    import datetime

    from diagnose.optimize import OptimizeOptions, report
    from diagnose.optimize import optimize as run_loop
    from harness.backends import detect_backend
    from harness.task import task_name

    if (task_file is None) == (resume_run is None):
        raise UserFacingError("give a TASK file to start a run, or --resume RUN to continue one",
                              "e.g. kb optimize corpora/operators/softmax/task.py --rounds 5")
    if llm == "openai":
        from diagnose.llm import LLMConfig

        if LLMConfig.from_env() is None:
            raise UserFacingError("--llm openai needs an endpoint", "set KB_LLM_BASE_URL (and KB_LLM_MODEL, KB_LLM_API_KEY)")
    options = OptimizeOptions(rounds=rounds, time_budget_s=time_budget, llm=llm, strategy=strategy,
                              backend=detect_backend() if backend == "auto" else backend, release=release,
                              references=_stand_ins(versus), warmup_ms=warmup_ms, rep_ms=rep_ms,
                              check_workers=check_workers)
    if options.backend == "interpreter":
        raise UserFacingError("kb optimize needs a device to time on (cuda or npu): the CPU interpreter's time is "
                              "not kernel performance", "run it on the GPU machine (kb run checks correctness here)")
    if resume_run is not None:
        directory = _run_dir(ctx, resume_run)
        spec = None
    else:
        if not Path(task_file).is_file():
            raise UserFacingError(f"{task_file} does not exist", "pass the path of a task .py file")
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # The default place is the KB home's runs/, so the home must be one (created if new).
        directory = run_dir or _home(ctx, create=True).runs_dir / f"{task_name(task_file)}-{stamp}"
        spec = {"path": str(Path(task_file).resolve())}
    kb_home = _diagnosis_home(ctx)
    if spec is None:
        from diagnose.rounds import RoundsStore

        store = RoundsStore(directory)
        spec = store.run().spec
        store.close()

    def say(message: str) -> None:
        click.echo(message, err=True)

    say(f"run: {directory}")
    try:
        store = run_loop(spec, options, directory, kb_home, log=say, resume=resume_run is not None,
                         stop_at=time.time() + stop_after if stop_after is not None else None)
    except KeyboardInterrupt:
        click.echo(f"interrupted: continue with `kb optimize --resume {directory}`", err=True)
        sys.exit(130)
    summary = report(store)
    store.close()
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    _echo_rounds(summary)


def _echo_rounds(summary: dict[str, Any]) -> None:
    click.echo(f"run {summary['run']} ({summary['task']}): {summary['status']}, {summary['rounds']} rounds, best round "
               f"{summary['best_round']} (diagnosed at {summary['best_level'] or '-'}), speedup over the initial "
               f"kernel {summary['speedup_vs_initial']:.3f}x "
               + ("(measured)" if summary.get("speedup_vs_initial_measured") else "(chained over rounds)"))
    click.echo(f"{'round':>5} {'parent':>6} {'level':>5} {'finding':<30} {'pattern':<26} {'outcome':<9} {'speedup':>8}")
    for h in summary["history"]:
        speed = f"{h['speedup']:.3f}x" if h["speedup"] else "-"
        click.echo(f"{h['round']:>5} {h['parent'] or 0:>6} {h['level'] or '-':>5} {(h['finding'] or 'search'):<30} "
                   f"{h['pattern']:<26} {h['outcome'] or h['state']:<9} {speed:>8}")
        if h["outcome"] in ("rejected", "failed"):
            click.echo(f"{'':>13}why: {h['reason']}")
    if summary.get("per_case_vs_initial"):
        click.echo("best vs initial per case: " + ", ".join(f"{k} {v:.3f}x"
                                                             for k, v in summary["per_case_vs_initial"].items()))
    elif summary.get("per_case_best"):
        click.echo("best round per case: " + ", ".join(f"{k} {v:.3f}x" for k, v in summary["per_case_best"].items()))
    if summary.get("note"):
        click.echo(f"note: {summary['note']}")
    click.echo(f"best kernel: {summary['dir']}/best.py" if summary["best_round"] else "no round beat the initial kernel")


@main.group()
def rounds() -> None:
    """Optimize runs and their rounds."""


@rounds.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def rounds_list(ctx: click.Context, as_json: bool) -> None:
    """Runs under the KB home's runs/ directory."""
    from diagnose.optimize import report
    from diagnose.rounds import RoundsStore

    root = _runs_root(ctx)
    rows = []
    for d in _runs_in(root):
        store = RoundsStore(d)
        rows.append(report(store))
        store.close()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo(f"no runs under {root}")
    for r in rows:
        click.echo(f"{r['run']:<40} {r['task']:<20} {r['status']:<12} {r['rounds']:>3} rounds  best {r['best_round']}  "
                   f"{r['speedup_vs_initial']:.3f}x")


@rounds.command("show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def rounds_show(ctx: click.Context, run: str, as_json: bool) -> None:
    """One run's rounds: hypothesis, level, rewrite, outcome and why."""
    from diagnose.optimize import report
    from diagnose.rounds import RoundsStore

    store = RoundsStore(_run_dir(ctx, run))
    summary = report(store)
    store.close()
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    _echo_rounds(summary)


# ---------------------------------------------------------------------------------------------- bench
@main.command()
@click.option("--suite", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Operator folders, each with task.py (default: corpora/operators).")
@click.option("--ops", default=None, help="Comma-separated operators (default: the whole suite).")
@click.option("--rounds", default=5, show_default=True, help="Rounds per operator.")
@click.option("--time-budget", "time_budget", type=float, default=None, help="Seconds per operator run.")
@click.option("--strategy", default="progressive", show_default=True,
              help="Diagnosis strategies, comma-separated; each one is a condition run over the whole suite.")
@click.option("--workers", default=1, show_default=True, help="Jobs at once, one per GPU (CUDA_VISIBLE_DEVICES).")
@click.option("--llm", type=click.Choice(["none", "openai"]), default="none", show_default=True)
@click.option("--backend", type=click.Choice(["auto", "cuda", "npu"]), default="auto", show_default=True)
@click.option("--bench-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the bench lives (default: bench/<time> under the KB home).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Continue a bench: finished runs are kept, paused ones resumed, the rest started.")
@click.option("--stop-after", "stop_after", type=float, default=None,
              help="Seconds from now after which no job or round starts (a GPU machine lent for minutes).")
@click.option("--vs", "versus", type=click.Choice(["eager", "compiled"]), multiple=True, default=("eager",),
              show_default=True, help="PyTorch stand-ins each operator's initial and best kernels are timed against.")
@click.option("--ray", "ray_address", default=None,
              help="Run the jobs on a Ray cluster, one GPU each: auto (the running cluster), ray://HOST:PORT, or "
                   "local (start one here). Every node needs this checkout at the same path and the bench dir shared.")
@click.option("--retime", "retime_ops", default=None,
              help="With --resume: comma-separated operators whose finished runs take their end-of-run measurement "
                   "again (after their task's stand-in or initial kernel changed).")
@_timing_window_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@_user_errors
def bench(ctx: click.Context, suite: Path | None, ops: str | None, rounds: int, time_budget: float | None,
          strategy: str, workers: int, llm: str, backend: str, bench_dir: Path | None, resume_dir: Path | None,
          stop_after: float | None, versus: tuple[str, ...], ray_address: str | None, retime_ops: str | None,
          warmup_ms: int | None, rep_ms: int | None, as_json: bool) -> None:
    """The optimize loop over a benchmark suite, resumable, then its report (JSON, Markdown, PNG)."""
    import datetime

    from diagnose.bench import (DEFAULT_SUITE, STRATEGIES, BenchSpec, Condition, create_bench, load_suite, retime,
                                run_bench, set_timing_windows)
    from diagnose.bench_report import write_report
    from harness.backends import detect_backend

    if resume_dir is not None:
        directory = resume_dir
        if retime_ops:  # first: an unknown operator stops the command before anything is changed
            again = retime(directory, [x.strip() for x in retime_ops.split(",") if x.strip()])
            click.echo(f"{len(again)} finished run(s) will take their end-of-run measurement again", err=True)
        set_timing_windows(directory, warmup_ms, rep_ms)  # the jobs still to run take the new windows
    elif retime_ops:
        raise UserFacingError("--retime works on an existing bench", "use it with --resume DIR")
    else:
        strategies = [x.strip() for x in strategy.split(",") if x.strip()]
        bad = [x for x in strategies if x not in STRATEGIES]
        if bad or not strategies:
            raise UserFacingError(f"unknown strategy {', '.join(bad) or strategy!r}", f"use {', '.join(STRATEGIES)}")
        chosen = detect_backend() if backend == "auto" else backend
        if chosen == "interpreter":
            raise UserFacingError("kb bench times kernels on a device (cuda or npu)", "run it on the GPU machine")
        suite_dir = suite or DEFAULT_SUITE
        names = [x.strip() for x in ops.split(",") if x.strip()] if ops else list(load_suite(suite_dir))
        # Each job resolves the home as this command does (--home, else $KB_HOME, else the default).
        home = str(Path(ctx.obj["home"]).resolve()) if ctx.obj.get("home") else None
        spec = BenchSpec(str(suite_dir.resolve()), names, [Condition(x, x, home) for x in strategies], rounds,
                         time_budget, llm, chosen, references=list(dict.fromkeys(versus)), warmup_ms=warmup_ms,
                         rep_ms=rep_ms)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        directory = bench_dir or _home(ctx, create=True).root / "bench" / stamp
        create_bench(directory, spec)
    click.echo(f"bench: {directory}", err=True)
    bar = _progress_bar("bench")

    def event(what: str, job: Any) -> None:
        if what == "done":
            bar.advance(task)
            bar.console.print(f"{job.condition.name}/{job.operator}: {job.state} in {job.seconds:.0f} s "
                              f"(log {job.log})")

    from diagnose.bench import jobs, load_bench

    todo = [j for j in jobs(directory, load_bench(directory)) if j.state in ("new", "partial")]
    with bar:
        task = bar.add_task("jobs", total=len(todo))
        try:
            result = run_bench(directory, workers, stop_after, event, ray_address=ray_address)
        except KeyboardInterrupt:
            click.echo(f"interrupted: continue with `kb bench --resume {directory}`", err=True)
            sys.exit(130)
    data = write_report(directory)
    left = [j for j in result if j.state in ("new", "partial")]
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo((directory / "report.md").read_text())
    if left:
        click.echo(f"{len(left)} job(s) not finished: continue with `kb bench --resume {directory}`", err=True)


@main.command("bench-report")
@click.argument("bench_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write report.json/.md/.png here (default: the bench directory).")
@click.option("--json", "as_json", is_flag=True)
@_user_errors
def bench_report_cmd(bench_dir: Path, into: Path | None, as_json: bool) -> None:
    """Re-render a bench's report from its runs (a bench cut short reports what finished)."""
    from diagnose.bench_report import write_report

    data = write_report(bench_dir, into)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    click.echo(((into or bench_dir) / "report.md").read_text())


# ---------------------------------------------------------------------------------------------- synthesis
@main.command()
@click.argument("runs", nargs=-1)
@click.option("--into", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write learned patterns here (e.g. corpora/patterns/learned) instead of the KB home.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def synthesize(ctx: click.Context, runs: tuple[str, ...], into: Path | None, as_json: bool) -> None:
    """Fold finished optimize runs (run dirs, ids or bench dirs; default: all in the KB home) into pattern
    statistics and learned patterns."""
    from diagnose.synthesis import synthesize as fold

    home = _home(ctx, create=True)
    dirs = [d for r in runs for d in _runs_of(ctx, r)] or _runs_in(home.runs_dir)
    if not dirs:
        raise UserFacingError(f"no optimize runs under {home.runs_dir}", "run `kb optimize TASK` first, or name RUN dirs")
    with home.lock(write=True):
        summary = fold(home, dirs, into)
        from kb.index import load_manifest

        if summary["learned"] and load_manifest(home, "patterns", "catalog") is not None:
            from indexer.patterns import index_patterns
            from kb.embed import embedder_for

            index_patterns(home, embedder_for(home))
            summary["reindexed"] = True
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    click.echo(f"{summary['rounds']} new rounds from {len(dirs)} runs")
    for pid, s in summary["stats"].items():
        click.echo(f"  {pid:<32} {s['wins']}/{s['tries']} won" + (f"  ({s['status']})" if s.get("status") else ""))
    for pid in summary["learned"]:
        click.echo(f"  learned: {pid}")
    for pid in summary["demoted"]:
        click.echo(f"  demoted to high risk (its wins do not hold up): {pid}")


@main.group()
def patterns() -> None:
    """The pattern catalog with its statistics and provenance."""


@patterns.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
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
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
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
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_user_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """What the KB holds: indexes per corpus and release, symbol counts, where it lives."""
    from kb.index import list_manifests
    from kb.releases import interrupted, reindex_command
    from kb.retrieve import installed_triton_release
    from kb.symbols import SymbolStore

    home = _home(ctx)
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
    info = {
        "home": str(home.root),
        "vector_store": os.environ.get("KB_CHROMA_URL") or str(home.chroma_dir),
        **({"vector_store_unreachable": unreachable} if unreachable else {}),
        "installed_triton": installed_triton_release(),
        "indexes": [{"corpus": m.corpus, "release": m.release, "chunks": m.count, "collection": m.collection,
                     **({"interrupted": unfinished[m.key]} if m.key in unfinished else {})} for m in manifests],
        "symbols": counts,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        if unreachable:
            sys.exit(1)
        return
    store = info["vector_store"] + (f" (unreachable: {unreachable})" if unreachable else "")
    click.echo(f"KB home: {info['home']}\nvector store: {store}\ninstalled triton: {info['installed_triton']}")
    for m in info["indexes"]:
        click.echo(f"  {m['corpus']}@{m['release']}: {m['chunks']} chunks"
                   + (f" (stopped before its symbols; finish it: {m['interrupted']})" if "interrupted" in m else ""))
    for release, c in counts.items():
        click.echo(f"  symbols@{release}: {c['symbols']} symbols, {c['passes']} passes, {c['links']} links")
    if not manifests:
        click.echo("  (empty: run `kb index patterns` and `kb index compiler --installed`)")
    if unreachable:
        sys.exit(1)


if __name__ == "__main__":
    main()
