"""The one owner of the chroma client.

Embedded `PersistentClient` under the KB home by default; a team-shared server through `HttpClient`
when `$KB_CHROMA_URL` is set (e.g. http://kb-server:8000 in front of `chroma run --path DIR`).
Telemetry off, cosine space, embeddings always supplied by us (chroma's default embedding
function would download a model).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any
from urllib.parse import urlparse

from harness.errors import UserFacingError
from kb.home import KBHome

__all__ = ["chroma_client", "create_collection", "get_collection", "remove_orphan_segments"]


def chroma_client(home: KBHome) -> Any:
    import chromadb
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False, allow_reset=False)
    url = os.environ.get("KB_CHROMA_URL")
    if url:
        parsed = urlparse(url if "://" in url else f"http://{url}")
        if not parsed.hostname:
            raise UserFacingError(f"KB_CHROMA_URL={url!r} has no host", "set it like http://host:8000")
        try:
            return chromadb.HttpClient(
                host=parsed.hostname,
                port=parsed.port or (443 if parsed.scheme == "https" else 8000),
                ssl=parsed.scheme == "https",
                settings=settings,
            )
        except Exception as exc:  # noqa: BLE001 - any connection failure means the same to the user
            raise UserFacingError(
                f"cannot reach the chroma server at {url} ({type(exc).__name__})",
                "start it with `chroma run --path DIR` or unset KB_CHROMA_URL to use the embedded store",
            ) from exc
    try:
        return chromadb.PersistentClient(path=str(home.chroma_dir), settings=settings)
    except Exception as exc:  # noqa: BLE001 - corrupt sqlite/hnsw files surface as many types
        raise UserFacingError(
            f"the vector store at {home.chroma_dir} is unreadable ({type(exc).__name__}: {str(exc)[:120]})",
            "remove that directory and rebuild with `kb index patterns` and `kb index compiler --installed`",
        ) from exc


# HNSW's search breadth. Chroma's default (100) equals the candidates a search asks for
# (kb.retrieve), so the returned neighbours were approximate, and they differed between processes
# for the same query (14 of 496 gold-set answers on the 2026-11-29 home). At 500 two processes agree
# and vector recall is a little higher, for a few ms a query.
HNSW_EF_SEARCH = 500


def create_collection(client: Any, name: str) -> Any:
    return client.create_collection(
        name=name, configuration={"hnsw": {"space": "cosine", "ef_search": HNSW_EF_SEARCH}}, embedding_function=None
    )


def get_collection(client: Any, name: str) -> Any:
    try:
        return client.get_collection(name=name, embedding_function=None)
    except Exception as exc:  # noqa: BLE001 - chroma raises NotFoundError/ValueError by version
        raise UserFacingError(
            f"collection {name} named by a manifest is missing from the vector store",
            "re-run the `kb index ...` command that built it",
        ) from exc


def list_collection_names(client: Any) -> list[str]:
    return [c if isinstance(c, str) else c.name for c in client.list_collections()]


_SEGMENT_DIR = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def remove_orphan_segments(home: KBHome) -> list[str]:
    """Remove the HNSW directories of deleted collections; returns their names.

    Local chroma 1.x deletes a collection from its catalogue but leaves its vector segment's
    directory on disk (chroma-core/chroma#5259, #5520: removal is left to a garbage collector the
    embedded client does not run), so every re-index would leave a copy of the release's vectors
    behind. A directory named like a segment id that the catalogue (`segments` in chroma.sqlite3) no
    longer lists is one of those. Anything unexpected (a server-backed store, another schema) is left
    alone. The caller holds the home's write lock.
    """
    import sqlite3

    catalogue = home.chroma_dir / "chroma.sqlite3"
    if os.environ.get("KB_CHROMA_URL") or not catalogue.is_file():
        return []
    try:
        db = sqlite3.connect(f"{catalogue.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
        try:
            live = {str(row[0]) for row in db.execute("SELECT id FROM segments")}
            collections = db.execute("SELECT COUNT(*) FROM collections").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return []
    if collections and not live:  # collections without segments: a catalogue this code does not understand
        return []
    removed = []
    for directory in home.chroma_dir.iterdir():
        if directory.is_dir() and _SEGMENT_DIR.fullmatch(directory.name) and directory.name not in live:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory.name)
    return removed
