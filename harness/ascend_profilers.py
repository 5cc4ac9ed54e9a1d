"""Ascend NPU profilers: `msprof op` (its command line and OPPROF directories) and the torch_npu profiler
(kernel_details.csv), read into `KernelProfile`.

Formats followed:

* `msprof op` (Ascend CANN operator profiling on the board): CANN 8.0.0 / 8.5.0 "msprof op
  performance data files": OpBasicInfo.csv (Op Name, Op Type, Task Duration(us), Block Dim, Mix Block
  Dim, Device ID, PID, Current Freq, Rated Freq), PipeUtilization.csv (one row per core: block_id,
  sub_block_id, ai*_time(us), aiv_vec_ratio, aic_cube_ratio, ai*_scalar_ratio, aic_mte1_ratio,
  ai*_mte2_ratio, ai*_mte3_ratio, ...), Memory.csv (..., GM_to_UB_bw_usage_rate(%),
  UB_to_GM_bw_usage_rate(%), ...) and L2Cache.csv (..., ai*_total_hit_rate(%)). Layout as in the
  MindStudio "msprof op" tool guide: single operator: `OPPROF_<timestamp>_<id>/OpBasicInfo.csv`;
  several operators or devices: `OPPROF_.../[deviceN/]<OpName>/<launch>/OpBasicInfo_<timestamp>.csv`.
  Ratios are documented as "cycles of that instruction type / total cycles", i.e. fractions.
* torch_npu profiler: Ascend PyTorch Profiler `<worker>_<timestamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/
  kernel_details.csv` (CANN "timeline and summary data", kernel_details); base columns from torch_npu's
  own `CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS` ("Device_id","Name","Type","Accelerator Core",
  "Start Time(us)","Duration(us)","Wait Time(us)","Block Num"; older releases say "Block Dim"), an
  optional leading "Step Id", and with aic_metrics=PipeUtilization the op_summary pipe columns
  (aic_mac_ratio for the cube, aiv_vec_ratio, ai*_scalar/mte1/mte2/mte3_ratio, ...).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserFacingError
from harness.profile_record import (
    KernelProfile,
    first_cell,
    int_cell,
    mean_of,
    number_cell,
    numeric_cells,
    read_table,
    require_columns,
)

__all__ = ["find_msprof", "msprof_op_command", "parse_msprof_op", "parse_torch_npu_profile"]


def msprof_op_command(argv: list[str], *, output: str | Path, kernel_name: str | None = None,
                      msprof: str = "msprof") -> list[str]:
    """The command line that profiles `argv` under `msprof op`, writing an OPPROF_* directory into
    `output` that `parse_msprof_op` reads (triton-ascend docs/en/debug_guide/profiling.md:
    `msprof op --kernel-name=NAME --output=DIR python3 app.py`)."""
    if not argv:
        raise UserFacingError("nothing to profile: the command to run under msprof op is empty",
                              "pass the worker's argv")
    command = [msprof, "op", f"--output={output}"]
    if kernel_name:
        command.append(f"--kernel-name={kernel_name}")
    return [*command, *argv]


def find_msprof() -> str | None:
    """`msprof` on PATH, else under the CANN toolkit ($ASCEND_TOOLKIT_HOME or $ASCEND_HOME_PATH)."""
    found = shutil.which("msprof")
    if found:
        return found
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        home = os.environ.get(var)
        for candidate in ((Path(home) / "bin" / "msprof", Path(home) / "tools" / "profiler" / "bin" / "msprof")
                          if home else ()):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


# --------------------------------------------------------------------------------------------------
# Ascend NPU: pipes, memory and cache columns shared by msprof op and torch_npu
# --------------------------------------------------------------------------------------------------

# Columns per pipe; a pipe both core types have (scalar, mte2, ...) takes the busier core type.
_PIPE_COLUMNS = {
    "vector": ("aiv_vec_ratio", "aic_vec_ratio"),
    "cube": ("aic_cube_ratio", "aic_mac_ratio", "aiv_mac_ratio"),
    "scalar": ("aiv_scalar_ratio", "aic_scalar_ratio"),
    "mte1": ("aic_mte1_ratio", "aiv_mte1_ratio"),
    "mte2": ("aiv_mte2_ratio", "aic_mte2_ratio"),
    "mte3": ("aiv_mte3_ratio", "aic_mte3_ratio"),
}
_COMPUTE_PIPES = ("vector", "cube")
_GM_USAGE = re.compile(r"^(?:GM_to_[A-Za-z0-9]+|[A-Za-z0-9]+_to_GM)_bw_usage_rate\(%\)", re.IGNORECASE)


def _ratio_scale(values: Iterable[float]) -> float:
    """100 when the ratios are fractions, as documented; 1 when a file already holds percents.

    A fraction of cycles cannot exceed 1, so any ratio above 1 shows the file is in percent.
    """
    return 1.0 if any(value > 1.0 for value in values) else 100.0


def _pipe_ratios(values: dict[str, float]) -> list[float]:
    return [values[column] for columns in _PIPE_COLUMNS.values() for column in columns if column in values]


def _pipes(values: dict[str, float], scale: float) -> dict[str, float]:
    pipes = {}
    for pipe, columns in _PIPE_COLUMNS.items():
        found = [values[column] for column in columns if column in values]
        if found:
            pipes[pipe] = max(found) * scale
    return pipes


def _busiest_compute(pipes: dict[str, float]) -> float | None:
    """NPU analogue of SM throughput: the vector or cube pipe, whichever is busier.

    Scalar is left out: a scalar-heavy kernel is latency-bound, not short of compute throughput.
    """
    busy = [pipes[pipe] for pipe in _COMPUTE_PIPES if pipe in pipes]
    return max(busy) if busy else None


def _gm_usage_pct(values: dict[str, float]) -> float | None:
    """DRAM throughput on the NPU: the busiest GM<->core path, as ncu's throughput is its busiest part."""
    usage = [value for name, value in values.items() if _GM_USAGE.match(name)]
    return max(usage) if usage else None


