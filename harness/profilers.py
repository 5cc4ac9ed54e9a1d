"""Read what a GPU/NPU profiler measured into one normalized record per kernel launch.

Why: diagnosis asks the same questions of every backend (is the kernel memory- or compute-bound,
which pipe or stall dominates, how big was the launch), but Nsight Compute, `msprof op` and the
torch_npu profiler answer them in three different file formats, units and vocabularies. This module
is the only place that knows those formats; everything above it sees `KernelProfile`.

Formats followed (parse by column *name*, never by position: every tool adds columns over time):

* Nsight Compute (`ncu --csv --page raw`): NVIDIA "Nsight Compute CLI" user guide (2023.x-2025.x),
  sections "Output Pages" and "Command Line Options"; filter flags as in "Nsight Compute Training,
  Usage Examples: Filter Options" (`--kernel-name regex:Bar`, `--launch-count 2`). The raw page is a
  header row ("ID","Process ID",...,"Kernel Name",...,"CC", metric names...), a units row, then one
  row per profiled launch. `ncu --csv` without `--page raw` (the details page: one row per metric,
  "Metric Name","Metric Unit","Metric Value") is accepted too.
  Warp stalls use `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`: the hardware
  counter family the WarpStateStats section and its CPIStall rule read in Nsight Compute 2023-2025
  (warp cycles stalled per issued instruction). Unlike `smsp__pcsamp_warps_issue_stalled_*` it needs
  no PC-sampling pass and is exact rather than sampled; the pcsamp, `average_warp_latency` and
  `warp_issue_stalled_*_per_warp_active` families are still recognized when a CSV carries them.
  Checked against ncu 2025.3.1 on an H200: it accepts every name in NCU_METRICS, prints units as "ns"
  (older releases: "nsecond") and thousands separators ("41,984"), and prints the table after the
  profiled program's own output.
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

import csv
import io
import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.errors import UserFacingError

__all__ = [
    "NCU_METRICS",
    "NCU_SECTORS",
    "sectors_per_request",
    "KernelProfile",
    "find_ncu",
    "ncu_command",
    "find_msprof",
    "msprof_op_command",
    "parse_msprof_op",
    "parse_ncu_csv",
    "parse_torch_npu_profile",
    "summarize",
]


@dataclass
class KernelProfile:
    """One kernel launch as a profiler measured it, normalized across profilers."""

    kernel: str  # kernel name as the profiler reports it
    source: str  # "ncu" | "msprof" | "torch_npu"
    duration_us: float | None = None
    dram_throughput_pct: float | None = None  # % of peak DRAM (NPU: GM/HBM) bandwidth
    sm_throughput_pct: float | None = None  # % of peak compute throughput (NVIDIA SM; NPU: busiest compute pipe)
    achieved_occupancy_pct: float | None = None  # NVIDIA only
    l2_hit_rate_pct: float | None = None
    top_stalls: list[tuple[str, float]] = field(default_factory=list)  # (reason, % of stalls), descending, <= 5
    pipes: dict[str, float] = field(default_factory=dict)  # NPU: % of time per pipe: vector, cube, scalar, mte1-3
    block_dim: int | None = None  # launch grid as the profiler saw it (NPU block dim; NVIDIA grid size product)
    metrics: dict[str, float] = field(default_factory=dict)  # every numeric raw metric, by its original name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict, so profiles can travel back from a worker and be cached."""
        record = asdict(self)
        record["top_stalls"] = [[reason, share] for reason, share in self.top_stalls]
        return record

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelProfile:
        """Inverse of `to_dict`; ignores keys a newer writer added."""
        missing = [key for key in ("kernel", "source") if key not in d]
        if missing:
            raise UserFacingError(
                f"kernel profile record lacks {', '.join(missing)}",
                "pass a dict written by KernelProfile.to_dict",
            )
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in d.items() if key in known}
        values["top_stalls"] = [(str(reason), float(share)) for reason, share in d.get("top_stalls", [])]
        values["pipes"] = {str(k): float(v) for k, v in d.get("pipes", {}).items()}
        values["metrics"] = {str(k): float(v) for k, v in d.get("metrics", {}).items()}
        return cls(**values)


# --------------------------------------------------------------------------------------------------
# Shared cell and table reading
# --------------------------------------------------------------------------------------------------

