"""L1 on the launch the user makes: the source read with the launch's real values beside it.

Source rules alone (diagnose.triage) say what a kernel could suffer from at some launch. With the
intercepted launch (`harness.launches.LaunchFacts`: the grid, every integer argument and constexpr,
the tensors' dtypes and strides) L1 can say what this launch suffers from:

- parallelism: how many programs the grid runs against the SMs of the target, and whether the work is
  large enough for the idle SMs to cost time (outranks pipelining and vectorization when the grid
  cannot fill the device: no per-program fix helps idle SMs);
- coalescing: an access whose lanes step through memory by a runtime stride (consecutive lanes in
  different 32-byte sectors) moves a sector for every element it uses;
- masks: one false for most lanes leaves most of each tile idle; one never false caps no vector width;
- the source rules' suspicions checked against the values: a streaming loop that runs once is not a
  pipelining problem, an IEEE dot on fp16 operands is still a tensor-core dot.

Each finding carries its expected gain (`Finding.gain`): what fixing it could buy at most, from the
launch's numbers; the stop rule and the ranking weigh it.
"""

from __future__ import annotations

import ast
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.features import KernelFeatures, access_mask, dotted_name, kernel_functions
from diagnose.launch_values import address_definitions, evaluate, expand, single_assignments, trip_count
from diagnose.records import EvidenceLog, Finding
from diagnose.triage import source_line
from diagnose.work import operand_flops
from harness.cuda_shim import device_model_for
from harness.launches import LaunchFacts

if TYPE_CHECKING:
    from diagnose.rewriters.causal import CausalLoop

__all__ = ["LAUNCH_KINDS", "launch_triage"]

# Findings that come from the launch's numbers, or from what the call does beside its launches, which no
# IR stage shows: L3 keeps them as they are, and a kernel measured at its roof does not temper them (the
# wrapper's own PyTorch passes cost the call time however fast the kernel is).
LAUNCH_KINDS = ("parallelism.", "memory.uncoalesced", "host.")

_SECTOR = 32  # bytes: the unit DRAM and L2 move for a warp's request
_LAUNCH_S = 5e-6  # a kernel launch and its tail: no kernel is faster than this
_HIDING_WARPS = 16  # resident warps per SM (a quarter of 64) from which occupancy hides load latency


def launch_triage(feats: KernelFeatures, launches: list[LaunchFacts], findings: list[Finding], log: EvidenceLog,
                  notes: list[str]) -> list[Finding]:
    """`findings` (the source rules') checked against the launches, plus the launch's own findings."""
    if not launches:
        return findings
    kernels = kernel_functions(feats.file)
    # The launches of this file's kernels; one from another file is triaged with that file's source.
    mine = [f for f in launches if Path(f.source_file).resolve() == Path(feats.file).resolve()]
    kept = _temper(feats, kernels, launches, mine, findings, log, notes)
    _causal_gains(feats, kernels, mine, kept, log)
    kept += _wrapper_work(feats, launches, log)
    for facts in mine:
        kept += _parallelism(feats, facts, log)
        kernel = kernels.get(facts.kernel)
        if kernel is not None:
            values, definitions = facts.integers(), single_assignments(kernel)
            kept += _coalescing(feats, facts, kernel, values, log)
            kept = _masks(feats, facts, kernel, values, definitions, kept, log, notes)
    return kept


# ----------------------------------------------------------------------------------- the wrapper's own work
_WRAPPER_SHARE = 0.1  # PyTorch work below a tenth of the kernels' bytes is left unsaid


