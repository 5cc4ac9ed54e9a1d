"""Where kernels run: `cuda` (an NVIDIA GPU), `interpreter` (TRITON_INTERPRET=1 on the CPU: correctness
only) and `npu` (Ascend through triton-ascend and torch_npu)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from harness.errors import UserFacingError

__all__ = ["BACKENDS", "TIMED", "Backend", "BackendName", "backend_env", "detect_backend", "select_backend"]

# The backends a kernel can be judged on; the options and records that name one are typed with it.
BackendName = Literal["cuda", "interpreter", "npu"]
BACKENDS: tuple[BackendName, ...] = ("cuda", "interpreter", "npu")
TIMED = ("cuda", "npu")  # the interpreter's seconds say nothing about a kernel


@dataclass(frozen=True)
class Backend:
    name: str
    device: str  # torch device the inputs are created on
    times: bool  # whether its timings mean anything

    def device_name(self) -> str:
        import torch

        if self.name == "cuda":
            return torch.cuda.get_device_name()
        if self.name == "npu":
            return torch.npu.get_device_name()  # type: ignore[attr-defined]
        return "cpu (Triton interpreter)"


def detect_backend() -> str:
    """cuda with an NVIDIA GPU, npu with an Ascend device, else the interpreter; without importing torch."""
    if os.path.exists("/dev/nvidiactl") or os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() not in ("", "-1") \
            and os.path.exists("/proc/driver/nvidia"):
        return "cuda"
    if os.path.exists("/dev/davinci0") or os.path.exists("/dev/davinci_manager"):
        return "npu"
    return "interpreter"


def backend_env(name: str) -> dict[str, str]:
    """Environment a worker for this backend starts with (read by triton at import/decoration)."""
    if name == "interpreter":
        return {"TRITON_INTERPRET": "1"}
    if name == "cuda":
        return {"TRITON_INTERPRET": "0"}  # a caller's TRITON_INTERPRET=1 must not turn device kernels into Python
    if name == "npu":
        # triton-ascend writes kernel.ttir.mlir / kernel.ttadapter.mlir / kernel.mlir with it, under
        # TRITON_DUMP_DIR; a fresh one per worker keeps each job's dumps apart (harness.npu).
        import tempfile

        return {"TRITON_DEBUG": "1", "TRITON_DUMP_DIR": tempfile.mkdtemp(prefix="kb-npu-dump-")}
    return {}


def select_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise UserFacingError(f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    if name == "interpreter":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise UserFacingError("the interpreter backend needs TRITON_INTERPRET=1 before triton is imported",
                                  "run it through harness.sandbox.Worker (kb run does), not in-process")
        return Backend("interpreter", "cpu", times="interpreter" in TIMED)
    import torch

    if name == "npu":
        try:
            import torch_npu  # noqa: F401  # registers the npu device with torch
        except ImportError as exc:
            raise UserFacingError(
                "the npu backend needs torch_npu and triton-ascend, and torch_npu is not installed",
                "run on an Ascend host with `pip install torch_npu triton-ascend`, or use --backend cuda|interpreter",
            ) from exc
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise UserFacingError("torch_npu sees no Ascend device", "check npu-smi info and ASCEND_RT_VISIBLE_DEVICES")
        return Backend("npu", "npu", times="npu" in TIMED)
    if not torch.cuda.is_available():
        raise UserFacingError("the cuda backend needs an NVIDIA GPU and this machine has none",
                              "use --backend interpreter for correctness on the CPU, or run on a GPU host")
    return Backend("cuda", "cuda", times="cuda" in TIMED)