_MISSING = frozenset({"", "n/a", "na", "nan", "-", "none", "null"})
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")


def _number(raw: str | None) -> float | None:
    """A cell as a float, or None for "n/a", blanks and text.

    Commas are removed only in a thousands-separator pattern ("1,234.5"), so a shape such as
    "1024,1024" is text, not the number 10241024.
    """
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in _MISSING:
        return None
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(raw: str | None) -> int | None:
    value = _number(raw)
    return int(value) if value is not None else None


def _first(row: dict[str, str], names: Iterable[str]) -> str | None:
    """The cell of the first of `names` the row has: tools renamed columns across releases."""
    for name in names:
        if name in row:
            return row[name]
    return None


def _numeric(row: dict[str, str], skip: frozenset[str]) -> dict[str, float]:
    """Every numeric cell of a row by column name, except the identity columns in `skip`."""
    return {name: value for name, raw in row.items() if name not in skip and (value := _number(raw)) is not None}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """A CSV file as its header and (line number, row) pairs; a ragged row is the user's to fix.

    Reads utf-8 with an optional BOM (CANN tools write one on some releases) and tolerates
    trailing empty cells, which spreadsheet round trips add.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserFacingError(f"cannot read {path}: {exc}", "check the path and that the file is a CSV") from None
    reader = csv.reader(io.StringIO(text))
    try:
        rows = [(reader.line_num, values) for values in reader]
    except csv.Error as exc:
        raise UserFacingError(
            f"{path}: line {reader.line_num}: not valid CSV ({exc})", "re-run the profiler to rewrite the file"
        ) from None
    rows = [(line, _trim(values)) for line, values in rows if any(cell.strip() for cell in values)]
    if not rows:
        raise UserFacingError(f"{path}: line 1: empty file, no CSV header", "re-run the profiler; it stopped early")
    header = [name.strip() for name in rows[0][1]]
    records = []
    for line, values in rows[1:]:
        if len(values) != len(header):
            raise UserFacingError(
                f"{path}: line {line}: {len(values)} fields where the header has {len(header)}",
                "the file is truncated or was edited; re-run the profiler",
            )
        records.append((line, dict(zip(header, values))))
    return header, records


def _preview(header: list[str]) -> str:
    return ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")


def _trim(values: list[str]) -> list[str]:
    while values and not values[-1].strip():
        values = values[:-1]
    return values


def _require(path: Path, header: list[str], choices: Iterable[tuple[str, ...]]) -> None:
    """Fail naming the file when a column the record cannot do without is absent."""
    for names in choices:
        if not any(name in header for name in names):
            wanted = " or ".join(repr(name) for name in names)
            raise UserFacingError(
                f"{path}: line 1: no {wanted} column (header: {_preview(header)})",
                "pass the file the profiler wrote, unmodified",
            )


# --------------------------------------------------------------------------------------------------
# Nsight Compute
# --------------------------------------------------------------------------------------------------

_NCU_DURATION = ("gpu__time_duration.sum", "Duration")
_NCU_DRAM = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM Throughput",
)
_NCU_SM = ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput")
_NCU_OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy")
_NCU_L2_HIT = ("lts__t_sector_hit_rate.pct", "L2 Hit Rate")
_NCU_GRID = "launch__grid_size"
# Global memory sectors per request, loads and stores: 4 for a warp of fp32 lanes reading adjacent
# addresses (128 bytes), up to 32 when every lane touches its own sector (uncoalesced).
NCU_SECTORS = {
    "load": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    "store": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
}

# The warp states the WarpStateStats section breaks stalls into on Volta and later. Hopper-only
# reasons (gmma) are left out: ncu rejects a metric the GPU does not have, failing the whole run.
_STALL_REASONS = (
    "long_scoreboard", "short_scoreboard", "wait", "barrier", "mio_throttle", "lg_throttle",
    "math_pipe_throttle", "not_selected", "selected", "no_instruction", "dispatch_stall", "membar",
    "branch_resolving", "drain", "sleeping", "tex_throttle", "imc_miss",
)  # fmt: skip

def sectors_per_request(metrics: dict[str, Any]) -> dict[str, float]:
    """Global sectors per request by access ("load", "store"), from ncu's raw metrics where it measured them."""
    out = {}
    for access, (sectors, requests) in NCU_SECTORS.items():
        s, r = metrics.get(sectors), metrics.get(requests)
        if isinstance(s, (int, float)) and isinstance(r, (int, float)) and r > 0:
            out[access] = s / r
    return out


