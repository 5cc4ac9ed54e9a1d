"""CUDA as a CPU-only machine can pretend it: enough for a wrapper written for a GPU to reach its launch.

Kernels from the wild check `x.is_cuda`, enter `torch.cuda.device(x.device)`, allocate with
`device="cuda"`, read the SM count or the capability to pick a config. Capture only needs such a
wrapper to run up to `kernel[grid](...)` (which the capture intercepts), so within `cuda_on_cpu()`:

- tensors report `is_cuda` and a `cuda:0` device, while their memory stays on the CPU;
- every torch function asked for a cuda device (factories, `.to`, `.cuda()`) gets the CPU instead;
- `torch.cuda`'s queries answer for the target device (capability, SM count, shared memory), and its
  contexts, streams and synchronisation are no-ops.

What the wrapper computes on such tensors is CPU arithmetic; only the launches matter, and those are
intercepted. A torch function mode, not a monkeypatched tensor class: it ends with the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = ["DeviceModel", "H200", "cuda_on_cpu", "device_model_for", "device_model_named"]


@dataclass(frozen=True)
class DeviceModel:
    """What a wrapper may ask of the device it is written for."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    shared_memory_per_block: int  # bytes a block may opt in to
    registers_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    total_memory: int = 80 << 30
    l2_bytes: int = 50 << 20
    # Datasheet rates (dense), for orders of magnitude only: measured ceilings (harness.roofline) win
    # wherever a run was measured.
    dram_gbps: float = 2000.0
    tensor_tflops: float = 300.0  # fp16/bf16 inputs
    fp32_tflops: float = 19.5  # FMA


H200 = DeviceModel("NVIDIA H200", (9, 0), 132, 232448, total_memory=141 << 30, l2_bytes=60 << 20, dram_gbps=4800.0,
                   tensor_tflops=989.0, fp32_tflops=67.0)
A100 = DeviceModel("NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912, total_memory=80 << 30, l2_bytes=40 << 20,
                   dram_gbps=2039.0, tensor_tflops=312.0, fp32_tflops=19.5)
_BY_ARCH = {90: H200, 80: A100}


def device_model_named(name: str) -> DeviceModel | None:
    """The model of a device by the name a report records ("NVIDIA H200"); None for one not modelled."""
    return next((m for m in (H200, A100) if m.name.split()[1].split("-")[0] in name), None)


def device_model_for(target: str) -> DeviceModel:
    """The device a `cuda:NN` target stands for (an H200 for sm90, an A100 for sm80; else sm90's)."""
    backend, _, arch = target.partition(":")
    return _BY_ARCH.get(int(arch), H200) if backend == "cuda" and arch.isdigit() else H200


class _Stream:
    """A stand-in for torch.cuda.Stream: a class, since libraries annotate with it (`Stream | None`)."""

    cuda_stream = 0
    device = None

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait_stream(self, _other: Any) -> None:
        return None

    def record_event(self, _event: Any = None) -> None:
        return None


class _Device(contextlib.nullcontext):
    """A stand-in for torch.cuda.device: a context that changes nothing (one device, and it is the CPU)."""

    def __init__(self, _device: Any = None) -> None:
        super().__init__()


def _cuda_module_stand_ins(model: DeviceModel) -> dict[str, Any]:
    props = SimpleNamespace(
        name=model.name, major=model.capability[0], minor=model.capability[1],
        multi_processor_count=model.sm_count, total_memory=model.total_memory,
        max_threads_per_multi_processor=model.max_threads_per_sm, regs_per_multiprocessor=model.registers_per_sm,
        shared_memory_per_block_optin=model.shared_memory_per_block, L2_cache_size=model.l2_bytes, warp_size=32,
    )
    stream = _Stream()
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        # torch.cuda's own parameter names, so a call that names them (`synchronize(device=y.device)`,
        # as a TritonBench-T draft writes it) reaches the stand-in too.
        "set_device": lambda device: None,
        "get_device_capability": lambda device=None: model.capability,
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: model.name,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "current_stream": lambda device=None: stream,
        "default_stream": lambda device=None: stream,
        "device": _Device,
        "stream": lambda stream=None: contextlib.nullcontext(),
        "Stream": _Stream,
    }


def _cpu_device(value: Any) -> Any:
    import torch

    if isinstance(value, str) and value.split(":")[0] == "cuda":
        return "cpu"
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # `.to(0)` is ambiguous with dtypes only in theory; torch reads an int as a cuda index
    return value


def _mode_class() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    getters = {torch._C.TensorBase.__dict__[name]: name for name in ("is_cuda", "device")}
    cuda_device = torch.device("cuda", 0)

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            getter = getters.get(getattr(func, "__self__", None))
            if getter == "is_cuda" and getattr(func, "__name__", "") == "__get__":
                return True
            if getter == "device" and getattr(func, "__name__", "") == "__get__":
                return cuda_device
            name = getattr(func, "__name__", "")
            if name == "cuda":
                return args[0]
            if name in ("get_device",):
                return 0
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            if name == "to" and args:
                args = (args[0], *(_cpu_device(a) if not isinstance(a, int) else a for a in args[1:]))
            return func(*args, **kwargs)

    return CudaOnCpu


@contextlib.contextmanager
def cuda_on_cpu(model: DeviceModel = H200) -> Iterator[DeviceModel]:
    """Within the block, CPU tensors pass for cuda tensors of `model` (module docstring)."""
    import torch

    saved = {name: getattr(torch.cuda, name) for name in _cuda_module_stand_ins(model) if hasattr(torch.cuda, name)}
    for name, stand_in in _cuda_module_stand_ins(model).items():
        setattr(torch.cuda, name, stand_in)
    try:
        with _mode_class()():
            yield model
    finally:
        for name in _cuda_module_stand_ins(model):
            if name in saved:
                setattr(torch.cuda, name, saved[name])
            else:
                delattr(torch.cuda, name)
