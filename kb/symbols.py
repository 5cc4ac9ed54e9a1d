"""The symbol store: exact lookups that vectors cannot do, and the cross-layer links L4 walks.

SQLite, one file per KB home, rows keyed by release. A release is replaced in one transaction, so a
crash mid-index leaves the previous rows intact.

Tables:
    symbols  definitions and uses: (release, name, kind, lang, file, line, end_line, role, chunk_id, scope, digest)
             role: def | decl | ref (a call) | example (an op used in a lit test) | emit (a diagnostic message)
    passes   TableGen pass definitions: (release, def_name, argument, summary, description, options, ...)
    links    typed edges between names: (release, src_kind, src, relation, dst_kind, dst, evidence)
    files    what each release was built from: (release, path, sha256, lang, chunks)
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserFacingError

__all__ = ["Link", "PassDef", "SourceFile", "Symbol", "SymbolStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS symbols (
    release TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, lang TEXT NOT NULL,
    file TEXT NOT NULL, line INTEGER NOT NULL, end_line INTEGER NOT NULL, role TEXT NOT NULL,
    chunk_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS symbols_name ON symbols (name COLLATE NOCASE, release);
CREATE TABLE IF NOT EXISTS files (
    release TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL, lang TEXT NOT NULL, chunks INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS files_release ON files (release, path);
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
-- A release whose chunks are being published: the collection its manifest is about to name. Set
-- just before the manifest switch, cleared with the symbols' swap (one transaction): a row naming
-- the live collection means a build died in between, chunks new and symbols old.
CREATE TABLE IF NOT EXISTS publishing (release TEXT PRIMARY KEY, collection TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS links_src ON links (src, release);
CREATE INDEX IF NOT EXISTS links_dst ON links (dst, release);
"""
# Columns added after the first schema: (table, column, declaration). Older stores get them on open.
_ADDED_COLUMNS = (
    ("symbols", "scope", "TEXT NOT NULL DEFAULT ''"),
    ("symbols", "digest", "TEXT NOT NULL DEFAULT ''"),
    ("passes", "constructor", "TEXT NOT NULL DEFAULT ''"),
    ("links", "dst_file", "TEXT NOT NULL DEFAULT ''"),
)
_TABLES = ("symbols", "passes", "links", "files", "publishing")


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
    role: str = "def"  # def | decl | ref | example | emit
    chunk_id: str = ""
    scope: str = ""  # enclosing class/namespace; for `emit`, the function that emits the message
    digest: str = ""  # hash of a definition's text

    @property
    def qualified(self) -> str:
        return f"{self.scope}::{self.name}" if self.scope and self.role in ("def", "decl") else self.name

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
    constructor: str = ""

    def cite(self) -> str:
        return f"{self.file}:{self.line}@{self.release}"


@dataclass(frozen=True)
class SourceFile:
    """One file a release was built from."""

    release: str
    path: str
    sha256: str
    lang: str
    chunks: int


@dataclass(frozen=True)
class Link:
    """A typed edge, e.g. pipeline-call `passes.ttgpuir.add_coalesce` -runs-> pass `tritongpu-coalesce`.

    `evidence` says how the link was established ("exact", "name-match", ...) so a reader can
    weigh it. `dst_file` is the file defining `dst`, where the linker knows it: two passes' classes
    may share a name (PlanMemoryPass in PlanMemory.cpp and regbase/PlanMemory.cpp).
    """

    release: str
    src_kind: str
    src: str
    relation: str
    dst_kind: str
    dst: str
    evidence: str
    dst_file: str = ""


class SymbolStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=60)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            for table, column, declaration in _ADDED_COLUMNS:
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in columns:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        except sqlite3.DatabaseError as exc:
            raise UserFacingError(
                f"symbol store {path} is unreadable ({exc})",
                "delete it and re-run `kb index compiler --installed` (the other stores are unaffected)",
            ) from exc

    def close(self) -> None:
        self._db.close()

    # -- writing -------------------------------------------------------------------------------
    def replace_release(
        self, release: str, symbols: Iterable[Symbol], passes: Iterable[PassDef], links: Iterable[Link],
        files: Iterable[SourceFile] = (),
    ) -> None:
        """Swap every row of `release` for the given ones, atomically."""
        with self._db:
            for table in _TABLES:
                self._db.execute(f"DELETE FROM {table} WHERE release = ?", (release,))
            self._db.executemany(
                "INSERT INTO symbols (release, name, kind, lang, file, line, end_line, role, chunk_id, scope, digest) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [(s.release, s.name, s.kind, s.lang, s.file, s.line, s.end_line, s.role, s.chunk_id, s.scope, s.digest)
                 for s in symbols],
            )
            self._db.executemany(
                "INSERT INTO passes (release, def_name, argument, summary, description, options, file, line, end_line,"
                " constructor) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (p.release, p.def_name, p.argument, p.summary, p.description, json.dumps(p.options), p.file,
                     p.line, p.end_line, p.constructor)
                    for p in passes
                ],
            )
            self._db.executemany(
                "INSERT INTO links (release, src_kind, src, relation, dst_kind, dst, evidence, dst_file)"
                " VALUES (?,?,?,?,?,?,?,?)",
                [(lk.release, lk.src_kind, lk.src, lk.relation, lk.dst_kind, lk.dst, lk.evidence, lk.dst_file)
                 for lk in links]
            )
            self._db.executemany("INSERT INTO files VALUES (?,?,?,?,?)",
                                 [(f.release, f.path, f.sha256, f.lang, f.chunks) for f in files])

    def mark_publishing(self, release: str, collection: str) -> None:
        """Record that `release`'s manifest is about to name `collection` (see the `publishing` table)."""
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO publishing VALUES (?, ?)", (release, collection))

    def publishing(self, release: str) -> str | None:
        """The collection a build of `release` was publishing when it stopped, if one did."""
        row = self._db.execute("SELECT collection FROM publishing WHERE release = ?", (release,)).fetchone()
        return row[0] if row else None

    def drop_release(self, release: str) -> None:
        with self._db:
            for table in _TABLES:
                self._db.execute(f"DELETE FROM {table} WHERE release = ?", (release,))

    # -- reading -------------------------------------------------------------------------------
    def releases(self) -> list[str]:
        return [r for (r,) in self._db.execute(
            "SELECT release FROM symbols UNION SELECT release FROM files ORDER BY release")]

    def find(self, name: str, release: str | None = None, role: str | None = None) -> list[Symbol]:
        """Symbols named `name`, case-insensitive, definitions first.

        `A::b` matches `b` defined in a scope ending with `A` (else any `b`); a dotted name
        (`tt.load`, `passes.ttgpuir.add_coalesce`) matches exactly, else by its last component.
        """
        def query(text: str) -> list[Symbol]:
            sql = "SELECT * FROM symbols WHERE name = ? COLLATE NOCASE"
            args: list[object] = [text]
            if release:
                sql += " AND release = ?"
                args.append(release)
            if role:
                sql += " AND role = ?"
                args.append(role)
            order = " ORDER BY CASE role WHEN 'def' THEN 0 WHEN 'decl' THEN 1 WHEN 'emit' THEN 2 ELSE 3 END, file, line"
            return [Symbol(*row) for row in self._db.execute(sql + order, args)]

        if "::" in name:
            short = name.split("::")[-1]
            found = query(short)
            scoped = [s for s in found if s.qualified.lower().endswith(name.lower())]
            # Uses carry no class (`loadDGlobal(...)` is a call by short name): they stay.
            return scoped + [s for s in found if s.role not in ("def", "decl") and s not in scoped] if scoped else found
        found = query(name)
        if not found and "." in name:
            found = query(name.rsplit(".", 1)[-1])
        return found

    def pass_by_argument(self, argument: str, release: str | None = None) -> PassDef | None:
        return self._one_pass("argument", argument, release)

    def pass_by_def(self, def_name: str, release: str | None = None) -> PassDef | None:
        return self._one_pass("def_name", def_name, release)

    def _one_pass(self, column: str, value: str, release: str | None) -> PassDef | None:
        sql = f"SELECT * FROM passes WHERE {column} = ?"  # column: one of the two literals above
        args: list[object] = [value]
        if release:
            sql += " AND release = ?"
            args.append(release)
        row = self._db.execute(sql, args).fetchone()
        return self._pass(row) if row else None

    def passes(self, release: str) -> Iterator[PassDef]:
        for row in self._db.execute("SELECT * FROM passes WHERE release = ? ORDER BY argument", (release,)):
            yield self._pass(row)

    def links_of(self, name: str, release: str | None = None) -> list[Link]:
        sql = ("SELECT release, src_kind, src, relation, dst_kind, dst, evidence, dst_file FROM links"
               " WHERE (src = ? OR dst = ?)")
        args: list[object] = [name, name]
        if release:
            sql += " AND release = ?"
            args.append(release)
        return [Link(*row) for row in self._db.execute(sql, args)]

    def pipeline_calls_of(self, binding: str, release: str | None = None) -> list[str]:
        """Pipeline calls (`passes.ttir.add_auto_blockify`) that reach the pybind binding `binding`
        (`add_auto_blockify`): links name the call as Python writes it."""
        sql = "SELECT DISTINCT src FROM links WHERE src_kind = 'pipeline-call' AND src LIKE ?"
        args: list[object] = [f"%.{binding}"]
        if release:
            sql += " AND release = ?"
            args.append(release)
        return [row[0] for row in self._db.execute(sql, args) if row[0].endswith(f".{binding}")]

    def rewrite_patterns(self, op: str, release: str) -> list[str]:
        """Rewrite-pattern classes that match the op `op` (`tt.dot`), or, when no op has that full
        name, ops named by its last part (`tl.dot` -> `tt.dot`; `program_id` -> `tt.get_program_id`)."""
        last = op.rsplit(".", 1)[-1]
        rows = [(src, dst) for src, dst in self._db.execute(
            "SELECT src, dst FROM links WHERE release = ? AND relation = 'rewrites'", (release,))
            if dst == op or dst.endswith((f".{last}", f"_{last}"))]  # a few hundred rows per release
        exact = [src for src, dst in rows if dst == op]
        if exact:
            return exact
        by_part = [src for src, dst in rows if dst.rsplit(".", 1)[-1] == last]
        return by_part or [src for src, _ in rows]

    def find_message(self, message: str, release: str | None = None, limit: int = 5) -> list[Symbol]:
        """Diagnostics whose literal text the printed `message` contains, best (longest) first.

        Emitted literals lose their streamed values (`"vec = " << vec`), so a printed remark is matched
        when the literal's words appear in it in order. A remark pasted whole has its location and
        severity (`k.py:8:9: remark: `) left out; a fragment ("vectorization fails", or a remark cut
        short) matches the literals holding its words, values aside, in order."""
        words = _DIAGNOSTIC_PREFIX.sub("", message.strip()).split()
        fixed = [w for w in words if not _VALUE.fullmatch(w)]  # the words a literal holds: no streamed values
        sql = "SELECT * FROM symbols WHERE role = 'emit'"
        args: list[object] = []
        if release:
            sql += " AND release = ?"
            args.append(release)
        # Prefilter on the first real word: a literal usually starts the message, values follow.
        anchor = next((w.strip(":,.") for w in words if w.strip(":,.").isalpha() and len(w) >= 4), "")
        if anchor:
            sql += " AND name LIKE ?"
            args.append(f"%{anchor}%")
        found = []
        for row in self._db.execute(sql, args):
            sym = Symbol(*row)
            literal = _ESCAPE.sub(" ", sym.name).split()  # "... not supported\n" as stored from source
            if _in_order(literal, words) or (len(fixed) >= 2 and _in_order(fixed, literal)):
                found.append(sym)
        return sorted(found, key=lambda s: -len(s.name))[:limit]

    def search_names(self, pattern: str, release: str | None = None, limit: int = 20) -> list[Symbol]:
        """Definitions whose name contains `pattern` (case-insensitive)."""
        sql = "SELECT * FROM symbols WHERE role IN ('def', 'decl') AND name LIKE ?"
        args: list[object] = [f"%{pattern}%"]
        if release:
            sql += " AND release = ?"
            args.append(release)
        return [Symbol(*row) for row in self._db.execute(sql + " ORDER BY length(name), name LIMIT ?", [*args, limit])]

    def files(self, release: str) -> dict[str, SourceFile]:
        rows = self._db.execute("SELECT * FROM files WHERE release = ?", (release,))
        return {row[1]: SourceFile(*row) for row in rows}

    def definitions(self, release: str) -> dict[tuple[str, str, str], Symbol]:
        """(scope-qualified name, kind, file) -> definition, for comparing releases."""
        rows = self._db.execute(
            "SELECT * FROM symbols WHERE release = ? AND role = 'def' AND kind NOT IN ('namespace', 'macro')",
            (release,))
        return {(s.qualified, s.kind, s.file): s for s in (Symbol(*row) for row in rows)}

    def count(self, release: str) -> dict[str, int]:
        return {
            table: self._db.execute(f"SELECT COUNT(*) FROM {table} WHERE release = ?", (release,)).fetchone()[0]
            for table in _TABLES
        }

    @staticmethod
    def _pass(row: tuple) -> PassDef:
        release, def_name, argument, summary, description, options, file, line, end_line, constructor = row
        return PassDef(release, def_name, argument, summary, description, json.loads(options), file, line, end_line,
                       constructor)


# /tmp/k/scale.py:8:9: remark: Warning: vectorization fails ...   (as MLIR prints a diagnostic)
# Severity in lower case, as MLIR prints it: a message's own "Warning: ..." stays.
_DIAGNOSTIC_PREFIX = re.compile(r"^(?:\S+:\d+:\d+:\s*)?(?:remark|warning|error|note):\s+")
_ESCAPE = re.compile(r"\\[ntr]")


_VALUE = re.compile(r"[-+]?(?:\d[\w.]*|0x[0-9a-f]+)|\.\.\.|…", re.IGNORECASE)


def _in_order(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(word == h for h in it) for word in needle)
