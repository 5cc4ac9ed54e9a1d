"""Device ceilings, measured once per device and cached, and each case's place under them.

Ceilings are what this device actually reaches through the library, not datasheet numbers
(evaluation.md): device-to-device copy bandwidth (bytes read + written per second), at 1 GiB and as a
curve over sizes, the torch matmul rate per input dtype, and the launch floor (an empty Triton launch,
harness/launch_floor.py). They are cached per device name, torch and triton version in
`$KB_CACHE_DIR/ceilings.json` (default ~/.cache/kernel-kb).

A memory-bound case is placed against the copy rate at its own size. On the H200 torch's copy moves 8 MB
at 0.29 of its 1 GiB rate, 34 MB at 0.58, 134 MB at 0.85 (docs/device/2026-12-04-h200-own-suite-2/): the
ramp and the last wave's tail cost every kernel that moves that much, and the exact-GELU kernel of our
suite sat at 0.29 / 0.60 / 0.86 of the 1 GiB rate on those sizes, on the copy's curve, while its bound
against the single rate said 1.47x to take.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from harness.measurement import Roofline

__all__ = ["ceilings", "copy_gbps_at", "copy_summary", "measure_ceilings", "place"]


def cache_dir() -> Path:
    root = os.environ.get("KB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernel-kb")
    return Path(root)


def _device_key() -> str:
    import torch
    import triton

    # "ceilings 4": the set with a ceiling per input dtype, the launch floor and the copy curve; older caches
    # are measured again.
    return f"{torch.cuda.get_device_name()}|torch {torch.__version__}|triton {triton.__version__}|ceilings 4"


def ceilings(refresh: bool = False) -> dict[str, Any]:
    """The current CUDA device's ceilings: from the cache, else measured now (about 10 s) and cached."""
    path = cache_dir() / "ceilings.json"
    key = _device_key()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not refresh and key in known:
        return known[key]
    known[key] = measure_ceilings()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, path)  # a crash mid-write leaves the old cache, never half a file
    return known[key]


def measure_ceilings() -> dict[str, Any]:
    import datetime

    import torch

    result = {
        "device": torch.cuda.get_device_name(),
        "copy_gbps": _copy_gbps(),
        "copy_curve": _copy_curve(),
        "matmul_bf16_tflops": _matmul_tflops(torch.bfloat16),
        "matmul_fp16_tflops": _matmul_tflops(torch.float16),
        "matmul_tf32_tflops": _matmul_tflops(torch.float32, tf32=True),
        "matmul_fp32_tflops": _matmul_tflops(torch.float32),
        "matmul_int8_tops": _matmul_tflops(torch.int8),
        "launch_floor_us": _launch_floor_us(),
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "how": "copy: 1 GiB fp32 tensor.copy_, read+write bytes, and the same from 1 MiB up (copy_curve: [bytes "
               "moved, GB/s]); matmul: torch 8192^3 per input dtype (fp32 with "
               "tf32 off and on; int8 through torch._int_mm); triton.testing.do_bench median, L2 flushed; "
               "launch floor: an empty one-program Triton launch timed as the harness times kernels",
    }
    torch.cuda.empty_cache()
    return result


def _copy_gbps() -> float:
    return _copy_rate(1 << 28, rep_ms=500)  # 1 GiB of fp32: far beyond any L2


COPY_CURVE_ELEMENTS = tuple(1 << e for e in range(18, 29, 2))  # fp32 sources of 1 MiB to 1 GiB, 4x apart


def _copy_curve() -> list[list[float]]:
    """[bytes moved (read + written), GB/s] of torch's device copy at each of COPY_CURVE_ELEMENTS."""
    return [[float(2 * n * 4), round(_copy_rate(n), 1)] for n in COPY_CURVE_ELEMENTS]


