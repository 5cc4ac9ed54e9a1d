"""The normalized record of one profiled kernel launch, the choice of the launch that matters, and the
cell and table reading every profiler format shares (by column *name*, never by position: every tool
adds columns over time)."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.errors import UserFacingError

__all__ = ["KernelProfile", "first_cell", "int_cell", "keyed_row", "kernel_pattern", "mean_of", "number_cell",
           "numeric_cells", "read_table", "require_columns", "summarize"]


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


def number_cell(raw: str | None) -> float | None:
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


def int_cell(raw: str | None) -> int | None:
    value = number_cell(raw)
    return int(value) if value is not None else None


def first_cell(row: dict[str, str], names: Iterable[str]) -> str | None:
    """The cell of the first of `names` the row has: tools renamed columns across releases."""
    for name in names:
        if name in row:
            return row[name]
    return None


def numeric_cells(row: dict[str, str], skip: frozenset[str]) -> dict[str, float]:
    """Every numeric cell of a row by column name, except the identity columns in `skip`."""
    return {name: value for name, raw in row.items() if name not in skip and (value := number_cell(raw)) is not None}


def mean_of(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
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
    records = [(line, keyed_row(path, line, values, header, "the file is truncated or was edited; re-run the profiler"))
               for line, values in rows[1:]]
    return header, records


def keyed_row(source: object, line: int, values: list[str], header: list[str], fix: str,
              header_at: str = "the header") -> dict[str, str]:
    """A table row's cells by column name; a one-line error naming the line where its width is not the
    header's (a truncated, edited or interleaved table)."""
    if len(values) != len(header):
        raise UserFacingError(f"{source}: line {line}: {len(values)} fields where {header_at} has {len(header)}", fix)
    return dict(zip(header, values))


def _preview(header: list[str]) -> str:
    return ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")


def _trim(values: list[str]) -> list[str]:
    while values and not values[-1].strip():
        values = values[:-1]
    return values


def require_columns(path: Path, header: list[str], choices: Iterable[tuple[str, ...]]) -> None:
    """Fail naming the file when a column the record cannot do without is absent."""
    for names in choices:
        if not any(name in header for name in names):
            wanted = " or ".join(repr(name) for name in names)
            raise UserFacingError(
                f"{path}: line 1: no {wanted} column (header: {_preview(header)})",
                "pass the file the profiler wrote, unmodified",
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
    pattern = kernel_pattern(kernel_regex) if kernel_regex else None
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


def kernel_pattern(kernel_regex: str) -> re.Pattern[str]:
    try:
        return re.compile(kernel_regex)
    except re.error as exc:
        raise UserFacingError(
            f"kernel regex {kernel_regex!r} is invalid: {exc}", "pass a Python regular expression"
        ) from None