def _l2_hit_pct(values: dict[str, float]) -> float | None:
    hit = mean_of([value for name, value in values.items() if name.endswith("total_hit_rate(%)")])
    if hit is not None:
        return hit
    legacy = mean_of([value for name, value in values.items() if name.endswith("l2_cache_hit_rate")])
    if legacy is None:
        return None
    return legacy * 100.0 if legacy <= 1.0 else legacy


# --------------------------------------------------------------------------------------------------
# msprof op
# --------------------------------------------------------------------------------------------------

_CSV_KIND = re.compile(r"^(?P<kind>[A-Za-z0-9]+)(?:_\d+)?\.csv$")
_MSPROF_IDENTITY = frozenset({"Op Name", "Op Type", "Device Id", "Device ID", "Pid", "PID"})
_CORE_COLUMNS = frozenset({"block_id", "sub_block_id"})


def parse_msprof_op(path: str | Path) -> list[KernelProfile]:
    """Profiles from an `msprof op` output directory, one per profiled operator launch.

    `path` is the OPPROF_<timestamp>_<id> directory, a directory holding exactly one, or a single
    launch's directory. Per-core CSV columns are averaged over the cores of their type.
    """
    root = _opprof_root(Path(path))
    basics = sorted(file for file in root.rglob("*.csv") if _csv_kind(file) == "OpBasicInfo")
    if not basics:
        raise UserFacingError(
            f"{root}: no OpBasicInfo.csv in this msprof op output",
            "pass the OPPROF_<timestamp>_<id> directory of a run that finished; a failed run leaves none",
        )
    return [profile for basic in basics for profile in _msprof_launch(basic)]


def _opprof_root(path: Path) -> Path:
    if not path.is_dir():
        problem = f"{path} is not a directory" if path.exists() else f"{path} does not exist"
        raise UserFacingError(problem, "pass the OPPROF_<timestamp>_<id> directory that msprof op wrote")
    if path.name.startswith("OPPROF_") or any(_csv_kind(file) == "OpBasicInfo" for file in path.glob("*.csv")):
        return path
    runs = sorted(child for child in path.iterdir() if child.is_dir() and child.name.startswith("OPPROF_"))
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise UserFacingError(f"{path} holds no OPPROF_* directory", "pass the --output directory of `msprof op`")
    names = ", ".join(run.name for run in runs)
    raise UserFacingError(
        f"{path} holds {len(runs)} msprof op runs ({names})", "pass the OPPROF_* directory you mean"
    )


def _csv_kind(file: Path) -> str | None:
    """"L2Cache_20240603022812284.csv" -> "L2Cache": multi-operator runs stamp their file names."""
    match = _CSV_KIND.match(file.name)
    return match["kind"] if match else None


def _sibling(basic: Path, kind: str) -> Path | None:
    matches = sorted(file for file in basic.parent.glob("*.csv") if _csv_kind(file) == kind)
    return matches[0] if matches else None


def _msprof_launch(basic: Path) -> list[KernelProfile]:
    header, rows = read_table(basic)
    require_columns(basic, header, [("Op Name",)])
    # Per-core files describe the one operator of their directory; a multi-row OpBasicInfo cannot share them.
    cores = _msprof_cores(basic) if len(rows) == 1 else _Cores()
    profiles = []
    for _, row in rows:
        metrics = numeric_cells(row, _MSPROF_IDENTITY)
        metrics.update(cores.values)
        profiles.append(
            KernelProfile(
                kernel=row["Op Name"].strip(),
                source="msprof",
                duration_us=number_cell(row.get("Task Duration(us)")),
                dram_throughput_pct=cores.dram,
                sm_throughput_pct=_busiest_compute(cores.pipes),
                l2_hit_rate_pct=cores.l2,
                pipes=dict(cores.pipes),
                block_dim=int_cell(first_cell(row, ("Block Dim", "Block Num"))),
                metrics=metrics,
            )
        )
    return profiles


