"""L3 for triton-ascend: TTIR -> ttadapter (linalg/memref + hivm/annotation) -> bishengir HIVM.

Reads the TRITON_DEBUG dumps collected by harness.npu (stages "ttir", "ttadapter", "mlir"; HIVM
pass snapshots as "pass:<arg>"; bishengir's own output in metadata["compiler_output"]). Modes and
their documented signatures: failure-modes.md A1-A7 and A9.
"""

from __future__ import annotations

import re

from diagnose.analyzers.common import at, log_op, short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze", "DEFAULT_VECTOR_CORES"]

# 910B-class (Atlas A2) devices: 48 vector cores (triton-ascend docs/en/debug_guide/profiling.md).
DEFAULT_VECTOR_CORES = 48
_UB_OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits? available", re.IGNORECASE)
_INT_OPS = ("cmpi", "addi", "subi", "muli", "divsi", "remsi", "maxsi", "minsi")


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
        said = next(ln for ln in output.splitlines() if m.group(0) in ln)
        ev = log.add("L3", "compiler-output", f"bishengir reports UB overflow: the kernel needs {need} bits of the "
                     f"{have} bits ({have // 8 // 1024} KiB) of Unified Buffer", "compiler-output", said)
        findings.append(Finding(
            "ascend.ub-overflow", "ascend-memory", f"UB overflow: {need // 8 // 1024} KiB needed, {have // 8 // 1024} KiB available",
            "The tiles live in a program's Unified Buffer at once (plus alignment padding and multi-buffer copies) "
            "exceed it, so hivm-plan-memory cannot place them and compilation fails.", [ev], [], "hivm-plan-memory",
            confidence=0.95))
    if not adapter:
        return findings
    loop_lines = ir.in_loops(adapter)
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
    int_ops = [(op, kind) for op in ir.op_source_lines(adapter) if (kind := _int_tensor_op(op))
               and (kind[1] == "i64" or kind[0] == "cmpi")]
    if int_ops:
        op, (name, elt) = int_ops[0]
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttadapter", op, f"`arith.{name}` on a {elt} tensor at {at(src, line)} "
                        "survives into ttadapter")]
        findings.append(Finding(
            "ascend.int-vector-op", "ascend-compute", f"integer vector op on {elt} at {at(src, line)}",
            f"The Vector unit has no {elt} {name} (triton-ascend performance guidelines, "
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
    findings += _mask_padding(adapter, src, log)
    findings += _alignment_padding(adapter, src, log)
    findings += _dynamic_strides(adapter, src, log)
    findings += _cube_vector_sync(adapter, hivm or art.stages.get("mlir", ""), log)
    return findings


def _mask_padding(adapter: str, src: str, log: EvidenceLog) -> list[Finding]:
    """A5: a masked load without `other` is filled before the copy: `scf.if %partial { linalg.fill }`
    tagged hivm.unlikely_condition (LoadConverter::fillTensorWithOtherForMaskScenario), so the
    MTE2 copy waits for a Vector fill on every partial tile."""
    lines = adapter.splitlines()
    ops = ir.op_source_lines(adapter)
    copies = [o for o in ops if o.op == "memref.copy"]
    for op in (o for o in ops if o.op == "scf.if"):
        indent = len(lines[op.ir_line - 1]) - len(lines[op.ir_line - 1].lstrip())
        end = next((j for j in range(op.ir_line, len(lines)) if lines[j].strip().startswith("}")
                    and len(lines[j]) - len(lines[j].lstrip()) == indent), None)
        if end is None or "hivm.unlikely_condition" not in lines[end] \
                or not any("linalg.fill" in lines[k] for k in range(op.ir_line, end)):
            continue
        load = next((c for c in copies if c.ir_line > end + 1), None)
        line = load.loc.line if load and load.loc else 0
        chain = [log_op(log, "ttadapter", op, f"the masked load at {at(src, line)} is preceded by `scf.if {{ linalg.fill "
                        "}` tagged hivm.unlikely_condition: partial tiles are zero-filled before the copy")]
        if load is not None:
            chain.append(log_op(log, "ttadapter", load, "the copy (MTE2) that fills the same buffer after the Vector fill"))
        return [Finding(
            "ascend.mask-padding", "ascend-memory", f"the masked load at {at(src, line)} pads its tile before copying",
            "A masked tl.load without `other` keeps GPU semantics (zeros in masked lanes) by default, so triton-to-linalg "
            "fills the local buffer with a Vector op before the MTE2 copy into it: a Vector->MTE2 dependency on every "
            "partial tile. Where the masked lanes are never read, care_padding=False drops the fill.",
            chain, [line] if line else [], "triton-to-linalg", confidence=0.75)]
    return []


_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i8": 1, "i16": 2, "i32": 4, "i64": 8}
UB_ALIGN_BYTES = 32  # the last axis of a UB buffer is laid out in 32-byte units (AscendNPU-IR best_practice.md)


def _alignment_padding(adapter: str, src: str, log: EvidenceLog) -> list[Finding]:
    """A6: a multi-dimensional local buffer whose last axis is not a 32-byte multiple is padded to one
    by hivm-align-alloc-size / hivm-enable-stride-align: UB holds (and DMAs move) the padding too."""
    worst: tuple[float, ir.OpLine, list[int], int, int] | None = None
    for op in ir.op_source_lines(adapter, {"memref.alloc"}):
        buffer = next(iter(ir.shaped_types(op.text, "memref")), None)
        if buffer is None or not buffer.static or buffer.element not in _BYTES or len(buffer.shape) < 2:
            continue  # 1-D buffers are one contiguous run: only the total is rounded
        dims = list(buffer.shape)
        last = dims[-1] * _BYTES[buffer.element]
        if last % UB_ALIGN_BYTES == 0:
            continue
        padded = -(-last // UB_ALIGN_BYTES) * UB_ALIGN_BYTES
        factor = padded / last
        if worst is None or factor > worst[0]:
            worst = (factor, op, dims, last, padded)
    if worst is None or worst[0] < 1.5:
        return []
    factor, op, dims, last, padded = worst
    line = op.loc.line if op.loc else 0
    chain = [log_op(log, "ttadapter", op, f"the local buffer {'x'.join(map(str, dims))} at {at(src, line)} has a "
                    f"{last}-byte last axis, padded to {padded} bytes in UB: "
                    f"{factor:.1f}x the space and the transfer")]
    return [Finding(
        "ascend.alignment-padding", "ascend-memory",
        f"the tile at {at(src, line)} wastes {100 * (1 - 1 / factor):.0f}% of its Unified Buffer on alignment padding",
        "UB buffers are aligned to 32 bytes on their last axis (hivm-align-alloc-size, hivm-enable-stride-align); a "
        "tile whose innermost extent is a few bytes is stored, moved and computed at the padded width, which shrinks "
        "the tiles that fit and multiplies DMA work.", chain, [line] if line else [], "hivm-align-alloc-size",
        confidence=0.8 if factor >= 2 else 0.6)]


_DYNAMIC_STRIDE = re.compile(r"memref\.reinterpret_cast .*strides: \[(?P<strides>[^\]]*)\]")


def _dynamic_strides(adapter: str, src: str, log: EvidenceLog) -> list[Finding]:
    """A7: a 2-D (or higher) block whose outer stride is a runtime value (`strides: [%x, 1]`)."""
    for op in ir.op_source_lines(adapter, {"memref.reinterpret_cast"}):
        m = _DYNAMIC_STRIDE.search(op.text)
        if not m:
            continue
        strides = [x.strip() for x in m.group("strides").split(",")]
        if len(strides) < 2 or not any(x.startswith("%") for x in strides[:-1]):
            continue
        line = op.loc.line if op.loc else 0
        chain = [log_op(log, "ttadapter", op, f"the block at {at(src, line)} is addressed with runtime strides "
                        f"[{', '.join(strides)}]")]
        return [Finding(
            "ascend.dynamic-strides", "ascend-memory", f"runtime strides in the block access at {at(src, line)}",
            "A block whose outer stride is only known at run time is moved as a strided DMA with dynamic strides; "
            "triton-ascend#1673 measured such a kernel 5.4x slower than the same one with constexpr strides. Whether "
            "it matters here depends on the transfer sizes: the cause is reported, not measured.",
            chain, [line] if line else [], "triton-to-linalg", confidence=0.5)]
    return []


_SYNC = re.compile(r"hivm\.hir\.sync_block_(set|wait)\b")


def _cube_vector_sync(adapter: str, hivm: str, log: EvidenceLog) -> list[Finding]:
    """A9: a mixed Cube-Vector kernel whose cores hand data to each other with block syncs inside
    the loop: every iteration waits for the other core type."""
    if 'mix_mode = "mix"' not in adapter or not _SYNC.search(hivm):
        return []
    loops = ir.in_loops(hivm)
    syncs = [(i, ln) for i, ln in enumerate(hivm.splitlines(), start=1) if _SYNC.search(ln)]
    looped = [(i, ln) for i, ln in syncs if i in loops]
    if not looped:
        return []
    ev = log.add("L3", "hivm", f"the kernel is a mixed Cube-Vector kernel (mix_mode = \"mix\") with {len(looped)} of its "
                 f"{len(syncs)} sync_block_set/wait operations inside a loop: Cube and Vector wait for each other "
                 "every iteration", f"hivm:{looped[0][0]}", looped[0][1].strip())
    return [Finding(
        "ascend.cv-sync", "ascend-pipeline", f"Cube and Vector cores synchronize {len(looped)} times per loop iteration",
        "hivm-split-mix-kernel splits a kernel with tl.dot and vector work into a Cube and a Vector part that hand "
        "tiles over through the workspace; with the hand-over inside the loop, each core idles while the other "
        "works unless cv-pipelining and the mix tiling (tile_mix_cube_loop / tile_mix_vector_loop) overlap them.",
        [ev], [], "hivm-split-mix-kernel", confidence=0.6)]


def _int_tensor_op(op: ir.OpLine) -> tuple[str, str] | None:
    """(op, element) of an integer arith op on an i32/i64 tensor (`arith.cmpi` on `tensor<64xi64>` ->
    ("cmpi", "i64")): the last such tensor type of the line, as the result's type is printed last."""
    name = op.op.removeprefix("arith.")
    if not op.op.startswith("arith.") or name not in _INT_OPS or "=" not in op.text.split(op.op)[0]:
        return None
    ints = [t.element for t in ir.shaped_types(op.text) if t.element in ("i64", "i32") and not t.encoding]
    return (name, ints[-1]) if ints else None
