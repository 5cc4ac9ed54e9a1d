"""`kb embedder tune|list|use|drop`: embedding models of a KB home."""

from __future__ import annotations

import json
import random
from collections import Counter

import click

from cli.app import main
from cli.options import json_option, open_home, progress_bar, user_errors


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
@user_errors
def embedder_tune(ctx: click.Context, releases_: tuple[str, ...], name: str, corpus: str, epochs: int,
                  max_pairs: int | None, batch_size: int, learning_rate: float, use: bool, dry_run: bool) -> None:
    """Fine-tune the embedder on what indexed compiler source says of itself: each comment or
    docstring with the code below it, each TableGen pass record with the C++ implementing it.

    Existing indexes keep the model that built them; re-index a release to search it with the new one.
    """
    from kb.tune import check_model_name, mine_pairs, save_model, train, use_model

    home = open_home(ctx)
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
    with progress_bar("tuning") as bar:
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
@json_option()
@click.pass_context
@user_errors
def embedder_list(ctx: click.Context, as_json: bool) -> None:
    """The embedding models of this home, which one new indexes use, and which indexes each built."""
    from kb.embed import BASE_MODEL, active_model, tuned_models
    from kb.index import list_manifests

    home = open_home(ctx)
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
@user_errors
def embedder_use(ctx: click.Context, name: str) -> None:
    """Build new indexes with model NAME ("base" for the bundled one)."""
    from kb.tune import use_model

    home = open_home(ctx)
    with home.lock(write=True):
        model = use_model(home, name)
    click.echo(f"new indexes of {home.root} are built with {model.id}")


@embedder.command("drop")
@click.argument("name")
@click.pass_context
@user_errors
def embedder_drop(ctx: click.Context, name: str) -> None:
    """Remove tuned model NAME (refused while an index uses it)."""
    from kb.tune import drop_model

    home = open_home(ctx)
    with home.lock(write=True):
        drop_model(home, name)
    click.echo(f"dropped {name}")


