"""Nsight Compute: the command line that profiles a worker, and its CSV pages read into `KernelProfile`.

Format followed:

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
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.errors import UserFacingError
from harness.profile_record import KernelProfile, kernel_pattern, keyed_row, numeric_cells

__all__ = ["NCU_METRICS", "NCU_SECTORS", "find_ncu", "ncu_command", "parse_ncu_csv", "sectors_per_request"]


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
        kernel_pattern(kernel_regex)
        command += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_count is not None:
        if launch_count < 1:
            raise UserFacingError(f"launch count {launch_count} profiles nothing", "pass a launch count of 1 or more")
        command += ["--launch-count", str(launch_count)]
    return [*command, *argv]


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
        records.append((number, keyed_row(source, number, values, header, "the ncu output is truncated or interleaved "
                                          "with program output; re-run and pass all of it",
                                          f"the header on line {index + 1}")))
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
    metrics = numeric_cells(row, _NCU_IDENTITY)
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


