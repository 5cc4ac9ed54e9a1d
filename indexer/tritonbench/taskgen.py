"""A TritonBench-T operator and one draft, written as a kernel-kb task folder.

    <op>_draft.py      the draft as screened (demo statements dropped)
    <op>_reference.py  the data file above its separator: the PyTorch reference, as written
    <op>_cases.py      the operator's own input code, generated from its perf script and its test:
                       `perf_call(i)` is the entry's arguments for the sweep's i-th input set, as
                       call_op passes them; `test_calls()` the calls the test function makes
    task.py            entry, reference, 5 timed cases over the sweep, held-out cases from the test,
                       bytes and flops from the perf script's formulas, family, allow_torch

The perf script's and test's code is kept as written, with three changes made on its syntax tree:
the sweep yields one input set at a time (`self.input_tensors.append(x)` becomes `yield x`, so case i
builds sets 0..i only, not the whole sweep), the operator's name is replaced by a recorder (the call's
arguments are what the entry gets), and devices named "cuda" become torch's default device (the judge
sets it: a GPU, or the CPU under the interpreter).
"""

from __future__ import annotations

import ast
import datetime
from dataclasses import dataclass, field
from pathlib import Path

from indexer.tritonbench.drafts import Screened
from indexer.tritonbench.source import Draft, Operator

__all__ = ["CasesProbe", "family_of", "timed_indices", "write_cases_module", "write_task"]

# The perf class's own timing and device plumbing: the judge times, and the harness places the tensors.
_SKIPPED_PERF_METHODS = {"run_benchmark", "get_do_bench_config", "to_cuda", "get_runtime"}


@dataclass
class CasesProbe:
    """What the probe measured of an operator's cases module (see `indexer.tritonbench.probe`)."""

    sweep: int  # input sets in the perf sweep
    sizes: dict[int, str] = field(default_factory=dict)  # per timed index: the shapes, for case labels
    bytes: dict[int, float] = field(default_factory=dict)
    flops: dict[int, float] = field(default_factory=dict)
    tests: int = 0  # test calls usable as held-out cases (no tensor passed by keyword)
    tests_dropped: int = 0  # those passing an out= tensor or in place: the judge would see an input change


def family_of(name: str) -> str:
    """A family from the operator's name, first match wins: the fused ops name their heaviest part first
    often enough (`fused_mv_sigmoid_sub` is a GEMV), and reports only group by it."""
    words = set(name.lower().split("_"))
    rules = [
        ("matmul", {"matmul", "mm", "bmm", "addmm", "mv", "linear", "tensordot", "dot", "baddbmm", "addmv", "gemm",
                    "bilinear", "einsum", "outer", "vdot", "symmetric"}),
        ("conv", {"conv1d", "conv2d", "conv3d", "conv", "conv_transpose2d"}),
        ("linalg", {"svd", "eig", "det", "qr", "cholesky", "solve", "lu", "inv", "ldl", "lstsq", "pinv", "eigh",
                    "factor", "triangular"}),
        ("normalization", {"norm", "batch", "layer", "instance", "group", "rms", "normalize", "rmsnorm"}),
        ("softmax", {"softmax", "log_softmax", "logsoftmax", "logsumexp"}),
        ("reduction", {"sum", "mean", "max", "min", "argmax", "argmin", "prod", "var", "std", "cumsum", "cumprod",
                       "reduce", "median", "mode", "norm", "all", "any"}),
        ("pooling", {"pool", "pool1d", "pool2d", "avg", "adaptive"}),
        ("gather/scatter", {"gather", "scatter", "index", "embedding", "take", "masked", "select", "grid", "sample"}),
    ]
    return next((family for family, keys in rules if words & keys), "elementwise")


def timed_indices(sweep: int, count: int = 5) -> list[int]:
    """`count` input sets spread evenly over a sweep of `sweep`, its last (largest) always among them."""
    if sweep <= count:
        return list(range(sweep))
    return sorted({round(i * (sweep - 1) / (count - 1)) for i in range(count)})


