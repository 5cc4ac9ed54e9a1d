"""L2 profiling diagnosis: a run's measurements become a bottleneck class with the metrics as evidence.

Input is a `RunReport` (what `kb run --json [--profile]` prints): per case the median time, the
roofline position against the device's measured ceilings, and, with --profile, Nsight Compute (or
msprof) counters. Classes (finding kinds `profile.*`, matched by patterns' symptoms):

- launch-bound: every case finishes in a few microseconds, the launch overhead's order;
- host-bound: the time stays flat while the work grows many-fold across the cases (the small ones at
  least: a fixed cost per call that the large cases hide), or the device works
  a small part of the time a call takes (ncu's kernel time against the timed call);
- memory-bound short of the roofline: memory-bound by intensity, below 80% of the copy ceiling (below
  60%: far from it, with more confidence);
- latency-bound: counters show the warps stalled on memory (long scoreboard) with DRAM far from busy,
  or low achieved occupancy;
- compute-bound without tensor cores: compute-bound with FLOP/s below the fp32 CUDA-core ceiling;
- ALU-bound: a memory-bound operation whose SMs are busy (>= 60%) while DRAM is not (< 40%);
- scalar-bound (Ascend): the scalar pipe dominates the vector pipe;
- grid above the core count (Ascend): the profiler's Block Dim exceeds the vector cores;
- uncoalesced (ncu): global loads or stores move many 32-byte sectors per request.

A memory-bound or tensor-core finding read from fewer timed cases than the other bound holds is kept as
worth checking, not a defect (`_minority`).

Where the run's rooflines rest on the task's bytes/flops formula, the kernel's own work at the launch
(`diagnose.work.kernel_work`: its tensors' bytes, its dots' FLOPs from its operands or its IR) is set
beside it: a formula more than 2x off is said, and the kernel's work places the case instead; a run
without a formula is placed by the kernel's work alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import median

from diagnose.analyzers.ascend import DEFAULT_VECTOR_CORES
from diagnose.records import EvidenceLog, Finding
from diagnose.work import KernelWork
from harness.measurement import Roofline, RunReport, Timing
from harness.profilers import NCU_SECTORS, sectors_per_request
from harness.roofline import place

__all__ = ["classify"]

LAUNCH_US = 8.0  # kernels this short are dominated by launch and tail effects
FAR_FROM_ROOF = 0.6
NEAR_ROOF = 0.9  # of the copy bandwidth: from here a memory-bound kernel is healthy (profile.ok); issue 27's bar
AT_COMPUTE_ROOF = 0.8  # of the measured matmul ceiling: little left for a rewrite to gain
MINORITY_CONFIDENCE = 0.4  # a bound seen in fewer cases than the other: below REPORT_CONFIDENCE, worth checking
HOST_FLAT = 1.5  # times within this ratio of each other are flat
HOST_WORK_SPAN = 8.0  # ... while the work grows at least this many-fold
HOST_MIN_GAIN = 1.2  # a fixed cost the run's geomean would not feel is left unsaid
FORMULA_OFF = 2.0  # a task formula this far from the kernel's own work is not trusted
# Sectors per request: a coalesced warp moves 4 (4-byte lanes) to 16 (16-byte vectors); more than 16
# only when lanes touch sectors of their own (32 for 4-byte lanes).
UNCOALESCED_SECTORS = 24.0


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


def _minority(finding: Finding, cases: int, others: int) -> Finding:
    """A bound's finding read from fewer timed cases than the other bound holds (one small memory-bound size
    of an attention whose other four sizes are compute-bound): worth checking, not a defect. The speedup is a
    geomean over the cases, so the kernel is mostly the other bound's, and its rounds belong there."""
    if finding.healthy or cases >= others:
        return finding
    return replace(finding, title=f"{finding.title} ({cases} of {cases + others} timed cases)",
                   confidence=min(finding.confidence, MINORITY_CONFIDENCE))


