"""Walking a directory the user points at: every entry is either returned or said to be unreadable.

`Path.rglob` leaves out a directory it may not list without a word; the source indexer and the IR
dump reader both need that said, the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["entries_under", "os_reason"]


def os_reason(exc: OSError) -> str:
    """`Permission denied`, or the error's type when the OS gave no message."""
    return exc.strerror or type(exc).__name__


def entries_under(root: Path, unlistable: Callable[[str, str], None], prune: tuple[str, ...] = ()) -> list[Path]:
    """Every entry under `root` that is not a directory (files, links, FIFOs), sorted. Links to
    directories are not followed; directories named in `prune` are not entered. A directory that
    cannot be listed is reported as `unlistable(path relative to root, reason)`."""
    def on_error(exc: OSError) -> None:
        unlistable(Path(exc.filename).relative_to(root).as_posix() if exc.filename else "?", os_reason(exc))

    found: list[Path] = []
    for directory, dirs, names in os.walk(root, onerror=on_error):
        dirs[:] = [d for d in dirs if d not in prune]
        found += [Path(directory) / n for n in names]
    return sorted(found)