def _wrapper_work(feats: KernelFeatures, launches: list[LaunchFacts], log: EvidenceLog) -> list[Finding]:
    """The call's PyTorch ops beside its Triton launches (harness.wrapper_work, recorded while the
    launches were intercepted): each is a kernel of its own and a pass over its bytes, which a timing
    of the whole call charges to the Triton kernel (first drafts scale an input, clone it or copy a
    permuted view before the launch). The gain, if the kernel did that work as it loads and stores:
    the call's bytes over the kernels' own, both at the same bandwidth."""
    work = [w for facts in launches for w in facts.wrapper_work]
    kernel_bytes = sum(f.tensor_bytes() for f in launches)
    extra = sum(b for _, _, b in work)
    if not work or not kernel_bytes or extra < _WRAPPER_SHARE * kernel_bytes:
        return []
    ops = ", ".join(f"aten.{op}" + (f" x{n}" if n > 1 else "") + f" ({b / 1e6:.1f} MB)" for op, n, b in work[:4])
    line = feats.launch_line or 1
    claim = (f"besides its Triton launch(es), the call runs {sum(n for _, n, _ in work)} PyTorch op(s) that make data: "
             f"{ops}; {extra / 1e6:.1f} MB against the kernels' own {kernel_bytes / 1e6:.1f} MB")
    ev = log.add("L1", "launch", claim, f"{Path(feats.file).name}:{line}", ops)
    gain = (kernel_bytes + extra) / kernel_bytes
    return [Finding("host.torch-work", "host", f"the wrapper does PyTorch work beside the kernel: {ops}",
                    "Each PyTorch op is a kernel launch and a pass over its tensors of its own, timed with the call "
                    "but not part of the Triton kernel: a scaling, a cast or a clone of an input can be done by the "
                    "kernel as it loads, a copy to make a view contiguous by the kernel reading the view's "
                    "strides, and a sum, mean or norm of the kernel's output by the kernel as it stores it.", [ev], [line], "", "L1", 0.8, gain=round(gain, 2))]


# ----------------------------------------------------------------------------------- parallelism
def _parallelism(feats: KernelFeatures, facts: LaunchFacts, log: EvidenceLog) -> list[Finding]:
    """Fewer programs than SMs matters when the work is large enough that the busy SMs, not the launch,
    set the time: the time at `programs` SMs' share of the device against the time the whole device
    needs (never below a launch) is what spreading the work could gain."""
    programs = facts.programs
    if not programs or not facts.target.startswith("cuda"):
        return []
    device = device_model_for(facts.target)
    sms = device.sm_count
    if programs >= sms:
        return []
    moved = facts.tensor_bytes()
    flops, rate_tflops = _dot_work(feats, facts, device)
    # One SM can draw about twice its even share of DRAM bandwidth, and exactly its share of math.
    at_grid = max(moved / (programs * 2 * device.dram_gbps * 1e9 / sms), flops / (programs * rate_tflops * 1e12 / sms))
    at_device = max(moved / (device.dram_gbps * 1e9), flops / (rate_tflops * 1e12), _LAUNCH_S)
    gain = at_grid / at_device
    if gain < 1.5:
        return []
    name = Path(feats.file).name
    line = feats.launch_line or 1
    grid = "x".join(str(g) for g in facts.grid or ())
    work = f"{moved / 1e6:.1f} MB" + (f" and {flops / 1e9:.1f} GFLOP" if flops else "")
    claim = (f"the launch of {facts.kernel} runs {programs} program(s) (grid {grid}, num_warps={facts.num_warps}) on "
             f"the {sms} SMs of {device.name} for {work}: at {programs} SMs' share of the device that takes at least "
             f"{at_grid * 1e6:.1f} us, against {at_device * 1e6:.1f} us on all of it")
    ev = log.add("L1", "launch", claim, f"{name}:{line}", f"grid={list(facts.grid or ())} num_warps={facts.num_warps}")
    confidence = 0.95 if gain >= 4 else 0.85 if gain >= 2 else 0.6
    return [Finding("parallelism.grid-underfilled", "parallelism",
                    f"{programs} program(s) for {sms} SMs: the grid leaves {sms - programs} SMs idle",
                    "Each program runs on one SM; with fewer programs than SMs the rest of the device idles "
                    "whatever each program does, so no per-program fix (pipelining, vector width) can reach the "
                    "roofline. Split the work over more programs: smaller blocks, the loop or the reduction split "
                    "across programs (a second pass or atomics), several programs per row.",
                    [ev], [line], "", "L1", confidence, gain=round(gain, 2))]


