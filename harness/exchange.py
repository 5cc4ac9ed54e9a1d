"""Tensors between processes as plain data, so the judge never shares memory with, nor unpickles from,
a process that imported candidate code.

A value crosses as JSON: numbers, strings, None, dtypes, tuples/lists/dicts of them, and tensors as
`TensorRef`s. A tensor's bytes travel one of two ways:

- **files** (CPU and NPU tensors): the bytes of the storage span the tensor covers, in a file of the
  receiver's exchange directory;
- **CUDA IPC** (CUDA tensors): a `cuIpcGetMemHandle` handle of the allocation holding the tensor, and
  the tensor's offset in it. The receiver maps the allocation, checks the offset and length against
  the size the driver reports for the mapping (a lying sender cannot make it read past it), copies
  the bytes into its own memory and unmaps. Device memory moves at device speed: a 1 GiB output costs
  about a millisecond instead of a second through the host.

Whatever the route, the receiver copies into memory it owns, so nothing it later compares can be
written by the sender. A sender that must expose its *own* memory (the judge's inputs) copies them
first into buffers that hold nothing else (`Arena`), one set of buffers per receiving worker.

Only the driver API is used for IPC (through ctypes: `libcuda.so.1`), not torch's pickled IPC, whose
receiving side opens a reference-count file named by the sender.
"""

from __future__ import annotations

import base64
import ctypes
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4  # bound at the harness's import, before any kernel's

__all__ = ["Arena", "ExchangeError", "TensorRef", "decode", "encode", "exchange_root", "handover_bytes", "load_tensor", "release_arenas"]


class ExchangeError(RuntimeError):
    """A value that cannot cross, or a reference that does not describe a tensor the sender may hand over."""


@dataclass
class TensorRef:
    """One tensor handed over: where its bytes are and how to view them."""

    dtype: str  # torch dtype name, e.g. "float32"
    shape: list[int]
    stride: list[int]
    nbytes: int  # bytes of the storage span the view covers
    device: str  # where it lived ("cpu", "cuda:0", "npu:0")
    kind: str  # "file" | "cuda" | "empty"
    file: str = ""  # kind file: the file's name in the receiver's exchange directory
    handle: str = ""  # kind cuda: base64 of the 64-byte IPC handle
    offset: int = 0  # kind cuda: byte offset of the span in the allocation


def exchange_root() -> Path:
    """A fresh directory for one judging session's files: in /dev/shm (memory) when it is writable."""
    import tempfile

    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="kb-exchange-", dir=base))


# --- values ----------------------------------------------------------------------------------

def encode(value: Any, put: Any, path: str = "input") -> Any:
    """`value` as JSON, each tensor replaced by `put(tensor)` (a TensorRef as a dict). The same tensor
    object twice is sent once (`{"same": n}`), so arguments that alias stay aliased."""
    seen: dict[int, int] = {}
    return _encode(value, put, path, seen)


