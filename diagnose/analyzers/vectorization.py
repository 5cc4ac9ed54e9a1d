"""L3: are global loads and stores vectorized, and if not, what stopped them.

Evidence chain: PTX access widths at each kernel line -> the compiler's remark at that line (vec,
origin vec, mask) and the pass that emitted it -> the TTGIR layout the coalescer planned -> the
TTIR specialization of the arguments (tt.divisibility) and the mask that bounds the access.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from diagnose.analyzers.common import short
from diagnose.records import EvidenceLog, Finding
from harness import ir
from harness.ir.artifacts import Artifacts

__all__ = ["analyze"]

# Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1
_VEC_REMARK = re.compile(r"vectorization fails vec = (?P<vec>\d+) origin vec = (?P<origin>\d+).*?mask is (?P<mask>\d+)")


def _mask_bound_args(ttir: str, kernel_line: int) -> list[str]:
    """Kernel arguments that bound the mask of the load/store written at `kernel_line`."""
    defs = ir.ssa_defs(ttir)
    args = {a.name for a in ir.func_args(ttir)}
    found: list[str] = []
    for op in ir.op_source_lines(ttir, {"tt.load", "tt.store"}):
        if op.loc is None or op.loc.line != kernel_line:
            continue
        operands = ir.ssa_names(op.text.split(":")[0].split("=", 1)[-1])
        mask = operands[1] if op.op == "tt.load" and len(operands) > 1 else (operands[2] if len(operands) > 2 else None)
        frontier, seen = [mask] if mask else [], set()
        while frontier:
            value = frontier.pop()
            if value in seen:
                continue
            seen.add(value)
            name = value.lstrip("%")
            if name in args and name not in found:
                found.append(name)
                continue
            frontier.extend(ir.ssa_names(defs.get(value, "").split(":")[0]))
    return found


def _address_terms(ttir: str, kernel_line: int) -> tuple[set[str], set[str], bool]:
    """How the address of the access at `kernel_line` uses integer arguments.

    Returns (base_args, element_args, divmod): arguments that scale a scalar (a row or program
    offset: they decide the base's alignment), arguments splatted across the tile (a per-element
    stride: they decide contiguity), and whether a division or remainder by a runtime value is on
    the way.
    """
    defs = ir.ssa_defs(ttir)
    int_args = {a.name for a in ir.func_args(ttir) if not a.is_pointer}
    base: set[str] = set()
    element: set[str] = set()
    divmod = False
    for op in ir.op_source_lines(ttir, {"tt.load", "tt.store"}):
        if op.loc is None or op.loc.line != kernel_line:
            continue
        operands = ir.ssa_names(op.text.split(":")[0].split("=", 1)[-1])
        frontier, seen = operands[:1], set()
        while frontier:
            value = frontier.pop()
            if value in seen or value not in defs:
                continue
            seen.add(value)
            body = defs[value]
            uses = ir.ssa_names(body.split(":")[0])
            if re.match(r"arith\.(div|rem)[su]i", body) and len(uses) > 1 and not defs.get(uses[1], "").startswith("arith.constant"):
                divmod = True
            scalar_op = "tensor<" not in body.split(":", 1)[-1]
            for u in uses:
                name = u.lstrip("%")
                if name in int_args:
                    (base if scalar_op else element).add(name)
            frontier.extend(uses)
    return base, element, divmod


def analyze(art: Artifacts, log: EvidenceLog) -> list[Finding]:
    ptx = art.stages.get("ptx", "")
    if not ptx:
        return []
    src = short(art.source_file)
    by_line: dict[tuple[int, str], list[ir.MemAccess]] = defaultdict(list)
    for a in ir.ptx_memory_accesses(ptx):
        if a.kind in ("load", "store") and a.loc is not None:
            by_line[(a.loc.line, a.kind)].append(a)
    if not by_line:
        return []
    remarks = {r.line: r for r in art.remarks if "vectorization fails" in r.message}
    divisible = art.divisible_args()
    ttir = art.stages.get("ttir", "")
    findings: list[Finding] = []
    healthy_evidence: list[str] = []
    skipped = 0  # accesses another analyzer owns
    tile_lines = {op.loc.line for op in ir.op_source_lines(ttir, {"tt.load", "tt.store"})
                  if op.loc and "tensor<" in op.text.split(" : ")[-1]} if ttir else set()
    for (line, kind), group in sorted(by_line.items()):
        if ttir and line not in tile_lines:
            continue  # a scalar access (one value per program) has nothing to vectorize
        widest = max(group, key=lambda a: a.bits)
        ptx_ev = log.add(
            "L3", "ptx",
            f"the {kind} at {src}:{line} compiles to {len(group)} `{widest.instruction}` instruction(s) of "
            f"{widest.bits} bits" + (" each, predicated" if widest.predicated else ""),
            f"ptx:{widest.ptx_line}", _line(ptx, widest.ptx_line),
        )
        if widest.bits >= 128 or (widest.vector > 1 and widest.bits >= 64 and widest.element_bits < 32):
            healthy_evidence.append(ptx_ev)
            continue
        chain = [ptx_ev]
        remark = remarks.get(line)
        vec = origin = mask_const = None
        if remark is not None:
            chain.append(log.add(
                "L3", "remark",
                f"the compiler reports at {src}:{line}: {remark.message}"
                + (f" (emitted during pass {remark.pass_name})" if remark.pass_name else ""),
                f"{src}:{remark.line}:{remark.col}", remark.message,
            ))
            if m := _VEC_REMARK.search(remark.message):
                vec, origin, mask_const = int(m["vec"]), int(m["origin"]), int(m["mask"])
        layout = _load_layout(art, line)
        if layout:
            chain.append(log.add("L3", "ttgir", f"the TTGIR layout of this {kind} has {layout[0]}", layout[1], layout[2]))
        mask_args = _mask_bound_args(ttir, line) if ttir else []
        undivisible_mask_args = [a for a in mask_args if a not in divisible and art.signature.get(a, "").startswith("i")]
        if origin is not None and origin > 1 and mask_const is not None and mask_const < origin:
            for arg in undivisible_mask_args:
                chain.append(_arg_evidence(art, log, arg, "bounds the mask"))
            bound = ", ".join(undivisible_mask_args) or "its bound"
            findings.append(Finding(
                kind="vectorization.mask",
                topic="vectorization",
                title=f"the masked {kind} at {src}:{line} is split into {widest.bits}-bit accesses by its mask",
                explanation=(
                    f"The pointer allows {origin}-wide vectors (origin vec = {origin}) but the mask is only provably "
                    f"constant over {mask_const} element(s), so the vector width drops to {vec or 1}. The mask compares "
                    f"the offsets with {bound}, which the launch did not specialize as divisible by 16."
                ),
                evidence=chain,
                kernel_lines=[line],
                deciding_pass=remark.pass_name if remark else "",
            ))
            continue
        base_args, element_args, divmod = _address_terms(ttir, line) if ttir else (set(), set(), False)
        if divmod:
            skipped += 1
            continue  # index.divmod owns this access: the division hides contiguity (diagnose.analyzers.index)
        pointer_args = [a.name for a in ir.func_args(ttir) if a.is_pointer] if ttir else []
        unaligned = [a for a in pointer_args if a not in divisible]
        unaligned_base = sorted(a for a in base_args if a not in divisible and a not in element_args)
        if not unaligned and unaligned_base and (origin is None or origin <= 1):
            for arg in unaligned_base:
                chain.append(_arg_evidence(art, log, arg, "scales the access's base offset"))
            true_hints = _launch_true_hints(art, unaligned_base)
            if true_hints:
                chain.append(log.add("L3", "launch", f"at this launch {true_hints}", f"launch:{art.kernel}",
                                     str({a: (art.metadata.get("launch_args") or {}).get(a) for a in unaligned_base})))
            findings.append(Finding(
                kind="vectorization.divisibility",
                topic="vectorization",
                title=f"the {kind} at {src}:{line} is scalar: its base offset uses {', '.join(unaligned_base)}, "
                      "not known divisible by 16",
                explanation=(
                    f"The pointer argument is aligned, but the access starts at an offset scaled by "
                    f"{', '.join(unaligned_base)} (a row stride or length), which the launch did not specialize as "
                    "divisible by 16: AxisInfo can prove no alignment for the base, so every access is scalar."
                    + (f" A hint must be true for every launch: at this one {true_hints}." if true_hints else "")
                ),
                evidence=chain,
                kernel_lines=[line],
                deciding_pass=remark.pass_name if remark else "",
            ))
            continue
        if unaligned:
            for arg in unaligned:
                chain.append(_arg_evidence(art, log, arg, "is a pointer"))
            findings.append(Finding(
                kind="vectorization.divisibility",
                topic="vectorization",
                title=f"the {kind} at {src}:{line} is scalar: pointer(s) {', '.join(unaligned)} not known 16-byte aligned",
                explanation=(
                    "Vector width is bounded by the alignment AxisInfo can prove; without tt.divisibility on the base "
                    "pointer only scalar accesses are legal."
                ),
                evidence=chain,
                kernel_lines=[line],
                deciding_pass=remark.pass_name if remark else "",
            ))
            continue
        small_tile = layout is not None and _elements_per_thread(layout[0]) == 1
        findings.append(Finding(
            kind="vectorization.small-tile" if small_tile and remark is None else "vectorization.contiguity",
            topic="vectorization",
            title=f"the {kind} at {src}:{line} is not vectorized ({widest.bits}-bit accesses)",
            explanation=(
                "Each thread owns one element of this tile (sizePerThread = 1): the tile is too small for the warps."
                if small_tile and remark is None else
                "The offsets are not provably contiguous along the fastest dimension (or not divisible), so the "
                "coalescer could not plan vector accesses."
            ),
            evidence=chain,
            kernel_lines=[line],
            deciding_pass=remark.pass_name if remark else "tritongpu-coalesce",
        ))
    if not findings and healthy_evidence and not skipped:
        findings.append(Finding(
            kind="vectorization.ok",
            topic="vectorization",
            title="global loads and stores are vectorized",
            explanation="Every tile load and store in the PTX is a vector access of 128 bits (or of 64 bits over "
                        "16-bit elements); one-value-per-program accesses are not counted.",
            evidence=healthy_evidence,
            kernel_lines=sorted({line for (line, _) in by_line}),
        ))
    return findings


def _elements_per_thread(description: str) -> int:
    return math.prod(ir.int_list_attribute(description, "sizePerThread"))


def _line(text: str, lineno: int) -> str:
    lines = text.splitlines()
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def _load_layout(art: Artifacts, kernel_line: int) -> tuple[str, str, str] | None:
    """(sizePerThread description, ttgir:line, the op line) for the load/store at `kernel_line`."""
    ttgir = art.stages.get("ttgir", "")
    aliases = ir.blocked_layouts(ttgir)
    for op in ir.op_source_lines(ttgir, {"tt.load", "tt.store"}):
        if op.loc is None or op.loc.line != kernel_line:
            continue
        for alias, body in aliases.items():
            spt = ir.int_list_attribute(body, "sizePerThread")
            if alias in ir.ALIAS_REF.findall(op.text) and spt:
                return f"sizePerThread = [{', '.join(map(str, spt))}] ({alias})", f"ttgir:{op.ir_line}", op.text
    return None


def _launch_true_hints(art: Artifacts, args: list[str]) -> str:
    """What `tl.multiple_of` may truthfully say of each integer argument at the launch that was compiled,
    e.g. "stride = 1000 = 8 x 125: tl.multiple_of(stride, 8) holds, 16 would be false"."""
    from harness.launches import largest_power_of_two_divisor

    values = art.metadata.get("launch_args") or {}
    said = []
    for arg in args:
        value = values.get(arg)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            continue
        divisor = largest_power_of_two_divisor(value)
        if divisor >= 16:
            said.append(f"{arg} = {value} is a multiple of 16")
        elif divisor > 1:
            said.append(f"{arg} = {value} = {divisor} x {value // divisor}: tl.multiple_of({arg}, {divisor}) holds, "
                        "16 would be false")
        else:
            said.append(f"{arg} = {value} is odd: no divisibility hint is true for it")
    return "; ".join(said)


def _arg_evidence(art: Artifacts, log: EvidenceLog, arg: str, role: str) -> str:
    ttir = art.stages.get("ttir", "")
    header = next((i for i, ln in enumerate(ttir.splitlines(), 1) if "tt.func" in ln), 0)
    specialized = arg in art.divisible_args()
    return log.add(
        "L3", "ttir",
        f"argument `{arg}` ({role}) has {'' if specialized else 'no '}tt.divisibility = 16 in the launch specialization",
        f"ttir:{header}",
        f"{arg}: {art.signature.get(arg, '?')} attrs={art.arg_attrs.get(arg, [])}",
    )
