"""L3: shared-memory budget (N17), atomics (N19) and precise libdevice math (N23)."""

from __future__ import annotations

import re

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze", "SHARED_LIMIT"]

# Opt-in shared memory per block by compute capability (CUDA programming guide, "Technical
# Specifications per Compute Capability"); sm90 = H100/H200.
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
_LIBDEVICE = re.compile(r"^(__nv_\w+?)\.exit(?:\.\w+)*:", re.MULTILINE)
# Inlined libdevice helpers that are part of any fp code, not a precise-math choice.
_HELPERS = ("__nv_isnan", "__nv_isinf", "__nv_fadd_rn", "__nv_fmul_rn", "__nv_fmaf", "__nv_fabs", "__nv_copysign",
            "__nv_sqrt", "__nv_rsqrt", "__nv_fdiv")  # tl.sqrt and `/` lower through these; they are not a choice
# PTX writes the qualifiers in either order (Triton emits `atom.global.gpu.acq_rel.add`, the ISA manual
# `atom.acq_rel.gpu.global.add`): match the run of qualifiers and read ordering and scope out of it.
# tl.exp's lowering (ExpOpConversionApprox): the argument times log2(e), 0f3FB8AA3B in PTX's float syntax
_LOG2E_MUL = re.compile(r"^\s*mul(?:\.\w+)*\.f32\s+%\w+,\s*%\w+,\s*0f3FB8AA3B;", re.MULTILINE)
_EX2 = re.compile(r"\bex2\.approx(?:\.\w+)*\.f32\b")
_ATOM = re.compile(r"\b(?:atom|red)(?P<quals>(?:\.[a-z0-9_]+)+)")
_SEMS = ("acq_rel", "acquire", "release", "relaxed")
_SCOPES = ("gpu", "sys", "cta", "cluster")


def _qualifier(quals: str, choices: tuple[str, ...]) -> str | None:
    return next((q for q in quals.split(".") if q in choices), None)


