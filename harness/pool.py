"""Fresh workers on demand: a candidate gets a worker no other kernel ever ran in, and starting one
(importing torch and triton: seconds) should not hold up the judge. A pool keeps `spares` workers
started ahead, in background threads, and hands one out per `take`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from harness.errors import UserFacingError
from harness.sandbox import Worker

__all__ = ["SparePool"]


class SparePool:
    def __init__(self, make: Callable[[], Worker], spares: int = 0, warm: bool = False) -> None:
        self._make = make
        self._warm = warm  # spares set up the device while they wait (harness.worker_main's `warm`)
        self._spares = max(0, spares)
        self._ready: list[Worker] = []
        self._starting = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = False
        self._error: UserFacingError | None = None
        self.fill()

    def fill(self) -> None:
        """Start workers in the background until `spares` are ready or starting."""
        with self._lock:
            wanted = self._spares - len(self._ready) - self._starting
            self._starting += max(0, wanted)
        for _ in range(max(0, wanted)):
            threading.Thread(target=self._start_one, daemon=True).start()

    def _start_one(self) -> None:
        worker = self._make()
        try:
            worker.start()
            if self._warm and not worker.submit({"op": "warm"}, 300).get("ok"):
                raise UserFacingError("a spare worker could not set up the device", "run `kb run TASK` to see why")
        except UserFacingError as exc:
            worker.close()
            with self._lock:
                self._starting -= 1
                self._error = exc
                self._changed.notify_all()
            return
        with self._lock:
            self._starting -= 1
            if self._closed:
                worker.close()
                return
            self._ready.append(worker)
            self._changed.notify_all()

    def take(self) -> Worker:
        """A started worker that has run nothing yet."""
        with self._lock:
            if not self._ready and self._starting and not self._error:
                self._changed.wait_for(lambda: self._ready or not self._starting or self._error is not None)
            worker = self._ready.pop(0) if self._ready else None
            error, self._error = self._error, None
        if worker is None:
            if error is not None:
                raise error
            worker = self._make()
            worker.start()
        self.fill()
        return worker

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        for worker in ready:
            worker.close()