def _tensor_cores_underused(cases: list[_Timed], fp32_ceiling: float | None, log: EvidenceLog, where: str) -> list[Finding]:
    """Compute-bound cases whose dots run on tensor cores (above the fp32 CUDA-core rate, which tensor
    cores pass many times over) yet below AT_COMPUTE_ROOF of the measured matmul ceiling for their dtype.
    On Hopper the tile, stages and warps decide that distance: the drafts' 64x64x32 tile reached 0.44-0.56x
    of cuBLAS from 1024^3 up, a tile per size 0.76-0.95x (docs/device/2026-12-03-h200-matmul)."""
    under = [(c.label, r) for c in cases if (r := c.roofline) and r.bound == "compute" and r.fraction < AT_COMPUTE_ROOF
             and fp32_ceiling and (r.achieved_tflops or 0.0) >= fp32_ceiling]
    if not under:
        return []
    mid = median(r.fraction for _, r in under)
    ev = log.add("L2", "roofline", f"{len(under)} compute-bound case(s) run their dots on tensor cores (above the "
                 f"{fp32_ceiling:.0f} TFLOP/s CUDA-core rate) at a median {mid:.0%} of the measured matmul ceiling", where,
                 ", ".join(f"{label}: {r.achieved_tflops or 0:.0f} TFLOP/s ({r.fraction:.0%})" for label, r in under))
    return [Finding("dot.tile-underused", "tensor-cores", f"tensor-core dots at {mid:.0%} of the matmul ceiling",
                    "The dots reach tensor cores but keep them busy a fraction of the time: on Hopper the tile "
                    "shape, the pipeline's stages and the warps per program decide how much of the wgmma peak a "
                    "kernel keeps, and no one tile suits every size.", [ev], [], "tritongpu-accelerate-matmul", "L2",
                    0.8, gain=round(1.0 / max(mid, 0.05), 2))]


