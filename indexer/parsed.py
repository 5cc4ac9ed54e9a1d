"""What parsing one source file yields, independent of where it lives and which release it is in.

A `ParsedFile` depends only on (language, file content, parser version), so it is cached by content
hash: indexing a new release re-parses only files whose bytes changed. Paths and the release name
are applied when a release is assembled (`indexer.compiler`).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb.home import open_cache_db

__all__ = ["PARSER_VERSION", "Fact", "ParseCache", "ParsedFile", "SourceSymbol", "Unit", "content_key", "source_lines"]

# Bump when any parser's output changes: cached parses of older versions are then ignored.
PARSER_VERSION = 14


def source_lines(text: str) -> list[str]:
    """A file's lines as tree-sitter and line numbers count them: split at newlines only.
    `str.splitlines` also splits at form feeds and U+2028, which shifted every later chunk."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


@dataclass
class Unit:
    """A chunk of one file: whole syntax units (functions, classes, pass records, lit-test cases).

    Attributes:
        text: the source text.
        start_line, end_line: 1-based, inclusive.
        symbol: the main symbol defined (or "" for glue).
        kind: that symbol's kind (function, class, rewrite-pattern, pass, lit-test, ...).
        scope: enclosing class or namespace of `symbol` (`mlir::triton::gpu`, `CoalescePass`).
        summary: what to embed instead of the text (prefixed with the file path only), where raw
            text embeds badly or many chunks share one meaning (the cases of an MLIR lit test);
            "" means embed the text.
    """

    text: str
    start_line: int
    end_line: int
    symbol: str = ""
    kind: str = "code"
    scope: str = ""
    summary: str = ""


@dataclass
class SourceSymbol:
    """A definition (`def`, `decl`) or a use (`ref`, `example`, `emit`) of a name in one file."""

    name: str
    kind: str
    line: int
    end_line: int
    role: str = "def"
    scope: str = ""
    unit: int = -1  # index of the Unit holding it, -1 when none
    digest: str = ""  # hash of a definition's text: tells "changed" from "moved" between releases


@dataclass
class Fact:
    """A cross-layer clue found in one file, resolved into links once the whole release is parsed.

    kinds:
        gen-pass-def      a = PASSNAME from `#define GEN_PASS_DEF_PASSNAME`
        implements-base   a = class, b = `XBase` it derives from (the TableGen pass X)
        rewrites-op       a = pattern class, b = op class it matches (`OpRewritePattern<tt::LoadOp>`)
        binding           a = python name (`add_coalesce`), b = C++ factory (`createTritonGPUCoalesce`)
        run-pass          a = pass argument on a lit test's RUN line
    """

    kind: str
    a: str
    b: str = ""
    line: int = 0


@dataclass
class ParsedFile:
    lang: str
    units: list[Unit] = field(default_factory=list)
    symbols: list[SourceSymbol] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    passes: list[dict[str, Any]] = field(default_factory=list)  # TableGenPass fields
    records: list[dict[str, Any]] = field(default_factory=list)  # TableGenRecord fields (op naming)

    def unit_at(self, line: int) -> int:
        """Index of the unit holding `line`, -1 when none does (blank or skipped lines)."""
        return next((i for i, u in enumerate(self.units) if u.start_line <= line <= u.end_line), -1)

    def to_bytes(self) -> bytes:
        # The same JSON as `asdict(self)`, without its recursive deep copy: 4x faster, which is
        # ~2 s of a 624-file index (the records are flat dataclasses; passes/records plain dicts).
        data = {"lang": self.lang, "units": [vars(u) for u in self.units], "symbols": [vars(s) for s in self.symbols],
                "facts": [vars(f) for f in self.facts], "passes": self.passes, "records": self.records}
        return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 3)

    @classmethod
    def from_bytes(cls, blob: bytes) -> ParsedFile:
        data = json.loads(zlib.decompress(blob))
        return cls(
            lang=data["lang"],
            units=[Unit(**u) for u in data["units"]],
            symbols=[SourceSymbol(**s) for s in data["symbols"]],
            facts=[Fact(**f) for f in data["facts"]],
            passes=data["passes"],
            records=data["records"],
        )


def content_key(lang: str, raw: bytes) -> str:
    return hashlib.sha256(f"{PARSER_VERSION}\0{lang}\0".encode() + raw).hexdigest()


class ParseCache:
    """SQLite map content_key -> ParsedFile, committed in batches so a killed index run resumes."""

    def __init__(self, path: Path) -> None:
        self._db = open_cache_db(path, "CREATE TABLE IF NOT EXISTS parsed (key TEXT PRIMARY KEY, blob BLOB NOT NULL)")
        self._pending: list[tuple[str, bytes]] = []

    def get(self, key: str) -> ParsedFile | None:
        row = self._db.execute("SELECT blob FROM parsed WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            return ParsedFile.from_bytes(row[0])
        except (zlib.error, json.JSONDecodeError, TypeError, KeyError):
            return None  # a damaged entry is re-parsed, never trusted

    def put(self, key: str, parsed: ParsedFile) -> None:
        self._pending.append((key, parsed.to_bytes()))
        if len(self._pending) >= 100:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            with self._db:
                self._db.executemany("INSERT OR REPLACE INTO parsed VALUES (?, ?)", self._pending)
            self._pending = []

    def close(self) -> None:
        self.flush()
        self._db.close()
