"""L3: software pipelining of loop loads, and whether Hopper wgmma overlaps across iterations.

- pipelining.none: an innermost scf.for loads global memory but the final TTGIR has no async copy
  (no cp.async / TMA), so every iteration waits a full memory latency (failure-modes N9).
- pipelining.registers: the pipeliner's remark that a load "cannot use vectorized copy" and is
  rotated through registers instead (N10).
- dot.wgmma-serialized: `ttng.warp_group_dot_wait {pendings = 0}` inside the loop, so each wgmma
  waits for the previous one to drain (N8).
- memory.no-tma: on sm90+, the dot loop's operand tiles are loaded through pointer tensors, not
  tensor descriptors (N12). Block pointers (`tt.make_tensor_ptr`), which read like TMA but are
  rewritten to pointer loads in Triton <= 3.7, make it a defect; plain pointer loads only an
  opportunity, since cp.async pipelining already serves most shapes well.
"""

from __future__ import annotations

import re

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]

_ASYNC = ("ttg.async_copy_global_to_local", "ttng.async_tma_copy_global_to_local", "tt.descriptor_load")


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ttgir = art.stages.get("ttgir", "")
    if not ttgir:
        return []
    src = short(art.source_file)
    loop_lines = ir.in_loops(ttgir)
    findings: list[Finding] = []
    for r in art.remarks:
        if "Pipelining load that cannot use vectorized copy" in r.message:
            ev = log.add("L3", "remark", f"the compiler reports at {src}:{r.line}: {r.message}", f"{src}:{r.line}:{r.col}",
                         r.message)
            findings.append(Finding(
                "pipelining.registers", "pipelining", f"the load at {src}:{r.line} is pipelined in registers",
                "The pipeliner could not turn this load into a vectorized async copy (each copy must move at least "
                "4 contiguous, aligned bytes), so it keeps the prefetched values in registers across iterations.",
                [ev], [r.line], r.pass_name or "tritongpu-pipeline"))
    loads = [op for op in ir.op_source_lines(ttgir, {"tt.load"}) if op.ir_line in loop_lines and "tensor<" in op.text]
    has_async = any(op in ttgir for op in _ASYNC)
    if loads and re.search(r"tt\.num_stages\s*=\s*1\b", art.stages.get("ttir", "") + ttgir):
        loads = []  # the kernel asked for no pipelining (tl.range(..., num_stages=1)): a choice, not a defect
    has_dot = "tt.dot" in ttgir or "ttng.warp_group_dot" in ttgir
    if loads and not has_async and not findings:
        first = loads[0]
        line = first.loc.line if first.loc else 0
        chain = [log_op(log, "ttgir", first,
                        f"the load at {at(src, line)} runs inside an scf.for loop as a plain `tt.load` in the final TTGIR")]
        chain.append(log.add("L3", "ttgir", "the final TTGIR has no async copy (ttg.async_copy_global_to_local, "
                             "TMA or descriptor loads): no load is prefetched into shared memory", "ttgir",
                             "no " + ", ".join(_ASYNC)))
        why = ("Loads that do not feed a tl.dot are pipelined only when the loop asks for it "
               "(tl.range(..., num_stages=N) sets tt.num_stages)" if not has_dot else
               "The loop's loads were not converted to multi-buffered async copies (num_stages <= 1, an outer loop, "
               "or loads the pipeliner cannot convert)")
        findings.append(Finding(
            "pipelining.none", "pipelining", f"the loop loads at {at(src, line)} are not software-pipelined",
            f"{why}; without it each iteration issues its load and waits the full global-memory latency before the "
            "arithmetic that uses it.", chain, sorted({op.loc.line for op in loads if op.loc}), "tritongpu-assign-latencies"))
    elif loads and has_async:
        async_op = next(op for op in ir.op_source_lines(ttgir) if op.op in _ASYNC)
        findings.append(Finding("pipelining.ok", "pipelining", "loop loads are prefetched with async copies",
                                "The pipeliner converted loop loads into multi-buffered async copies.",
                                [log_op(log, "ttgir", async_op, "the loop's loads are async copies into shared memory")]))
    findings += _no_tma(art, ttgir, loop_lines, src, log)
    for op in ir.op_source_lines(ttgir, {"ttng.warp_group_dot_wait"}):
        if op.ir_line in loop_lines and ir.attribute(op.text, "pendings") == "0":
            line = op.loc.line if op.loc else 0
            dot = next((d for d in ir.op_source_lines(ttgir, {"ttng.warp_group_dot"}) if d.ir_line in loop_lines), None)
            chain = [log_op(log, "ttgir", op, f"inside the K-loop the wgmma at {at(src, line)} is followed by "
                                              "`warp_group_dot_wait {pendings = 0}`: it waits for every wgmma in flight")]
            if dot is not None:
                chain.append(log_op(log, "ttgir", dot, "the loop's dot is an async warp-group MMA (wgmma)"))
            findings.append(Finding(
                "dot.wgmma-serialized", "tensor-cores", f"the wgmma at {at(src, line)} is serialized every iteration",
                "The compiler waits for every wgmma in flight inside the loop, so the tensor cores drain each "
                "iteration instead of overlapping the next tile. The wgmma pipeliner keeps a dot in flight only when "
                "its accumulator feeds nothing but the next dot (a rescale or second use of the accumulator in the "
                "loop prevents it).",
                chain, [line], "tritongpu-pipeline"))
    return findings


_TMA_OPS = ("ttng.async_tma_copy_global_to_local", "tt.descriptor_load", "ttng.tensormap_create", "tt.make_tensor_descriptor")


def _no_tma(art: Artifacts, ttgir: str, loop_lines: set[int], src: str, log: EvidenceLog) -> list[Finding]:
    m = re.search(r"cuda:(\d+)", art.target)
    if not m or int(m.group(1)) < 90 or any(op in ttgir for op in _TMA_OPS):
        return []
    dots = [op for op in ir.op_source_lines(ttgir, {"tt.dot", "ttng.warp_group_dot"}) if op.ir_line in loop_lines]
    if not dots:
        return []
    ttir = art.stages.get("ttir", "")
    block_ptrs = ir.op_source_lines(ttir, {"tt.make_tensor_ptr"})
    line = dots[0].loc.line if dots[0].loc else 0
    chain = [log_op(log, "ttgir", dots[0], f"the dot at {at(src, line)} runs in a loop on sm{m.group(1)}, and the final "
                                           "TTGIR has no TMA copy or tensor descriptor")]
    if block_ptrs:
        op = block_ptrs[0]
        chain.append(log_op(log, "ttir", op, "its tiles come from block pointers (tt.make_tensor_ptr), which this "
                                             "Triton rewrites to pointer loads, never TMA"))
        return [Finding("memory.no-tma", "pipelining", f"block pointers at {at(src, line)} do not become TMA",
                        "rewrite-tensor-pointer lowers tl.make_block_ptr loads to per-element pointer tensors (Triton "
                        "3.3-3.7; removed in 3.8); only tensor descriptors produce TMA bulk copies.", chain, [line],
                        "triton-rewrite-tensor-pointer", confidence=0.85)]
    return [Finding("memory.no-tma", "pipelining", f"the dot loop at {at(src, line)} loads tiles through pointer tensors",
                    "TMA (tensor descriptors) would move each tile with one bulk copy and no per-element address "
                    "registers; worth trying on large tiles, not a defect by itself.", chain, [line], "",
                    confidence=0.4)]