def _capability(target: str) -> int | None:
    """The CUDA compute capability of a "cuda:90" target; None for other backends."""
    m = re.fullmatch(r"cuda:(\d+)\w*", target)
    return int(m.group(1)) if m else None


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    findings: list[Finding] = []
    src = short(art.source_file)
    shared = int(art.metadata.get("shared") or 0)
    cap = _capability(art.target)
    limit = SHARED_LIMIT.get(cap) if cap is not None else None
    if limit and shared:
        stages, warps = art.options.get("num_stages"), art.options.get("num_warps")
        ev = log.add("L3", "metadata", f"the kernel needs {shared} bytes of shared memory per block "
                     f"(num_stages={stages}, num_warps={warps}); sm{cap} allows {limit} per block",
                     "metadata:shared", f"shared = {shared}")
        if shared > limit:
            findings.append(Finding(
                "resources.shared-memory-over-limit", "resources",
                f"the kernel needs {shared // 1024} KiB of shared memory, above the {limit // 1024} KiB sm{cap} allows",
                "The multi-buffered operand tiles (num_stages copies of each loaded tile) do not fit: the launch fails "
                "with OutOfResources on the device. Fewer stages or smaller tiles fit.",
                [ev], [], "allocate-shared-memory", confidence=0.95))
    ptx = art.stages.get("ptx", "")
    atoms = [m for m in _ATOM.finditer(ptx) if ".global" in m.group("quals")]
    if atoms:
        ttir = art.stages.get("ttir", "")
        ops = ir.op_source_lines(ttir, {"tt.atomic_rmw", "tt.atomic_cas"})
        op = ops[0] if ops else None
        line = op.loc.line if op and op.loc else 0
        # No ordering written means relaxed (PTX ISA, atom); no scope means gpu.
        sem = _qualifier(atoms[0].group("quals"), _SEMS) or "relaxed"
        scope = _qualifier(atoms[0].group("quals"), _SCOPES) or "gpu"
        chain = []
        if op is not None:
            chain.append(log_op(log, "ttir", op, f"the atomic at {at(src, line)} is `{op.op}` with its ordering as printed"))
        chain.append(log.add("L3", "ptx", f"PTX issues {len(atoms)} `{atoms[0].group(0)}` instructions "
                             f"({sem} ordering, {scope} scope)", "ptx", atoms[0].group(0)))
        same_address = op is not None and _splat_pointer(ttir, op)
        if op is not None and same_address:
            chain.append(log.add("L3", "ttir", "every lane's atomic targets the same address (the pointer tensor is "
                                 "a splat/broadcast of one pointer)", "ttir", op.text[:200]))
        ordered = sem in ("acq_rel", "acquire", "release")
        fences = _fences(art.stages.get("sass", ""), log) if ordered else []
        if ordered and not same_address and (why := _accumulates_only(ttir, ops)) is not None:
            chain += [log.add("L3", "ttir", why, "ttir", op.text[:200] if op else ""), *fences]
            findings.append(Finding(
                "atomics.ordered", "atomics", f"the atomic at {at(src, line)} issues {len(atoms)} "
                f"`{atoms[0].group(0).split('.')[0]}.global` with {sem} ordering and its result unused",
                "An ordered atomic is a GPU-wide memory barrier before its read-modify-write and an L1 invalidation "
                "after it, and the thread waits for the old value. The kernel only accumulates through its atomics: "
                "relaxed ordering changes no value it or a later kernel sees, and with the result unused it lowers "
                "to a fire-and-forget `red`.", chain, [line], "convert-triton-gpu-to-llvm", confidence=0.9))
        elif same_address or sem == "acq_rel":
            chain += fences
            findings.append(Finding(
                "atomics.contended", "atomics", f"the atomic at {at(src, line)} issues {len(atoms)} "
                f"`{atoms[0].group(0).split('.')[0]}.global` "
                + ("on one address " if same_address else "") + f"with {sem} ordering",
                "Each element is its own read-modify-write at gpu scope; acq_rel adds ordering fences, and lanes "
                "hitting one address serialize in the memory system. Reducing in registers first (tl.sum) leaves one "
                "atomic per program.", chain, [line], "convert-triton-gpu-to-llvm",
                confidence=0.9 if same_address else 0.6))
    llir = art.stages.get("llir", "")
    precise = sorted({n for n in _LIBDEVICE.findall(llir) if not n.startswith(_HELPERS)})
    if precise:
        ev = log.add("L3", "llir", f"LLVM IR inlines precise libdevice routine(s) {', '.join(precise)}",
                     "llir", next(line for line in llir.splitlines() if precise[0] + ".exit" in line))
        lines = ptx.count("\n")
        chain = [ev, log.add("L3", "ptx", f"the PTX is {lines} lines long", "ptx", f"{lines} lines")]
        findings.append(Finding(
            "math.precise-libdevice", "math", f"the kernel calls precise libdevice math ({', '.join(precise)})",
            "libdevice's correctly-rounded routines are inlined as long branchy sequences (special cases, range "
            "reduction); the hardware approximations (ex2.approx, lg2.approx) are one instruction each.",
            chain, [], "convert-triton-gpu-to-llvm", confidence=0.85))
    findings += _log2e_multiplies(ptx, log)
    return findings


def _log2e_multiplies(ptx: str, log: EvidenceLog) -> list[Finding]:
    """The per-element multiplies by log2(e) that feed ex2.approx: the IR side of L1's
    `math.exp-unfolded-scale`. Whether a scale exists to fold them into is the source's to say, so the
    engine keeps this only as evidence for an L1 finding of the same kind."""
    multiplies = _LOG2E_MUL.findall(ptx)
    exps = len(_EX2.findall(ptx))
    if not multiplies or not exps:
        return []
    ev = log.add("L3", "ptx", f"PTX multiplies {len(multiplies)} values by log2(e) (0f3FB8AA3B) for its {exps} "
                 "`ex2.approx.f32`: tl.exp's lowering, one multiply per exponentiated element", "ptx",
                 multiplies[0].strip())
    return [Finding("math.exp-unfolded-scale", "math", f"{len(multiplies)} multiplies by log2(e) feed ex2.approx",
                    "tl.exp(x) lowers to ex2.approx(x * log2(e)); a scale the exponent already carries could take "
                    "log2(e) once.", [ev], [], "convert-triton-gpu-to-llvm", confidence=0.8)]


