"""The device's launch floor: the time of an empty Triton launch, timed the way the harness times any
kernel (harness/timing.py: L2 flush, device events, the host's launch work covered). No rewrite of a
kernel that is itself a Triton launch can take less, so the roofline bound on a small case is what
is left above this floor, not what is left above the bandwidth line.

Imported only when the ceilings are measured (harness/roofline.py): it compiles a kernel."""

from __future__ import annotations

import statistics
from typing import Any

import triton

from harness.timing import sample_calls

__all__ = ["launch_floor_us"]


@triton.jit
def _empty() -> None:
    pass


def launch_floor_us(warmup_ms: int = 50, rep_ms: int = 200) -> float:
    """Median µs of a one-program launch of an empty kernel. An empty kernel takes no arguments, so a
    real kernel's launch (arguments to pack, a grid to compute) is slower: the floor errs low, and
    bounds computed with it err high."""

    def call(_index: int, start: Any, stop: Any) -> None:
        start()
        _empty[(1,)]()
        stop()

    samples_ms = sample_calls(call, 1, warmup_ms=warmup_ms, rep_ms=rep_ms)
    return statistics.median(samples_ms) * 1000.0
