"""One device shared by the import's checks, with a way to have it alone.

The import judges several drafts at once on one GPU, each in its own judge (a reference worker and
kernel workers). Their memory adds up: on an 80 GB H100, fifteen at once ran the device out of memory
(docs/tritonbench.md), and a draft that met it had done nothing wrong. Such a draft is judged again
alone: no check starts while it waits for the others to finish, and none runs beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DeviceGate"]


class DeviceGate:
    """A shared/exclusive lock over the device; a waiting exclusive holder goes before new sharers, so a
    stream of checks cannot keep a retry waiting for ever."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._sharing = 0
        self._alone = False
        self._waiting_alone = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._state:
            self._state.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._sharing += 1
        try:
            yield
        finally:
            with self._state:
                self._sharing -= 1
                self._state.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._state:
            self._waiting_alone += 1
            self._state.wait_for(lambda: not self._alone and self._sharing == 0)
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._state:
                self._alone = False
                self._state.notify_all()
