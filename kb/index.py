"""Published indexes: one (corpus, release) = one chroma collection + one BM25 index + one manifest.

Publishing is crash-safe: a new index is written under a fresh build name, and only when the
collection and the BM25 files are complete is the manifest replaced (atomic rename). Readers follow
the manifest, so an interrupted build leaves the previous index live; its leftovers are removed by
the next publish.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import UserFacingError
from kb.home import KBHome

if TYPE_CHECKING:
    from kb.embed import OfflineEmbedding


__all__ = ["INDEX_SCHEMA_VERSION", "Chunk", "Manifest", "drop_builds", "drop_index", "leftover_builds",
           "list_manifests", "load_manifest", "publish", "texts_to_embed"]

INDEX_SCHEMA_VERSION = 2
_BATCH = 1024  # chunks embedded and added to chroma per step (larger chroma batches add faster)


@dataclass
class Chunk:
    """One retrievable unit of text with where it came from.

    Attributes:
        id: content-addressed, `path#sha1(text)`: the same chunk has the same id in every release.
        text: what is shown and indexed for BM25.
        metadata: flat scalars only (chroma): file, start_line, end_line, symbol, lang, kind, release, ...
        embed_text: what is embedded when it differs from `text`: a lit test's file summary, a code
            chunk led by its path and names spelled as words, a licence/include chunk's short summary.
    """

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    embed_text: str = ""

    @property
    def embedded(self) -> str:
        """The text its vector is computed from."""
        return self.embed_text or self.text


def texts_to_embed(chunks: list[Chunk]) -> list[str]:
    """The distinct texts the chunks' vectors come from, in order: what a build embeds, once each."""
    return list(dict.fromkeys(c.embedded for c in chunks))


@dataclass
class Manifest:
    corpus: str
    release: str
    collection: str
    count: int
    schema_version: int
    embed_model: str
    embed_dim: int
    chunker: dict[str, Any]
    source: dict[str, Any]
    created: float

    @property
    def key(self) -> str:
        return manifest_key(self.corpus, self.release)


def manifest_key(corpus: str, release: str) -> str:
    return f"{_safe(corpus)}__{_safe(release)}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


def _manifest_path(home: KBHome, corpus: str, release: str) -> Path:
    return home.manifests_dir / f"{manifest_key(corpus, release)}.json"


