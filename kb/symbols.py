"""The symbol store: exact lookups that vectors cannot do, and the cross-layer links L4 walks.

SQLite, one file per KB home, rows keyed by release. A release is replaced in one transaction, so a
crash mid-index leaves the previous rows intact.

Tables:
    symbols  definitions and references: (release, name, kind, lang, file, line, end_line, role)
    passes   TableGen pass definitions: (release, def_name, argument, summary, description, options)
    links    typed edges between names: (release, src_kind, src, relation, dst_kind, dst, evidence)
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.errors import UserFacingError

__all__ = ["Link", "PassDef", "Symbol", "SymbolStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS symbols (
    release TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, lang TEXT NOT NULL,
    file TEXT NOT NULL, line INTEGER NOT NULL, end_line INTEGER NOT NULL, role TEXT NOT NULL,
    chunk_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS symbols_name ON symbols (name COLLATE NOCASE, release);
CREATE TABLE IF NOT EXISTS passes (
    release TEXT NOT NULL, def_name TEXT NOT NULL, argument TEXT NOT NULL, summary TEXT NOT NULL,
    description TEXT NOT NULL, options TEXT NOT NULL, file TEXT NOT NULL, line INTEGER NOT NULL,
    end_line INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS passes_arg ON passes (argument, release);
CREATE TABLE IF NOT EXISTS links (
    release TEXT NOT NULL, src_kind TEXT NOT NULL, src TEXT NOT NULL, relation TEXT NOT NULL,
    dst_kind TEXT NOT NULL, dst TEXT NOT NULL, evidence TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS links_src ON links (src, release);
CREATE INDEX IF NOT EXISTS links_dst ON links (dst, release);
"""


@dataclass(frozen=True)
class Symbol:
    """A definition or reference of a name in compiler source at one release."""

    release: str
    name: str
    kind: str  # function, class, method, pass, pipeline-call, macro, ...
    lang: str  # cpp, python, tablegen
    file: str  # path relative to the indexed root
    line: int
    end_line: int
    role: str = "def"  # def | ref
    chunk_id: str = ""

    def cite(self) -> str:
        return f"{self.file}:{self.line}@{self.release}"


@dataclass(frozen=True)
class PassDef:
    """A TableGen `def X : Pass<"argument", "anchor">` record."""

    release: str
    def_name: str
    argument: str
    summary: str
    description: str
    options: list[dict[str, str]] = field(default_factory=list)
    file: str = ""
    line: int = 0
    end_line: int = 0

    def cite(self) -> str:
        return f"{self.file}:{self.line}@{self.release}"


@dataclass(frozen=True)
class Link:
    """A typed edge, e.g. pipeline-call `passes.ttgpuir.add_coalesce` -runs-> pass `tritongpu-coalesce`.

    `evidence` says how the link was established ("exact", "name-match", ...) so a reader can
    weigh it.
    """

    release: str
    src_kind: str
    src: str
    relation: str
    dst_kind: str
    dst: str
    evidence: str


class SymbolStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=60)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise UserFacingError(
                f"symbol store {path} is unreadable ({exc})",
                "delete it and re-run `kb index compiler --installed` (the other stores are unaffected)",
            ) from exc

    def close(self) -> None:
        self._db.close()

    # -- writing -------------------------------------------------------------------------------
    def replace_release(
        self, release: str, symbols: Iterable[Symbol], passes: Iterable[PassDef], links: Iterable[Link]
    ) -> None:
        """Swap every row of `release` for the given ones, atomically."""
        with self._db:
            for table in ("symbols", "passes", "links"):
                self._db.execute(f"DELETE FROM {table} WHERE release = ?", (release,))
            self._db.executemany(
                "INSERT INTO symbols VALUES (?,?,?,?,?,?,?,?,?)",
                [(s.release, s.name, s.kind, s.lang, s.file, s.line, s.end_line, s.role, s.chunk_id) for s in symbols],
            )
            self._db.executemany(
                "INSERT INTO passes VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (p.release, p.def_name, p.argument, p.summary, p.description, json.dumps(p.options), p.file,
                     p.line, p.end_line)
                    for p in passes
                ],
            )
            self._db.executemany(
                "INSERT INTO links VALUES (?,?,?,?,?,?,?)", [tuple(asdict(lk).values()) for lk in links]
            )

    def drop_release(self, release: str) -> None:
        with self._db:
            for table in ("symbols", "passes", "links"):
                self._db.execute(f"DELETE FROM {table} WHERE release = ?", (release,))

    # -- reading -------------------------------------------------------------------------------
    def releases(self) -> list[str]:
        return [r for (r,) in self._db.execute("SELECT DISTINCT release FROM symbols ORDER BY release")]

    def find(self, name: str, release: str | None = None, role: str | None = None) -> list[Symbol]:
        """Symbols named `name` (case-insensitive; `A::b` also matches its last component)."""
        short = name.split("::")[-1].split(".")[-1]
        sql = "SELECT * FROM symbols WHERE (name = ? COLLATE NOCASE OR name = ? COLLATE NOCASE)"
        args: list[object] = [name, short]
        if release:
            sql += " AND release = ?"
            args.append(release)
        if role:
            sql += " AND role = ?"
            args.append(role)
        return [Symbol(*row) for row in self._db.execute(sql + " ORDER BY role, file, line", args)]

    def pass_by_argument(self, argument: str, release: str | None = None) -> PassDef | None:
        sql = "SELECT * FROM passes WHERE argument = ?"
        args: list[object] = [argument]
        if release:
            sql += " AND release = ?"
            args.append(release)
        row = self._db.execute(sql, args).fetchone()
        return self._pass(row) if row else None

    def pass_by_def(self, def_name: str, release: str | None = None) -> PassDef | None:
        sql = "SELECT * FROM passes WHERE def_name = ?"
        args: list[object] = [def_name]
        if release:
            sql += " AND release = ?"
            args.append(release)
        row = self._db.execute(sql, args).fetchone()
        return self._pass(row) if row else None

    def passes(self, release: str) -> Iterator[PassDef]:
        for row in self._db.execute("SELECT * FROM passes WHERE release = ? ORDER BY argument", (release,)):
            yield self._pass(row)

    def links_of(self, name: str, release: str | None = None) -> list[Link]:
        sql = "SELECT * FROM links WHERE (src = ? OR dst = ?)"
        args: list[object] = [name, name]
        if release:
            sql += " AND release = ?"
            args.append(release)
        return [Link(*row) for row in self._db.execute(sql, args)]

    def count(self, release: str) -> dict[str, int]:
        return {
            table: self._db.execute(f"SELECT COUNT(*) FROM {table} WHERE release = ?", (release,)).fetchone()[0]
            for table in ("symbols", "passes", "links")
        }

    @staticmethod
    def _pass(row: tuple) -> PassDef:
        release, def_name, argument, summary, description, options, file, line, end_line = row
        return PassDef(release, def_name, argument, summary, description, json.loads(options), file, line, end_line)