def classify(report: RunReport, log: EvidenceLog, work: KernelWork | None = None) -> list[Finding]:
    """L2's findings from a measured run; `work` is the kernel's own work at the diagnosed launch."""
    cases = _timed(report)
    if not cases:
        return []
    where = f"run:{report.task}@{report.device}"
    findings: list[Finding] = []
    if work is not None:
        cases = _placed_by_kernel(cases, work, report, log, where)
    findings += _host_bound(cases, log, where)
    times = [c.timing.median_us for c in cases]
    if max(times) < LAUNCH_US:
        ev = log.add("L2", "timing", f"every timed case takes under {LAUNCH_US:g} us (max {max(times):.1f} us, "
                     f"{len(times)} cases on {report.device})", where, ", ".join(f"{c.label}: {c.timing.median_us:.1f} us"
                                                                            for c in cases))
        findings.append(Finding("profile.launch-bound", "launch", "launch-bound: each call is a few microseconds",
                                "At this size the launch and the grid's tail dominate; more work per program or a "
                                "persistent grid amortizes them.", [ev], [], "", "L2", 0.8))
    memory = [(c.label, r) for c in cases if (r := c.roofline) and r.bound == "memory" and c.timing.median_us >= LAUNCH_US]
    compute_bound = [c for c in cases if (r := c.roofline) and r.bound == "compute" and c.timing.median_us >= LAUNCH_US]
    first = len(findings)
    if memory:
        fractions = [r.fraction for _, r in memory]
        mid = median(fractions)
        ceiling = report.ceilings or {}
        copy = ceiling.get("copy_gbps")
        against = ("of the measured copy rate at their sizes" if ceiling.get("copy_curve") else
                   f"of the measured copy bandwidth ({f'{copy:.0f}' if copy else '?'} GB/s)")
        ev = log.add("L2", "roofline", f"{len(memory)} memory-bound case(s) reach a median {mid:.0%} {against}", where,
                     ", ".join(f"{label}: {r.achieved_gbps:.0f} GB/s ({r.fraction:.0%})"
                               for label, r in memory if r.achieved_gbps))
        if mid < FAR_FROM_ROOF:
            findings.append(Finding("profile.memory-bound", "memory", f"memory-bound at {mid:.0%} of the copy roofline",
                                    "The kernel moves little data per unit time for a memory-bound operation: "
                                    "accesses are narrow, uncoalesced, unpipelined, or the grid leaves bandwidth idle.",
                                    [ev], [], "", "L2", 0.8 if mid < 0.4 else 0.65))
        elif mid < NEAR_ROOF:
            # Between the two, a rewrite still has up to 1.7x to take, so the memory-side rewrites are asked for,
            # with less confidence. Liger's GEGLU on the H200: 68% of copy, 1.46x from column tiles; and at 86%,
            # after the launch search's 1.26x, the same tiles still took it to 100% (449 -> 385 us).
            findings.append(Finding("profile.memory-bound", "memory", f"memory-bound at {mid:.0%} of the copy roofline",
                                    "Short of the measured copy bandwidth by more than 10% (streaming kernels reach it: on "
                                    "the H200, Liger's SwiGLU and the column-tiled GEGLU): tiles too coarse for the SMs to overlap, narrow or unpipelined "
                                    "accesses.", [ev], [], "", "L2", 0.5))
        else:
            findings.append(Finding("profile.ok", "memory", f"memory-bound at {mid:.0%} of the copy roofline",
                                    "Within 10% of the measured copy bandwidth: little left to gain.", [ev], [], "", "L2"))
        findings[first:] = [_minority(f, len(memory), len(compute_bound)) for f in findings[first:]]
    at_compute_roof = [(c.label, r) for c in cases if (r := c.roofline) and r.bound == "compute" and r.fraction >= AT_COMPUTE_ROOF]
    if at_compute_roof:
        label, r = at_compute_roof[0]
        ev = log.add("L2", "roofline", f"case {label} is compute-bound at {r.fraction:.0%} of the attainable rate "
                     f"({r.achieved_tflops or 0:.0f} TFLOP/s)", where, f"{label}: {r}")
        findings.append(Finding("profile.ok", "tensor-cores", f"compute-bound at {r.fraction:.0%} of its ceiling",
                                "Within 20% of the measured matmul ceiling for its input dtype: little left to gain.",
                                [ev], [], "", "L2"))
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
    findings += [_minority(f, len(compute_bound), len(memory))
                 for f in _tensor_cores_underused(cases, fp32_ceiling, log, where)]
    profiles = [c.profile for c in cases if isinstance(c.profile, dict)]
    if profiles:
        p = _numeric(profiles[-1])  # the largest case: the one whose behaviour dominates
        stalls = {str(s[0]): float(s[1]) for s in p.get("top_stalls", [])
                  if isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[1], (int, float))}
        long_sb = max((v for k, v in stalls.items() if "long_scoreboard" in k), default=0.0)
        dram = p.get("dram_throughput_pct")
        occ = p.get("achieved_occupancy_pct")
        sm = p.get("sm_throughput_pct")
        memory_op = any(c.roofline and c.roofline.bound == "memory" for c in cases)
        at = f"{where}:{p.get('kernel')}"
        # A kernel with DRAM or its SMs near peak is at a roof (below): waiting warps or few of them are how it
        # gets there (a GEMM runs at low occupancy by design), not what holds it back.
        at_roof = max((v for v in (dram, sm) if isinstance(v, (int, float))), default=0.0) >= BUSY_PCT
        if not at_roof:
            if long_sb >= 40 and (dram is None or dram < 60):
                ev = log.add("L2", "counters", f"ncu: {long_sb:.0f}% of warp stalls are long scoreboard (waiting on "
                             f"global memory) while DRAM throughput is {dram if dram is not None else '?'}% of peak",
                             at, str({k: v for k, v in stalls.items()}))
                findings.append(Finding("profile.latency-bound", "pipelining",
                                        "latency-bound: warps wait on memory, DRAM idle",
                                        "Too few loads are in flight to cover memory latency: loads are not prefetched "
                                        "(pipelining), or occupancy is too low to hide them.", [ev], [], "", "L2", 0.8))
            elif occ is not None and occ < 25:
                ev = log.add("L2", "counters", f"ncu: achieved occupancy {occ:.0f}%", at, f"{occ}")
                findings.append(Finding("profile.latency-bound", "pipelining",
                                        f"occupancy-bound: {occ:.0f}% achieved occupancy",
                                        "Few warps per SM leave memory latency exposed.", [ev], [], "", "L2", 0.7))
        if sm is not None and sm >= 60 and dram is not None and dram < 40 and memory_op:
            ev = log.add("L2", "counters", f"ncu: SM throughput {sm:.0f}% of peak while DRAM is at {dram:.0f}% in a "
                         "memory-bound operation", at, f"sm {sm}, dram {dram}")
            findings.append(Finding("profile.alu-bound", "index-math", "ALU-bound: instructions, not bytes, limit it",
                                    "A memory-bound operation whose SMs are busier than its DRAM spends its time on "
                                    "instructions: index arithmetic (64-bit, division), scalar accesses, or "
                                    "redundant work per element.", [ev], [], "", "L2", 0.75))
        findings += _uncoalesced(p, log, at)
        findings += _counters_at_a_roof(p, memory_op, log, at)
        findings += _idle_sms(p, report.device, cases[-1].timing.median_us, log, at)
        block_dim = p.get("block_dim")
        if report.backend == "npu" and block_dim and block_dim > DEFAULT_VECTOR_CORES:
            ev = log.add("L2", "counters", f"{p.get('source')}: Block Dim {block_dim}, above the {DEFAULT_VECTOR_CORES} "
                         "vector cores of a 910B-class device (triton-ascend docs/en/debug_guide/profiling.md)",
                         at, f"block_dim = {block_dim}")
            findings.append(Finding("ascend.grid-too-large", "ascend-launch", f"{block_dim} blocks for "
                                    f"{DEFAULT_VECTOR_CORES} cores", "The launch runs in batches of the core count, "
                                    "paying scheduling overhead per batch.", [ev], [], "", "L2", 0.8))
        pipes = p.get("pipes") or {}
        if pipes.get("scalar", 0) > max(pipes.get("vector", 0), 1):
            ev = log.add("L2", "counters", f"scalar pipe busy {pipes['scalar']:.0f}% vs vector {pipes.get('vector', 0):.0f}%",
                         at, str(pipes))
            findings.append(Finding("profile.scalar-bound", "ascend-compute", "scalar-bound: the scalar pipe dominates",
                                    "Work that should run on the vector unit runs element by element.", [ev], [], "",
                                    "L2", 0.8))
    return findings