@dataclass
class _Cores:
    """What the per-core files next to one OpBasicInfo.csv say, averaged over cores."""

    values: dict[str, float] = field(default_factory=dict)
    pipes: dict[str, float] = field(default_factory=dict)
    dram: float | None = None
    l2: float | None = None


def _msprof_cores(basic: Path) -> _Cores:
    cores = _Cores()
    pipe_file, memory_file, l2_file = (_sibling(basic, kind) for kind in ("PipeUtilization", "Memory", "L2Cache"))
    if pipe_file:
        averages = _core_averages(pipe_file)
        cores.pipes = _pipes(averages, _ratio_scale(_pipe_ratios(averages)))
        cores.values.update(averages)
    if memory_file:
        averages = _core_averages(memory_file)
        cores.dram = _gm_usage_pct(averages)
        cores.values.update(averages)
    if l2_file:
        averages = _core_averages(l2_file)
        cores.l2 = _l2_hit_pct(averages)
        cores.values.update(averages)
    return cores


def _core_averages(file: Path) -> dict[str, float]:
    """Each numeric column's mean over the cores it describes.

    aic_* columns describe cube cores and aiv_* vector cores; on a row of the other core type they
    are N/A or 0, and counting those zeros would halve a mixed operator's utilization.
    """
    _, rows = read_table(file)
    columns: dict[str, list[float]] = {}
    for _, row in rows:
        core = row.get("sub_block_id", "").strip().lower()
        for name, raw in row.items():
            if name in _CORE_COLUMNS or _other_core(name, core):
                continue
            value = number_cell(raw)
            if value is not None:
                columns.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in columns.items()}


def _other_core(column: str, core: str) -> bool:
    if column.startswith("aic_"):
        return core.startswith("vector")
    return column.startswith("aiv_") and core.startswith("cube")


# --------------------------------------------------------------------------------------------------
# torch_npu profiler
# --------------------------------------------------------------------------------------------------

_KERNEL_DETAILS = "kernel_details.csv"
_TORCH_NPU_NAME = ("Name", "Op Name")
_TORCH_NPU_DURATION = ("Duration(us)", "Task Duration(us)")
_TORCH_NPU_BLOCK = ("Block Dim", "Block Num")
# Identity and text columns: numeric or not, they are no measurement of the kernel.
_TORCH_NPU_IDENTITY = frozenset({
    "Step Id", "Step ID", "Device_id", "Model ID", "Task ID", "Stream ID", "Context ID", "Name", "Op Name",
    "Type", "OP Type", "OP State", "Accelerator Core", "Task Type", "Start Time(us)", "Task Start Time(us)",
    "HF32 Eligible",
})  # fmt: skip


def parse_torch_npu_profile(path: str | Path) -> list[KernelProfile]:
    """Profiles from torch_npu profiler output, one per kernel_details.csv row (one per launch).

    `path` is kernel_details.csv itself, its ASCEND_PROFILER_OUTPUT directory, or the *_ascend_pt
    directory above it.
    """
    file = _kernel_details_file(Path(path))
    header, rows = read_table(file)
    require_columns(file, header, [_TORCH_NPU_NAME, _TORCH_NPU_DURATION])
    measured = [(row, _torch_npu_metrics(row)) for _, row in rows]
    scale = _ratio_scale(value for _, metrics in measured for value in _pipe_ratios(metrics))
    return [_torch_npu_profile(row, metrics, scale) for row, metrics in measured]


def _kernel_details_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise UserFacingError(f"{path} does not exist", "pass a *_ascend_pt directory or its kernel_details.csv")
    found = sorted(path.rglob(_KERNEL_DETAILS))
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserFacingError(
            f"{path} holds no {_KERNEL_DETAILS}",
            "the profile was not parsed yet or was exported as .db; profile with export_type text",
        )
    listed = ", ".join(str(file.relative_to(path)) for file in found[:4])
    raise UserFacingError(
        f"{path} holds {len(found)} {_KERNEL_DETAILS} files ({listed})", "pass the *_ascend_pt directory of one rank"
    )


def _torch_npu_metrics(row: dict[str, str]) -> dict[str, float]:
    metrics = numeric_cells(row, _TORCH_NPU_IDENTITY)
    return {name: value for name, value in metrics.items() if not name.startswith(("Input ", "Output "))}


def _torch_npu_profile(row: dict[str, str], metrics: dict[str, float], scale: float) -> KernelProfile:
    pipes = _pipes(metrics, scale)
    return KernelProfile(
        kernel=(first_cell(row, _TORCH_NPU_NAME) or "").strip(),
        source="torch_npu",
        duration_us=number_cell(first_cell(row, _TORCH_NPU_DURATION)),
        dram_throughput_pct=_gm_usage_pct(metrics),
        sm_throughput_pct=_busiest_compute(pipes),
        l2_hit_rate_pct=_l2_hit_pct(metrics),
        pipes=pipes,
        block_dim=int_cell(first_cell(row, _TORCH_NPU_BLOCK)),
        metrics=metrics,
    )


