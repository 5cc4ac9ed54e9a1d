"""Sandboxed execution: each job runs in a worker process with a time limit.

A hang (time limit), a crash (segfault, abort), an illegal memory access or any CUDA error is that
job's failure with a clear reason; the caller survives, and the next job gets a healthy worker: a
worker that timed out, died or saw a device fault is replaced before the next job.

Workers are plain `python -m harness.worker_main` subprocesses (not multiprocessing), so a profiler can
wrap them (`wrap=` a function adding e.g. `ncu ... ` in front of the command). Each gets a secret in
its first line of input, and only answers carrying it count (harness.worker_main); a line on the channel
that claims to be an answer without it is reported as forged. Each carries a marker in its environment
(harness.processes) so that what it leaves behind can be found and killed.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import processes
from harness.backends import backend_env
from harness.errors import UserFacingError
from harness.worker_main import MARK
from harness.zygote import Forked, zygote_for

__all__ = ["FORGED", "Worker"]

# Environment a worker reads when it imports torch or triton: a forked worker inherits its zygote's, so
# workers that differ here come from different zygotes. TRITON_INTERPRET is read when a kernel is
# decorated, and triton.language decorates its own helpers (tl.max, tl.sum) when it is imported.
_READ_AT_IMPORT = ("TRITON_INTERPRET",)

_START_TIMEOUT_S = 180.0  # importing torch and triton on a cold disk
FORGED = ("a line on the harness's protocol channel did not carry this worker's secret: "
          "the kernel wrote on the channel in the harness's name")


class Worker:
    """One worker process for one backend; `submit` runs a job in it under a time limit.

    `directory`: the worker's exchange directory (tensors handed over as files land there); a fresh
    temporary one when not given. `env`: more environment for the process."""

    def __init__(self, backend: str, *, wrap: Callable[[list[str]], list[str]] | None = None,
                 env: dict[str, str] | None = None, directory: Path | None = None, restart: bool = True) -> None:
        self.backend = backend
        self.restart = restart  # False: a worker that failed stays gone (what it held is lost with it)
        self._started = False
        self._starting = threading.Lock()
        # One request in flight: the channel pairs a request with the next answer line, so two threads
        # writing at once would each read the other's answer.
        self._exchanging = threading.Lock()
        self._wrap = wrap
        self._env = env or {}
        self._own_dir = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="kb-worker-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(8)
        self._secret = ""
        self._proc: subprocess.Popen[str] | Forked | None = None
        self._log: Any = None
        self._buffer = ""
        self._other: list[str] = []  # stdout lines that are not protocol: a wrapping profiler's output
        self._scratch: str | None = None  # a directory backend_env made for this process (npu dumps)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        with self._starting:  # a background start and a first request may race
            self._start()

    def _start(self) -> None:
        if self.alive:
            return
        self.close(keep_dir=True)
        root = str(Path(__file__).resolve().parent.parent)
        backend = backend_env(self.backend)
        # Its dumps are read into the job's answers while the process lives: the directory goes with it.
        self._scratch = backend.get("TRITON_DUMP_DIR")
        extra = {**backend, **self._env, processes.MARKER: self.token}
        self._log = tempfile.NamedTemporaryFile("w+", prefix="kb-worker-", suffix=".log", delete=False)
        self._buffer, self._other = "", []
        self._secret = secrets.token_hex(16)
        # A zygote forks workers that import nothing anew; what is read at import must match its own.
        at_import = {k: v for k, v in extra.items() if k in _READ_AT_IMPORT}
        zygote = zygote_for(at_import) if self._wrap is None and self.backend != "npu" else None
        if zygote is not None:
            try:
                self._proc = zygote.spawn({k: v for k, v in extra.items() if k not in at_import}, self._log.name)
            except OSError:
                zygote = None
        if zygote is None:
            env = {**os.environ, **extra}
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            cmd = [sys.executable, "-m", "harness.worker_main"]
            if self._wrap is not None:
                cmd = self._wrap(cmd)
            try:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                              env=env, text=True, start_new_session=True)
            except OSError as exc:
                raise UserFacingError(f"cannot start a worker ({cmd[0]}: {exc.strerror})",
                                      "check that the profiler or Python named is installed") from exc
        hello = {"secret": self._secret, "dir": str(self.directory), "backend": self.backend}
        self._write(hello)
        ready = self._read(_START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            reason = self._failure(ready, _START_TIMEOUT_S)
            raise UserFacingError(f"the {self.backend} worker did not start: {reason}",
                                  "run `python -m harness.worker_main` to see why (torch/triton importable?)")
        self._started = True  # from here on, with restart off, a worker that dies stays gone

    def submit(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run one job; always returns a dict: {"ok": True, "answer": ...} or {"ok": False, ...}."""
        with self._exchanging:
            return self._submit(job, timeout)

    def _submit(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self._started and not self.restart and not self.alive:
            return {"ok": False, "failure": "its worker failed earlier and is gone"}
        self.start()
        self._write(job)
        answer = self._read(timeout)
        if isinstance(answer, dict) and "ok" in answer:
            if answer.get("ok") and (answer.get("answer") or {}).get("fatal"):
                self.close(keep_dir=True)
            return answer
        failure = FORGED if answer == "forged" else self._failure(answer, timeout)
        self.close(keep_dir=True)
        return {"ok": False, "failure": failure, "forged": answer == "forged"}

    def finish(self, timeout: float) -> str:
        """End the worker by closing its input, so a wrapping profiler writes its report; returns
        everything on stdout that was not protocol (that report)."""
        if self._proc is None:
            return "\n".join(self._other)
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        while self._read(timeout) not in ("eof", "timeout"):
            pass
        text = "\n".join(self._other + [self._buffer])
        self.close()
        return text

    def leftovers(self) -> list[int]:
        """Live processes the worker's jobs started that are still running: its tree (it is their
        subreaper), and what escaped it to its zygote."""
        if not self.alive or self._proc is None:
            return []
        return processes.descendants(self._proc.pid) + _escapees(self._proc)

    def close(self, keep_dir: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stray = processes.descendants(proc.pid) if proc.poll() is None else []
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: wrapped profilers too
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            processes.kill(stray)
            proc.wait()
            processes.kill(_escapees(proc) + processes.carrying_marker(self.token))  # whatever escaped the tree
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        if self._log is not None:
            self._log.close()
            os.unlink(self._log.name)
            self._log = None
        import shutil

        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        if not keep_dir and self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 6) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())

    # --- protocol --------------------------------------------------------------------------

    def _write(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the read that follows reports how the worker died

    def _read(self, timeout: float) -> dict[str, Any] | str:
        """The next protocol message, or "timeout" / "eof" / "forged"."""
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        signed = MARK + self._secret + " "
        while True:
            while "\n" in self._buffer:
                line, self._buffer = self._buffer.split("\n", 1)
                if line.startswith(signed):
                    return json.loads(line[len(signed):])
                if line.startswith(MARK):
                    return "forged"
                self._other.append(line)
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return "eof"
                self._buffer += chunk.decode(errors="replace")

    def _failure(self, answer: Any, timeout: float) -> str:
        assert self._proc is not None
        if answer == "timeout":
            return f"timed out after {timeout:.0f} s (a hang, or far slower than allowed); the worker was killed"
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        tail = self.log_tail()
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            what = {"SIGSEGV": "a crash (segmentation fault)", "SIGABRT": "an abort", "SIGBUS": "a bus error",
                    "SIGKILL": "killed (out of memory?)", "SIGFPE": "an arithmetic fault"}.get(name, "a signal")
            return f"the worker died with {name}: {what}" + (f"; last output: {tail}" if tail else "")
        return f"the worker exited with status {code}" + (f"; last output: {tail}" if tail else "")


def _escapees(proc: Any) -> list[int]:
    """What escaped a forked worker's tree to its zygote (the zygote is a subreaper too); none for a
    plain subprocess."""
    zygote = getattr(proc, "zygote", None)
    if zygote is None:
        return []
    try:
        return [int(p) for p in zygote.ask({"op": "escapees"})["pids"]]
    except OSError:
        return []