def _dot_work(feats: KernelFeatures, facts: LaunchFacts, device: Any) -> tuple[float, float]:
    """FLOPs of the launch's dots and the device's datasheet rate for their inputs."""
    dtypes = facts.tensor_dtypes()
    fp32_fma = dtypes <= {"float32", "float64"} and any(d.detail == "ieee" for d in feats.dots)
    rate = device.fp32_tflops if fp32_fma else device.tensor_tflops * (2 if dtypes & {"int8", "uint8"} else 1)
    return operand_flops(facts) if feats.dots else 0.0, rate


# ------------------------------------------------------------------------------------ coalescing
def _coalescing(feats: KernelFeatures, facts: LaunchFacts, kernel: ast.FunctionDef, values: dict[str, int],
                log: EvidenceLog) -> list[Finding]:
    name = Path(feats.file).name
    out: list[Finding] = []
    definitions, unknown = address_definitions(kernel)  # pointers moved in place (`W += ...`) read through
    for call in (n for n in ast.walk(kernel) if isinstance(n, ast.Call)):
        what = dotted_name(call.func)
        if what not in ("tl.load", "tl.store") or not call.args:
            continue
        pointer = expand(call.args[0], definitions, 8)
        if any(isinstance(n, ast.Name) and n.id in unknown for n in ast.walk(pointer)):
            continue  # a term the source does not fix may hold the unit-stride axis
        strides = [s for s in _lane_strides(pointer, values)]
        if not strides or any(s == 1 for s in strides) or any(s is None for s in strides):
            continue  # a unit-stride lane axis (coalesced), or a stride this launch does not fix
        base = next((n.id for n in ast.walk(pointer) if isinstance(n, ast.Name) and facts.tensor(n.id)), None)
        size = facts.element_size(base) if base else None
        if size is None:
            continue
        step = min(int(s) for s in strides if s is not None)
        gap = abs(step) * size
        if gap < _SECTOR:
            continue  # lanes share sectors: a narrow, not an uncoalesced, access (L3's contiguity finding)
        efficiency = size / _SECTOR
        line = call.lineno
        text = source_line(feats.file, line)
        ev = log.add("L1", "kernel", f"the {what.split('.')[1]} at {name}:{line} steps {abs(step)} elements "
                     f"({gap} bytes) between consecutive lanes at this launch: each lane's {size}-byte element sits in "
                     f"its own {_SECTOR}-byte sector, {efficiency:.0%} of the bytes moved are used", f"{name}:{line}", text)
        out.append(Finding("memory.uncoalesced", "vectorization",
                           f"uncoalesced {what.split('.')[1]} at {name}:{line}: lanes {gap} bytes apart",
                           "Consecutive lanes of a warp read addresses a runtime stride apart, so a warp's request "
                           "touches up to 32 sectors for 32 elements: the access moves a sector per element. No "
                           "vector width fixes that; a tile whose unit-stride axis runs across the lanes does "
                           "(load [rows, cols] with cols contiguous, reduce or transpose in registers).",
                           [ev], [line], "tritongpu-coalesce", "L1", 0.85, gain=round(1 / efficiency, 2)))
    return out


