"""The KB home: where every store lives, how it is recognised, and who may write to it.

Layout (all under one directory, `$KB_HOME`, `--home`, or the per-user data directory):

    kb-home.json        marker: schema version; a directory without it is not ours
    chroma/             embedded chroma (unless $KB_CHROMA_URL points at a shared server)
    lexical/<index>/    BM25 per published index
    manifests/<c>__<r>.json   one manifest per (corpus, release): which collection is live
    symbols.sqlite      symbol store (definitions, references, cross-layer links, passes)
    embed-cache.sqlite  embeddings by content hash
    parse-cache.sqlite  parsed source files by content hash (re-indexing re-parses only changed files)
    models/<name>/      embedding models tuned on indexed source (`kb embedder tune`); models/active.json
                        names the one new indexes are built with
    compile-cache/      harness artifacts by content hash
    ir/<name>.b<id>.json  step timelines of indexed IR dumps (the manifest names the live one)
    runs/<run>/         optimize runs (rounds.sqlite, candidate kernels, best.py)
    patterns/stats.json pattern statistics kept by `kb synthesize`; patterns/learned/*.yaml learned patterns
    lock                fcntl lock: one writer, or any number of readers
    build.lock          fcntl lock: one index build at a time (it holds `lock` only to publish)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness.errors import UserFacingError

__all__ = ["HOME_SCHEMA_VERSION", "KBHome"]

HOME_SCHEMA_VERSION = 1
MARKER = "kb-home.json"
DEFAULT_LOCK_WAIT_S = 30.0


@dataclass(frozen=True)
class KBHome:
    root: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> KBHome:
        if home is None:
            home = os.environ.get("KB_HOME")
        if home is None:
            import platformdirs

            home = platformdirs.user_data_dir("kernel-kb", appauthor=False)
        return cls(Path(home).expanduser().resolve())

    @classmethod
    def if_present(cls, home: str | os.PathLike[str] | None = None) -> KBHome | None:
        """The home `resolve` names if it exists (it must then be sound), else None: a diagnosis then
        answers from the kernel and its IR alone."""
        found = cls.resolve(home)
        if not found.root.exists():
            return None
        found.validate()
        return found

    # -- paths ---------------------------------------------------------------------------------
    @property
    def chroma_dir(self) -> Path:
        return self.root / "chroma"

    @property
    def lexical_dir(self) -> Path:
        return self.root / "lexical"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests"

    @property
    def symbols_db(self) -> Path:
        return self.root / "symbols.sqlite"

    @property
    def embed_cache_db(self) -> Path:
        return self.root / "embed-cache.sqlite"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def parse_cache_db(self) -> Path:
        return self.root / "parse-cache.sqlite"

    @property
    def ir_dir(self) -> Path:
        """Step timelines of indexed IR dumps (`kb index ir`), read by `kb ir trace`."""
        return self.root / "ir"

    def timeline_files(self, ir_name: str) -> list[Path]:
        """Every timeline file written for `ir_name` (one per build; its manifest names the live one)."""
        # Exactly `<name>.b<8 hex>.json`: a glob `<name>.b*` would take `<name>.bf16.b1234abcd.json` too.
        own = re.compile(re.escape(re.sub(r"[^A-Za-z0-9._-]", "-", ir_name)) + r"\.b[0-9a-f]{8}\.json")
        return sorted(p for p in self.ir_dir.glob("*.json") if own.fullmatch(p.name)) if self.ir_dir.is_dir() else []

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def patterns_dir(self) -> Path:
        return self.root / "patterns"

    @property
    def compile_cache(self) -> Path:
        return self.root / "compile-cache"

    # -- identity ------------------------------------------------------------------------------
    def ensure(self) -> KBHome:
        """Create the home if needed; refuse a directory that is not a kernel-kb home."""
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise UserFacingError(f"KB home {self.root} is a file", "pass a directory with --home or $KB_HOME")
        if self.root.is_dir() and not marker.exists() and any(self.root.iterdir()):
            raise UserFacingError(
                f"{self.root} is not a kernel-kb home (no {MARKER}) and is not empty",
                "pass an empty or new directory with --home / $KB_HOME; kernel-kb will not write into it",
            )
        if not marker.exists():
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                tmp = marker.with_suffix(".tmp")
                tmp.write_text(json.dumps({"kind": "kernel-kb", "schema_version": HOME_SCHEMA_VERSION}))
                os.replace(tmp, marker)
            except OSError as exc:  # a file on the way (KB_HOME=some/file/home), no permission, a full disk
                raise UserFacingError(f"cannot create the KB home {self.root}: {exc.strerror or type(exc).__name__}",
                                      "pass a directory you can write with --home or $KB_HOME") from None
        self.validate()
        return self

    def validate(self, build_hint: str = "`kb index patterns` and `kb index compiler --installed`") -> None:
        """Fail clearly on a corrupt or foreign home before any store is opened; `build_hint` names the
        commands that build what the caller reads."""
        marker = self.root / MARKER
        if not marker.exists():
            raise UserFacingError(f"no knowledge base at {self.root}", f"build one with {build_hint}, or pass --home")
        try:
            data = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserFacingError(
                f"KB home marker {marker} is corrupt ({exc.__class__.__name__})",
                "remove the directory and rebuild it with `kb index patterns` and `kb index compiler --installed`",
            ) from exc
        if not isinstance(data, dict) or data.get("kind") != "kernel-kb":
            raise UserFacingError(f"{self.root} is not a kernel-kb home ({MARKER} is foreign)", "pass another --home")
        if data.get("schema_version") != HOME_SCHEMA_VERSION:
            raise UserFacingError(
                f"KB home {self.root} has schema {data.get('schema_version')}, this kb needs {HOME_SCHEMA_VERSION}",
                "rebuild it into a new --home",
            )

    # -- concurrency ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, *, write: bool, wait_s: float | None = None) -> Iterator[None]:
        """Hold the home's lock: exclusive for writers, shared for readers.

        Embedded chroma and SQLite tolerate one writer process per directory (a second
        PersistentClient can hang for minutes, chroma-core/chroma#7040), so writers exclude
        everyone and readers exclude writers. A busy lock is waited for with a message, then
        refused with one.
        """
        with self._flock("lock", exclusive=write, wait_s=wait_s, busy="using" if write else "writing"):
            yield

    @contextlib.contextmanager
    def build_lock(self, wait_s: float | None = None) -> Iterator[None]:
        """Exclusive among index builds only. A long build parses and embeds under this lock alone,
        into the content-addressed caches no reader opens, and takes the home's write `lock` just
        to store and publish: queries keep answering from the previous index meanwhile."""
        with self._flock("build.lock", exclusive=True, wait_s=wait_s, busy="building an index in"):
            yield

    @contextlib.contextmanager
    def _flock(self, name: str, *, exclusive: bool, wait_s: float | None, busy: str) -> Iterator[None]:
        wait_s = float(os.environ.get("KB_LOCK_WAIT_S", DEFAULT_LOCK_WAIT_S)) if wait_s is None else wait_s
        path = self.root / name
        with self._open_lock_file(path, exclusive) as fh:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            deadline = time.monotonic() + wait_s
            told = False
            while True:
                try:
                    fcntl.flock(fh, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _lock_holder(path)
                    if time.monotonic() >= deadline:
                        raise UserFacingError(
                            f"the KB at {self.root} is busy: another kb process is {busy} it{holder}",
                            "wait for it to finish and run again (or raise $KB_LOCK_WAIT_S)",
                        ) from None
                    if not told:
                        print(f"waiting for another kb process{holder} to release {self.root} …", file=sys.stderr)
                        told = True
                    time.sleep(0.2)
            if exclusive:
                fh.seek(0)
                fh.truncate()
                fh.write(f"{os.getpid()} {' '.join(sys.argv[:3])}")
                fh.flush()
            try:
                yield
            finally:
                if exclusive:  # the pid names the holder only while it holds the lock
                    fh.seek(0)
                    fh.truncate()
                    fh.flush()
                fcntl.flock(fh, fcntl.LOCK_UN)


    def _open_lock_file(self, path: Path, exclusive: bool) -> IO[str]:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            return open(path, "a+")
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # Even a query needs write access: embedded chroma and SQLite in WAL mode write when
            # they open. Said here, once, before a store fails with advice to delete itself.
            why = f"the KB at {self.root} is not writable here ({exc.strerror})"
            if exclusive:
                raise UserFacingError(why, "index into a home you can write: pass --home DIR or set $KB_HOME") from None
            raise UserFacingError(why + ", and its stores write even when queried",
                                  f"copy it somewhere writable (cp -r {self.root} DIR) and pass --home DIR") from None


def open_cache_db(path: Path, create_sql: str) -> sqlite3.Connection:
    """A cache's SQLite file in WAL mode, with its table. A cache holds nothing that cannot be
    computed again: a file that is not a database (overwritten, cut short) is moved aside to
    `<name>.corrupt` and started afresh, with a line on stderr, instead of failing every index run.
    A locked or full disk is not corruption and is raised as it is: the cache may hold hours of work."""
    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout=60)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(create_sql)
        except BaseException:
            db.close()
            raise
        return db

    try:
        return connect()
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) or not re.search(r"not a database|malformed", str(exc)):
            raise
        print(f"note: the cache {path} was unreadable ({exc}); moved it to {path.name}.corrupt and started afresh",
              file=sys.stderr)
        os.replace(path, path.with_name(path.name + ".corrupt"))
        for stale in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            stale.unlink(missing_ok=True)
        return connect()


def _lock_holder(path: Path) -> str:
    """` (pid N command)` of the writer named in the lock file, if it is still alive. A writer killed
    with -9 never clears its line; the lock may then be held by readers, which write none."""
    with contextlib.suppress(OSError):
        text = path.read_text().strip()
        pid = text.split(maxsplit=1)[0] if text else ""
        if pid.isdigit() and _alive(int(pid)):
            return f" (pid {text})"
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