def _encode(value: Any, put: Any, path: str, seen: dict[int, int]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            return {"same": seen[id(value)]}
        seen[id(value)] = len(seen)
        return {"tensor": put(value)}
    if value is None or isinstance(value, (bool, int, str)):
        return {"value": value}
    if isinstance(value, float):
        return {"value": value} if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (tuple, torch.Size)):
        return {"tuple": [_encode(v, put, f"{path}[{i}]", seen) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return {"list": [_encode(v, put, f"{path}[{i}]", seen) for i, v in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode(v, put, f"{path}[{k!r}]", seen) for k, v in value.items()}}
    raise ExchangeError(f"{path} is a {type(value).__name__}: only tensors, numbers, strings, None, dtypes, devices "
                        "and tuples/lists/dicts of them can be passed to a kernel worker")


def decode(data: Any, get: Any) -> Any:
    """The inverse of `encode`: each tensor reference turned into a tensor by `get(ref dict)`."""
    tensors: list[Any] = []
    return _decode(data, get, tensors)


def _decode(data: Any, get: Any, tensors: list[Any]) -> Any:
    import torch

    if not isinstance(data, dict) or len(data) != 1:
        raise ExchangeError(f"not an encoded value: {str(data)[:80]}")
    (kind, body), = data.items()
    if kind == "tensor":
        tensors.append(get(body))
        return tensors[-1]
    if kind == "same":
        if not isinstance(body, int) or not 0 <= body < len(tensors):
            raise ExchangeError("an aliased tensor refers to none sent before it")
        return tensors[body]
    if kind == "value":
        if body is not None and not isinstance(body, (bool, int, float, str)):
            raise ExchangeError("a plain value that is not a number, string or None")
        return body
    if kind == "float":
        return float(body)
    if kind == "dtype":
        return _dtype(body)
    if kind == "device":
        return torch.device(str(body))
    if kind in ("tuple", "list"):
        items = [_decode(v, get, tensors) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {str(k): _decode(v, get, tensors) for k, v in body.items()}
    raise ExchangeError(f"unknown encoded kind {kind!r}")


def _dtype(name: Any) -> Any:
    import torch

    dtype = getattr(torch, str(name), None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ExchangeError(f"{name!r} is not a torch dtype")
    return dtype


# --- tensors: the span a view covers ---------------------------------------------------------

def span_elements(shape: list[int], stride: list[int]) -> int:
    """Elements of storage from the view's first element to its last (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _flat_bytes(t: Any) -> Any:
    """The storage span `t` covers, as a 1-D uint8 tensor (a view, no copy)."""
    import torch

    span = span_elements(list(t.shape), list(t.stride()))
    return torch.as_strided(t, (span,), (1,)).view(torch.uint8)


def _ref_of(t: Any, kind: str) -> TensorRef:
    if any(st < 0 for st in t.stride()):
        raise ExchangeError("a tensor with a negative stride cannot be handed over")
    span = span_elements(list(t.shape), list(t.stride()))
    return TensorRef(dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape), stride=list(t.stride()),
                     nbytes=span * t.element_size(), device=str(t.device), kind=kind if span else "empty")


def _view(raw: Any, ref: TensorRef, device: Any) -> Any:
    """A tensor of `ref`'s dtype, shape and stride over `raw` (uint8, exactly the span's bytes)."""
    import torch

    dtype = _dtype(ref.dtype)
    if ref.kind == "empty":
        return torch.empty_strided(ref.shape, ref.stride, dtype=dtype, device=device)
    return torch.as_strided(raw.view(dtype), ref.shape, ref.stride)


def check_ref(data: Any) -> TensorRef:
    """A TensorRef from untrusted JSON, each field checked for type and consistency."""
    if not isinstance(data, dict):
        raise ExchangeError("a tensor reference is not an object")
    try:
        ref = TensorRef(**data)
    except TypeError as exc:
        raise ExchangeError(f"a malformed tensor reference ({exc})") from None
    ints = [*ref.shape, *ref.stride, ref.nbytes, ref.offset]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) \
            or len(ref.shape) != len(ref.stride) or len(ref.shape) > 16:
        raise ExchangeError("a tensor reference with invalid shape, stride, size or offset")
    dtype = _dtype(ref.dtype)
    itemsize = dtype.itemsize
    span = span_elements(ref.shape, ref.stride)
    if ref.kind != "empty" and span * itemsize != ref.nbytes:
        raise ExchangeError(f"a tensor reference whose {ref.nbytes} bytes do not cover its view "
                            f"({span} x {itemsize} bytes)")
    if ref.kind not in ("file", "cuda", "empty"):
        raise ExchangeError(f"unknown tensor reference kind {ref.kind!r}")
    return ref


# --- files -----------------------------------------------------------------------------------

def write_file(t: Any, directory: Path) -> dict[str, Any]:
    """`t`'s span into a new file of `directory`; returns the reference."""
    ref = _ref_of(t, "file")
    if ref.kind == "file":
        ref.file = f"t-{uuid4().hex}.bin"
        _flat_bytes(t.detach()).cpu().numpy().tofile(directory / ref.file)
    return asdict(ref)


def read_file(ref: TensorRef, directory: Path, device: Any, remove: bool = True) -> Any:
    import numpy as np
    import torch

    if ref.kind == "empty":
        return _view(None, ref, device)
    name = Path(ref.file).name
    if name != ref.file or not name:
        raise ExchangeError(f"a file reference outside the exchange directory: {ref.file!r}")
    path = directory / name
    try:
        if path.stat().st_size != ref.nbytes:
            raise ExchangeError(f"{name} holds {path.stat().st_size} bytes, its reference says {ref.nbytes}")
        raw = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
    except OSError as exc:
        raise ExchangeError(f"cannot read {name}: {exc.strerror}") from None
    finally:
        if remove:
            path.unlink(missing_ok=True)
    return _view(raw.to(device), ref, device)


# --- CUDA IPC through the driver API ---------------------------------------------------------

class _IpcHandle(ctypes.Structure):
    # Bytes, not c_char: ctypes reads a c_char array as a string and stops at its first NUL.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def handle_bytes(handle: _IpcHandle) -> bytes:
    return bytes(handle.reserved)


def handle_from(raw: bytes) -> _IpcHandle:
    handle = _IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), raw, 64)
    return handle


class _Driver:
    """The few driver-API calls IPC needs, on the context torch made current."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ExchangeError(f"the CUDA driver library is not loadable ({exc})") from None

    def call(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name + "_v2", None) or getattr(self.lib, name)
        code = fn(*args)
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise ExchangeError(f"{name} failed: {(text.value or b'?').decode()} ({code})")

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self.call("cuMemGetAddressRange", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        return base.value, size.value

    def handle_of(self, base: int) -> bytes:
        handle = _IpcHandle()
        self.call("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(base))
        return handle_bytes(handle)

    def open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        self.call("cuIpcOpenMemHandle", ctypes.byref(ptr), handle_from(handle), ctypes.c_uint(1))  # lazy peer access
        return ptr.value

    def close(self, ptr: int) -> None:
        self.call("cuIpcCloseMemHandle", ctypes.c_uint64(ptr))

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def free(self, ptr: int) -> None:
        self.call("cuMemFree", ctypes.c_uint64(ptr))


_DRIVER: list[_Driver] = []


def _driver() -> _Driver:
    import torch

    if not _DRIVER:
        torch.cuda.init()
        torch.empty(1, device="cuda")  # makes torch's (primary) context current on this thread
        _DRIVER.append(_Driver())
    return _DRIVER[0]


class _DeviceBytes:
    """`nbytes` of device memory at `ptr` as a zero-copy uint8 tensor (__cuda_array_interface__)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2, "strides": None}


