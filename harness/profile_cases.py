"""Profiler metrics per case: each case's kernels run in a worker wrapped by the device's profiler
(Nsight Compute on cuda, `msprof op` on npu), and its report is parsed into a `KernelProfile` for the
case's dominant kernel."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.measurement import RunReport
from harness.profilers import (
    KernelProfile,
    find_msprof,
    find_ncu,
    msprof_op_command,
    ncu_command,
    parse_msprof_op,
    parse_ncu_csv,
    summarize,
)

__all__ = ["MSPROF", "NCU", "PROFILERS", "Profiler", "profile_cases"]


@dataclass(frozen=True)
class Profiler:
    name: str
    find: Callable[[], str | None]
    missing: str  # the note when the tool is absent
    # wrap(argv, tool, kernel names, output dir) -> the wrapped command line
    wrap: Callable[[list[str], str, list[str], str], list[str]]
    # read(stdout of the wrapped worker, output dir, where) -> profiles
    read: Callable[[str, str, str], list[KernelProfile]]


def _ncu_wrap(argv: list[str], tool: str, kernels: list[str], _out: str) -> list[str]:
    return ncu_command(argv, kernel_regex=_regex(kernels), ncu=tool)


def _msprof_wrap(argv: list[str], tool: str, kernels: list[str], out: str) -> list[str]:
    # msprof op takes one kernel name; the first launched kernel is the task's main one.
    return msprof_op_command(argv, output=out, kernel_name=kernels[0] if len(kernels) == 1 else None, msprof=tool)


def _regex(kernels: list[str]) -> str:
    return "|".join(f"^{re.escape(name)}$" for name in kernels)


NCU = Profiler("ncu", find_ncu, "no Nsight Compute metrics: ncu is not installed or not on PATH", _ncu_wrap,
               lambda text, _out, where: parse_ncu_csv(text, source=where))
MSPROF = Profiler("msprof op", find_msprof,
                  "no msprof op metrics: msprof is not on PATH (source the CANN set_env.sh)", _msprof_wrap,
                  lambda _text, out, _where: parse_msprof_op(out))
PROFILERS = {"cuda": NCU, "npu": MSPROF}


def profile_cases(report: RunReport, judge: Any, options: Any, kernels: list[Any],
                  profiler: Profiler | None = None) -> None:
    """Each timed case of each kernel (harness.judge.KernelSpec) run once more under the profiler, in a
    worker of its own, its report parsed into the case's `profile`."""
    profiler = profiler or PROFILERS.get(options.backend)
    if profiler is None:
        report.notes.append(f"--profile: no profiler for the {options.backend} backend")
        return
    tool = profiler.find()
    if tool is None:
        report.notes.append(profiler.missing)
        return
    for kernel in kernels:
        run = report.run(kernel.role)
        if run is None or not run.kernels:
            continue
        timed = [c for c in run.cases if not c.heldout]
        indices = options.cases if options.cases is not None else list(range(len(timed)))
        for index, case in zip(indices, timed):
            out = tempfile.mkdtemp(prefix="kb-profile-")
            try:
                failure, output = judge.profile(kernel, index, lambda cmd: profiler.wrap(cmd, tool, run.kernels, out))
                if failure:
                    report.notes.append(f"{profiler.name} on case {case.label}: {failure}")
                    continue
                profiles = profiler.read(output, out, f"{profiler.name} on {case.label}")
            finally:
                shutil.rmtree(out, ignore_errors=True)
            dominant = summarize(profiles, _regex(run.kernels))
            if dominant is not None:
                # The worker launches each kernel three times; the last launch is the warm one.
                case.profile = [p for p in profiles if p.kernel == dominant.kernel][-1].to_dict()