def _masks(feats: KernelFeatures, facts: LaunchFacts, kernel: ast.FunctionDef, values: dict[str, int],
           definitions: dict[str, ast.expr], findings: list[Finding], log: EvidenceLog, notes: list[str]) -> list[Finding]:
    """What the masks do at this launch: one that is never false cannot cap a vector width (the source
    rule's suspicion goes), and one false for most lanes leaves most of each tile idle (a finding: the
    tile or the grid's split does not fit the sizes)."""
    fractions: dict[int, float] = {}  # exact: the share of lanes each access's mask lets through
    at_most: dict[int, float] = {}  # bounded: a term the launch does not fix (a loop's offset) counts as all true
    for call in (n for n in ast.walk(kernel) if isinstance(n, ast.Call)):
        name = dotted_name(call.func)
        mask = access_mask(call) if name in ("tl.load", "tl.store") or name.startswith("tl.atomic_") else None
        if mask is None:
            continue
        expanded = expand(mask, definitions, 8)
        fraction = _true_fraction(expanded, values, facts.grid or ())
        if fraction is not None:
            fractions[call.lineno] = min(fraction, fractions.get(call.lineno, 1.0))
        bound = fraction if fraction is not None else _true_fraction(expanded, values, facts.grid or (), upper_bound=True)
        if bound is not None:
            at_most[call.lineno] = min(bound, at_most.get(call.lineno, 1.0))
    kept = []
    for f in findings:
        if f.kind == "vectorization.mask" and f.level == "L1" and f.kernel_lines and \
                all(fractions.get(line) == 1.0 for line in f.kernel_lines):
            notes.append(f"L1 dropped {f.kind}: at this launch every mask at line(s) "
                         f"{', '.join(map(str, f.kernel_lines))} is true for every lane")
            continue
        kept.append(f)
    if not at_most:
        return kept
    line, worst = min(at_most.items(), key=lambda item: item[1])
    if worst >= 0.5:
        return kept
    name = Path(feats.file).name
    ev = log.add("L1", "launch", f"at this launch the mask at {name}:{line} is true for {worst:.1%} of the lanes "
                 "(its bound against the tile and the grid)", f"{name}:{line}", source_line(feats.file, line))
    return [*kept, Finding("parallelism.masked-lanes", "parallelism",
                           f"{1 - worst:.0%} of the lanes at {name}:{line} are masked off",
                           "The tile (or the grid's split of the work) does not fit the sizes: most lanes load and "
                           "compute nothing, so the SMs run a fraction of the useful work they could. Tile along the "
                           "axis that is long (several rows per program, the whole short axis in one tile).",
                           [ev], [line], "", "L1", 0.8 if worst < 0.25 else 0.6, gain=round(min(1 / worst, 16.0), 2))]


def _true_fraction(mask: ast.expr, values: dict[str, int], grid: tuple[int, ...], upper_bound: bool = False
                   ) -> float | None:
    """The share of lanes (over the programs) a mask of the form `offs < bound` (and `&` of such) lets
    through, where offs is a tl.arange, offset per program by tl.program_id; None where this launch's
    values do not fix it (a loop variable, a data-dependent bound). With `upper_bound`, a conjunction of a
    fixed term and one that is not is at most the fixed term's share (a row mask of 1 in 128 `&` a column
    mask that moves with the loop)."""
    if isinstance(mask, ast.BinOp) and isinstance(mask.op, ast.BitAnd):
        left = _true_fraction(mask.left, values, grid, upper_bound)
        right = _true_fraction(mask.right, values, grid, upper_bound)
        if upper_bound and (left is None) != (right is None):
            return left if right is None else right
        if left is None or right is None:
            return None
        # Bounds on one axis (both `cols < ..`) intersect; on two axes (`rows[:, None] < M`, `cols[None, :]
        # < N`) they multiply.
        return min(left, right) if _tile_axis(mask.left) == _tile_axis(mask.right) else left * right
    if not (isinstance(mask, ast.Compare) and len(mask.ops) == 1 and isinstance(mask.ops[0], (ast.Lt, ast.LtE))):
        return None
    lanes, bound_node = mask.left, mask.comparators[0]
    while isinstance(lanes, ast.Subscript):
        lanes = lanes.value
    aranges = [n for n in ast.walk(lanes) if isinstance(n, ast.Call) and _is_arange(n)]
    bound = evaluate(bound_node, values)
    if len(aranges) != 1 or bound is None or len(aranges[0].args) != 2:
        return None
    start, stop = (evaluate(a, values) for a in aranges[0].args)
    if start is None or stop is None or stop <= start:
        return None
    bound += isinstance(mask.ops[0], ast.LtE)
    pids = [n for n in ast.walk(lanes) if isinstance(n, ast.Call) and dotted_name(n.func).endswith("program_id")]
    others = {n.id for n in ast.walk(lanes) if isinstance(n, ast.Name)} - {"tl", "triton"} - set(values)
    if others:
        return None  # a loop variable or a loaded value moves the lanes: not fixed by the launch
    extent = stop - start
    if not pids:
        return min(max(bound - start, 0), extent) / extent
    axis = pids[0].args[0].value if pids[0].args and isinstance(pids[0].args[0], ast.Constant) else 0
    if not isinstance(axis, int) or axis >= len(grid):
        return None
    step = next((evaluate(n.right if _has_pid(n.left) else n.left, values) for n in ast.walk(lanes)
                 if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (_has_pid(n.left) or _has_pid(n.right))),
                None)
    if step != extent:
        return None  # programs step by something other than the tile: their coverage is not the grid's
    covered = grid[axis] * extent  # program p covers [p * extent, (p + 1) * extent)
    return min(max(bound, 0), covered) / covered