def _wrap(ptr: int, nbytes: int, device: Any) -> Any:
    import torch

    return torch.as_tensor(_DeviceBytes(ptr, nbytes), device=device)


def share_cuda(t: Any) -> dict[str, Any]:
    """A reference to `t`'s bytes where they are: the IPC handle of its allocation and its offset.
    The caller keeps `t` alive until the receiver has copied it."""
    ref = _ref_of(t, "cuda")
    if ref.kind == "cuda":
        driver = _driver()
        base, _ = driver.address_range(t.data_ptr())
        ref.handle = base64.b64encode(driver.handle_of(base)).decode()
        ref.offset = t.data_ptr() - base
    return asdict(ref)


def open_cuda(refs: list[TensorRef], device: Any) -> list[Any]:
    """Copies of the tensors `refs` describe, each handle opened once, checked against the mapping's
    real size, copied, and closed."""
    import torch

    driver = _driver()
    out: list[Any] = [None] * len(refs)
    by_handle: dict[str, list[int]] = {}
    for i, ref in enumerate(refs):
        if ref.kind == "empty":
            out[i] = _view(None, ref, device)
        else:
            by_handle.setdefault(ref.handle, []).append(i)
    for handle, indices in by_handle.items():
        try:
            raw = base64.b64decode(handle, validate=True)
        except ValueError:
            raise ExchangeError("an IPC handle that is not base64") from None
        if len(raw) != 64:
            raise ExchangeError("an IPC handle that is not 64 bytes")
        ptr = driver.open(raw)
        try:
            _, size = driver.address_range(ptr)
            for i in indices:
                ref = refs[i]
                if ref.offset + ref.nbytes > size:
                    raise ExchangeError(f"a tensor reference past the end of its allocation "
                                        f"({ref.offset} + {ref.nbytes} > {size} bytes)")
                out[i] = _view(_wrap(ptr + ref.offset, ref.nbytes, device).clone(), ref, device)
            torch.cuda.synchronize()
        finally:
            driver.close(ptr)
    return out


