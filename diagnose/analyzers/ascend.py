"""L3 for triton-ascend: TTIR -> ttadapter (linalg/memref + hivm/annotation) -> bishengir HIVM.

Reads the TRITON_DEBUG dumps collected by harness.npu (stages "ttir", "ttadapter", "mlir"; HIVM
pass snapshots as "pass:<arg>"; bishengir's own output in metadata["compiler_output"]). Modes and
their documented signatures: failure-modes.md A1-A6.
"""

from __future__ import annotations

import re

from diagnose.analyzers.common import at, in_loops, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.artifacts import Artifacts

__all__ = ["analyze", "DEFAULT_VECTOR_CORES"]

# 910B-class (Atlas A2) devices: 48 vector cores (triton-ascend docs/en/debug_guide/profiling.md).
DEFAULT_VECTOR_CORES = 48
_UB_OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits? available", re.IGNORECASE)
_INT_TENSOR_OP = re.compile(r"=\s*arith\.(?P<op>cmpi|addi|subi|muli|divsi|remsi|maxsi|minsi)\b.*tensor<[\dx?]+x(?P<t>i64|i32)>")


def _hivm(art: Artifacts) -> str:
    return next((t for k, t in art.stages.items() if k.startswith("pass:") and "hivm" in t), "") or (
        art.stages.get("mlir", "") if "hivm." in art.stages.get("mlir", "") else "")


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    adapter = art.stages.get("ttadapter", "")
    output = str(art.metadata.get("compiler_output", ""))
    if not adapter and not output:
        return []
    src = short(art.source_file) if art.source_file else art.kernel
    findings: list[Finding] = []
    if m := _UB_OVERFLOW.search(output):
        need, have = int(m.group(1)), int(m.group(2))
        line = next(ln for ln in output.splitlines() if m.group(0) in ln)
        ev = log.add("L3", "compiler-output", f"bishengir reports UB overflow: the kernel needs {need} bits of the "
                     f"{have} bits ({have // 8 // 1024} KiB) of Unified Buffer", "compiler-output", line)
        findings.append(Finding(
            "ascend.ub-overflow", "ascend-memory", f"UB overflow: {need // 8 // 1024} KiB needed, {have // 8 // 1024} KiB available",
            "The tiles live in a program's Unified Buffer at once (plus alignment padding and multi-buffer copies) "
            "exceed it, so hivm-plan-memory cannot place them and compilation fails.", [ev], [], "hivm-plan-memory",
            confidence=0.95))
    if not adapter:
        return findings
    loop_lines = in_loops(adapter)
    discrete = [op for op in ir.op_source_lines(adapter) if "DiscreteMemAccess" in op.text]
    # Untagged scalar loads in a loop are the same symptom without the pass's own tag: weaker evidence.
    scalar = [op for op in ir.op_source_lines(adapter, {"memref.load", "tensor.extract"}) if op.ir_line in loop_lines]
    if discrete or scalar:
        op = (discrete or scalar)[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttadapter", op, f"the access at {at(src, line)} is "
                        + ("tagged DiscreteMemAccess" if discrete else f"a scalar `{op.op}` inside an scf.for")
                        + " in ttadapter: it was lowered element by element")]
        findings.append(Finding(
            "ascend.discrete-access", "ascend-memory", f"the memory access at {at(src, line)} is scalarized (discrete)",
            "triton-to-unstructure could not prove a structured (contiguous, 32-byte-multiple) offset for this access "
            "(offsets from loaded indices, modulo, or an inner extent that is not a 32 B multiple), so it became a "
            "loop of scalar loads instead of one DMA.", chain, sorted({o.loc.line for o in discrete + scalar if o.loc}),
            "triton-to-unstructure", confidence=0.9 if discrete else 0.6))
    int_ops = [(op, m) for op in ir.op_source_lines(adapter) if (m := _INT_TENSOR_OP.search(op.text))
               and (m.group("t") == "i64" or m.group("op") == "cmpi")]
    if int_ops:
        op, m = int_ops[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttadapter", op, f"`arith.{m.group('op')}` on a {m.group('t')} tensor at {at(src, line)} "
                        "survives into ttadapter")]
        findings.append(Finding(
            "ascend.int-vector-op", "ascend-compute", f"integer vector op on {m.group('t')} at {at(src, line)}",
            f"The Vector unit has no {m.group('t')} {m.group('op')} (triton-ascend performance guidelines, "
            "'Optimizing Data Types'), so HIVM lowers it to a scalar loop (hivm-lower-to-loops).",
            chain, sorted({o.loc.line for o, _ in int_ops if o.loc}), "hivm-lower-to-loops", confidence=0.85))
    grid = art.metadata.get("grid")
    cores = int(art.metadata.get("num_vectorcore") or DEFAULT_VECTOR_CORES)
    if grid:
        blocks = 1
        for g in grid:
            blocks *= int(g)
        if blocks > cores:
            ev = log.add("L3", "launch", f"the launch grid {list(grid)} has {blocks} programs for {cores} vector cores"
                         + ("" if art.metadata.get("num_vectorcore") else
                            " (910B-class default; triton-ascend docs/en/debug_guide/profiling.md)"),
                         "launch:grid", f"grid = {list(grid)}")
            findings.append(Finding(
                "ascend.grid-too-large", "ascend-launch", f"{blocks} programs for {cores} cores",
                "On Ascend a program is bound to a physical core; a grid above the core count is run in batches, "
                "paying scheduling overhead per batch. A grid of one program per core looping over blocks does not.",
                [ev], [], "", confidence=0.85 if blocks > 4 * cores else 0.6))
    hivm = _hivm(art)
    has_loop = "scf.for" in adapter
    if hivm and "set_flag" in hivm and "multi_buffer" not in hivm and not has_loop:
        flags = hivm.count("hivm.hir.set_flag")
        ev = log.add("L3", "hivm", f"after hivm-inject-sync the kernel has {flags} set_flag/wait_flag pairs and no "
                     "hivm.hir.multi_buffer_counter: loads, vector work and stores run one after another",
                     "hivm", next(ln.strip() for ln in hivm.splitlines() if "set_flag" in ln))
        ev2 = log.add("L3", "ttadapter", "ttadapter has no scf.for: the whole block is one straight-line tile",
                      "ttadapter", "no scf.for")
        findings.append(Finding(
            "ascend.no-multibuffer", "ascend-pipeline", "no multi-buffering: MTE2, Vector and MTE3 do not overlap",
            "Multi-buffer (ping-pong) needs a loop over sub-tiles to rotate buffers across; a kernel that processes "
            "its block in one step leaves hivm-enable-multi-buffer nothing to double-buffer.",
            [ev, ev2], [], "hivm-enable-multi-buffer", confidence=0.8))
    return findings
