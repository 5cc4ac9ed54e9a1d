"""The PyTorch work a launch wrapper does beside its Triton kernels, seen while its launches are
intercepted: each aten op that produces data (not a view, not an empty allocation), with the bytes it
reads and writes. A first draft's wrapper that computes `other * alpha`, clones its input or copies a
permuted view before the launch pays a pass over memory per op, which the kernel's own time does not
show and a timing of the whole call charges to the kernel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.guards import tensors_in

__all__ = ["TorchWork", "WorkLog", "recording"]

# Ops that make no data: views, metadata, allocations whose contents nobody wrote yet.
_NO_WORK = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view", "as_strided",
    "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "slice", "select", "alias", "detach",
    "lift_fresh", "_reshape_alias", "reshape", "split", "unbind", "view_as", "unfold", "diagonal", "narrow",
    "resize_", "set_", "_local_scalar_dense", "is_pinned", "_to_copy_meta", "sym_size", "sym_stride",
}


@dataclass(frozen=True)
class TorchWork:
    op: str  # aten op, e.g. "mul"
    calls: int
    bytes: int  # read and written, summed over its calls


@dataclass
class WorkLog:
    ops: dict[str, list[int]] = field(default_factory=dict)  # op -> [calls, bytes]

    def add(self, op: str, nbytes: int) -> None:
        entry = self.ops.setdefault(op, [0, 0])
        entry[0] += 1
        entry[1] += nbytes

    def items(self) -> list[TorchWork]:
        return sorted((TorchWork(op, c, b) for op, (c, b) in self.ops.items()), key=lambda w: -w.bytes)


def _storage(t: Any) -> int | None:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, a wrapper subclass) moves nothing
        return None


@contextlib.contextmanager
def recording(log: WorkLog) -> Iterator[None]:
    """Within the block, every aten op that makes data is added to `log`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in _NO_WORK:
                return out
            inputs = tensors_in(args) + tensors_in(kwargs or {})
            outputs = tensors_in(out)
            read = {_storage(t) for t in inputs}
            in_place = name.endswith("_") or bool(kwargs and "out" in kwargs)
            made = [t for t in outputs if in_place or _storage(t) not in read]
            if made:
                log.add(name, sum(t.numel() * t.element_size() for t in inputs + made))
            return out

    with Watch():
        yield