def _tile_axis(compare: ast.expr) -> str:
    """Which axis of a tile a comparison's lanes run along: the index of `lanes[:, None]`, "" for 1-D."""
    lanes = compare.left if isinstance(compare, ast.Compare) else compare
    return ast.dump(lanes.slice) if isinstance(lanes, ast.Subscript) else ""


def _has_pid(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and dotted_name(n.func).endswith("program_id") for n in ast.walk(node))


def _lane_strides(pointer: ast.expr, values: dict[str, int]) -> Iterator[int | None]:
    """The element step between consecutive tl.arange values of each additive term of an address
    that holds one (1: unit stride; None: a step this launch's values cannot evaluate)."""
    for term in _terms(pointer):
        if not any(_is_arange(n) for n in ast.walk(term)):
            continue
        if isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult):
            left_lanes = any(_is_arange(n) for n in ast.walk(term.left))
            lanes, other = (term.left, term.right) if left_lanes else (term.right, term.left)
            if any(_is_arange(n) for n in ast.walk(other)):
                yield None
                continue
            inner = [s for s in _lane_strides(lanes, values)]
            factor = evaluate(other, values)
            yield (None if factor is None or None in inner or not inner
                   else min(int(s) for s in inner if s is not None) * factor)
        else:
            yield 1 if _plain_lanes(term) else None


def _plain_lanes(term: ast.expr) -> bool:
    """An arange offset, possibly indexed (`cols[None, :]`) or shifted by a scalar, not scaled."""
    while isinstance(term, ast.Subscript):
        term = term.value
    return _is_arange(term) or any(isinstance(n, ast.Call) and _is_arange(n) for n in ast.walk(term)) and not any(
        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.FloorDiv, ast.Mod)) for n in ast.walk(term))


def _terms(node: ast.expr) -> Iterator[ast.expr]:
    while isinstance(node, ast.Subscript) and not _is_arange(node):
        node = node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield from _terms(node.left)
        yield from _terms(node.right)
    else:
        yield node


