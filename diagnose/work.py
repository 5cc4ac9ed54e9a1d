"""What a call's launches do: the bytes of the tensors they are given and the FLOPs of their dots.

L2 sets this beside the task's bytes/flops formula (`diagnose.bottleneck`): a formula more than 2x off
is said, and a run without one is placed by this. The FLOPs of a kernel with `tl.dot` come from one
of two places:
- its operands, when two of the launch's tensors are a GEMM's A[..., M, K] and B[..., K, N];
- otherwise its compiled IR: each `tt.dot`'s tile (M x N x K, from its TTIR types) times the trip
  counts, at the launch's values, of the loops around it in the source, times the grid's programs.
  Attention is the usual case: its dots multiply tiles of Q, K and V, not two operands.
A dot whose loop bounds the launch does not fix (a causal bound on the program id, say) leaves the
work incomplete, and L2 then keeps the task's formula alone.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from diagnose.features import KernelFeatures, kernel_features, kernel_functions
from diagnose.launch_values import single_assignments, trip_count
from harness import ir
from harness.errors import UserFacingError
from harness.ir.artifacts import Artifacts
from harness.launches import LaunchFacts
from harness.roofline import compute_dtype_of

__all__ = ["KernelWork", "ir_dot_flops", "kernel_work", "operand_flops"]


@dataclass(frozen=True)
class KernelWork:
    """What a call's launches do: `bytes` of the tensors they are given (the least they can move), `flops`
    of their dots, `dtype` the input type that names the compute ceiling. `flops_from` says where the
    FLOPs came from ("operands", "ir", or "" without dots)."""

    bytes: float
    flops: float
    dtype: str
    complete: bool = True  # False when a kernel has tl.dot whose FLOPs neither its operands nor its IR gave
    flops_from: str = ""


def kernel_work(launches: list[LaunchFacts], compiled: Sequence[Artifacts] = ()) -> KernelWork | None:
    """The work of a call's launches, each read with its own kernel's source and, for dots its operands do
    not account for, with its compiled IR from `compiled` (None without launches)."""
    if not launches:
        return None
    moved = 0.0
    flops = 0.0
    complete = True
    sources: set[str] = set()
    biggest: tuple[int, str] = (0, "bf16")
    features: dict[str, KernelFeatures] = {}
    functions: dict[str, dict[str, ast.FunctionDef]] = {}
    for facts in launches:
        if facts.source_file not in features:
            try:
                features[facts.source_file] = kernel_features(facts.source_file)
            except UserFacingError:
                features[facts.source_file] = KernelFeatures(facts.source_file, [])
        feats = features[facts.source_file]
        moved += facts.tensor_bytes()
        for t in facts.arguments.values():
            if isinstance(t, dict):
                biggest = max(biggest, (math.prod(t.get("shape") or [1]), compute_dtype_of(str(t.get("dtype")))))
        if not feats.dots:
            continue
        art = next((a for a in compiled if a.kernel == facts.kernel), None)
        from_ir = None
        if art is not None:
            if facts.source_file not in functions:
                functions[facts.source_file] = kernel_functions(facts.source_file)
            from_ir = ir_dot_flops(art, feats, facts, functions[facts.source_file].get(facts.kernel))
        if from_ir == 0.0:
            continue  # its file has dots, this kernel's IR none
        from_operands = operand_flops(facts)
        if from_operands:
            flops += from_operands
            sources.add("operands")
        elif from_ir:
            flops += from_ir
            sources.add("ir")
        else:
            complete = False
    return KernelWork(moved, flops, biggest[1], complete, "+".join(sorted(sources)))


def operand_flops(facts: LaunchFacts) -> float:
    """2*M*N*K of a GEMM of two of the launch's tensors, A[..., M, K] and B[..., K, N] (0 when none is)."""
    tensors = [t for t in facts.arguments.values() if isinstance(t, dict) and len(t.get("shape") or []) >= 2]
    for a in tensors:
        for b in tensors:
            batch_a, batch_b = a["shape"][:-2], b["shape"][:-2]
            same_batch = batch_a == batch_b or not batch_a or not batch_b  # A[B, M, K] @ B[B, K, N], or a 2-D one
            if a is not b and same_batch and a["shape"][-1] == b["shape"][-2] and a["shape"][-1] >= 16:
                return 2.0 * math.prod(a["shape"][:-1]) * a["shape"][-1] * b["shape"][-1]
    return 0.0


def ir_dot_flops(art: Artifacts, feats: KernelFeatures, facts: LaunchFacts,
                 kernel: ast.FunctionDef | None) -> float | None:
    """The launch's dot FLOPs from its TTIR: per `tt.dot`, 2 x batch x M x N x K of its tile, times the trip
    counts of the source loops around its line (a `tl.static_range` is already unrolled in the IR), times
    the programs; 0.0 when the compiled kernel has no dot. None when the grid or a loop's trip count is
    not fixed by the launch, or when a dot sits outside `kernel`'s own body (a @triton.jit helper it
    calls, perhaps inside a loop of the kernel's that the helper's lines do not show). Names the kernel
    assigns once are read through in the loops' bounds."""
    programs = facts.programs
    ttir = art.stages.get("ttir", "")
    dots = ir.op_source_lines(ttir, {"tt.dot"})  # tt.dot_scaled packs its K: not counted
    if not dots:
        return None if "tt.dot_scaled" in ttir or not ttir else 0.0
    if not programs or "scf.while" in ttir or kernel is None:
        return None  # no grid; or a while loop, whose trip count the source's range() bounds do not give
    values = facts.integers()
    definitions = single_assignments(kernel)
    body = range(kernel.lineno, (kernel.end_lineno or kernel.lineno) + 1)
    kinds = {site.line: site.what for site in feats.loops}
    file = Path(feats.file).name
    per_program = 0.0
    for op in dots:
        types = ir.shaped_types(op.text)
        if len(types) < 2 or not all(t.static and len(t.shape) >= 2 for t in (types[0], types[-1])):
            return None
        a, out = types[0], types[-1]
        tile = 2.0 * math.prod(out.shape) * a.shape[-1]  # batch x M x N outputs, K products each
        if op.loc is None or Path(op.loc.file).name != file or op.loc.line not in body:
            return None  # a dot of an inlined helper: the loops around its call are not read here
        for start, end in feats.loop_ends.items():
            if start < op.loc.line <= end and not kinds.get(start, "").endswith("static_range"):
                trips = trip_count(feats.loop_bounds.get(start, ""), values, definitions)
                if trips is None:
                    return None
                tile *= trips
        per_program += tile
    return per_program * programs