def _placed_by_kernel(cases: list[_Timed], work: KernelWork, report: RunReport, log: EvidenceLog,
                      where: str) -> list[_Timed]:
    """The cases, the diagnosed launch's one placed on the roofline by the kernel's own work where the
    task gave no formula or one more than FORMULA_OFF from it. The launch is the case whose formula
    bytes are closest to the kernel's (the only case, for a run of one)."""
    ceilings = report.ceilings or {}
    if not ceilings.get("copy_gbps") or not work.complete:
        return cases  # no ceilings to place against, or dots whose FLOPs neither operands nor IR gave
    with_bytes = [c for c in cases if c.roofline and c.roofline.bytes]
    if len(cases) == 1:
        match = cases[0]
    elif with_bytes:
        match = min(with_bytes, key=lambda c: abs(math.log(((c.roofline.bytes if c.roofline else None) or 1.0) / max(work.bytes, 1.0))))
    else:
        return cases
    roof = match.roofline
    said = ""
    if roof is None or (not roof.bytes and not roof.flops):
        said = "the task gives no bytes/flops formula"
    else:
        off = [f"{name} {theirs:.3g} vs the kernel's {ours:.3g}" for name, theirs, ours in
               (("bytes", roof.bytes, work.bytes), ("flops", roof.flops, work.flops))
               if ours and (not theirs or max(theirs, ours) / min(theirs, ours) > FORMULA_OFF)]
        if not off:
            return cases
        said = f"the task's formula is more than {FORMULA_OFF:g}x off the kernel's own work ({'; '.join(off)})"
    placed = place(work.bytes, work.flops or None, match.timing.median_us * 1e-6, ceilings, work.dtype)
    if placed is None:
        return cases
    log.add("L2", "roofline", f"{said}: case {match.label} is placed by the kernel's work at its launch "
            f"({work.bytes / 1e6:.2f} MB, {work.flops / 1e9:.2f} GFLOP{_flops_from(work)}, {work.dtype} inputs): {placed.bound}-bound at "
            f"{placed.fraction:.0%} of the attainable rate", where,
            f"formula: bytes={roof.bytes if roof else None}, flops={roof.flops if roof else None}")
    return [_Timed(c.label, c.timing, placed, c.profile) if c is match else c for c in cases]


def _flops_from(work: KernelWork) -> str:
    return {"operands": " from its operands", "ir": " from its IR's dot tiles"}.get(work.flops_from, "")