def _is_arange(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and dotted_name(node.func) in ("tl.arange", "triton.language.arange")


# ---------------------------------------------------------------------------- causal key loops
def _causal_gains(feats: KernelFeatures, kernels: dict[str, ast.FunctionDef], mine: list[LaunchFacts],
                  findings: list[Finding], log: EvidenceLog) -> None:
    """A causal loop's gain at this launch: the key blocks its programs visit over those they would
    visit stopping at their rows' diagonal (evidence: both counts)."""
    for f in findings:
        if f.kind != "attention.causal-full-loop" or not f.kernel_lines:
            continue
        loop = next((c for c in feats.causal_loops if c.line == f.kernel_lines[0]), None)
        for facts in mine:
            kernel = kernels.get(facts.kernel)
            if loop is None or kernel is None or not kernel.lineno <= loop.line <= (kernel.end_lineno or 0):
                continue
            counts = _causal_blocks(loop, kernel, facts)
            if counts is None:
                continue
            total, visited = counts
            f.gain = round(total / visited, 2)
            f.evidence = [*f.evidence, log.add(
                "L1", "launch", f"at this launch its programs visit {total} key blocks, {total - visited} of them "
                f"wholly past their rows' diagonal", f"{Path(feats.file).name}:{loop.line}",
                f"for ... in range(0, {loop.bound}, {loop.step}); rows {loop.rows_start} + arange({loop.rows_width})")]
            break


def _causal_blocks(loop: CausalLoop, kernel: ast.FunctionDef, facts: LaunchFacts) -> tuple[int, int] | None:
    """(blocks visited as written, blocks up to the diagonal) over the grid's programs, where the row
    start is an expression of one program id and the launch's integers; None where it is not."""
    values, definitions = facts.integers(), single_assignments(kernel)

    def expression(text: str) -> ast.expr | None:
        try:
            return expand(ast.parse(text, mode="eval").body, definitions, 4)
        except SyntaxError:
            return None

    bound, step, width, start = (expression(t) for t in (loop.bound, loop.step, loop.rows_width, loop.rows_start))
    if bound is None or step is None or width is None or start is None:
        return None
    axes = {c.args[0].value for c in ast.walk(start) if isinstance(c, ast.Call) and dotted_name(c.func) == "tl.program_id"
            and c.args and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, int)}
    n, b, w = evaluate(bound, values), evaluate(step, values), evaluate(width, values)
    if n is None or w is None or not b or len(axes) != 1 or not facts.grid:
        return None
    (axis,) = axes
    if not isinstance(axis, int) or len(facts.grid) <= axis:
        return None
    # the row start as a function of `__pid`, evaluated per program (a copy: expand may share the kernel's nodes)
    start = _PidAsName().visit(copy.deepcopy(start))
    total = visited = 0
    for pid in range(min(facts.grid[axis], 1 << 16)):
        first = evaluate(start, {**values, "__pid": pid})
        if first is None:
            return None
        total += math.ceil(n / b)
        visited += math.ceil(max(0, min(n, first + w)) / b)
    return (total, visited) if visited else None


class _PidAsName(ast.NodeTransformer):
    """`tl.program_id(k)` -> the name `__pid`, which `evaluate` reads from the values it is given."""

    def visit_Call(self, node: ast.Call) -> Any:
        if dotted_name(node.func) == "tl.program_id":
            return ast.Name("__pid", ast.Load())
        return self.generic_visit(node)