def load_manifest(home: KBHome, corpus: str, release: str) -> Manifest | None:
    path = _manifest_path(home, corpus, release)
    if not path.exists():
        return None
    try:
        manifest = Manifest(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise UserFacingError(
            f"index manifest {path} is corrupt", f"rebuild that index (`kb index ...`) or delete {path}"
        ) from exc
    from kb.embed import EMBED_DIM, find_model

    if (manifest.schema_version, manifest.embed_dim) != (INDEX_SCHEMA_VERSION, EMBED_DIM):
        raise UserFacingError(
            f"index {manifest.key} was built by another kb version or embedding model",
            "rebuild it with the `kb index ...` command that made it",
        )
    if find_model(home, manifest.embed_model) is None:
        raise UserFacingError(
            f"index {manifest.key} was built with embedding model {manifest.embed_model}, which {home.root} no longer has",
            "rebuild it with the `kb index ...` command that made it (it then uses the active model)",
        )
    return manifest


def list_manifests(home: KBHome) -> list[Manifest]:
    if not home.manifests_dir.is_dir():
        return []
    out = []
    for path in sorted(home.manifests_dir.glob("*.json")):
        corpus, _, release = path.stem.partition("__")
        manifest = load_manifest(home, corpus, release)
        if manifest is not None:
            out.append(manifest)
    return out


def publish(
    home: KBHome,
    corpus: str,
    release: str,
    chunks: Sequence[Chunk],
    *,
    chunker: dict[str, Any],
    source: dict[str, Any],
    embedder: OfflineEmbedding,
    progress: Callable[[int, int], None] | None = None,
    before_switch: Callable[[str], None] | None = None,
) -> Manifest:
    """Embed, store and atomically publish `chunks` as the live index of (corpus, release).

    `before_switch(collection)` runs once the new collection is complete, just before the manifest
    names it: the caller records there what a kill between the switch and its own next write (the
    release's symbols) would leave half-done. The caller holds the home's write lock.
    """
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from kb.embed import EMBED_DIM
    from kb.lexical import LexicalIndex
    from kb.vectors import chroma_client, create_collection

    ids = [c.id for c in chunks]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:3]
        raise ValueError(f"duplicate chunk ids: {dupes}")
    client = chroma_client(home)
    key = manifest_key(corpus, release)
    previous = load_manifest(home, corpus, release)
    _remove_orphans(home, client, key, keep=previous.collection if previous else None)

    collection_name = f"{key}__b{uuid.uuid4().hex[:8]}"
    store = ChromaVectorStore(chroma_collection=create_collection(client, collection_name))
    for start in range(0, len(chunks), _BATCH):
        batch = chunks[start : start + _BATCH]
        texts = [c.embedded for c in batch]
        if progress and getattr(embedder, "commit_every", None):  # finer than a batch: embedding is the slow part
            def embedded(n: int, offset: int = start, total: int = len(chunks)) -> None:
                assert progress is not None
                progress(offset + n, total)

            vectors = embedder.embed_many(texts, on_progress=embedded)
        else:
            vectors = embedder.embed_many(texts)
        nodes = [
            TextNode(id_=c.id, text=c.text, metadata=c.metadata, embedding=v,
                     excluded_embed_metadata_keys=list(c.metadata), excluded_llm_metadata_keys=list(c.metadata))
            for c, v in zip(batch, vectors)
        ]
        store.add(list(nodes))  # TextNode is a BaseNode; the list's type is invariant
        if progress:
            progress(min(start + _BATCH, len(chunks)), len(chunks))
    LexicalIndex.build(ids, [c.text for c in chunks]).save(home.lexical_dir / collection_name)

    manifest = Manifest(
        corpus=corpus, release=release, collection=collection_name, count=len(chunks),
        schema_version=INDEX_SCHEMA_VERSION, embed_model=embedder.model_name, embed_dim=EMBED_DIM,
        chunker=chunker, source=source, created=time.time(),
    )
    home.manifests_dir.mkdir(parents=True, exist_ok=True)
    path = _manifest_path(home, corpus, release)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=1))
    if before_switch is not None:
        before_switch(collection_name)
    os.replace(tmp, path)  # the switch: from here on readers see the new index

    if previous is not None and previous.collection != collection_name:
        _drop_collection(home, client, previous.collection)
    return manifest


def drop_index(home: KBHome, corpus: str, release: str) -> bool:
    from kb.vectors import chroma_client

    manifest = load_manifest(home, corpus, release)
    if manifest is None:
        return False
    _manifest_path(home, corpus, release).unlink()
    _drop_collection(home, chroma_client(home), manifest.collection)
    return True


def leftover_builds(home: KBHome, release: str) -> list[str]:
    """Vector collections and lexical indexes of `release` that no manifest names: a build killed
    while storing. The next build of the same (corpus, release) removes its own; these are what
    `kb releases drop` finds of a release no build will finish."""
    from kb.vectors import chroma_client, list_collection_names

    live = {m.collection for m in list_manifests(home)}
    pattern = re.compile(rf"__{re.escape(_safe(release))}__b[0-9a-f]+$")
    names = set(list_collection_names(chroma_client(home)))
    if home.lexical_dir.is_dir():
        names |= {d.name for d in home.lexical_dir.iterdir()}
    return sorted(n for n in names if pattern.search(n) and n not in live)


def drop_builds(home: KBHome, names: list[str]) -> None:
    """Drop collections (and their lexical indexes) by name: the `leftover_builds` of a release."""
    from kb.vectors import chroma_client

    client = chroma_client(home) if names else None
    for name in names:
        _drop_collection(home, client, name)


def _drop_collection(home: KBHome, client: Any, name: str) -> None:
    from kb.vectors import remove_orphan_segments

    try:
        client.delete_collection(name)
    except Exception:  # noqa: BLE001 - already gone is fine
        pass
    remove_orphan_segments(home)  # chroma leaves the deleted collection's vectors on disk
    shutil.rmtree(home.lexical_dir / name, ignore_errors=True)


def _remove_orphans(home: KBHome, client: Any, key: str, keep: str | None) -> None:
    """Collections of this (corpus, release) that no manifest names: leftovers of a killed build."""
    from kb.vectors import list_collection_names

    for name in list_collection_names(client):
        if name.startswith(f"{key}__b") and name != keep:
            _drop_collection(home, client, name)
    if home.lexical_dir.is_dir():
        for directory in home.lexical_dir.glob(f"{key}__b*"):
            if directory.name != keep:
                shutil.rmtree(directory, ignore_errors=True)
