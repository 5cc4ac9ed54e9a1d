"""Sandboxed execution: each job runs in a worker process with a time limit.

A hang (time limit), a crash (segfault, abort), an illegal memory access or any CUDA error is that
job's failure with a clear reason; the caller survives, and the next job gets a healthy worker: a
worker that timed out, died or saw a device fault is replaced before the next job.

Workers are plain `python -m harness.worker` subprocesses (not multiprocessing), so a profiler can
wrap them (`wrap=` a function adding e.g. `ncu ... ` in front of the command).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.backends import backend_env
from harness.errors import UserFacingError
from harness.worker import MARK

__all__ = ["Worker"]

_START_TIMEOUT_S = 180.0  # importing torch and triton on a cold disk


class Worker:
    """One worker process for one backend; `submit` runs a job in it under a time limit."""

    def __init__(self, backend: str, *, wrap: Callable[[list[str]], list[str]] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.backend = backend
        self._wrap = wrap
        self._env = env or {}
        self._proc: subprocess.Popen[str] | None = None
        self._log: Any = None
        self._buffer = ""
        self._other: list[str] = []  # stdout lines that are not protocol: a wrapping profiler's output

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, **backend_env(self.backend), **self._env}
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "harness.worker"]
        if self._wrap is not None:
            cmd = self._wrap(cmd)
        self._log = tempfile.NamedTemporaryFile("w+", prefix="kb-worker-", suffix=".log", delete=False)
        self._buffer = ""
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                          env=env, text=True, start_new_session=True)
        except OSError as exc:
            raise UserFacingError(f"cannot start a worker ({cmd[0]}: {exc.strerror})",
                                  "check that the profiler or Python named is installed") from exc
        ready = self._read(_START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            reason = self._failure(ready, _START_TIMEOUT_S)
            raise UserFacingError(f"the {self.backend} worker did not start: {reason}",
                                  "run `python -m harness.worker` to see why (torch/triton importable?)")

    def submit(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run one job; always returns a dict: {"ok": True, "report": ...} or {"ok": False, ...}."""
        self.start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # the read below reports how the worker died
        answer = self._read(timeout)
        if isinstance(answer, dict) and "ok" in answer:
            if answer.get("fatal"):
                self.close()
            return answer
        failure = self._failure(answer, timeout)
        self.close()
        return {"ok": False, "failure": failure}

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

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: wrapped profilers too
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            proc.wait()
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

    def log_tail(self, lines: int = 6) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())

    # --- protocol --------------------------------------------------------------------------

    def _read(self, timeout: float) -> dict[str, Any] | str:
        """The next protocol message, or "timeout" / "eof"."""
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while True:
            while "\n" in self._buffer:
                line, self._buffer = self._buffer.split("\n", 1)
                if line.startswith(MARK):
                    return json.loads(line[len(MARK):])
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
