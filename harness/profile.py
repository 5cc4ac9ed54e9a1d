"""Nsight Compute metrics per case: each case's kernels run in a worker wrapped by `ncu`, and the
report (CSV on the profiler's stdout) is parsed into a `KernelProfile` for the case's dominant kernel."""

from __future__ import annotations

import re
from typing import Any

from harness.measurement import RunReport
from harness.profilers import find_ncu, ncu_command, parse_ncu_csv, summarize
from harness.sandbox import Worker

__all__ = ["profile_cases"]


def profile_cases(report: RunReport, task: dict[str, Any], options: Any, kernels: list[dict[str, Any]]) -> None:
    ncu = find_ncu()
    if ncu is None:
        report.notes.append("no Nsight Compute metrics: ncu is not installed or not on PATH")
        return
    for kernel in kernels:
        run = report.run(kernel["role"])
        if run is None or not run.kernels:
            continue
        regex = "|".join(f"^{re.escape(name)}$" for name in run.kernels)
        timed = [c for c in run.cases if not c.heldout]
        indices = options.cases if options.cases is not None else list(range(len(timed)))
        for index, case in zip(indices, timed):
            worker = Worker(options.backend, wrap=lambda cmd: ncu_command(cmd, kernel_regex=regex, ncu=ncu))
            answer = worker.submit({"task": task, "backend": options.backend, "kernels": [kernel], "cases": [index],
                                    "check": False, "profile": True}, options.timeout_s)
            output = worker.finish(options.timeout_s)
            if not answer.get("ok"):
                report.notes.append(f"ncu on case {case.label}: {answer.get('failure') or answer.get('user_error')}")
                continue
            profiles = parse_ncu_csv(output, source=f"ncu on {case.label}")
            dominant = summarize(profiles, regex)
            if dominant is not None:
                # The worker launches each kernel three times; the last launch is the warm one.
                case.profile = [p for p in profiles if p.kernel == dominant.kernel][-1].to_dict()