def _host_bound(cases: list[_Timed], log: EvidenceLog, where: str) -> list[Finding]:
    """Time that does not follow the work: flat across cases whose work differs many-fold, or a device
    busy for a small part of each call (the wrapper's Python, syncs, copies between launches)."""
    flat = flat_floor([(c.roofline.bytes or 0.0, c.timing.median_us, c.label) for c in cases
                       if c.roofline and c.roofline.bytes])
    times = [t for _, t, _ in flat] if flat is not None else []
    gain = _geomean_bound(times, len(cases))
    if flat is not None and gain >= HOST_MIN_GAIN:
        work_span = flat[-1][0] / max(flat[0][0], 1.0)
        time_span = max(times) / min(times)
        which = "the timed cases" if len(flat) == len(cases) else \
            f"{len(flat)} of the {len(cases)} timed cases ({flat[0][2]} to {flat[-1][2]})"
        ev = log.add("L2", "timing", f"the time stays within {time_span:.2f}x while the work grows {work_span:.0f}x "
                     f"across {which}", where, ", ".join(f"{label}: {b / 1e6:.2f} MB in {t:.1f} us"
                                                         for b, t, label in flat))
        return [Finding("profile.host-bound", "launch", "host-bound: the time does not follow the work"
                        + ("" if len(flat) == len(cases) else f" from case {flat[0][2]} to {flat[-1][2]}"),
                        "Something other than the kernel's work sets the time at these sizes: the wrapper's host "
                        "code (autotune lookups, device contexts, syncs, .item(), Python loops of launches, copies), "
                        "or a fixed serial part. Remove it, batch the launches, or capture a CUDA graph.",
                        [ev], [], "", "L2", 0.8, gain=round(gain, 2))]
    for c in cases:
        device_us = (c.profile or {}).get("duration_us")
        if isinstance(device_us, (int, float)) and device_us > 0 and c.timing.median_us > 3 * device_us \
                and c.timing.median_us - device_us > 10:
            ev = log.add("L2", "counters", f"case {c.label}: the device runs the kernels {device_us:.1f} us of the "
                         f"{c.timing.median_us:.1f} us a call takes", f"{where}:{(c.profile or {}).get('kernel')}",
                         f"ncu duration {device_us} us, timed call {c.timing.median_us} us")
            return [Finding("profile.host-bound", "launch", f"host-bound: the device works {device_us / c.timing.median_us:.0%} "
                            "of each call", "The GPU idles while the wrapper's host code runs between launches.",
                            [ev], [], "", "L2", 0.8, gain=round(c.timing.median_us / max(device_us, LAUNCH_US), 2))]
    return []


def flat_floor(sized: list[tuple[float, float, str]]) -> list[tuple[float, float, str]] | None:
    """The (bytes, us, label) cases, by work, that sit at the run's time floor: the contiguous run of
    cases around the fastest one whose times stay within HOST_FLAT of it while their work spans at least
    HOST_WORK_SPAN-fold, above a launch's time. That floor is a fixed cost per call whatever the size: a
    sync in the wrapper costs 150 us at 4096 elements as at 8M, while the large cases follow their
    bytes, and the small cases weigh as much in a suite's geomean. Around the fastest case, not from the
    smallest: a host-bound call's time is noisy, and its smallest case measured at 227 us beside 116 us
    for 16x the work on the H200. None where there is no such run."""
    ordered = sorted(sized)
    if len(ordered) < 3:
        return None  # two sizes alone say too little about how the time scales
    fastest = min(range(len(ordered)), key=lambda i: ordered[i][1])
    floor = ordered[fastest][1]
    lo = hi = fastest
    while lo > 0 and ordered[lo - 1][1] <= HOST_FLAT * floor:
        lo -= 1
    while hi + 1 < len(ordered) and ordered[hi + 1][1] <= HOST_FLAT * floor:
        hi += 1
    run = ordered[lo:hi + 1]
    if floor < LAUNCH_US or run[-1][0] / max(run[0][0], 1.0) < HOST_WORK_SPAN:
        return None
    return run


def _geomean_bound(flat_us: list[float], timed: int) -> float:
    """What the run's geomean over its `timed` cases gains at most if the flat cases drop to a launch."""
    return math.prod(t / LAUNCH_US for t in flat_us) ** (1 / max(timed, 1))


BUSY_PCT = 60.0  # DRAM or SM throughput (% of peak) from which the kernel runs at a roof
IDLE_PCT = 40.0  # both below this: the device is mostly idle


