"""Ascend specifics of a run: triton-ascend's TRITON_DEBUG dumps, collected into Artifacts.

With TRITON_DEBUG=1, triton-ascend writes kernel.ttir.mlir, kernel.ttadapter.mlir and kernel.mlir
(the bishengir input) through Triton's dump manager, one directory per kernel hash under
TRITON_DUMP_DIR (ascend/backend/compiler.py, `if opt.debug: get_dump_manager(...)`). A worker for
the npu backend gets a fresh TRITON_DUMP_DIR, so each job's dumps are its own.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from harness.ir import function_name, read_ir_dump
from harness.ir.artifacts import Artifacts

__all__ = ["collect_debug_dumps"]



_OUTPUT_SUFFIXES = (".log", ".txt", ".err", ".stderr")
_OUTPUT_LIMIT = 20000


def collect_debug_dumps(dump_dir: str | Path, triton_version: str = "", write: bool = True,
                        source_file: str = "") -> list[Artifacts]:
    """One Artifacts per kernel hash directory with its TTIR, ttadapter (linalg) and bishengir input.

    bishengir's `--mlir-print-ir-after` sections (TRITON_DEBUG adds hivm-inject-sync) become stages
    named "pass:<pass>", the last snapshot of each pass winning; its plain output (log files, e.g.
    a UB overflow message) is kept in metadata["compiler_output"]. With `write`, each record is
    also saved as `artifacts.json` beside its dumps, so a report can name the file instead of
    carrying the IR.
    """
    root = Path(dump_dir)
    if not root.is_dir():
        return []
    dump = read_ir_dump(root)
    # Key every snapshot by the directory its file sits in: a kernel's hash directory, or the root
    # itself when DIR is one kernel's directory.
    by_kernel: dict[str, dict[str, str]] = defaultdict(dict)
    for stage in sorted(dump.stages, key=lambda st: st.kind != "stage"):
        directory = Path(stage.source).parent.as_posix()
        name = stage.pass_arg if stage.kind == "stage" else f"pass:{stage.pass_arg}"
        by_kernel[directory][name] = stage.text
    records = []
    for kernel_dir, stages in sorted(by_kernel.items()):
        ttir = stages.get("ttir", "") or next(iter(stages.values()))
        function = next((fn for line in ttir.splitlines() if (fn := function_name(line))), None)
        output = "\n".join(p.read_text(errors="replace")[:_OUTPUT_LIMIT] for p in sorted((root / kernel_dir).glob("*"))
                           if p.suffix in _OUTPUT_SUFFIXES and p.is_file())
        where = (root / kernel_dir).resolve()
        record = Artifacts(kernel=function or where.name, source_file=source_file, target="npu",
                           triton_version=triton_version, signature={}, constants={}, arg_attrs={}, options={},
                           stages=stages, metadata={"hash": where.name, "dump_dir": str(where),
                                                    "problems": dump.problems, "compiler_output": output},
                           launched_on="device")
        if write:
            (root / kernel_dir / "artifacts.json").write_text(record.to_json())
        records.append(record)
    return records
