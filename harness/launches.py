"""What one launch of a kernel is, in numbers: its grid, its arguments' values, its launch options.

L1 reads these beside the source (a loop's trip count, a mask's true fraction, the divisibility of a
stride, how many programs fill how many SMs), so its hypotheses hold for the launch the user makes,
not for any launch. They come from intercepting the call (nothing compiles): cheap, unlike L3.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["LaunchFacts", "largest_power_of_two_divisor"]


@dataclass(frozen=True)
class LaunchFacts:
    """One distinct launch.

    Attributes:
        kernel: the JIT function's name; source_file: the file defining it.
        grid: programs per axis, None when the grid could not be resolved.
        arguments: by parameter: numbers as passed; a tensor as {dtype, shape, strides, align}.
        constants: constexpr (and specialized) values by parameter.
        num_warps, num_stages: the launch's options.
        divisible_16: parameters the launch specialized as divisible by 16 (pointers: aligned).
        target: what it was specialized for ("cuda:90").
        wrapper_work: the call's PyTorch ops beside its launches (first launch only).
    """

    kernel: str
    source_file: str
    grid: tuple[int, ...] | None
    arguments: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    divisible_16: tuple[str, ...] = ()
    target: str = "cuda:90"
    # The PyTorch work of the call that made this launch, beside its Triton kernels: (aten op, calls,
    # bytes read and written), on the call's first launch only (harness.wrapper_work).
    wrapper_work: tuple[tuple[str, int, int], ...] = ()

    @property
    def programs(self) -> int | None:
        return math.prod(self.grid) if self.grid else None

    def integers(self) -> dict[str, int]:
        """Every integer the launch fixes, by name: runtime integers and constexprs (booleans excluded)."""
        values = {**self.constants, **self.arguments}
        return {k: int(v) for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}

    def tensor(self, name: str) -> dict[str, Any] | None:
        value = self.arguments.get(name)
        return value if isinstance(value, dict) else None

    def element_size(self, name: str) -> int | None:
        """Bytes per element of the tensor passed as `name`."""
        t = self.tensor(name)
        return _DTYPE_BYTES.get(str(t.get("dtype"))) if t else None

    def tensor_bytes(self) -> float:
        """Bytes of every tensor the launch is given: the least it can move, touching each once."""
        return float(sum(math.prod(t.get("shape") or [1]) * (self.element_size(name) or 4)
                         for name, t in self.arguments.items() if isinstance(t, dict)))

    def tensor_dtypes(self) -> set[str]:
        return {str(v.get("dtype")) for v in self.arguments.values() if isinstance(v, dict)}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchFacts:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if known.get("grid") is not None:
            known["grid"] = tuple(int(g) for g in known["grid"])
        known["divisible_16"] = tuple(known.get("divisible_16", ()))
        known["wrapper_work"] = tuple((str(op), int(n), int(b)) for op, n, b in known.get("wrapper_work", ()))
        return cls(**known)

    @classmethod
    def of_launch(cls, launch: Any, target: str) -> LaunchFacts:
        """From a `harness.capture.Launch` (the JIT function, its specialization, grid and arguments)."""
        compiled = launch.compile
        params = [p.name for p in launch.fn.params]
        spec = json.loads(compiled["specialization_data"])
        options = spec.get("options", {})
        constants = {params[k[0]] if len(k) == 1 else str(k): v for k, v in compiled["constants"].items()
                     if isinstance(v, (bool, int, float, str))}
        attrs = compiled["configs"][0] if compiled.get("configs") else {}
        divisible = tuple(sorted(params[k[0]] for k, v in attrs.items() if len(k) == 1 and
                                 any(a[0] == "tt.divisibility" and int(a[1]) % 16 == 0 for a in v)))
        code = launch.fn.fn.__code__
        return cls(kernel=launch.fn.fn.__qualname__, source_file=str(code.co_filename),
                   grid=tuple(launch.grid) if launch.grid else None, arguments=dict(launch.arguments or {}),
                   constants=constants, num_warps=int(options.get("num_warps", 4)),
                   num_stages=int(options.get("num_stages", 3)), divisible_16=divisible, target=target)


def largest_power_of_two_divisor(value: int, cap: int = 16) -> int:
    """The largest power of two (at most `cap`) dividing `value`: what `tl.multiple_of` may truthfully say."""
    if value == 0:
        return cap
    return min(cap, value & -value)


_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
