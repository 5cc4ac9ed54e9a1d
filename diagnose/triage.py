"""L1 pattern triage: static kernel features -> suspected failure modes -> catalog patterns.

Each rule reads only the syntax tree and the launch keywords, so it can be wrong where the outcome
depends on runtime values (a mask bound that happens to be a multiple of 16, fp16 operands that make
input_precision irrelevant); its confidence says so, and progressive diagnosis escalates to the IR
for anything not certain. Rules whose outcome the source alone decides (a streaming loop that never
asks for pipelining; one element per thread) carry high confidence.
"""

from __future__ import annotations

from diagnose.features import KernelFeatures, Site
from diagnose.records import EvidenceLog, Finding

__all__ = ["SOURCE_KINDS", "source_line", "triage"]

# Findings the source settles: how many blocks a loop visits, which masks hold in all but its last
# iteration, whether a scale can take log2(e). L3 keeps them (as it keeps the launch's own facts) and adds
# what the IR shows of them as their evidence, never as findings of their own.
SOURCE_KINDS = ("attention.causal-full-loop", "loop.boundary-mask", "recurrence.step-at-a-time", "memory.scalar-loop",
                "reduction.in-loop", "math.exp-unfolded-scale")


def _ev(log: EvidenceLog, feats: KernelFeatures, site: Site, claim: str) -> str:
    name = feats.file.rsplit("/", 1)[-1]
    return log.add("L1", "kernel", claim, f"{name}:{site.line}", source_line(feats.file, site.line))


def _host_sync(feats: KernelFeatures, log: EvidenceLog) -> Finding:
    """The wrapper waits for the device on every call: certain for a sync or an upload, possible for a
    read-back (`.item()` waits only when its tensor is on the device, which the source does not say)."""
    name = feats.file.rsplit("/", 1)[-1]
    waits = feats.host_waits
    evidence = [_ev(log, feats, w, f"{w.what} at {name}:{w.line} makes the host wait for the device"
                    + ("" if w.detail else " if its tensor is there")) for w in waits[:4]]
    certain = [w for w in waits if w.what.startswith("torch.")]
    removable = sum(w.detail == "removable" for w in waits)
    calls = ", ".join(sorted({w.what for w in waits}))
    # Only the removable waits are the trim rewrite's symptom; a read-back alone is for a rewrite that
    # keeps the value on the device (the LLM's), so it is a finding of its own kind.
    kind = "host.sync" if removable else "host.read-back"
    return Finding(kind, "host", f"the wrapper waits for the device {len(waits)} time(s) per call ({calls})",
                   "A sync, an upload from pageable host memory (torch.tensor(x, device=...)) or a read of a device "
                   "value drains the stream: the host then launches the next kernel with the device idle, on every "
                   "call, which at small sizes is most of the call's time. Syncs can go (the stream orders the "
                   "launches), a scalar can be made on the device (torch.full), a value read back can often stay "
                   f"on the device; {removable} of these {len(waits)} can go without knowing the kernel's values.",
                   evidence, sorted({w.line for w in waits}), "", "L1", 0.85 if certain else 0.5)


def source_line(path: str, line: int) -> str:
    """The text of a kernel file's line, stripped ("" when it cannot be read)."""
    try:
        with open(path) as fh:
            for i, text in enumerate(fh, 1):
                if i == line:
                    return text.strip()
    except OSError:
        pass
    return ""


