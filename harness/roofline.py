"""Device ceilings, measured once per device and cached, and each case's place under them.

Ceilings are what this device actually reaches through the library, not datasheet numbers
(evaluation.md): device-to-device copy bandwidth (bytes read + written per second), the torch
matmul rate per input dtype, and the launch floor (an empty Triton launch, harness/launch_floor.py). They are cached per device name, torch and triton
version in `$KB_CACHE_DIR/ceilings.json` (default ~/.cache/kernel-kb).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness.measurement import Roofline

__all__ = ["ceilings", "measure_ceilings", "place"]


def cache_dir() -> Path:
    root = os.environ.get("KB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernel-kb")
    return Path(root)


def _device_key() -> str:
    import torch
    import triton

    # "ceilings 3": the set with a ceiling per input dtype and the launch floor; older caches are measured again.
    return f"{torch.cuda.get_device_name()}|torch {torch.__version__}|triton {triton.__version__}|ceilings 3"


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
        "matmul_bf16_tflops": _matmul_tflops(torch.bfloat16),
        "matmul_fp16_tflops": _matmul_tflops(torch.float16),
        "matmul_tf32_tflops": _matmul_tflops(torch.float32, tf32=True),
        "matmul_fp32_tflops": _matmul_tflops(torch.float32),
        "matmul_int8_tops": _matmul_tflops(torch.int8),
        "launch_floor_us": _launch_floor_us(),
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "how": "copy: 1 GiB fp32 tensor.copy_, read+write bytes; matmul: torch 8192^3 per input dtype (fp32 with "
               "tf32 off and on; int8 through torch._int_mm); triton.testing.do_bench median, L2 flushed; "
               "launch floor: an empty one-program Triton launch timed as the harness times kernels",
    }
    torch.cuda.empty_cache()
    return result


def _copy_gbps() -> float:
    import torch
    from triton.testing import do_bench

    n = 1 << 28  # 1 GiB of fp32: far beyond any L2
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * n * 4 / (ms * 1e-3) / 1e9


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
    bw = ceiling["copy_gbps"] * 1e9
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
