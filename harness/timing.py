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
from dataclasses import replace
from typing import Any

from harness.measurement import Timing

# Bound when this module is imported, in a kernel worker before any kernel: a kernel that replaces
# time.perf_counter afterwards does not change this clock (and is named by the integrity check).
_perf_counter = time.perf_counter

__all__ = ["MAX_TIMING_PASSES", "REP_MS", "RETIME_SPREAD", "ROTATE_BELOW_BYTES", "WARMUP_MS", "interleaved_timings",
           "merge_pair", "rotation_count", "sample_calls", "timing_of"]

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


# A case whose two timings of some kernel disagree by more than this is timed again (ABAB again, after
# a burn-in), up to MAX_TIMING_PASSES passes, keeping the steadiest pass. On the H200 the end-of-run
# measurement of matmul once read 0.32x for a tile the round had timed at 1.11x on 512^3, its two
# timings 71% apart, while the other GPU's job ran on the same host.
RETIME_SPREAD = 0.10
MAX_TIMING_PASSES = 3


def rotation_count(arg_bytes: int) -> int:
    if arg_bytes <= 0 or arg_bytes >= ROTATE_BELOW_BYTES:
        return 1
    return max(1, min(_MAX_ROTATIONS, ROTATE_BELOW_BYTES // max(arg_bytes, 1)))


def sample_calls(call: Callable[[int, Callable[[], None], Callable[[], None]], Any], sets: int, *,
                 warm_cache: bool = False, warmup_ms: int = WARMUP_MS, rep_ms: int = REP_MS,
                 probe: tuple[float, Callable[[int], None]] | None = None) -> list[float]:
    """Per-repetition times (ms) of `call(i, start, stop)`, i cycling through `sets` input sets; one call
    per repetition. The call runs `start()` right before the kernel's entry and `stop()` right after
    it: whatever else it does around the entry (the worker's watch) stays outside the timed region.
    `start()` flushes the L2 and then records the start event, so that the flush keeps the device busy
    while the host prepares the launch, as in do_bench (the host's work before the flush is not timed,
    and is not raced against the flush either).

    The procedure is `triton.testing.do_bench`'s (a first call, an estimate over 5 calls, a warm-up of
    `warmup_ms`, then `rep_ms` of repetitions, each after the L2 is flushed with Triton's own flush
    buffer, each between two device events), written out here for two reasons. After the flush a spin
    kernel as long as the host's slowest tenth of calls keeps the device busy while the host prepares
    the launch (on the H200, Triton 3.6's flush lasts ~25 µs: a guarded call's host work outlasted it,
    the start event fired on an idle device, and softmax timed 2x slow). And one hook: `probe` = (fraction, hook)
    calls `hook(i)` before the repetition at that fraction of the run, with the index of the set that
    repetition uses, outside the timed region (before the flush). Without a GPU (the interpreter) the
    clock is the host's and nothing is flushed: the samples exercise the judge, and are never reported."""
    clock = _Clock()
    state = {"i": 0}

    def run(start: Callable[[], None] = _nothing, stop: Callable[[], None] = _nothing) -> None:
        index = state["i"] % sets
        state["i"] += 1
        call(index, start, stop)

    run()
    clock.synchronize()
    flush = clock.flush_buffer() if not warm_cache else None
    first, last = clock.event(), clock.event()
    first.record()
    for _ in range(5):
        run(lambda: clock.flush(flush))
    last.record()
    clock.synchronize()
    estimate = max(first.elapsed_time(last) / 5, 1e-3)
    host_s = []
    for _ in range(max(1, int(warmup_ms / estimate))):
        t = _perf_counter()
        run()
        host_s.append(_perf_counter() - t)
    # The host's time from the flush to the kernel's launch must not show in the timing: a spin on the
    # device after the flush, as long as the host's slowest tenth of calls, keeps it busy meanwhile.
    cover_us = 1.25e6 * sorted(host_s)[int(0.9 * (len(host_s) - 1))] + 10.0 if clock.device is not None else 0.0
    # The spin is device time each repetition spends: the window stays `rep_ms` (fewer repetitions).
    repeats = max(1, int(rep_ms / (estimate + min(cover_us, 5000.0) / 1000.0)))
    probe_at = int(probe[0] * repeats) if probe is not None else -1
    starts = [clock.event() for _ in range(repeats)]
    ends = [clock.event() for _ in range(repeats)]
    for r in range(repeats):
        if r == probe_at and probe is not None:
            probe[1](state["i"] % sets)

        def start(event: Any = starts[r]) -> None:
            clock.flush(flush)
            clock.cover(cover_us)
            event.record()

        run(start, ends[r].record)
    clock.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _nothing() -> None:
    pass


class _HostEvent:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
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
        self.cycles_per_us: float | None = None

    def event(self) -> Any:
        return self.device.Event(enable_timing=True) if self.device is not None else _HostEvent()

    def synchronize(self) -> None:
        if self.device is not None:
            self.device.synchronize()

    def cover(self, us: float) -> None:
        """Keep the device busy for about `us` microseconds (torch.cuda._sleep, calibrated once)."""
        if self.device is None or us <= 0:
            return
        import torch

        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return
        if self.cycles_per_us is None:
            sleep(1000)  # loaded before it is timed
            begin, end = self.event(), self.event()
            begin.record()
            sleep(2_000_000)
            end.record()
            self.synchronize()
            self.cycles_per_us = 2_000_000 / max(begin.elapsed_time(end) * 1000.0, 1.0)
        sleep(int(min(us, 5000.0) * self.cycles_per_us))

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


def interleaved_timings(roles: list[str], time_one: Callable[[str], Timing], again: Callable[[], object],
                        max_spread: float = RETIME_SPREAD, passes: int = MAX_TIMING_PASSES) -> dict[str, Timing]:
    """Each role timed twice, interleaved (A B A B: drift hits every kernel alike), merged into one
    Timing per role: the mean of the two medians, `repeat_spread` = how far apart they were. A pass
    whose largest spread is above `max_spread` is repeated (`again` first: a burn-in) up to `passes`
    passes in all; the pass with the smallest largest spread is kept, and `timing_passes` says how
    many were taken, so a figure that stayed noisy shows it."""
    best: dict[str, Timing] | None = None
    taken = 0
    for taken in range(1, passes + 1):
        if taken > 1:
            again()
        pairs: dict[str, list[Timing]] = {role: [] for role in roles}
        for _ in range(2):
            for role in roles:
                pairs[role].append(time_one(role))
        merged = {role: merge_pair(*pair) for role, pair in pairs.items()}
        if best is None or _worst_spread(merged) < _worst_spread(best):
            best = merged
        if _worst_spread(merged) <= max_spread:
            break
    assert best is not None
    for timing in best.values():
        timing.timing_passes = taken
    return best


def merge_pair(first: Timing, second: Timing) -> Timing:
    merged = replace(first)
    merged.median_us = (first.median_us + second.median_us) / 2
    gap = abs(second.median_us - first.median_us)
    merged.repeat_spread = gap / first.median_us if first.median_us > 0 else (float("inf") if gap else 0.0)
    merged.reps = first.reps + second.reps
    return merged


def _worst_spread(timings: dict[str, Timing]) -> float:
    return max((t.repeat_spread or 0.0 for t in timings.values()), default=0.0)
