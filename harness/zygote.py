"""A fork server for workers: `python -m harness.zygote FD`.

Starting a worker means importing torch and triton, seconds each time; a candidate gets a fresh worker
every time. The zygote imports them once (never touching a device: CUDA must be initialised after the
fork) and forks a worker per request. The worker is the zygote's child: its stdin and stdout are pipes
the caller made and handed over with the request (SCM_RIGHTS), it leads a session of its own, and its
exit status is the zygote's to collect and report.

The zygote is a child subreaper too: a process that escapes a worker's own tree (the worker killed, or
its subreaper flag dropped) is reparented here, and `escapees` lists it for the caller to kill.

Caller side: `Zygote` (one per backend and process, `zygote_for`), `Forked` (what `subprocess.Popen`
gives, for harness.sandbox). Linux only; elsewhere workers are plain subprocesses.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Forked", "Zygote", "zygote_for"]

_PRELOAD = ("torch", "triton", "triton.language", "torch._dynamo", "triton.runtime.interpreter", "triton.compiler",
            "harness.worker_main",
            "harness.host", "harness.reference", "harness.exchange", "harness.tripwires", "harness.timing",
            "harness.task", "harness.capture")


# --- the server ------------------------------------------------------------------------------

def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    parent = os.getppid()
    from harness.processes import become_subreaper, children, reap

    become_subreaper()
    for name in _PRELOAD:
        __import__(name)
    _warm()
    workers: dict[int, int | None] = {}  # pid -> exit status (None while it runs)
    _send(sock, {"ready": True, "pid": os.getpid()})
    buffer = b""
    while True:
        reap(workers)
        if os.getppid() != parent:
            break  # the caller is gone
        ready, _, _ = select.select([sock], [], [], 0.2)
        if not ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        if not data:
            break
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            if request["op"] == "spawn":
                pid = _spawn(sock, request, fds)
                fds = []
                workers[pid] = None
                _send(sock, {"pid": pid})
            elif request["op"] == "status":
                reap(workers)
                _send(sock, {"status": workers.get(int(request["pid"]), "unknown")})
            elif request["op"] == "escapees":
                _send(sock, {"pids": [p for p in children(os.getpid()) if p not in workers]})
            elif request["op"] == "forget":
                workers.pop(int(request["pid"]), None)
                _send(sock, {})
    for pid in [*workers, *children(os.getpid())]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _warm() -> None:
    """What every worker's first call would otherwise pay for, on the CPU only (a device initialised
    before a fork is unusable after it): the lazy imports behind torch's function and dispatch modes."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    with Functions(), Dispatch():
        torch.empty(1).fill_(0.0)


def _spawn(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    try:  # the worker
        os.setsid()
        sock.close()
        stdin, stdout = fds
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.update(request.get("env", {}))
        sys.argv = ["harness.worker_main"]
        from harness.worker_main import main as worker_main

        worker_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported by the exit status; the traceback is in stderr
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


# --- the caller's side -----------------------------------------------------------------------

class Zygote:
    """A running fork server for one backend's environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parent.parent)
        full = {**os.environ, **env, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self._log = open(os.devnull, "w")  # noqa: SIM115 - the zygote's own output: nothing to say
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.zygote", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=full, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=self._log, start_new_session=True)
        theirs.close()
        self.sock = ours
        self._buffer = b""
        ready = self._read(180.0)
        if not ready.get("ready"):
            raise OSError("the zygote did not start")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, env: dict[str, str], stderr: str) -> Forked:
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        try:
            with self._lock:
                message = json.dumps({"op": "spawn", "env": env, "stderr": stderr}).encode() + b"\n"
                socket.send_fds(self.sock, [message], [in_read, out_write])
                pid = int(self._read(30.0)["pid"])
        finally:
            os.close(in_read)
            os.close(out_write)
        return Forked(self, pid, os.fdopen(in_write, "w", buffering=1), os.fdopen(out_read, "rb", buffering=0))

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            return self._read(30.0)

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], max(0.0, min(left, 1.0)))
            if ready:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    raise OSError("the zygote is gone")
                self._buffer += chunk
            elif left <= 0:
                raise OSError("the zygote did not answer")
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


class Forked:
    """A worker forked by a zygote, with the parts of `subprocess.Popen` the sandbox uses."""

    def __init__(self, zygote: Zygote, pid: int, stdin: Any, stdout: Any) -> None:
        self.zygote = zygote
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                status = self.zygote.ask({"op": "status", "pid": self.pid})["status"]
            except OSError:
                status = -signal.SIGKILL  # the zygote is gone, and its workers with it
            if status != "unknown" and status is not None:
                self.returncode = int(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            time.sleep(0.01)
        try:
            self.zygote.ask({"op": "forget", "pid": self.pid})
        except OSError:
            pass
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_ZYGOTES: dict[tuple[tuple[str, str], ...], Zygote | None] = {}  # None: it failed to start, do not retry
_LOCK = threading.Lock()


def zygote_for(env: dict[str, str]) -> Zygote | None:
    """The process's zygote for workers started with `env` (started on first use); None where there
    is none to be had (not Linux, or it failed to start), and workers are plain subprocesses."""
    if not sys.platform.startswith("linux") or os.environ.get("KB_NO_ZYGOTE"):
        return None
    key = tuple(sorted(env.items()))
    with _LOCK:
        if key in _ZYGOTES and _ZYGOTES[key] is None:
            return None
        zygote = _ZYGOTES.get(key)
        if zygote is not None and zygote.alive:
            return zygote
        try:
            zygote = Zygote(env)
        except OSError:
            zygote = None
        _ZYGOTES[key] = zygote
        return zygote


def _close_all() -> None:
    for zygote in _ZYGOTES.values():
        if zygote is not None:
            zygote.close()


import atexit  # noqa: E402 - registered once the functions it calls exist

atexit.register(_close_all)


if __name__ == "__main__":
    main()