class Arena:
    """Device buffers that hold only what is handed to one receiving worker: the receiver maps the
    whole allocation, so nothing else of ours may live there. The buffers are reused for that worker's
    next hand-over (it has copied the last one by then) and freed only when the worker is gone
    (`release`): memory a live importer may still map must never go back to the driver, which could
    give it to something of ours."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.buffers: list[tuple[int, int, str]] = []  # (ptr, nbytes, base64 handle); the last one fills
        self.offset = 0

    def rewind(self, need: int = 0) -> None:
        """Start filling from the beginning again (the worker copied everything handed over before), in
        one buffer of at least `need` bytes: the next hand-over's size (`handover_bytes`). Sized to it,
        not grown by doubling: old buffers stay allocated until release, so doubling held about four
        times each hand-over per live worker, and six candidates of a 3 GiB task ran an H200 out of
        memory (docs/benchmarks.md, the L4 bench)."""
        if len(self.buffers) > 1:  # keep the largest; the others stay allocated until release
            self.buffers.append(self.buffers.pop(max(range(len(self.buffers)), key=lambda i: self.buffers[i][1])))
        self.offset = 0
        if need and (not self.buffers or self.buffers[-1][1] < need):
            self._add_buffer(need)

    def _add_buffer(self, nbytes: int) -> None:
        size = max(_aligned(nbytes), 1 << 20)
        ptr = _driver().alloc(size)
        self.buffers.append((ptr, size, base64.b64encode(_driver().handle_of(ptr)).decode()))
        self.offset = 0

    def put(self, t: Any) -> dict[str, Any]:
        """A copy of `t` in this arena, as a reference the receiver can open."""
        ref = _ref_of(t, "cuda")
        if ref.kind == "empty":
            return asdict(ref)
        need = _aligned(ref.nbytes)
        if not self.buffers or self.offset + need > self.buffers[-1][1]:
            self._add_buffer(need)  # more than the hand-over announced: this tensor's bytes only
        ptr, _, handle = self.buffers[-1]
        _wrap(ptr + self.offset, ref.nbytes, self.device).copy_(_flat_bytes(t.detach()))
        ref.handle, ref.offset = handle, self.offset
        self.offset += need
        return asdict(ref)

    def release(self) -> None:
        for ptr, _, _ in self.buffers:
            _driver().free(ptr)
        self.buffers = []


def handover_bytes(tensors: list[Any]) -> int:
    """The arena bytes `tensors` take when handed over (each distinct tensor once, aligned as `put` lays them out)."""
    distinct = {id(t): t for t in tensors}.values()
    return sum(_aligned(ref.nbytes) for ref in (_ref_of(t, "cuda") for t in distinct) if ref.kind != "empty")


def release_arenas(arenas: dict[str, Arena], worker: str) -> None:
    arena = arenas.pop(worker, None)
    if arena is not None:
        arena.release()


def _aligned(n: int) -> int:
    return (n + 255) // 256 * 256


# --- one entry point per direction -----------------------------------------------------------

def load_tensor(data: Any, directory: Path, device: Any) -> Any:
    """A copy, in this process's memory on `device`, of the tensor a reference from another process describes."""
    ref = check_ref(data)
    if ref.kind == "cuda":
        return open_cuda([ref], device)[0]
    return read_file(ref, directory, device)


def load_all(refs: list[Any], directory: Path, device: Any) -> list[Any]:
    """`load_tensor` of many references, each IPC handle opened once."""
    checked = [check_ref(r) for r in refs]
    cuda = [i for i, r in enumerate(checked) if r.kind == "cuda"]
    out: list[Any] = [None] * len(checked)
    if cuda:
        for i, t in zip(cuda, open_cuda([checked[i] for i in cuda], device)):
            out[i] = t
    for i, ref in enumerate(checked):
        if ref.kind != "cuda":
            out[i] = read_file(ref, directory, device)
    return out


def device_kind(device: Any) -> str:
    return str(device).split(":")[0]


_IPC: list[bool] = []


def ipc_available() -> bool:
    """Whether this process can export device memory by IPC handle (not under every sandbox: gVisor's
    GPU proxy, say). Without it CUDA tensors travel as files, through the host: slower, never wrong."""
    if not _IPC:
        try:
            driver = _driver()
            ptr = driver.alloc(1 << 20)
            try:
                driver.handle_of(ptr)
                _IPC.append(True)
            finally:
                driver.free(ptr)
        except ExchangeError:
            _IPC.append(False)
    return _IPC[0]


def sender_for(device: Any, directory: Path) -> Any:
    """How this process hands over its own tensors (outputs): in place on CUDA, else as files."""
    if device_kind(device) == "cuda" and ipc_available():
        def share(t: Any) -> dict[str, Any]:
            try:
                return share_cuda(t)
            except ExchangeError:  # memory the driver cannot export (torch's expandable segments): a file
                return write_file(t, directory)
        return share
    return lambda t: write_file(t, directory)
