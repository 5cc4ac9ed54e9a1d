"""L1 static features of a Triton kernel file, read from its Python syntax tree.

Cheap (no compile, no device): what the kernel loads and stores and how it masks them, how offsets
are computed, its dots and their precision, loops and whether they ask for pipelining, reductions,
atomics, math calls, hints, and the launch configuration its wrapper passes. Python's own `ast`
is the exact parser for Python source; tree-sitter is for the compiler's C++.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import UserFacingError
from harness.guards import is_kernel

if TYPE_CHECKING:
    from diagnose.rewriters.causal import CausalLoop

__all__ = ["KernelFeatures", "Site", "access_mask", "dotted_name", "kernel_features", "kernel_functions"]

_REDUCTIONS = {"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum", "cumsum", "cumprod", "associative_scan"}
_ATOMICS = {"atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas"}


@dataclass(frozen=True)
class Site:
    """One place in the kernel: line, what is there, and the detail that matters."""

    line: int
    what: str
    detail: str = ""
    in_loop: bool = False


@dataclass
class KernelFeatures:
    file: str
    kernels: list[str]
    params: dict[str, list[str]] = field(default_factory=dict)  # kernel -> runtime (non-constexpr) parameters
    loads: list[Site] = field(default_factory=list)  # detail: "masked" | "unmasked"
    stores: list[Site] = field(default_factory=list)
    dots: list[Site] = field(default_factory=list)  # detail: input precision ("default" when not given)
    loops: list[Site] = field(default_factory=list)  # what: range | tl.range | static_range; detail: loads/dot/num_stages
    loop_bounds: dict[int, str] = field(default_factory=dict)  # loop line -> its range arguments as written
    loop_ends: dict[int, int] = field(default_factory=dict)  # loop line -> the last line of its body
    reductions: list[Site] = field(default_factory=list)
    atomics: list[Site] = field(default_factory=list)  # detail: sem ("default" = acq_rel)
    # accumulating atomics left at acq_rel whose ordering orders nothing (diagnose.rewriters.atomics)
    ordered_atomics: list[Site] = field(default_factory=list)
    int64_casts: list[Site] = field(default_factory=list)  # only those reaching an address (rewriters.offsets)
    divmod: list[Site] = field(default_factory=list)  # detail: the runtime divisor
    libdevice: list[Site] = field(default_factory=list)
    transposes: list[Site] = field(default_factory=list)
    hints: list[Site] = field(default_factory=list)  # multiple_of, max_contiguous, assume
    block_pointers: list[Site] = field(default_factory=list)  # make_block_ptr / make_tensor_descriptor
    # loops whose full iterations evaluate boundary masks only the last needs; detail: how many terms
    boundary_loops: list[Site] = field(default_factory=list)
    # causal key loops that visit the blocks past their rows' diagonal (diagnose.rewriters.causal)
    causal_loops: list[CausalLoop] = field(default_factory=list)
    # linear recurrences stepped one time step per iteration (diagnose.rewriters.scan); detail: the state
    recurrences: list[Site] = field(default_factory=list)
    # loops that load one element per iteration and sum it (diagnose.rewriters.vectorize); detail: the sums
    scalar_loops: list[Site] = field(default_factory=list)
    # block reductions added to an accumulator every loop iteration (diagnose.rewriters.accumulate); detail: it
    loop_reductions: list[Site] = field(default_factory=list)
    # exponentials of scores whose scale could carry log2(e) (diagnose.rewriters.exp2); detail: where the scale is
    unfolded_exps: list[Site] = field(default_factory=list)
    # calls in the wrappers that make the host wait for the device (diagnose.rewriters.host); detail:
    # "removable" where trim-wrapper-overhead takes the wait out, else ""
    host_waits: list[Site] = field(default_factory=list)
    launch: dict[str, Any] = field(default_factory=dict)  # constant keyword arguments of kernel[grid](...)
    launch_line: int = 0  # the line of the first kernel[grid](...) call

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dotted_name(node: ast.AST) -> str:
    """Dotted name of a call target: tl.load -> "tl.load", libdevice.pow -> "libdevice.pow"."""
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return dotted_name(node.func)
    return ""


def access_mask(call: ast.Call) -> ast.expr | None:
    """The mask of a tl.load / tl.store / tl.atomic_* call, given by keyword or by position (None: unmasked;
    a compare-and-swap takes none)."""
    leaf = dotted_name(call.func).split(".")[-1]
    if leaf == "atomic_cas":
        return None
    position = 2 if leaf == "store" or leaf.startswith("atomic_") else 1
    return _kw(call, "mask") or (call.args[position] if len(call.args) > position else None)


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _const(node: ast.expr | None) -> Any:
    return node.value if isinstance(node, ast.Constant) else None


class _KernelVisitor(ast.NodeVisitor):
    def __init__(self, feats: KernelFeatures, runtime_params: set[str]) -> None:
        self.f = feats
        self.runtime = runtime_params
        self.loop_depth = 0

    def visit_For(self, node: ast.For) -> None:
        call = node.iter if isinstance(node.iter, ast.Call) else None
        kind = dotted_name(call.func) if call else "iter"
        body = ast.Module(body=node.body, type_ignores=[])
        names = {dotted_name(n.func).split(".")[-1] for n in ast.walk(body) if isinstance(n, ast.Call)}
        stages_node = _kw(call, "num_stages") if call else None
        if call is not None and stages_node is None and kind.endswith("tl.range") and len(call.args) >= 4:
            stages_node = call.args[3]  # tl.range(start, end, step, num_stages)
        stages = (_const(stages_node) if isinstance(stages_node, ast.Constant) else
                  ast.unparse(stages_node) if stages_node is not None else None)
        bounds = ", ".join(ast.unparse(a) for a in call.args) if call else ""
        detail = ",".join(x for x in ("loads" if "load" in names else "", "dot" if "dot" in names else "",
                                      f"num_stages={stages}" if stages is not None else "") if x)
        self.f.loop_bounds[node.lineno] = bounds  # the trip count, symbolically: (start, stop, step)
        self.f.loop_ends[node.lineno] = node.end_lineno or node.lineno
        self.f.loops.append(Site(node.lineno, kind, detail,
                                 self.loop_depth > 0))
        self.loop_depth += 1
        self.generic_visit(node)
        self.loop_depth -= 1

    def visit_While(self, node: ast.While) -> None:
        self.f.loops.append(Site(node.lineno, "while", "", self.loop_depth > 0))
        self.loop_depth += 1
        self.generic_visit(node)
        self.loop_depth -= 1

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func)
        leaf = name.split(".")[-1]
        loop = self.loop_depth > 0
        if name in ("tl.load", "tl.store"):
            masked = access_mask(node) is not None
            (self.f.loads if leaf == "load" else self.f.stores).append(
                Site(node.lineno, name, "masked" if masked else "unmasked", loop))
        elif name == "tl.dot":
            prec = _const(_kw(node, "input_precision"))
            if prec is None and _const(_kw(node, "allow_tf32")) is False:
                prec = "ieee"
            self.f.dots.append(Site(node.lineno, name, str(prec or "default"), loop))
        elif name.startswith("tl.") and leaf in _REDUCTIONS:
            self.f.reductions.append(Site(node.lineno, name, "", loop))
        elif leaf in _ATOMICS:
            self.f.atomics.append(Site(node.lineno, name, str(_const(_kw(node, "sem")) or "default"), loop))
        elif leaf == "to" and node.args and dotted_name(node.args[0]) in ("tl.int64", "tl.uint64"):
            self.f.int64_casts.append(Site(node.lineno, "to(int64)", "", loop))  # kept if it reaches an address
        elif name.startswith(("libdevice.", "tl.extra.")) and leaf not in ("exp2", "log2", "fma", "rsqrt", "sqrt"):
            self.f.libdevice.append(Site(node.lineno, name, "", loop))
        elif name in ("tl.trans", "tl.permute") or (leaf == "trans" and isinstance(node.func, ast.Attribute)):
            self.f.transposes.append(Site(node.lineno, name, "", loop))
        elif name in ("tl.multiple_of", "tl.max_contiguous", "tl.assume", "tl.max_constancy"):
            self.f.hints.append(Site(node.lineno, name, "", loop))
        elif name in ("tl.make_block_ptr", "tl.make_tensor_descriptor"):
            self.f.block_pointers.append(Site(node.lineno, name, "", loop))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and isinstance(node.right, ast.Name) and node.right.id in self.runtime:
            self.f.divmod.append(Site(node.lineno, "//" if isinstance(node.op, ast.FloorDiv) else "%", node.right.id,
                                      self.loop_depth > 0))
        self.generic_visit(node)


def _runtime_params(fn: ast.FunctionDef) -> list[str]:
    out = []
    for arg in fn.args.args:
        ann = dotted_name(arg.annotation) if arg.annotation is not None else ""
        if not ann.endswith("constexpr"):
            out.append(arg.arg)
    return out


def kernel_features(path: str | Path) -> KernelFeatures:
    """Features of every @triton.jit function in `path` and of the launches its wrappers write."""
    path = Path(path)
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserFacingError(f"cannot read kernel file {path}: {exc}", "pass a readable .py file") from exc
    except SyntaxError as exc:
        raise UserFacingError(f"{path}:{exc.lineno}: not valid Python ({exc.msg})", "fix the syntax error") from exc
    kernels = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and is_kernel(n)]
    feats = KernelFeatures(str(path), [k.name for k in kernels])
    for fn in kernels:
        params = _runtime_params(fn)
        feats.params[fn.name] = params
        _KernelVisitor(feats, set(params)).visit(fn)
    sites = _loop_rewrite_sites(source)
    feats.boundary_loops, feats.causal_loops, feats.recurrences = list(sites.boundary), list(sites.causal), list(sites.recurrences)
    feats.scalar_loops, feats.loop_reductions = list(sites.scalar), list(sites.reductions)
    feats.host_waits = list(_host_wait_sites(source))
    feats.unfolded_exps = list(_unfolded_exp_sites(source))
    feats.ordered_atomics = list(_ordered_atomic_sites(source))
    # A cast that widens a value for its range (a count, a hash) is no index: only address casts are kept.
    addressing = set(_address_cast_lines(source))
    feats.int64_casts = [s for s in feats.int64_casts if s.line in addressing]
    names = set(feats.kernels)
    for node in ast.walk(tree):
        # kernel[grid](..., num_warps=8, BLOCK=1024): the launch keywords with constant values
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and dotted_name(node.func.value) in names:
            feats.launch_line = feats.launch_line or node.lineno
            for kw in node.keywords:
                if kw.arg and isinstance(kw.value, ast.Constant):
                    feats.launch.setdefault(kw.arg, kw.value.value)
    return feats


@dataclass(frozen=True)
class _LoopSites:
    boundary: tuple[Site, ...]
    causal: tuple[CausalLoop, ...]
    recurrences: tuple[Site, ...]
    scalar: tuple[Site, ...]
    reductions: tuple[Site, ...]


@functools.lru_cache(maxsize=32)
def _loop_rewrite_sites(source: str) -> _LoopSites:
    """The loops the boundary, causal, scan, vectorize and accumulate rewrites would change: their own
    preconditions, so that what L1 reports is what they change. Each reads the module with libcst (a few
    hundred ms together), and one diagnosis and the optimize loop's rounds ask for the same source's
    features several times."""
    from diagnose.rewriters.accumulate import loop_reductions
    from diagnose.rewriters.causal import causal_loops
    from diagnose.rewriters.peel import boundary_loops
    from diagnose.rewriters.scan import linear_recurrences
    from diagnose.rewriters.vectorize import scalar_loops

    return _LoopSites(tuple(Site(b.line, "for", str(b.terms), False) for b in boundary_loops(source)),
                      tuple(causal_loops(source)),
                      tuple(Site(r.line, "for", r.state, False) for r in linear_recurrences(source)),
                      tuple(Site(v.line, "for", ", ".join(v.accumulators), False) for v in scalar_loops(source)),
                      tuple(Site(r.line, "tl.sum", r.accumulator, True) for r in loop_reductions(source)))


@functools.lru_cache(maxsize=32)
def _unfolded_exp_sites(source: str) -> tuple[Site, ...]:
    """The exponentials exp2-fast-math's fold rewrites (cached as the loop sites are)."""
    from diagnose.rewriters.exp2 import score_domains

    return tuple(Site(line, "tl.exp", "; ".join(d.entries)) for d in score_domains(source) for line in d.exp_lines)


@functools.lru_cache(maxsize=32)
def _ordered_atomic_sites(source: str) -> tuple[Site, ...]:
    """The atomics relaxed-atomics relaxes (cached as the loop sites are)."""
    from diagnose.rewriters.atomics import ordered_atomics

    return tuple(Site(a.line, a.op, "acq_rel") for a in ordered_atomics(source))


@functools.lru_cache(maxsize=32)
def _address_cast_lines(source: str) -> tuple[int, ...]:
    """The lines of the int64 casts that reach an address (cached as the loop sites are)."""
    from diagnose.rewriters.offsets import address_cast_lines

    return tuple(address_cast_lines(source))


@functools.lru_cache(maxsize=32)
def _host_wait_sites(source: str) -> tuple[Site, ...]:
    """The wrapper's waits as trim-wrapper-overhead sees them (cached as the loop sites are)."""
    from diagnose.rewriters.host import host_waits

    return tuple(Site(w.line, w.what, "removable" if w.removable else "") for w in host_waits(source))


def kernel_functions(path: str | Path) -> dict[str, ast.FunctionDef]:
    """The @triton.jit functions of a kernel file by name ({} when it cannot be read or parsed)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and is_kernel(n)}