def triage(feats: KernelFeatures, log: EvidenceLog, target: str = "cuda:90") -> list[Finding]:
    """Suspicions from the source. Rules about NVIDIA lowering (vector widths, shared memory, the
    pipeliner, FMA dots) apply only to CUDA targets; index math and atomics are target-neutral."""
    out: list[Finding] = []
    name = feats.file.rsplit("/", 1)[-1]
    cuda = target.split(":")[0] == "cuda"
    for loop in feats.loops if cuda else ():
        if "loads" in loop.detail and "dot" not in loop.detail and "num_stages" not in loop.detail \
                and loop.what in ("range", "tl.range") and not loop.in_loop:
            ev = _ev(log, feats, loop, f"the loop at {name}:{loop.line} loads global memory, has no tl.dot, and does "
                                       "not ask for pipelining (no tl.range(..., num_stages=N))")
            out.append(Finding("pipelining.none", "pipelining", f"the streaming loop at {name}:{loop.line} is not pipelined",
                               "Triton pipelines only loads that feed a tl.dot unless the loop carries num_stages "
                               "(tl.range docstring), so each iteration waits for its load.",
                               [ev], [loop.line], "tritongpu-assign-latencies", "L1", 0.85))
    for dot in feats.dots if cuda else ():
        if dot.detail == "ieee":
            ev = _ev(log, feats, dot, f"the tl.dot at {name}:{dot.line} asks for input_precision=\"ieee\"")
            out.append(Finding("dot.fma", "tensor-cores", f"the dot at {name}:{dot.line} may run on FMA (ieee precision)",
                               "With fp32 operands, IEEE input precision rules out tensor cores; whether the operands "
                               "are fp32 is decided at launch.", [ev], [dot.line], "tritongpu-accelerate-matmul", "L1", 0.6))
    if feats.int64_casts:
        s = feats.int64_casts[0]
        ev = _ev(log, feats, s, f"offsets are cast to int64 at {name}:{s.line}")
        out.append(Finding("index.int64", "index-math", f"offsets widened to int64 at {name}:{s.line}",
                           "64-bit per-element index math costs registers and instructions; needed only above 2^31 "
                           "elements.", [ev], [x.line for x in feats.int64_casts], "", "L1", 0.6))
    if feats.divmod:
        s = feats.divmod[0]
        ev = _ev(log, feats, s, f"`{s.what} {s.detail}` at {name}:{s.line} divides by the runtime argument {s.detail}")
        out.append(Finding("index.divmod", "index-math", f"runtime `{s.what}` in index math at {name}:{s.line}",
                           "Division by a runtime value is emulated and hides contiguity from the compiler.",
                           [ev], sorted({x.line for x in feats.divmod}), "", "L1", 0.7))
    if feats.libdevice:
        s = feats.libdevice[0]
        ev = _ev(log, feats, s, f"`{s.what}` is called at {name}:{s.line}")
        out.append(Finding("math.precise-libdevice", "math", f"precise libdevice math ({s.what}) at {name}:{s.line}",
                           "libdevice routines are correctly rounded and long once inlined.", [ev],
                           [x.line for x in feats.libdevice], "", "L1", 0.7))
    if feats.ordered_atomics and cuda:
        s = feats.ordered_atomics[0]
        ev = _ev(log, feats, s, f"`{s.what}` at {name}:{s.line} uses the default acq_rel ordering and discards its "
                 "result; no atomic of the kernel is read, exchanged or compared, and no load is volatile")
        out.append(Finding("atomics.ordered", "atomics", f"{len(feats.ordered_atomics)} ordered atomic(s) that only "
                           f"accumulate, the first at {name}:{s.line}",
                           "An acq_rel atomic is a GPU-wide memory barrier before its read-modify-write and an L1 "
                           "invalidation after it, and the thread waits for the old value. Nothing in this kernel "
                           "reads another program's atomics before it ends, so relaxed ordering changes no value "
                           "it or a later kernel sees, and lowers to a fire-and-forget reduction.", [ev],
                           [x.line for x in feats.ordered_atomics], "", "L1", 0.8))
    for s in feats.atomics if not (feats.ordered_atomics and cuda) else ():
        if s.detail == "default":
            ev = _ev(log, feats, s, f"`{s.what}` at {name}:{s.line} uses the default acq_rel ordering")
            out.append(Finding("atomics.contended", "atomics", f"acq_rel atomic at {name}:{s.line}",
                               "Atomics default to acq_rel at gpu scope; whether they are per element and contended "
                               "shows in the IR.", [ev], [s.line], "", "L1", 0.4))
            break
    for s in feats.transposes if cuda else ():
        if s.in_loop:
            ev = _ev(log, feats, s, f"`{s.what}` inside a loop at {name}:{s.line}")
            out.append(Finding("layout.convert", "layout", f"a transpose inside the loop at {name}:{s.line}",
                               "A transpose in a loop usually becomes a layout conversion every iteration.", [ev],
                               [s.line], "", "L1", 0.4))
            break
    block, warps = feats.launch.get("BLOCK"), feats.launch.get("num_warps", 4)
    if cuda and isinstance(block, int) and isinstance(warps, int) and warps > 0 and not feats.dots:
        per_thread = block / (32 * warps)
        if per_thread < 4:
            site = Site(feats.launch_line or 1, "launch")
            ev = log.add("L1", "kernel", f"the launch passes BLOCK={block} with num_warps={warps}: {block} elements over "
                         f"{32 * warps} threads is {per_thread:g} per thread", f"{name}:{site.line}",
                         source_line(feats.file, site.line))
            out.append(Finding("vectorization.small-tile", "vectorization",
                               f"{per_thread:g} element(s) per thread: BLOCK={block} over num_warps={warps}",
                               "A 128-bit access needs 4 consecutive fp32 elements per thread; fewer elements per "
                               "thread than that cannot be vectorized.", [ev], [site.line], "tritongpu-coalesce", "L1",
                               0.85 if per_thread <= 1 else 0.6))
    bm, bn, bk = (feats.launch.get(k) for k in ("BM", "BN", "BK"))
    stages = feats.launch.get("num_stages", 3)
    if cuda and feats.dots and isinstance(bm, int) and isinstance(bn, int) and isinstance(bk, int) \
            and isinstance(stages, int):
        from diagnose.rewriters.configs import SHARED_LIMIT_SM90, dot_operand_bytes

        need = dot_operand_bytes(bm, bn, bk, stages)  # 16-bit operands assumed; fp32 doubles it
        if need > SHARED_LIMIT_SM90:
            ev = log.add("L1", "kernel", f"BM={bm}, BN={bn}, BK={bk}, num_stages={stages}: {stages} buffers of the A and "
                         f"B tiles need at least {need} bytes of shared memory (2-byte elements)",
                         f"{name}:{feats.launch_line or 1}", source_line(feats.file, feats.launch_line or 1))
            out.append(Finding("resources.shared-memory-over-limit", "resources",
                               f"num_stages={stages} of {bm}x{bk} and {bk}x{bn} tiles exceed sm90 shared memory",
                               "Pipelined operands are buffered num_stages times in shared memory.", [ev], [],
                               "allocate-shared-memory", "L1", 0.7))
    ascend = target.split(":")[0] in ("npu", "ascend")
    for loop in feats.loops if ascend else ():
        if loop.what.endswith("static_range") and "loads" in loop.detail:
            ev = _ev(log, feats, loop, f"the loop at {name}:{loop.line} is a tl.static_range over loads: it is unrolled "
                                       "in TTIR, one copy of its tiles per iteration")
            out.append(Finding("ascend.static-unroll", "ascend-memory",
                               f"tl.static_range at {name}:{loop.line} unrolls tile loads",
                               "Every unrolled iteration's buffers are live when hivm-plan-memory places them; on "
                               "910_95 this overflows the Unified Buffer where tl.range fits (triton-ascend#2246). "
                               "Whether it does depends on the trip count and tile sizes.",
                               [ev], [loop.line], "hivm-plan-memory", "L1", 0.5))
            break
    for causal in feats.causal_loops[:1]:  # the source decides it: the blocks are visited
        loop = Site(causal.line, "for")
        if causal.window:
            past = " and past their diagonal" if causal.causal else ""
            kind, title = "attention.window-full-loop", f"the windowed loop at {name}:{loop.line} visits the key blocks " \
                f"before the window{past}"
            claim = (f"the key loop at {name}:{loop.line} starts at key 0 while a sliding-window select sets every score "
                     f"before the rows' window (keys below {causal.window} for the block's first row){past} to -inf")
            why = ("Blocks wholly outside every row's window are loaded, multiplied and exponentiated only to be masked "
                   "out: for a window W over a sequence S, about (S - W) / S of the loop's work at the last rows.")
        else:
            kind, title = "attention.causal-full-loop", f"the causal loop at {name}:{loop.line} visits the key blocks " \
                "past the diagonal"
            claim = (f"the key loop at {name}:{loop.line} runs over the whole sequence while a causal select sets every "
                     "score past the rows' diagonal to -inf")
            why = ("Blocks wholly past the diagonal are loaded, multiplied and exponentiated only to be masked out: for a "
                   "square causal problem about half of the loop's work.")
        out.append(Finding(kind, "attention", title, why, [_ev(log, feats, loop, claim)], [loop.line], "", "L1", 0.9))
    if feats.unfolded_exps:
        first = feats.unfolded_exps[0]
        lines = ", ".join(str(x.line) for x in feats.unfolded_exps)
        ev = _ev(log, feats, first, f"tl.exp at {name}:{lines} exponentiates values scaled by `{first.detail}`, and "
                                    "each element pays a multiply by log2(e) before ex2")
        out.append(Finding("math.exp-unfolded-scale", "math",
                           f"tl.exp over scaled scores at {name}:{lines}: log2(e) applied per element",
                           "tl.exp(x) lowers to ex2.approx(x * log2(e)); when the exponent is built from values "
                           "that already carry a scale (an online softmax's dot * scale), folding log2(e) into that "
                           "scale and calling tl.exp2 drops one multiply per element from the softmax's ALU work.",
                           [ev], [x.line for x in feats.unfolded_exps], "convert-triton-gpu-to-llvm", "L1", 0.8))
    for loop in feats.recurrences:
        ev = _ev(log, feats, loop, f"the loop at {name}:{loop.line} updates {loop.detail} = a * {loop.detail} + b "
                                   "one time step per iteration, loading and storing one step at a time")
        out.append(Finding("recurrence.step-at-a-time", "recurrence",
                           f"the linear recurrence at {name}:{loop.line} runs one step per iteration",
                           "Each step's loads and update wait for the previous step's state, so a program keeps "
                           "one vector of loads in flight; the update is associative, so a chunk of steps can be "
                           "loaded at once and combined by a scan.", [ev], [loop.line], "", "L1", 0.7))
        break
    for loop in feats.scalar_loops:
        ev = _ev(log, feats, loop, f"each iteration of the loop at {name}:{loop.line} loads one element and adds it "
                                   f"to {loop.detail}")
        out.append(Finding("memory.scalar-loop", "memory",
                           f"the loop at {name}:{loop.line} loads one element per iteration",
                           "A program that walks its data one scalar load at a time keeps one load in flight and "
                           "uses one lane of its warps: the loads of many iterations can be issued together as a "
                           "tile and summed with tl.sum.", [ev], [loop.line], "", "L1", 0.9))
        break
    for s in feats.loop_reductions:
        ev = _ev(log, feats, s, f"the tl.sum at {name}:{s.line} reduces a block every iteration of its loop and adds "
                                f"the result to {s.detail}")
        out.append(Finding("reduction.in-loop", "reduction",
                           f"the loop reduces a block into {s.detail} every iteration ({name}:{s.line})",
                           "Each iteration pays a cross-lane reduction (warp shuffles, and across warps a shared-"
                           "memory exchange between two barriers) to add one value; adding the blocks lane by "
                           "lane in the loop and reducing once after it does the same additions without the "
                           "per-iteration exchange, and lets the block grow.", [ev],
                           [x.line for x in feats.loop_reductions], "", "L1", 0.85))  # the source decides it
        break
    if feats.host_waits and cuda:
        out.append(_host_sync(feats, log))
    for loop in feats.boundary_loops if cuda else ():
        ev = _ev(log, feats, loop, f"every iteration of the loop at {name}:{loop.line} evaluates {loop.detail} boundary "
                                   "mask term(s) comparing the loop's own block with its bound, true in all but the last")
        out.append(Finding("loop.boundary-mask", "vectorization",
                           f"the loop at {name}:{loop.line} masks every block for the last one's sake",
                           "Only the last block of the loop can be partial, yet each iteration pays the compare, the "
                           "predicated (and, without a bound divisible by 16, narrower) accesses and any select on "
                           "the tile.", [ev], [loop.line], "convert-triton-gpu-to-llvm", "L1", 0.5))
        break
    masked = [s for s in feats.loads + feats.stores if s.detail == "masked"]
    if masked and cuda:
        s = masked[0]
        ev = _ev(log, feats, s, f"the access at {name}:{s.line} carries a mask")
        out.append(Finding("vectorization.mask", "vectorization", f"masked accesses at {name}:{s.line}",
                           "A mask bounded by a size that is not a multiple of 16 caps the vector width; whether it "
                           "is depends on the launch.", [ev], [x.line for x in masked], "", "L1", 0.3))
    return out
