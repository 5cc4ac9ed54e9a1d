"""L3: layout conversions in hot loops (N13) and reductions that cross warps (N18)."""

from __future__ import annotations

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]

# One warp holding the whole reduced row at <= 16 values per lane is the cheap alternative.
_ONE_WARP_EXTENT = 32 * 16


def _reduce_signature(lines: list[str], ir_line: int) -> str:
    """The operand types of a generic-form `"tt.reduce"(...) ({ ... }) : (tensor<...>) -> ...` op,
    printed on the line that closes its region."""
    code = ir.region_end(lines, ir_line).split(" loc(")[0]
    return code.split("})", 1)[1].split("->")[0] if "})" in code else ""


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ttgir = art.stages.get("ttgir", "")
    if not ttgir:
        return []
    src = short(art.source_file)
    loop_lines = ir.in_loops(ttgir)
    lines = ttgir.splitlines()
    has_loop = "scf.for" in ttgir or "scf.while" in ttgir
    findings: list[Finding] = []
    converts = [op for op in ir.op_source_lines(ttgir, {"ttg.convert_layout"}) if op.ir_line in loop_lines]
    if converts:
        op = converts[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttgir", op, f"a `ttg.convert_layout` at {at(src, line)} survives inside the loop body")]
        ptx = art.stages.get("ptx", "")
        through_smem = "bar.sync" in ptx and "st.shared" in ptx
        if through_smem:
            chain.append(log.add("L3", "ptx", f"the kernel's PTX stages data in shared memory: {ptx.count('st.shared')} "
                                 f"x `st.shared`, {ptx.count('bar.sync')} x `bar.sync`", "ptx", "st.shared ... bar.sync"))
        findings.append(Finding(
            "layout.convert", "layout", f"a layout conversion at {at(src, line)} runs every loop iteration",
            "Two ops in the loop want the same tensor in different register layouts (e.g. tl.trans, a reduction "
            "axis, or a dot operand); RemoveLayoutConversions could not hoist or fold the conversion, so each "
            "iteration re-lays the tile out" + (", and this kernel's PTX does so through shared memory and barriers."
                                                if through_smem else " (in registers or with warp shuffles)."),
            chain, sorted({c.loc.line for c in converts if c.loc}), "tritongpu-remove-layout-conversions"))
    layouts = ir.blocked_layouts(ttgir)
    for op in ir.op_source_lines(ttgir, {"tt.reduce"}):
        if has_loop and op.ir_line not in loop_lines:
            continue  # a final reduction after a streaming loop is amortized over the loop
        axis_text = ir.attribute(op.text, "axis")
        # The reduced operand: a tile of values laid out by an alias (an inline layout is not a blocked one).
        operand = next((t for t in ir.shaped_types(_reduce_signature(lines, op.ir_line)) if t.static
                        and t.encoding and "." not in t.encoding and not t.element.startswith("!")), None)
        if not axis_text or not axis_text.isdigit() or operand is None or operand.encoding not in layouts:
            continue
        axis = int(axis_text)
        shape = list(operand.shape)
        body = layouts[operand.encoding]
        warps = ir.int_list_attribute(body, "warpsPerCTA")
        if axis >= len(shape) or axis >= len(warps) or warps[axis] <= 1 or shape[axis] > _ONE_WARP_EXTENT:
            continue
        line = op.loc.line if op.loc else 0
        per_thread = (ir.int_list_attribute(body, "sizePerThread") or [1] * len(shape))[axis]
        chain = [log_op(log, "ttgir", op, f"the reduction at {at(src, line)} runs over axis {axis} of {shape[axis]} "
                                          f"elements laid out with warpsPerCTA[{axis}] = {warps[axis]}, "
                                          f"sizePerThread[{axis}] = {per_thread}")]
        ptx = art.stages.get("ptx", "")
        chain.append(log.add("L3", "ptx", f"PTX combines the per-warp partials through shared memory: "
                             f"{ptx.count('shfl.sync')} x `shfl.sync`, {ptx.count('st.shared')} x `st.shared`, "
                             f"{ptx.count('bar.sync')} x `bar.sync`", "ptx", "shfl.sync.bfly ... st.shared ... bar.sync"))
        findings.append(Finding(
            "reduction.cross-warp", "reduction", f"the reduction at {at(src, line)} is split across {warps[axis]} warps",
            f"The reduced axis ({shape[axis]} elements) is spread over {warps[axis]} warps, so after the in-warp "
            "shuffles each warp's partial goes through shared memory with two barriers; one warp could hold the "
            f"whole axis ({max(1, -(-shape[axis] // 32))} value(s) per lane), reducing with shuffles only.",
            chain, [line], "convert-triton-gpu-to-llvm"))
        break  # one finding per kernel: every reduction over that layout shares the cause
    return findings