NCU_METRICS: tuple[str, ...] = (
    _NCU_DURATION[0],
    _NCU_DRAM[0],
    _NCU_SM[0],
    _NCU_OCCUPANCY[0],
    _NCU_L2_HIT[0],
    _NCU_GRID,
    *(name for pair in NCU_SECTORS.values() for name in pair),
    *(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in _STALL_REASONS),
)

# Stall families in order of preference; a row is read from the first family it carries, so two
# families in one CSV are never added together.
_STALL_FAMILIES = (
    re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<reason>\w+)$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_(?P<reason>\w+?)(?:\.(?:ratio|pct|sum))?$"),
    re.compile(r"^smsp__warp_issue_stalled_(?P<reason>\w+?)_per_warp_active\.pct$"),
)
_REASON_ALIASES = {"no_instructions": "no_instruction"}

# Launch identity columns of both ncu CSV pages: never metrics, even when numeric.
_NCU_IDENTITY = frozenset({
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value",
    "Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup",
})  # fmt: skip

# Microseconds per unit. An empty unit is ncu's base unit for durations, nanoseconds.
_TIME_UNITS = {
    "": 1e-3, "nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0,
    "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6,
}  # fmt: skip

_NCU_CANDIDATES = (
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)


def ncu_command(
    argv: list[str], *, kernel_regex: str | None = None, ncu: str = "ncu", launch_count: int | None = None
) -> list[str]:
    """The command line that profiles `argv` under Nsight Compute and prints what `parse_ncu_csv` reads.

    `--print-units base` keeps every value in its base unit (ns, byte, ...), so `metrics` of two runs
    compare without rescaling; `--target-processes all` follows a launcher into the worker process.
    """
    if not argv:
        raise UserFacingError("nothing to profile: the command to run under ncu is empty", "pass the worker's argv")
    command = [ncu, "--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(NCU_METRICS)]
    command += ["--target-processes", "all"]
    if kernel_regex:
        _compile(kernel_regex)
        command += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_count is not None:
        if launch_count < 1:
            raise UserFacingError(f"launch count {launch_count} profiles nothing", "pass a launch count of 1 or more")
        command += ["--launch-count", str(launch_count)]
    return [*command, *argv]


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


def find_ncu() -> str | None:
    """Where Nsight Compute's CLI is: PATH first, then the CUDA toolkit's and standalone install dirs.

    Worker images often ship the toolkit without putting its bin/ on PATH. Newest version first.
    """
    found = shutil.which("ncu")
    if found:
        return found
    homes = [os.environ[var] for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    roots = [os.path.join(home, "bin", "ncu") for home in homes]
    for pattern in (*roots, *_NCU_CANDIDATES):
        for candidate in sorted(_glob_absolute(pattern), reverse=True):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def _glob_absolute(pattern: str) -> Iterator[Path]:
    path = Path(pattern)
    if not any(char in pattern for char in "*?["):
        return iter([path])
    return Path(path.anchor).glob(str(path.relative_to(path.anchor)))


def parse_ncu_csv(text: str, *, source: str = "ncu output") -> list[KernelProfile]:
    """Profiles from `ncu --csv` output, one per launch, in the order ncu printed them.

    Lines before the CSV header (the profiled program's stdout, `==PROF==` progress) and non-CSV
    lines after it are skipped. `source` names the output in error messages (e.g. the log file).
    """
    header, records = _ncu_records(text, source)
    if "Metric Name" in header and "Metric Value" in header:
        launches = _ncu_pivot(records)
    else:
        launches = _ncu_wide(records)
    return [_ncu_profile(row, units, f"{source}: line {line}") for line, row, units in launches]


def _ncu_records(text: str, source: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    lines = text.splitlines()
    for index, line in enumerate(lines):  # noqa: B007 - where the header is: read after the loop
        if line.startswith('"') and "Kernel Name" in _csv_line(line):
            header = _csv_line(line)
            break
    else:
        raise UserFacingError(
            f"{source}: no Nsight Compute CSV header (a row with \"Kernel Name\") found",
            "run ncu with --csv --page raw (harness.profilers.ncu_command) and pass its complete output",
        )
    records = []
    for number, line in enumerate(lines[index + 1 :], start=index + 2):
        if not line.startswith('"'):
            continue  # program output or ==PROF== lines interleaved with the table
        values = _csv_line(line)
        if values == header:
            continue  # ncu repeats the header per profiled process
        if len(values) != len(header):
            raise UserFacingError(
                f"{source}: line {number}: {len(values)} fields, the header on line {index + 1} has {len(header)}",
                "the ncu output is truncated or interleaved with program output; re-run and pass all of it",
            )
        records.append((number, dict(zip(header, values))))
    return header, records


def _csv_line(line: str) -> list[str]:
    return next(csv.reader([line]), [])


def _ncu_wide(records: list[tuple[int, dict[str, str]]]) -> list[tuple[int, dict[str, str], dict[str, str]]]:
    """Raw page: a units row (no ID, no kernel) applies to the launch rows after it."""
    units: dict[str, str] = {}
    launches = []
    for line, row in records:
        if not row.get("ID", "").strip() and not row.get("Kernel Name", "").strip():
            units = row
        else:
            launches.append((line, row, units))
    return launches


def _ncu_pivot(records: list[tuple[int, dict[str, str]]]) -> list[tuple[int, dict[str, str], dict[str, str]]]:
    """Details page: one row per (launch, metric), turned into one row per launch with its own units."""
    launches: dict[str, tuple[int, dict[str, str], dict[str, str]]] = {}
    for line, row in records:
        key = row.get("ID", "") or f"{row.get('Process ID', '')}:{row.get('Kernel Name', '')}"
        if key not in launches:
            identity = {name: value for name, value in row.items() if name in _NCU_IDENTITY}
            launches[key] = (line, identity, {})
        _, wide, units = launches[key]
        name = row.get("Metric Name", "").strip()
        if name and name not in _NCU_IDENTITY and name not in wide:
            wide[name] = row.get("Metric Value", "")
            units[name] = row.get("Metric Unit", "")
    return list(launches.values())


def _ncu_profile(row: dict[str, str], units: dict[str, str], where: str) -> KernelProfile:
    metrics = _numeric(row, _NCU_IDENTITY)
    duration_name = next((name for name in _NCU_DURATION if name in metrics), None)
    duration = None
    if duration_name is not None:
        duration = _to_us(metrics[duration_name], units.get(duration_name, ""), duration_name, where)
    grid = metrics.get(_NCU_GRID)
    return KernelProfile(
        kernel=row.get("Kernel Name", "").strip(),
        source="ncu",
        duration_us=duration,
        dram_throughput_pct=_first_metric(metrics, _NCU_DRAM),
        sm_throughput_pct=_first_metric(metrics, _NCU_SM),
        achieved_occupancy_pct=_first_metric(metrics, _NCU_OCCUPANCY),
        l2_hit_rate_pct=_first_metric(metrics, _NCU_L2_HIT),
        top_stalls=_top_stalls(metrics),
        block_dim=int(grid) if grid is not None else _grid_product(row.get("Grid Size", "")),
        metrics=metrics,
    )


def _first_metric(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((metrics[name] for name in names if name in metrics), None)


def _to_us(value: float, unit: str, metric: str, where: str) -> float:
    scale = _TIME_UNITS.get(unit.strip().lower())
    if scale is None:
        raise UserFacingError(
            f"{where}: {metric} is in {unit!r}, not a unit of time",
            "re-run ncu with --print-units base (harness.profilers.ncu_command does)",
        )
    return value * scale


def _grid_product(grid: str) -> int | None:
    """"(16, 8, 1)" -> 128: the number of blocks, comparable with an NPU block dim."""
    dims = [int(dim) for dim in re.findall(r"\d+", grid)]
    return math.prod(dims) if dims else None


def _top_stalls(metrics: dict[str, float]) -> list[tuple[str, float]]:
    """The five largest stall reasons as % of all stall cycles (or samples), largest first.

    "selected" is the warp issuing, not stalling, so it is no share of the stalls.
    """
    for family in _STALL_FAMILIES:
        stalls: dict[str, float] = {}
        for name, value in metrics.items():
            match = family.match(name)
            if not match or match["reason"].endswith("_not_issued"):
                continue
            reason = _REASON_ALIASES.get(match["reason"], match["reason"])
            if reason != "selected" and value > 0:
                stalls[reason] = stalls.get(reason, 0.0) + value
        total = sum(stalls.values())
        if total > 0:
            shares = [(reason, 100.0 * value / total) for reason, value in stalls.items()]
            return sorted(shares, key=lambda item: (-item[1], item[0]))[:5]
    return []


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
    hit = _mean([value for name, value in values.items() if name.endswith("total_hit_rate(%)")])
    if hit is not None:
        return hit
    legacy = _mean([value for name, value in values.items() if name.endswith("l2_cache_hit_rate")])
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
    header, rows = _read_table(basic)
    _require(basic, header, [("Op Name",)])
    # Per-core files describe the one operator of their directory; a multi-row OpBasicInfo cannot share them.
    cores = _msprof_cores(basic) if len(rows) == 1 else _Cores()
    profiles = []
    for _, row in rows:
        metrics = _numeric(row, _MSPROF_IDENTITY)
        metrics.update(cores.values)
        profiles.append(
            KernelProfile(
                kernel=row["Op Name"].strip(),
                source="msprof",
                duration_us=_number(row.get("Task Duration(us)")),
                dram_throughput_pct=cores.dram,
                sm_throughput_pct=_busiest_compute(cores.pipes),
                l2_hit_rate_pct=cores.l2,
                pipes=dict(cores.pipes),
                block_dim=_int(_first(row, ("Block Dim", "Block Num"))),
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
    _, rows = _read_table(file)
    columns: dict[str, list[float]] = {}
    for _, row in rows:
        core = row.get("sub_block_id", "").strip().lower()
        for name, raw in row.items():
            if name in _CORE_COLUMNS or _other_core(name, core):
                continue
            value = _number(raw)
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
    header, rows = _read_table(file)
    _require(file, header, [_TORCH_NPU_NAME, _TORCH_NPU_DURATION])
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
    metrics = _numeric(row, _TORCH_NPU_IDENTITY)
    return {name: value for name, value in metrics.items() if not name.startswith(("Input ", "Output "))}


def _torch_npu_profile(row: dict[str, str], metrics: dict[str, float], scale: float) -> KernelProfile:
    pipes = _pipes(metrics, scale)
    return KernelProfile(
        kernel=(_first(row, _TORCH_NPU_NAME) or "").strip(),
        source="torch_npu",
        duration_us=_number(_first(row, _TORCH_NPU_DURATION)),
        dram_throughput_pct=_gm_usage_pct(metrics),
        sm_throughput_pct=_busiest_compute(pipes),
        l2_hit_rate_pct=_l2_hit_pct(metrics),
        pipes=pipes,
        block_dim=_int(_first(row, _TORCH_NPU_BLOCK)),
        metrics=metrics,
    )


# --------------------------------------------------------------------------------------------------
# Choosing the kernel that matters
# --------------------------------------------------------------------------------------------------


def summarize(profiles: list[KernelProfile], kernel_regex: str | None = None) -> KernelProfile | None:
    """The dominant kernel among those whose name matches `kernel_regex` (searched, not anchored).

    Dominant = longest total time over its launches, because that is where optimizing pays. The
    result's `duration_us` is that total; every other field is the longest single launch's, whose
    counters are the least disturbed by launch overhead. None when nothing matches.
    """
    pattern = _compile(kernel_regex) if kernel_regex else None
    totals: dict[str, float] = {}
    longest: dict[str, KernelProfile] = {}
    for profile in profiles:
        if pattern is not None and not pattern.search(profile.kernel):
            continue
        totals[profile.kernel] = totals.get(profile.kernel, 0.0) + (profile.duration_us or 0.0)
        best = longest.get(profile.kernel)
        if best is None or (profile.duration_us or 0.0) > (best.duration_us or 0.0):
            longest[profile.kernel] = profile
    if not totals:
        return None
    name = max(totals, key=lambda kernel: totals[kernel])
    best = longest[name]
    return replace(
        best,
        duration_us=totals[name] if best.duration_us is not None else None,
        top_stalls=list(best.top_stalls),
        pipes=dict(best.pipes),
        metrics=dict(best.metrics),
    )


def _compile(kernel_regex: str) -> re.Pattern[str]:
    try:
        return re.compile(kernel_regex)
    except re.error as exc:
        raise UserFacingError(
            f"kernel regex {kernel_regex!r} is invalid: {exc}", "pass a Python regular expression"
        ) from None
