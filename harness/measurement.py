"""Measurement records: what running a task produced, per kernel and case. Plain, JSON-serialisable.

A `RunReport` holds one `KernelRun` per kernel that ran (the task's own "baseline" and, when given,
a "candidate"), each with one `CaseResult` per case. Correctness comes first: a kernel is timed only
after every case and seed passed, and a rejection carries one reason a person can act on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["geomean", "CaseCheck", "CaseResult", "KernelRun", "Roofline", "RunReport", "Timing"]

def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values (speedups), None when there are none."""
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


SPEEDUP_REVIEW = 10.0  # evaluation.md: speedups above this are flagged for a second look


@dataclass
class CaseCheck:
    """Correctness of one output of one case over all seeds (worst seen)."""

    output: int
    dtype: str
    shape: list[int]
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    mismatched: int = 0  # elements outside atol + rtol * |ref|
    nan_mismatch: int = 0  # NaN in one of kernel/reference but not the other
    inf_mismatch: int = 0
    unwritten: int = 0  # elements the kernel never wrote (still poisoned)
    first_bad: list[int] | None = None  # index of the first bad element
    atol: float = 0.0
    rtol: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.nan_mismatch or self.inf_mismatch or self.unwritten)


@dataclass
class Timing:
    """Device time of one case: median of many repetitions, and how repeatable it was."""

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    repeat_spread: float | None = None  # |median of a second timing - first| / first
    l2_flushed: bool = True
    rotating_buffers: int = 1
    warmup_ms: int | None = None  # the windows it was timed with (None: records from before they were kept)
    rep_ms: int | None = None
    timing_passes: int = 1  # ABAB passes taken: more than one when a pass was too noisy (harness.runner)


@dataclass
class Roofline:
    """Where a case sits against the device's measured ceilings."""

    bytes: float | None
    flops: float | None
    achieved_gbps: float | None
    achieved_tflops: float | None
    bound: str  # "memory" or "compute" by arithmetic intensity vs the ridge point
    fraction: float  # achieved / attainable at this intensity (1.0 = on the roofline)
    # The device's launch floor (µs) when it was measured: no launch is faster, whatever the roofline says.
    floor_us: float | None = None

    def bound_on_speedup(self, median_us: float) -> float:
        """The most a rewrite could speed this case up: to the roofline, or to the launch floor when the
        roofline time lies below it (1.0 for a case at or past its ceiling)."""
        attainable_us = median_us * self.fraction
        if self.floor_us:
            attainable_us = max(attainable_us, self.floor_us)
        return max(1.0, median_us / attainable_us) if attainable_us > 0 else 1.0


@dataclass
class CaseResult:
    case: dict[str, Any]
    label: str
    heldout: bool = False
    generated: bool = False  # a held-out case drawn for this run from the task's heldout_ranges
    checks: list[CaseCheck] = field(default_factory=list)
    seeds: int = 0
    timing: Timing | None = None
    roofline: Roofline | None = None
    profile: dict[str, Any] | None = None  # harness.profilers.KernelProfile.to_dict()
    error: str | None = None
    input_bytes: int | None = None  # the timed input set's tensors, as the kernel's wrapper sees them

    @property
    def correct(self) -> bool:
        return self.error is None and all(c.ok for c in self.checks)


@dataclass
class KernelRun:
    role: str  # "baseline" | "candidate" | "eager" | "compiled" (PyTorch stand-ins, timed only)
    source: str  # file that defines the entry
    cases: list[CaseResult] = field(default_factory=list)
    rejected: str | None = None  # the first reason this kernel cannot be trusted or timed
    launches: int = 0  # Triton launches seen in one call of the first case
    kernels: list[str] = field(default_factory=list)  # names of the Triton kernels launched
    artifacts: list[str] = field(default_factory=list)  # Artifacts JSON files (npu: TRITON_DEBUG dumps)
    # What its outputs were compared with: "the reference", "the task's own kernel", or None when nothing
    # could be (a kernel without a reference, checked by the guards alone).
    compared_with: str | None = None

    @property
    def correct(self) -> bool:
        return self.rejected is None and all(c.correct for c in self.cases)

    @property
    def verdict(self) -> str:
        """"correct", "rejected", or "guards only" (passed every guard; no outputs compared)."""
        if not self.correct:
            return "rejected"
        return "correct" if self.compared_with or not self.cases else "guards only"


@dataclass
class RunReport:
    task: str
    backend: str
    device: str
    runs: list[KernelRun] = field(default_factory=list)
    ceilings: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    failure: str | None = None  # the worker itself failed (hang, crash, CUDA error)
    seed: int | None = None  # the run's seed: inputs and generated held-out cases replay from it (--seed)

    def run(self, role: str) -> KernelRun | None:
        return next((r for r in self.runs if r.role == role), None)

    def speedups(self, baseline: str = "baseline", candidate: str = "candidate") -> dict[str, float]:
        """`baseline` median / `candidate` median per timed case label (e.g. eager over candidate: the
        kernel's speedup over PyTorch)."""
        base, cand = self.run(baseline), self.run(candidate)
        if base is None or cand is None:
            return {}
        times = {c.label: c.timing.median_us for c in base.cases if c.timing}
        return {c.label: times[c.label] / c.timing.median_us
                for c in cand.cases if c.timing and c.label in times and c.timing.median_us > 0}

    def flags(self) -> list[str]:
        return [f"{label}: speedup {s:.1f}x is above {SPEEDUP_REVIEW:.0f}x; check it before trusting it"
                for label, s in self.speedups().items() if s > SPEEDUP_REVIEW]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedups"] = self.speedups()
        d["flags"] = self.flags()
        for run, rd in zip(self.runs, d["runs"]):
            rd["correct"] = run.correct
            rd["verdict"] = run.verdict
            for case, cd in zip(run.cases, rd["cases"]):
                cd["correct"] = case.correct
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunReport:
        runs = []
        for rd in d.get("runs", []):
            cases = []
            for cd in rd.get("cases", []):
                cases.append(CaseResult(
                    case=cd["case"], label=cd["label"], heldout=cd.get("heldout", False),
                    generated=cd.get("generated", False),
                    checks=[CaseCheck(**c) for c in cd.get("checks", [])], seeds=cd.get("seeds", 0),
                    timing=Timing(**cd["timing"]) if cd.get("timing") else None,
                    roofline=Roofline(**cd["roofline"]) if cd.get("roofline") else None,
                    profile=cd.get("profile"), error=cd.get("error"), input_bytes=cd.get("input_bytes"),
                ))
            runs.append(KernelRun(role=rd["role"], source=rd["source"], cases=cases,
                                  rejected=rd.get("rejected"), launches=rd.get("launches", 0),
                                  kernels=list(rd.get("kernels", [])), artifacts=list(rd.get("artifacts", [])),
                                  compared_with=rd.get("compared_with")))
        return cls(task=d["task"], backend=d["backend"], device=d["device"], runs=runs,
                   ceilings=d.get("ceilings"), notes=list(d.get("notes", [])), failure=d.get("failure"),
                   seed=d.get("seed"))