def _copy_rate(n: int, rep_ms: int = 200) -> float:
    """GB/s (bytes read + written) of torch's copy of `n` fp32 elements, do_bench's median, L2 flushed."""
    import torch
    from triton.testing import do_bench

    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=rep_ms, return_mode="median")
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def copy_gbps_at(ceiling: dict[str, Any], bytes_moved: float | None) -> float:
    """The copy rate a kernel moving `bytes_moved` can reach: the copy curve read at that size (linear in
    log bytes between its points; past its ends, the nearest point's rate, which below the curve errs
    fast and so keeps the bound high), else the 1 GiB rate of a ceiling measured before the curve was."""
    peak = float(ceiling["copy_gbps"])
    curve = sorted(ceiling.get("copy_curve") or [])
    if not curve or not bytes_moved or bytes_moved <= 0:
        return peak
    if bytes_moved <= curve[0][0]:
        return float(curve[0][1])
    for (b0, g0), (b1, g1) in zip(curve, curve[1:]):
        if bytes_moved <= b1:
            t = (math.log(bytes_moved) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return float(g0 + t * (g1 - g0))
    return float(curve[-1][1])


def copy_summary(ceiling: dict[str, Any]) -> str:
    """How the copy ceiling reads in a report line: the 1 GiB rate, and the curve's smallest point."""
    curve = sorted(ceiling.get("copy_curve") or [])
    text = f"copy {float(ceiling.get('copy_gbps') or 0):.0f} GB/s"
    if curve:
        return text + (f" ({curve[0][1]:.0f} GB/s at {curve[0][0] / 1e6:.0f} MB moved; memory-bound cases are "
                       "placed against the copy at their own size)")
    return text + " (one rate for every size: measured before the copy curve)"


def _launch_floor_us() -> float | None:
    """The floor, or None where it cannot be measured: the bounds then leave launch latency out, as
    they did before the floor existed, rather than the run losing its ceilings."""
    try:
        from harness.launch_floor import launch_floor_us

        return round(launch_floor_us(), 3)
    except Exception:  # noqa: BLE001 - a missing figure, never a failed measurement of the kernel
        return None


def _matmul_tflops(dtype: Any, m: int = 8192, tf32: bool = False) -> float:
    import torch
    from triton.testing import do_bench

    if dtype == torch.int8:
        a = torch.randint(-8, 8, (m, m), device="cuda", dtype=dtype)
        b = torch.randint(-8, 8, (m, m), device="cuda", dtype=dtype)
        run = lambda: torch._int_mm(a, b)  # noqa: E731 - the int8 tensor-core path cuBLAS offers
    else:
        a = torch.randn(m, m, device="cuda", dtype=dtype)
        b = torch.randn(m, m, device="cuda", dtype=dtype)
        run = lambda: a @ b  # noqa: E731
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        ms = do_bench(run, warmup=100, rep=1000, return_mode="median")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * m**3 / (ms * 1e-3) / 1e12


# The compute ceiling of each input dtype (the reference worker names the largest input's); a cache
# written before a dtype had its own ceiling falls back to the bf16 one.
_PEAK_KEY = {"fp32": "matmul_fp32_tflops", "tf32": "matmul_tf32_tflops", "bf16": "matmul_bf16_tflops",
             "fp16": "matmul_fp16_tflops", "int8": "matmul_int8_tops"}


_COMPUTE_DTYPE = {"float32": "fp32", "float64": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8"}


def compute_dtype_of(dtype: str) -> str:
    """The compute ceiling a tensor dtype ("float16", "torch.int8") is placed against (bf16 for the rest)."""
    return _COMPUTE_DTYPE.get(dtype.removeprefix("torch."), "bf16")


def compute_peak(ceiling: dict[str, Any], compute_dtype: str) -> float:
    """TFLOP/s (TOP/s for int8) attainable at `compute_dtype`'s inputs. int8 is never below bf16: tensor
    cores run int8 at least at the bf16 rate, and where torch's int8 path measures slower (129 TOP/s
    against 679 bf16 on the H200, docs/benchmarks.md) it is torch's path that is slow, not the device."""
    key = _PEAK_KEY.get(compute_dtype, "matmul_bf16_tflops")
    peak = float(ceiling.get(key) or ceiling.get("matmul_bf16_tflops") or 0.0)
    if compute_dtype == "int8":
        peak = max(peak, float(ceiling.get("matmul_bf16_tflops") or 0.0))
    return peak


def place(bytes_moved: float | None, flops: float | None, seconds: float, ceiling: dict[str, Any],
          compute_dtype: str = "bf16") -> Roofline | None:
    """Achieved rates of one case and its fraction of the attainable rate at its intensity."""
    if seconds <= 0 or (not bytes_moved and not flops):
        return None
    bw = copy_gbps_at(ceiling, bytes_moved) * 1e9
    peak = compute_peak(ceiling, compute_dtype) * 1e12
    if flops and not peak:
        if not bytes_moved:
            return None
        flops = None  # no compute ceiling measured: the bytes alone place it
    gbps = bytes_moved / seconds / 1e9 if bytes_moved else None
    tflops = flops / seconds / 1e12 if flops else None
    if bytes_moved and flops:
        intensity = flops / bytes_moved
        bound = "memory" if intensity < peak / bw else "compute"
        fraction = (flops / seconds) / min(peak, intensity * bw)
    elif bytes_moved:
        bound, fraction = "memory", (bytes_moved / seconds) / bw
    else:
        bound, fraction = "compute", ((flops or 0.0) / seconds) / peak
    floor = ceiling.get("launch_floor_us")
    return Roofline(bytes=bytes_moved, flops=flops, achieved_gbps=gbps, achieved_tflops=tflops,
                    bound=bound, fraction=fraction, floor_us=float(floor) if floor else None)
