"""Device timing: Triton's own `do_bench` (device events, L2 flushed before every repetition), median
of the per-repetition times, input buffers rotated when they fit in cache.

The CPU interpreter is never timed: its seconds say nothing about a kernel.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from harness.measurement import Timing

__all__ = ["REP_MS", "ROTATE_BELOW_BYTES", "WARMUP_MS", "rotation_count", "time_calls"]

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


def time_calls(call: Callable[[Any], Any], arg_sets: Sequence[Any], *, warm_cache: bool = False,
               warmup_ms: int = WARMUP_MS, rep_ms: int = REP_MS) -> Timing:
    """Time `call(args)` cycling through `arg_sets`; every repetition is one call."""
    state = {"i": 0}

    def fn() -> None:
        args = arg_sets[state["i"] % len(arg_sets)]
        state["i"] += 1
        call(args)

    samples = _warm_samples(fn, warmup_ms, rep_ms) if warm_cache else _do_bench_samples(fn, warmup_ms, rep_ms)
    samples_us = sorted(s * 1000.0 for s in samples)
    return Timing(
        median_us=statistics.median(samples_us),
        p20_us=_quantile(samples_us, 0.2),
        p80_us=_quantile(samples_us, 0.8),
        reps=len(samples_us),
        l2_flushed=not warm_cache,
        rotating_buffers=len(arg_sets),
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
    )


def _do_bench_samples(fn: Callable[[], None], warmup_ms: int, rep_ms: int) -> list[float]:
    from triton.testing import do_bench

    try:
        samples = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    except (AssertionError, TypeError, ValueError):  # a triton without return_mode="all"
        samples = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    return list(samples) if isinstance(samples, (list, tuple)) else [float(samples)]


def _warm_samples(fn: Callable[[], None], warmup_ms: int, rep_ms: int) -> list[float]:
    """Like do_bench without the L2 flush, for tasks that declare a warm-cache workload."""
    from triton.runtime.driver import driver

    di = driver.active.get_device_interface()
    fn()
    di.synchronize()
    start, end = di.Event(enable_timing=True), di.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    di.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n = max(1, int(rep_ms / estimate))
    starts = [di.Event(enable_timing=True) for _ in range(n)]
    ends = [di.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    di.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