# ------------------------------------------------------------------------- values vs the source rules
def _temper(feats: KernelFeatures, kernels: dict[str, ast.FunctionDef], launches: list[LaunchFacts], mine: list[LaunchFacts],
            findings: list[Finding], log: EvidenceLog, notes: list[str]) -> list[Finding]:
    idle = _unlaunched_lines(kernels, {f.kernel for f in mine})
    values: dict[str, int] = {}
    for facts in launches:
        values.update(facts.integers())
    dtypes = set().union(*(f.tensor_dtypes() for f in launches))
    stages = max((f.num_stages for f in launches), default=3)
    kept = []
    for f in findings:
        if f.kernel_lines and all(line in idle for line in f.kernel_lines):
            notes.append(f"L1 left out {f.kind} at line {f.kernel_lines[0]}: it is in {idle[f.kernel_lines[0]]}, which "
                         "this call does not launch")
            continue
        if f.kind == "pipelining.none" and f.kernel_lines:
            trips = trip_count(feats.loop_bounds.get(f.kernel_lines[0], ""), values)
            if trips is not None and trips <= 1:
                notes.append(f"L1 dropped {f.kind} at line {f.kernel_lines[0]}: the loop runs {trips} time(s) at this "
                             "launch, so there is nothing to overlap")
                continue
            if trips is not None:
                ev = log.add("L1", "launch", f"the loop at line {f.kernel_lines[0]} runs {trips} iterations at this "
                             "launch", f"{Path(feats.file).name}:{f.kernel_lines[0]}", feats.loop_bounds[f.kernel_lines[0]])
                f.evidence = [*f.evidence, ev]
                if trips <= stages:
                    f.confidence = min(f.confidence, 0.45)
            resident = max((_warps_per_sm(facts) for facts in launches), default=0.0)
            if resident >= _HIDING_WARPS:
                # Other programs' warps keep loads in flight while one waits: prefetching within a program
                # adds little, so the loop is worth a try, not the diagnosed cause.
                ev = log.add("L1", "launch", f"at this launch each SM holds about {resident:.0f} warps (programs x "
                             "num_warps over the SMs, at most 64): other warps hide a load's latency",
                             f"{Path(feats.file).name}:{feats.launch_line or 1}", "")
                f.evidence = [*f.evidence, ev]
                f.confidence = min(f.confidence, 0.45)
        if f.kind == "reduction.in-loop" and f.kernel_lines:
            run = [line for line in f.kernel_lines if line not in idle]
            counts = [trip_count(feats.loop_bounds.get(_loop_of(feats, line) or -1, ""), values) for line in run]
            if counts and all(t is not None and t <= 1 for t in counts):
                # Liger's group norm: BLOCK_SIZE = next_power_of_2(hidden), so its loops run once and the
                # reduction is already done once; lanes kept over a 65536-wide block only cost registers.
                notes.append(f"L1 dropped {f.kind} at line {run[0]}: its loop runs once at this launch, so it "
                             "already reduces once")
                continue
        if f.kind == "dot.fma" and dtypes and not dtypes & {"float32", "float64"}:
            notes.append(f"L1 dropped {f.kind}: no operand of this launch is fp32 ({', '.join(sorted(dtypes))}), so "
                         "input_precision does not take the dot off tensor cores")
            continue
        kept.append(f)
    return kept


def _warps_per_sm(facts: LaunchFacts) -> float:
    """Warps resident per SM at this launch: the grid's programs spread over the SMs, capped by what an SM
    holds (64 warps; registers and shared memory, known only once compiled, may cap it lower)."""
    if not facts.programs or not facts.target.startswith("cuda"):
        return 0.0
    sms = device_model_for(facts.target).sm_count
    per_sm = math.ceil(facts.programs / sms)
    return float(min(per_sm * facts.num_warps, 64))


def _loop_of(feats: KernelFeatures, line: int) -> int | None:
    """The line of the innermost loop of the file's kernels whose body holds `line`."""
    return max((start for start, end in feats.loop_ends.items() if start < line <= end), default=None)


def _unlaunched_lines(kernels: dict[str, ast.FunctionDef], launched: set[str]) -> dict[int, str]:
    """Line -> kernel name, for the lines of the file's kernels that neither the launches nor the JIT
    functions they call (transitively) run: a library file holds the backward kernels beside the forward."""
    if not kernels or not launched:
        return {}
    reached, todo = set(), [k for k in launched if k in kernels]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [c for c in (dotted_name(n.func).split(".")[-1] for n in ast.walk(kernels[name]) if isinstance(n, ast.Call))
                 if c in kernels]
    if not reached:
        return {}  # none of the launched kernels is defined here: nothing to leave out
    return {line: name for name, fn in kernels.items() if name not in reached
            for line in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)}