# --- the cases module ----------------------------------------------------------------------------------

class _OnDefaultDevice(ast.NodeTransformer):
    """device="cuda" / torch.device("cuda") / x.cuda() / x.to("cuda") -> torch's default device."""

    _DEFAULT = "torch.get_default_device()"

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        self.generic_visit(node)
        if node.arg == "device" and _names_cuda(node.value):
            node.value = ast.parse(self._DEFAULT, mode="eval").body
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = ast.unparse(node.func)
        if func == "torch.device" and node.args and _names_cuda(node.args[0]):
            return ast.parse(self._DEFAULT, mode="eval").body
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not node.args:
            return ast.Call(ast.Attribute(node.func.value, "to", ast.Load()), [ast.parse(self._DEFAULT, mode="eval").body], [])
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args and _names_cuda(node.args[0]):
            node.args[0] = ast.parse(self._DEFAULT, mode="eval").body
        return node


def _names_cuda(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda")


class _Renamed(ast.NodeTransformer):
    """Calls of the operator by name -> calls of `new` (only calls: `max` may be a builtin elsewhere)."""

    def __init__(self, old: set[str], new: str) -> None:
        self.old, self.new = old, new

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.old:
            node.func = ast.Name(self.new, ast.Load())
        return node


class _AppendToYield(ast.NodeTransformer):
    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "self.input_tensors.append" and len(call.args) == 1:
            return ast.Expr(ast.Yield(self.visit(call.args[0])))
        return self.generic_visit(node)


def _imports(tree: ast.Module, skip: set[str]) -> list[str]:
    """A module's import lines, less those of modules in `skip` (the benchmark's own plumbing)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [a for a in node.names if a.name.split(".")[0] not in skip]
            if names:
                out.append(ast.unparse(ast.Import(names=names)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] not in skip:
            out.append(ast.unparse(node))
    return out


def _perf_class(op: Operator, tree: ast.Module) -> str:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                and any(isinstance(m, ast.FunctionDef) and m.name == "get_input_tensors" for m in n.body)), None)
    if cls is None:
        raise ValueError(f"{op.perf_file}: no class with get_input_tensors")
    methods = []
    for m in cls.body:
        if not isinstance(m, ast.FunctionDef) or m.name in _SKIPPED_PERF_METHODS:
            continue
        if m.name == "get_input_tensors":
            m = _AppendToYield().visit(m)
            m.name = "sweep"
            m.body = [s for s in m.body if ast.unparse(s) != "self.input_tensors = []"] or [ast.Pass()]
        methods.append(m)
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
                and n.module.split(".")[0] == "TorchBench_v1" for a in n.names} | {op.reference_name}
    # call_op's call of the operator is recorded; elsewhere (a sweep that runs it for an output shape)
    # the reference runs
    methods = [_Renamed(imported, "_called" if m.name == "call_op" else "_reference").visit(m) for m in methods]
    new = ast.ClassDef("PerfMetrics", [ast.Name("_PerformanceMetrics", ast.Load())], [], methods, [])
    new = _OnDefaultDevice().visit(new)
    return ast.unparse(ast.fix_missing_locations(new))


def _test_code(op: Operator, tree: ast.Module) -> tuple[str, str]:
    """The test part's definitions (helpers, the test function) with the operator recorded, and the
    test function's name."""
    test = next((n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")), None)
    if test is None:
        raise ValueError(f"{op.data_file}: no test_ function below the separator")
    # definitions and module constants; not the line that runs the test (`test_results = test_add()`)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            or (isinstance(n, ast.Assign) and test not in ast.unparse(n.value))]
    body = [_Renamed({op.reference_name}, "_record").visit(_OnDefaultDevice().visit(n)) for n in defs]
    return "\n\n\n".join(ast.unparse(ast.fix_missing_locations(n)) for n in body), test


def write_cases_module(op: Operator, directory: Path) -> Path:
    """`<op>_cases.py` and `<op>_reference.py` in `directory`; raises ValueError for an operator whose
    perf script or test has no shape this reads."""
    if op.perf_source is None:
        raise ValueError(f"{op.name} has no perf script under performance_metrics/perf_T/golden_metrics")
    perf_tree, test_tree = ast.parse(op.perf_source), ast.parse(op.test_source)
    plumbing = {"TorchBench_v1", "performance_utils", "sys", "os", "json", op.name}
    imports = list(dict.fromkeys(["import itertools", "import torch"]
                                 + _imports(perf_tree, plumbing) + _imports(test_tree, plumbing)))
    perf = _perf_class(op, perf_tree)
    test, test_name = _test_code(op, test_tree)
    text = f'''"""Input sets of TritonBench-T `{op.name}`, made by the operator's own code (generated by `kb import tritonbench`).

PerfMetrics: the perf script's class ({op.perf_file.name if op.perf_file else "-"}) with its methods as written,
except that get_input_tensors yields one input set at a time (`sweep`) and the operator is recorded
(`_called`) instead of run. `test_calls()`: the calls {test_name} makes ({op.data_file.name}), recorded
while the reference runs. Devices named "cuda" are torch's default device.
"""
{chr(10).join(imports)}

from {op.name}_reference import {op.reference_name} as _reference

class Called(Exception):
    """Raised by `_called`: the arguments call_op passes the operator."""


def _called(*args, **kwargs):
    raise Called(args, kwargs)


class _PerformanceMetrics:
    """What performance_utils.Performance_Metrics.__init__ sets; timing is the judge's, not this class's."""

    def __init__(self, op_name, dtype=None, is_backward=False, **kwargs):
        self.op_name, self.dtype, self.kwargs, self.input_tensors = op_name, dtype, kwargs, []


{perf}


def _on_device(x):
    if isinstance(x, torch.Tensor):
        return x.to(torch.get_default_device())
    if isinstance(x, (tuple, list)):
        return type(x)(_on_device(v) for v in x)
    if isinstance(x, dict):
        return {{k: _on_device(v) for k, v in x.items()}}
    return x


def perf_set(index):
    """The sweep's `index`-th input set (sets 0..index are made; the sweep's sizes grow)."""
    return next(itertools.islice(PerfMetrics().sweep(), index, None))


def perf_call(index):
    """The operator's (args, kwargs) for the sweep's `index`-th input set, as call_op passes them."""
    x = _on_device(perf_set(index))
    try:
        PerfMetrics().call_op(x)
    except Called as called:
        return called.args
    raise RuntimeError("call_op returned without calling the operator")


_CALLS = []


def _record(*args, **kwargs):
    clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731 - the recorded inputs stay as made
    call_args, call_kwargs = [clone(a) for a in args], {{k: clone(v) for k, v in kwargs.items()}}
    result = _reference(*call_args, **call_kwargs)
    _CALLS.append((args, kwargs, _aliases(result, [*call_args, *call_kwargs.values()])))
    return result


def _aliases(result, inputs):
    """Whether the reference returned (a view of) one of its inputs: an in-place call (`inplace=True`)."""
    outs = [result] if isinstance(result, torch.Tensor) else [r for r in result if isinstance(r, torch.Tensor)] \
        if isinstance(result, (tuple, list)) else []
    held = {{t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}}
    return any(o.numel() and o.untyped_storage().data_ptr() in held for o in outs)


{test}


def test_calls():
    """Every call {test_name} makes of the operator, as (args, kwargs, in_place)."""
    _CALLS.clear()
    {test_name}()
    return list(_CALLS)


def heldout_calls():
    """The test's calls as (args, kwargs), less those the judge cannot take as they are: an out= tensor
    or an in-place call (`inplace=True`) changes an input, which the judge rejects."""
    return [(a, k) for a, k, in_place in test_calls() if not in_place and not isinstance(k.get("out"), torch.Tensor)]
'''
    (directory / f"{op.name}_reference.py").write_text(op.reference_source.rstrip() + "\n", encoding="utf-8")
    path = directory / f"{op.name}_cases.py"
    path.write_text(text, encoding="utf-8")
    return path


# --- the task file --------------------------------------------------------------------------------------

def write_task(op: Operator, draft: Draft, screened: Screened, probe: CasesProbe, allow_torch: list[str],
               directory: Path, source_root: Path) -> Path:
    """`task.py` and `<op>_draft.py` in `directory` (beside the cases module)."""
    (directory / f"{op.name}_draft.py").write_text(screened.code, encoding="utf-8")
    wrapper, dropped = screened.wrapper, screened.dropped
    timed = [i for i in timed_indices(probe.sweep) if i in probe.bytes or i in probe.sizes]
    cases = ", ".join(f"dict(perf={i}, size={probe.sizes.get(i, '?')!r})" for i in timed)
    heldout = ", ".join(f"dict(test={i})" for i in range(probe.tests))
    table = lambda d: "{" + ", ".join(f"{i}: {d[i]!r}" for i in timed if i in d) + "}"  # noqa: E731
    today = datetime.date.today().isoformat()
    changes = ([f"{dropped} demo statement(s) run at import dropped"] if dropped else []) + (
        [f"added {'; '.join(screened.added_imports)}"] if screened.added_imports else [])
    dropped_note = f" ({', '.join(changes)})" if changes else ""
    test_note = f"; {probe.tests_dropped} call(s) writing an input (out=, in place) left out" if probe.tests_dropped else ""
    text = f'''"""TritonBench-T `{op.name}`: {draft.model}'s draft ({draft.file}, record {draft.record}) against the PyTorch reference.

Generated by `kb import tritonbench` from {source_root} on {today}: the first draft, in the import's
model order, that passed the judge's checks. Entry: `{wrapper}` of {op.name}_draft.py{dropped_note}.
Reference: `{op.reference_name}` of {op.name}_reference.py (data/TritonBench_T_v1/{op.name}.py above its separator).
Timed cases: input sets {", ".join(map(str, timed))} of the perf sweep's {probe.sweep} ({op.name}_perf.py); bytes
and flops are its get_gbps and get_tflops formulas at those sets. Held-out cases: the calls the test
function makes{test_note}.
"""
from {op.name}_cases import heldout_calls, perf_call
from {op.name}_draft import {wrapper} as entry  # noqa: F401
from {op.name}_reference import {op.reference_name} as reference  # noqa: F401
from harness.task import Call

family = {family_of(op.name)!r}
allow_torch = {sorted(allow_torch)!r}  # the torch calls the draft makes: a rewrite may keep them, not add more

cases = [{cases}]
heldout = [{heldout}]

_BYTES = {table(probe.bytes)}
_FLOPS = {table(probe.flops)}


def inputs(perf=None, test=None, size=None):
    args, kwargs = perf_call(perf) if perf is not None else heldout_calls()[test]
    return Call(args, kwargs)


def bytes(perf=None, test=None, size=None):
    return _BYTES.get(perf)


def flops(perf=None, test=None, size=None):
    return _FLOPS.get(perf)
'''
    path = directory / "task.py"
    path.write_text(text, encoding="utf-8")
    return path


def describe_shapes(value: object) -> str:
    """`4096 4096` for a set of two vectors, `8x16 16` for a matrix and a vector: what a case label
    shows of its input set (the first four tensors)."""
    import torch
    from torch.utils._pytree import tree_leaves

    shapes = ["x".join(map(str, t.shape)) or "scalar" for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return " ".join(shapes[:4]) + (" ..." if len(shapes) > 4 else "")
