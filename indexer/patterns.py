"""Index the pattern catalog: validated YAML -> one chunk per pattern in the `patterns` corpus."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kb.home import KBHome
from kb.index import Chunk, Manifest, publish
from kb.patterns import CATALOG_DIR, Pattern

if TYPE_CHECKING:
    from kb.embed import OfflineEmbedding


__all__ = ["PATTERNS_CORPUS", "PATTERNS_RELEASE", "index_patterns", "pattern_chunks"]

PATTERNS_CORPUS = "patterns"
PATTERNS_RELEASE = "catalog"


def pattern_chunks(patterns: list[Pattern]) -> list[Chunk]:
    return [
        Chunk(
            id=f"pattern:{p.id}",
            text=p.document(),
            metadata={
                "kind": "pattern",
                "pattern_id": p.id,
                "family": p.family,
                "backends": ",".join(p.backends),
                "symptoms": ",".join(p.symptoms),
                "risk": p.risk,
                "file": p.path,
                "start_line": 1,
                "release": PATTERNS_RELEASE,
            },
        )
        for p in patterns
    ]


def index_patterns(home: KBHome, embedder: OfflineEmbedding, catalog: Path | None = None) -> Manifest:
    """The catalog directory's patterns, plus the home's learned ones (kept by `kb synthesize`)."""
    from kb.patterns import catalog_for

    patterns = catalog_for(home, catalog)  # validates before anything is written
    return publish(
        home,
        PATTERNS_CORPUS,
        PATTERNS_RELEASE,
        pattern_chunks(patterns),
        chunker={"kind": "one-chunk-per-pattern"},
        source={"catalog": str(catalog or CATALOG_DIR), "patterns": len(patterns)},
        embedder=embedder,
    )
