"""L2 profiling diagnosis: a run's measurements become a bottleneck class with the metrics as evidence.

Input is a `RunReport` (what `kb run --json [--profile]` prints): per case the median time, the
roofline position against the device's measured ceilings, and, with --profile, Nsight Compute (or
msprof) counters. Classes (finding kinds `profile.*`, matched by patterns' symptoms):

- launch-bound: every case finishes in a few microseconds, the launch overhead's order;
- memory-bound far from the roofline: memory-bound by intensity, below 60% of the copy ceiling;
- latency-bound: counters show the warps stalled on memory (long scoreboard) with DRAM far from busy,
  or low achieved occupancy;
- compute-bound without tensor cores: compute-bound with FLOP/s below the fp32 CUDA-core ceiling;
- ALU-bound: a memory-bound operation whose SMs are busy (>= 60%) while DRAM is not (< 40%);
- scalar-bound (Ascend): the scalar pipe dominates the vector pipe;
- grid above the core count (Ascend): the profiler's Block Dim exceeds the vector cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from diagnose.analyzers.ascend import DEFAULT_VECTOR_CORES
from diagnose.records import EvidenceLog, Finding
from harness.measurement import Roofline, RunReport, Timing

__all__ = ["classify"]

LAUNCH_US = 8.0  # kernels this short are dominated by launch and tail effects
FAR_FROM_ROOF = 0.6


@dataclass(frozen=True)
class _Timed:
    """A listed case of the baseline that was timed: what L2 reads."""

    label: str
    timing: Timing
    roofline: Roofline | None
    profile: dict | None


def _timed(report: RunReport) -> list[_Timed]:
    run = report.run("baseline")
    return [_Timed(c.label, c.timing, c.roofline, c.profile) for c in (run.cases if run else [])
            if c.timing is not None and not c.heldout]


def _numeric(profile: dict) -> dict:
    """A profile with non-numeric metric values dropped (a hand-edited or foreign report)."""
    keys = ("dram_throughput_pct", "sm_throughput_pct", "achieved_occupancy_pct", "block_dim")
    out = {k: v for k, v in profile.items() if k not in keys or isinstance(v, (int, float))}
    pipes = profile.get("pipes")
    out["pipes"] = {k: v for k, v in pipes.items() if isinstance(v, (int, float))} if isinstance(pipes, dict) else {}
    return out


def classify(report: RunReport, log: EvidenceLog) -> list[Finding]:
    cases = _timed(report)
    if not cases:
        return []
    where = f"run:{report.task}@{report.device}"
    findings: list[Finding] = []
    times = [c.timing.median_us for c in cases]
    if max(times) < LAUNCH_US:
        ev = log.add("L2", "timing", f"every timed case takes under {LAUNCH_US:g} us (max {max(times):.1f} us, "
                     f"{len(times)} cases on {report.device})", where, ", ".join(f"{c.label}: {c.timing.median_us:.1f} us"
                                                                            for c in cases))
        findings.append(Finding("profile.launch-bound", "launch", "launch-bound: each call is a few microseconds",
                                "At this size the launch and the grid's tail dominate; more work per program or a "
                                "persistent grid amortizes them.", [ev], [], "", "L2", 0.8))
    memory = [(c.label, r) for c in cases if (r := c.roofline) and r.bound == "memory" and c.timing.median_us >= LAUNCH_US]
    if memory:
        fractions = [r.fraction for _, r in memory]
        mid = median(fractions)
        copy = (report.ceilings or {}).get("copy_gbps")
        ev = log.add("L2", "roofline", f"{len(memory)} memory-bound case(s) reach a median {mid:.0%} of the measured "
                     f"copy bandwidth ({f'{copy:.0f}' if copy else '?'} GB/s)", where,
                     ", ".join(f"{label}: {r.achieved_gbps:.0f} GB/s ({r.fraction:.0%})"
                               for label, r in memory if r.achieved_gbps))
        if mid < FAR_FROM_ROOF:
            findings.append(Finding("profile.memory-bound", "memory", f"memory-bound at {mid:.0%} of the copy roofline",
                                    "The kernel moves little data per unit time for a memory-bound operation: "
                                    "accesses are narrow, uncoalesced, unpipelined, or the grid leaves bandwidth idle.",
                                    [ev], [], "", "L2", 0.8 if mid < 0.4 else 0.65))
        elif mid >= 0.8:
            findings.append(Finding("profile.ok", "memory", f"memory-bound at {mid:.0%} of the copy roofline",
                                    "Within 20% of the measured copy bandwidth: little left to gain.", [ev], [], "", "L2"))
    compute = [(c.label, tflops) for c in cases
               if (r := c.roofline) and r.bound == "compute" and (tflops := r.achieved_tflops)]
    fp32_ceiling = (report.ceilings or {}).get("matmul_fp32_tflops")
    if compute and fp32_ceiling:
        best = max(tflops for _, tflops in compute)
        if best < fp32_ceiling:
            ev = log.add("L2", "roofline", f"compute-bound cases reach at most {best:.1f} TFLOP/s, below the measured fp32 "
                         f"CUDA-core ceiling of {fp32_ceiling:.0f} TFLOP/s", where,
                         ", ".join(f"{label}: {tflops:.1f} TFLOP/s" for label, tflops in compute))
            findings.append(Finding("profile.compute-bound", "tensor-cores", "compute-bound below the CUDA-core rate",
                                    "A tensor-core matmul runs an order of magnitude above the fp32 CUDA-core rate; "
                                    "this one does not, so its dots are on FMA or its tensor cores starve.",
                                    [ev], [], "", "L2", 0.75))
    profiles = [c.profile for c in cases if isinstance(c.profile, dict)]
    if profiles:
        p = _numeric(profiles[-1])  # the largest case: the one whose behaviour dominates
        stalls = {str(s[0]): float(s[1]) for s in p.get("top_stalls", [])
                  if isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[1], (int, float))}
        long_sb = max((v for k, v in stalls.items() if "long_scoreboard" in k), default=0.0)
        dram = p.get("dram_throughput_pct")
        occ = p.get("achieved_occupancy_pct")
        if long_sb >= 40 and (dram is None or dram < 60):
            ev = log.add("L2", "counters", f"ncu: {long_sb:.0f}% of warp stalls are long scoreboard (waiting on "
                         f"global memory) while DRAM throughput is {dram if dram is not None else '?'}% of peak",
                         f"{where}:{p.get('kernel')}", str({k: v for k, v in stalls.items()}))
            findings.append(Finding("profile.latency-bound", "pipelining", "latency-bound: warps wait on memory, DRAM idle",
                                    "Too few loads are in flight to cover memory latency: loads are not prefetched "
                                    "(pipelining), or occupancy is too low to hide them.", [ev], [], "", "L2", 0.8))
        elif occ is not None and occ < 25:
            ev = log.add("L2", "counters", f"ncu: achieved occupancy {occ:.0f}%", f"{where}:{p.get('kernel')}", f"{occ}")
            findings.append(Finding("profile.latency-bound", "pipelining", f"occupancy-bound: {occ:.0f}% achieved occupancy",
                                    "Few warps per SM leave memory latency exposed.", [ev], [], "", "L2", 0.7))
        sm, bound_memory = p.get("sm_throughput_pct"), any(c.roofline and c.roofline.bound == "memory" for c in cases)
        if sm is not None and sm >= 60 and dram is not None and dram < 40 and bound_memory:
            ev = log.add("L2", "counters", f"ncu: SM throughput {sm:.0f}% of peak while DRAM is at {dram:.0f}% in a "
                         "memory-bound operation", f"{where}:{p.get('kernel')}", f"sm {sm}, dram {dram}")
            findings.append(Finding("profile.alu-bound", "index-math", "ALU-bound: instructions, not bytes, limit it",
                                    "A memory-bound operation whose SMs are busier than its DRAM spends its time on "
                                    "instructions: index arithmetic (64-bit, division), scalar accesses, or "
                                    "redundant work per element.", [ev], [], "", "L2", 0.75))
        block_dim = p.get("block_dim")
        if report.backend == "npu" and block_dim and block_dim > DEFAULT_VECTOR_CORES:
            ev = log.add("L2", "counters", f"{p.get('source')}: Block Dim {block_dim}, above the {DEFAULT_VECTOR_CORES} "
                         "vector cores of a 910B-class device (triton-ascend docs/en/debug_guide/profiling.md)",
                         f"{where}:{p.get('kernel')}", f"block_dim = {block_dim}")
            findings.append(Finding("ascend.grid-too-large", "ascend-launch", f"{block_dim} blocks for "
                                    f"{DEFAULT_VECTOR_CORES} cores", "The launch runs in batches of the core count, "
                                    "paying scheduling overhead per batch.", [ev], [], "", "L2", 0.8))
        pipes = p.get("pipes") or {}
        if pipes.get("scalar", 0) > max(pipes.get("vector", 0), 1):
            ev = log.add("L2", "counters", f"scalar pipe busy {pipes['scalar']:.0f}% vs vector {pipes.get('vector', 0):.0f}%",
                         f"{where}:{p.get('kernel')}", str(pipes))
            findings.append(Finding("profile.scalar-bound", "ascend-compute", "scalar-bound: the scalar pipe dominates",
                                    "Work that should run on the vector unit runs element by element.", [ev], [], "",
                                    "L2", 0.8))
    return findings