def _counters_at_a_roof(profile: dict, memory_op: bool, log: EvidenceLog, where: str) -> list[Finding]:
    """ncu's throughputs: DRAM busy at >= 60% of peak is a kernel at a roof, and so are busy SMs, except in
    a memory-bound operation, where busy SMs are instructions in the way (ALU-bound, below)."""
    dram, sm = profile.get("dram_throughput_pct"), profile.get("sm_throughput_pct")
    busiest = max(((name, v) for name, v in (("DRAM", dram), ("SM", sm)) if isinstance(v, (int, float))
                   and not (name == "SM" and memory_op)), key=lambda nv: nv[1], default=None)
    if busiest is None or busiest[1] < BUSY_PCT:
        return []
    ev = log.add("L2", "counters", f"ncu: {busiest[0]} throughput {busiest[1]:.0f}% of peak (DRAM {dram}%, SM {sm}%)",
                 where, f"dram {dram}, sm {sm}")
    return [Finding("profile.ok", "memory" if busiest[0] == "DRAM" else "tensor-cores",
                    f"{busiest[0]} busy at {busiest[1]:.0f}% of peak", "The kernel keeps the device's busiest unit near "
                    "its peak: what it computes or moves is what bounds it, not how.", [ev], [], "", "L2")]


def _idle_sms(profile: dict, device: str, median_us: float, log: EvidenceLog, where: str) -> list[Finding]:
    """ncu's grid against the SMs of the measured device, with DRAM and SMs both mostly idle. What filling
    the device can gain is bounded by the launch too: a 5 us kernel cannot get faster than a launch."""
    from harness.cuda_shim import device_model_named

    model = device_model_named(device)
    grid = profile.get("block_dim") or (profile.get("metrics") or {}).get("launch__grid_size")
    dram, sm = profile.get("dram_throughput_pct"), profile.get("sm_throughput_pct")
    if model is None or not isinstance(grid, (int, float)) or not grid or grid >= model.sm_count \
            or not isinstance(dram, (int, float)) or not isinstance(sm, (int, float)) or max(dram, sm) >= IDLE_PCT:
        return []
    # Idle SMs, and idle warp slots on the busy ones (one program of a few warps per SM hides no latency).
    occupancy = profile.get("achieved_occupancy_pct")
    spread = max(model.sm_count / grid, 100.0 / occupancy if isinstance(occupancy, (int, float)) and occupancy > 0 else 1.0)
    gain = min(spread, median_us / LAUNCH_US)
    if gain < 1.5:
        return []
    ev = log.add("L2", "counters", f"ncu: the launch ran {int(grid)} program(s) on the {model.sm_count} SMs of "
                 f"{model.name}, DRAM at {dram:.0f}% and SMs at {sm:.0f}% of peak, achieved occupancy {occupancy}%", where,
                 f"launch__grid_size {grid}, dram {dram}, sm {sm}")
    return [Finding("parallelism.grid-underfilled", "parallelism", f"{int(grid)} program(s) for {model.sm_count} SMs, "
                    "the device mostly idle (measured)", "Fewer programs than SMs, and neither DRAM nor the busy SMs "
                    "near their peak: the grid, not what each program does, limits the kernel.", [ev], [], "", "L2",
                    0.9, gain=round(gain, 2))]


def _uncoalesced(profile: dict, log: EvidenceLog, where: str) -> list[Finding]:
    measured = sectors_per_request(profile.get("metrics") or {})
    if not measured:
        return []
    if max(measured.values()) < UNCOALESCED_SECTORS:
        ev = log.add("L2", "counters", "ncu: " + ", ".join(f"global {a}s move {v:.1f} sectors per request"
                                                           for a, v in measured.items()) + " (coalesced: 4 to 16)", where,
                     str({a: round(v, 2) for a, v in measured.items()}))
        return [Finding("memory.ok", "vectorization", "global accesses are coalesced (measured)",
                        "Each warp request moves no more sectors than its lanes' bytes need.", [ev], [], "", "L2")]
    access, per_request = next((a, v) for a, v in measured.items() if v >= UNCOALESCED_SECTORS)
    sectors_name, requests_name = NCU_SECTORS[access]
    metrics = profile.get("metrics") or {}
    ev = log.add("L2", "counters", f"ncu: global {access}s move {per_request:.1f} sectors per request "
                 "(a coalesced warp moves 4 to 16: 32 lanes x 4-16 bytes)", where,
                 f"{sectors_name} = {metrics[sectors_name]:g}, {requests_name} = {metrics[requests_name]:g}")
    return [Finding("memory.uncoalesced", "vectorization", f"uncoalesced {access}s: {per_request:.0f} sectors "
                    "per request", "Each lane of a warp touches its own 32-byte sector, so the memory system "
                    "moves several times the bytes the kernel uses.", [ev], [], "tritongpu-coalesce", "L2", 0.85,
                    gain=round(per_request / 16, 2))]
