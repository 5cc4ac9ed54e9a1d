"""Processes a kernel leaves behind.

A kernel worker makes itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`) before it imports any
kernel, so whatever the kernel forks, double-forks or daemonizes stays in the worker's process tree while
the worker lives: the judge lists that tree after every job, and anything alive in it (zombies aside) is
a process that outlived the call. Every worker also carries a marker in its environment that its
descendants inherit; when a worker is closed, any process still carrying its marker is killed, wherever
it was reparented to. Linux only; elsewhere these are no-ops and the threat model says so.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

__all__ = ["MARKER", "become_subreaper", "carrying_marker", "children", "describe", "descendants", "kill", "reap"]

MARKER = "KB_WORKER_ID"
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(name, parent pid, state) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], int(fields[1]), fields[0]


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _children_by_parent() -> dict[int, list[int]]:
    """Live (not zombie) processes, by parent pid."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        info = _stat(p)
        if info is not None and info[2] != "Z":
            children.setdefault(info[1], []).append(p)
    return children


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    return _children_by_parent().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Live (not zombie) processes below `pid`, in no particular order."""
    children = _children_by_parent()
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def reap(statuses: dict[int, int | None] | None = None) -> None:
    """Collect every exited child (ours, and the orphans a subreaper adopted), so none lingers as a
    zombie; the exit status of those in `statuses` is kept there (-signal, or the exit code)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if statuses is not None and pid in statuses:
            statuses[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def carrying_marker(token: str) -> list[int]:
    """Live processes of this user whose environment holds MARKER=token."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for p in _pids():
        if p == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            continue
        info = _stat(p)
        if needle in environ.split(b"\0") and info is not None and info[2] != "Z":
            found.append(p)
    return found


def describe(pid: int) -> str:
    info = _stat(pid)
    return f"process {pid} ({info[0]})" if info else f"process {pid}"


def kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
