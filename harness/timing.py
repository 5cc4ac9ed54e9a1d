"""Device timing: Triton's own `do_bench` (device events, L2 flushed before every repetition), median
of the per-repetition times, input buffers rotated when they fit in cache.

`sample_calls` runs in the kernel's worker (device events can only be read by the process that
launched the work) and returns the raw per-repetition times; `timing_of` turns them into a `Timing`
in the judge. The CPU interpreter is never timed: its seconds say nothing about a kernel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.measurement import Timing

# Bound when this module is imported, in a kernel worker before any kernel: a kernel that replaces
# time.perf_counter afterwards does not change this clock (and is named by the integrity check).
_perf_counter = time.perf_counter

__all__ = ["REP_MS", "ROTATE_BELOW_BYTES", "WARMUP_MS", "rotation_count", "sample_calls", "timing_of"]

# Rotate inputs when one set is smaller than this (a few times the H200's 50 MB L2), so that even
# without the flush consecutive repetitions do not find their inputs in cache.
ROTATE_BELOW_BYTES = 256 << 20
_MAX_ROTATIONS = 8

# Default windows of one timing. The warm-up is long because an idle GPU starts at a low clock: on the
# H200 a 25 ms warm-up left kernels under 20 µs with up to 30% spread between two timings (before the
# runner's burn-in existed). Shorter windows are an option (`RunOptions.rep_ms`): the sampling error of
# the median shrinks as 1/sqrt(reps), and docs/benchmarks.md shows it is far below the noise floor.
WARMUP_MS = 200
REP_MS = 300


def rotation_count(arg_bytes: int) -> int:
    if arg_bytes <= 0 or arg_bytes >= ROTATE_BELOW_BYTES:
        return 1
    return max(1, min(_MAX_ROTATIONS, ROTATE_BELOW_BYTES // max(arg_bytes, 1)))


def sample_calls(call: Callable[[int], Any], sets: int, *, warm_cache: bool = False, warmup_ms: int = WARMUP_MS,
                 rep_ms: int = REP_MS, probe: tuple[float, Callable[[int], None]] | None = None) -> list[float]:
    """Per-repetition times (ms) of `call(i)`, i cycling through `sets` input sets; one call per repetition.

    The procedure is `triton.testing.do_bench`'s (a first call, an estimate over 5 calls, a warm-up of
    `warmup_ms`, then `rep_ms` of repetitions, each after the L2 is flushed with Triton's own flush
    buffer, each between two device events), written out here for one hook: `probe` = (fraction, hook)
    calls `hook(i)` before the repetition at that fraction of the run, with the index of the set that
    repetition uses, outside the timed region (before the flush). Without a GPU (the interpreter) the
    clock is the host's and nothing is flushed: the samples exercise the judge, and are never reported."""
    clock = _Clock()
    state = {"i": 0}

    def run() -> None:
        index = state["i"] % sets
        state["i"] += 1
        call(index)

    run()
    clock.synchronize()
    flush = clock.flush_buffer() if not warm_cache else None
    first, last = clock.event(), clock.event()
    first.record()
    for _ in range(5):
        clock.flush(flush)
        run()
    last.record()
    clock.synchronize()
    estimate = max(first.elapsed_time(last) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        run()
    repeats = max(1, int(rep_ms / estimate))
    probe_at = int(probe[0] * repeats) if probe is not None else -1
    starts = [clock.event() for _ in range(repeats)]
    ends = [clock.event() for _ in range(repeats)]
    for r in range(repeats):
        if r == probe_at and probe is not None:
            probe[1](state["i"] % sets)
        clock.flush(flush)
        starts[r].record()
        run()
        ends[r].record()
    clock.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


class _HostEvent:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _perf_counter()

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1000.0


class _Clock:
    """Device events and Triton's L2 flush on a GPU; the host's clock without one."""

    def __init__(self) -> None:
        try:
            from triton.runtime.driver import driver

            self.driver = driver.active
            self.device = self.driver.get_device_interface()
        except (RuntimeError, AttributeError, ImportError):  # no GPU driver: the interpreter
            self.driver = self.device = None

    def event(self) -> Any:
        return self.device.Event(enable_timing=True) if self.device is not None else _HostEvent()

    def synchronize(self) -> None:
        if self.device is not None:
            self.device.synchronize()

    def flush_buffer(self) -> Any:
        if self.driver is None:
            return None
        make = getattr(self.driver, "get_empty_cache_for_benchmark", None)
        if make is not None:
            return make()
        import torch

        return torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")

    def flush(self, buffer: Any) -> None:
        if buffer is None:
            return
        clear = getattr(self.driver, "clear_cache", None)
        if clear is not None:
            clear(buffer)
        else:
            buffer.zero_()


def timing_of(samples_ms: Sequence[float], *, warm_cache: bool, rotating_buffers: int, warmup_ms: int,
              rep_ms: int) -> Timing:
    """A Timing from raw per-repetition times: median and 20/80th percentiles in µs."""
    samples_us = sorted(float(s) * 1000.0 for s in samples_ms)
    if not samples_us:
        raise ValueError("no timing samples")
    return Timing(
        median_us=statistics.median(samples_us),
        p20_us=_quantile(samples_us, 0.2),
        p80_us=_quantile(samples_us, 0.8),
        reps=len(samples_us),
        l2_flushed=not warm_cache,
        rotating_buffers=rotating_buffers,
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
    )


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
