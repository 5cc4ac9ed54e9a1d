"""What compiling one kernel specialization for one target produced.

Artifacts are plain, JSON-serialisable records so they can be cached by content,
shipped back from a GPU worker, and read by layers that never import triton.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Artifacts", "PtxasReport", "Remark", "SCHEMA_VERSION"]

# Bump when the shape of Artifacts changes: cached artifacts of another version are recompiled.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Remark:
    """One compiler diagnostic (MLIR_ENABLE_DIAGNOSTICS) with its kernel-source location.

    Attributes:
        file: kernel source file the compiler attributed the diagnostic to.
        line, col: 1-based location in that file.
        severity: "remark", "warning", "note" or "error", as the compiler printed it.
        message: the text after the severity, e.g. "Warning: vectorization fails vec = 1 ...".
        pass_name: the pass that was running when it was emitted (from the surrounding
            "IR Dump Before <pass>" header), or "" when no dump was interleaved.
    """

    file: str
    line: int
    col: int
    severity: str
    message: str
    pass_name: str = ""


@dataclass(frozen=True)
class PtxasReport:
    """Resource usage reported by `ptxas -v` for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_bytes: int
    raw: str

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass
class Artifacts:
    """Everything one compile produced, keyed by the specialization that produced it.

    Attributes:
        kernel: kernel function name.
        source_file: path of the Python file that defines the kernel.
        target: "cuda:90"-style target string.
        triton_version: version of the triton that compiled it (IR and passes differ per release).
        signature: argument name -> Triton type ("*fp32", "i32", "constexpr", ...).
        constants: constexpr argument name -> value (as repr-able JSON).
        arg_attrs: argument name -> launch specialization attributes, e.g. [["tt.divisibility", 16]].
        options: compile options actually used (num_warps, num_stages, ...).
        stages: IR text per stage ("ttir", "ttgir", "llir", "ptx"); binaries are not kept.
        pass_dumps: the MLIR_ENABLE_DUMP stream ("IR Dump Before <pass>" sections), raw.
        remarks: compiler diagnostics with source locations and the emitting pass.
        ptxas: the ptxas resource report, when the target has one.
        metadata: compiled-kernel metadata (shared memory, warps, hash, ...).
        specialization: Triton's own serialized specialization (JITFunction.preload format).
        launched_on: "device" when the specialization came from a real device launch,
            "cpu" when CPU tensors were specialized for the target without a GPU.
        cache_key: content hash this record is cached under.
    """

    kernel: str
    source_file: str
    target: str
    triton_version: str
    signature: dict[str, str]
    constants: dict[str, Any]
    arg_attrs: dict[str, list[list[Any]]]
    options: dict[str, Any]
    stages: dict[str, str]
    pass_dumps: str = ""
    remarks: list[Remark] = field(default_factory=list)
    ptxas: PtxasReport | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    specialization: str = ""
    launched_on: str = "cpu"
    cache_key: str = ""
    schema_version: int = SCHEMA_VERSION

    def divisible_args(self) -> set[str]:
        """Arguments the launch specialized as divisible by 16 (pointers: 16-byte aligned)."""
        return {
            name
            for name, attrs in self.arg_attrs.items()
            if any(a[0] == "tt.divisibility" and int(a[1]) % 16 == 0 for a in attrs)
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=repr)

    @classmethod
    def from_json(cls, text: str) -> Artifacts:
        data = json.loads(text)
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"artifacts schema {data.get('schema_version')} != {SCHEMA_VERSION}")
        data["remarks"] = [Remark(**r) for r in data.get("remarks", [])]
        if data.get("ptxas"):
            data["ptxas"] = PtxasReport(**data["ptxas"])
        return cls(**data)