def _accumulates_only(ttir: str, ops: list[ir.OpLine]) -> str | None:
    """Why the kernel's ordering orders nothing it relies on (None where it may): every atomic
    read-modify-write discards its result, none exchanges, and nothing compares-and-swaps or loads
    volatile. The source-side twin is diagnose.rewriters.atomics.ordered_atomics."""
    rmws = [o for o in ops if o.op == "tt.atomic_rmw"]
    if not rmws or len(rmws) != len(ops) or any(" exch," in o.text for o in rmws):
        return None
    if len(ir.unused_results(ttir, rmws)) != len(rmws) or ir.attribute(ttir, "isVolatile") == "true":
        return None
    defs = ir.ssa_defs(ttir)
    updated = {_pointer_root(defs, o.text) for o in rmws}
    if updated & {_pointer_root(defs, o.text) for o in ir.op_source_lines(ttir, {"tt.load"})}:
        return None  # it reads back what its atomics update: a relaxed update leaves L1 stale for that load
    return (f"the kernel's {len(rmws)} `tt.atomic_rmw` discard their results, and it has no exchange, "
            "compare-and-swap or volatile load: nothing synchronizes through these atomics")


def _pointer_root(defs: dict[str, str], op_text: str) -> str:
    """The kernel argument an access's pointer operand starts from, through splats, broadcasts and
    `tt.addptr`s (`%out_ptr` of `tt.atomic_rmw fadd, acq_rel, gpu, %5, ...`)."""
    operands = ir.ssa_names(op_text.split("=", 1)[-1])
    ptr = operands[0] if operands else ""
    for _ in range(16):
        body = defs.get(ptr, "")
        if not body.startswith(("tt.addptr", "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape")):
            break
        ptr = (ir.ssa_names(body) or [ptr])[0]
    return ptr


def _fences(sass: str, log: EvidenceLog) -> list[str]:
    """What ptxas made of the ordering, where the SASS was kept (harness.capture keeps it for ordered PTX)."""
    counts = ir.sass_opcode_counts(sass)
    barriers = sum(n for op, n in counts.items() if op.startswith("MEMBAR"))
    invalidations = sum(n for op, n in counts.items() if op.startswith("CCTL"))
    atomics = sum(n for op, n in counts.items() if op.startswith(("ATOMG", "REDG", "ATOM.", "RED.")))
    if not barriers and not invalidations:
        return []
    example = next(op for op in counts if op.startswith(("MEMBAR", "CCTL")))
    return [log.add("L3", "sass", f"SASS has {barriers} memory barrier(s) (MEMBAR) and {invalidations} L1 "
                    f"invalidation(s) (CCTL) around its {atomics} global atomic(s)", "sass", example)]


def _splat_pointer(ttir: str, op: ir.OpLine) -> bool:
    """Whether the atomic's pointer operand is a splat of one scalar pointer plus a constant-zero offset."""
    defs = ir.ssa_defs(ttir)
    operands = ir.ssa_names(op.text.split("=", 1)[-1])
    ptr = operands[0] if operands else ""
    seen = 0
    while ptr in defs and seen < 6:
        body = defs[ptr]
        seen += 1
        if body.startswith("tt.splat"):
            return True
        if body.startswith("tt.addptr"):
            base, off = (ir.ssa_names(body) + ["", ""])[:2]
            off_def = defs.get(off, "")
            if "arith.constant dense<0>" in off_def or "dense<0>" in off_def:
                ptr = base
                continue
            return False
        return False
    return False
