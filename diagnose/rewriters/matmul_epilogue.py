"""Fuse the PyTorch matmul a wrapper runs before its launch into the kernel that reads the product (issue 27,
host side; pattern fuse-matmul-epilogue, found by L1's `host.torch-work`).

First drafts of fused operators often leave the contraction to PyTorch and write only the elementwise tail in
Triton: `C = torch.tensordot(a, b, dims=1)`, then `rsqrt_kernel[grid](C, out, C.numel())`. That is two
launches and a round trip of C through device memory; at the small sizes of a perf sweep the launches are
the time (TritonBench-T's tensordot_rsqrt draft: 12.0 us at 32 x 32 on the H100, 3.8 us the launch floor).
One Triton GEMM can apply the tail to its accumulator tile before it stores it. Since cuBLAS beats a plain
Triton GEMM once the product is large, the fused kernel runs only below a size limit, one per variant, and
the call as written runs above it: a dispatch the judge times on every case.

It applies where the fused call provably computes what the call as written does:
- the wrapper assigns `C = torch.matmul(A, B)`, `torch.mm(A, B)`, `A @ B`, `A.matmul(B)`, `A.mm(B)` or
  `torch.tensordot(A, B, dims)` once, at its top level, and passes C (the name itself) to one launch, a
  statement of its own at the top level after it; every other use of C reads no element (its shape, its
  numel, `torch.empty_like(C)`): in the fused call C is an unwritten tensor of the product's shape;
- the kernel, straight-line code, loads C once at `C + OFFS` into a name (`x = tl.load(...)`, maybe
  `.to(dtype)`), stores once at `OUT + OFFS` with the same offsets and the same mask, OUT another parameter,
  where OFFS is `pid * BLOCK + tl.arange(0, BLOCK)` through names and the mask `OFFS < N`, N bound at the
  launch to C's numel;
- the statements between the load and the store, and the stored value, are elementwise: assignments of
  arithmetic and `tl` / libdevice math on the loaded name, names they assign, and the kernel's scalar
  parameters.

At run time the fused kernel is taken only for two 2-D tensors of one floating dtype on one device, with
matching inner sizes, `dims` equal to 1 for tensordot, and M x N x K at most the variant's limit; anything
else runs the call as written. The product is rounded to its dtype before the tail, as torch's matmul
returns it, and an fp32 product is accumulated in IEEE fp32 unless torch itself allows TF32
(`torch.backends.cuda.matmul.allow_tf32`). Tiles are up to 64 x 64 (K steps of up to 32), halved down to
16 while the grid has fewer than 128 programs: a small product on CUDA-core FMA is bound by how many SMs
it occupies. The flat index OFFS of the product is `row * N + column` (torch
returns it contiguous), so the fused kernel stores the tail of element (row, column) where the kernel as
written did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from diagnose.rewriters.aliasing import host_aliases, mutated_in_place
from diagnose.rewriters.base import (
    Variant,
    dotted,
    jit_functions,
    launch_arguments,
    launch_statement,
    register,
    simple_assign,
    target_launch,
    top_level_imports,
)
from diagnose.rewriters.blocks import (
    assigned_names,
    code,
    flat_access,
    fresh_name,
    names_in,
    numel_of,
    plain_assignments,
    pointer_roots,
)
from diagnose.rewriters.fold import metadata_use, with_torch
from diagnose.rewriters.rowloopread import names_read

__all__ = ["fuse_matmul_epilogue"]

# M x N x K at most this runs the fused kernel, one limit per variant: 256^3, 512^3, 1024^3.
LIMITS = (1 << 24, 1 << 27, 1 << 30)

_PRODUCTS = frozenset({"torch.matmul", "torch.mm", "torch.tensordot"})
# Elementwise calls the tail may make: they apply to a [BLOCK_M, BLOCK_N] tile as they do to a block.
_ELEMENTWISE = frozenset({
    "abs", "maximum", "minimum", "where", "exp", "exp2", "log", "log2", "sqrt", "sqrt_rn", "rsqrt", "sigmoid",
    "sin", "cos", "erf", "floor", "ceil", "fma", "fdiv", "div_rn", "clamp", "cdiv", "umulhi", "softplus"})
_HELPER = "_kb_matmul_fusable"


@dataclass
class _Plan:
    wrapper: cst.FunctionDef
    kernel: cst.FunctionDef
    launch: cst.Call
    launch_statement: cst.SimpleStatementLine
    product_statement: cst.SimpleStatementLine
    product: str  # C
    operands: tuple[cst.BaseExpression, cst.BaseExpression]  # A, B
    dims: cst.BaseExpression | None  # tensordot's dims
    out: str  # the kernel's parameter the tail is stored through
    loaded: str  # the name the kernel loads C into
    cast: cst.BaseExpression | None  # the dtype of `.to(dtype)` on the load
    tail: list[cst.SimpleStatementLine]
    value: cst.BaseExpression  # the stored value
    scalars: dict[str, cst.BaseExpression]  # the kernel's parameters the tail reads, with what the launch gives them
    fused_name: str  # the GEMM kernel's name, free in the module


def _product(value: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression | None] | None:
    """(A, B, dims) of a matrix product the wrapper computes, else None."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.MatrixMultiply):
        return value.left, value.right, None
    if not isinstance(value, cst.Call) or any(a.star for a in value.args):
        return None
    positional = [a.value for a in value.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
    func = dotted(value.func)
    if isinstance(value.func, cst.Attribute) and value.func.attr.value in ("matmul", "mm") and func not in _PRODUCTS:
        return (value.func.value, positional[0], None) if len(positional) == 1 and not keywords else None
    if func in ("torch.matmul", "torch.mm") and len(positional) == 2 and not keywords:
        return positional[0], positional[1], None
    if func == "torch.tensordot" and len(positional) in (2, 3) and set(keywords) <= {"dims"}:
        dims = positional[2] if len(positional) == 3 else keywords.get("dims")
        return (positional[0], positional[1], dims) if dims is not None else None
    return None


def _binds_triton(module: cst.Module) -> bool:
    """Whether the module binds `triton` and `tl` (`import triton`, `import triton.language as tl`) at its top
    level: the fused kernel and the dispatch are spelled with them."""
    return {("triton", None), ("triton.language", "tl")} <= top_level_imports(module)


_FRESH = frozenset({"torch.empty", "torch.empty_like", "torch.empty_strided"})


# The names the rewrite introduces: in the wrapper, the module, and the fused kernel beside the tail's own.
_INTRODUCED = frozenset({
    "_kb_a", "_kb_b", "_kb_fused", "_kb_m", "_kb_n", "_kb_k", "_kb_bm", "_kb_bn", "_kb_bk", "_kb_matmul_fusable",
    "_kb_a_ptr", "_kb_b_ptr", "_kb_M", "_kb_N", "_kb_K", "_kb_sam", "_kb_sak", "_kb_sbk", "_kb_sbn", "_KB_BM",
    "_KB_BN", "_KB_BK", "_KB_IEEE", "_kb_rm", "_kb_rn", "_kb_rk", "_kb_acc", "_kb_ks", "_kb_c"})


def _plan(module: cst.Module, context: dict[str, Any]) -> _Plan | None:
    if not _binds_triton(module) or any(isinstance(n, cst.Name) and n.value in _INTRODUCED
                                        for n in m.findall(module, m.Name())):
        return None
    target = target_launch(module, context)
    if target is None:
        return None
    name, launch = target
    kernel = jit_functions(module)[name]
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    found = launch_statement(launch, parents)
    if found is None or not (len(found[0].body) == 1 and isinstance(found[0].body[0], cst.Expr)):
        return None  # a launch in a branch, a loop or an expression, or beside other statements on its line
    statement, wrapper = found
    body = list(cst.ensure_type(wrapper.body, cst.IndentedBlock).body)
    before = body[:body.index(statement)]
    counts = assigned_names(wrapper)
    for param, arg in launch_arguments(kernel, launch).items():
        if not isinstance(arg.value, cst.Name) or counts.get(arg.value.value) != 1:
            continue
        product = arg.value.value
        made = next((s for s in before if (sa := simple_assign(s)) is not None and sa[0] == product), None)
        parts = _product(simple_assign(made)[1]) if made is not None else None  # type: ignore[index]
        if made is None or parts is None or not _reads_no_element(wrapper, product, arg, parents):
            continue
        plan = _kernel_side(module, kernel, launch, param, product, parents)
        if plan is None:
            continue
        out, loaded, cast, tail, value, scalars = plan
        between = body[body.index(made) + 1:body.index(statement)]
        if not _fresh_output(launch_arguments(kernel, launch)[out], counts, before, parents) \
                or not _operands_untouched(wrapper, between, parts[0], parts[1]):
            continue
        taken = {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}
        fused_name = fresh_name(f"{name}_matmul", taken)
        return _Plan(wrapper, kernel, launch, statement, cst.ensure_type(made, cst.SimpleStatementLine), product,
                     (parts[0], parts[1]), parts[2], out, loaded, cast, tail, value, scalars, fused_name)
    return None


def _fresh_output(arg: cst.Arg, counts: dict[str, int], before: list[cst.BaseStatement], parents: Any) -> bool:
    """Whether the launch stores the tail into a tensor the wrapper has just made with torch.empty*: memory no
    operand shares (the fused kernel reads the operands while it stores), and, since the harness rejects a
    kernel that leaves an output unwritten, memory the kernel as written must have covered whole."""
    if not isinstance(arg.value, cst.Name) or counts.get(arg.value.value) != 1:
        return False
    made = next((sa[1] for s in before if (sa := simple_assign(s)) is not None and sa[0] == arg.value.value), None)
    return isinstance(made, cst.Call) and dotted(made.func) in _FRESH


def _operands_untouched(wrapper: cst.FunctionDef, between: list[cst.BaseStatement], a: cst.BaseExpression,
                        b: cst.BaseExpression) -> bool:
    """Nothing between the product and the launch launches a kernel or writes what the operands are made of:
    the fused kernel reads them at the launch, the call as written read them at the product."""
    block = cst.IndentedBlock(body=between)
    if m.findall(block, m.Call(func=m.Subscript())):
        return False
    written = wrapper.with_changes(body=block)
    names = names_in(a) | names_in(b)
    return not any(mutated_in_place(written, alias) or alias in assigned_names(block)
                   for name in names for alias in host_aliases(wrapper, name))


def _reads_no_element(wrapper: cst.FunctionDef, product: str, arg: cst.Arg, parents: Any) -> bool:
    """Every use of the product but the launch's argument reads no element of it."""
    return all(parents[n] is arg or metadata_use(n, parents)
               for n in m.findall(wrapper, m.Name(product)) if isinstance(n, cst.Name))


def _kernel_side(module: cst.Module, kernel: cst.FunctionDef, launch: cst.Call, param: str, product: str,
                 parents: Any) -> tuple[str, str, cst.BaseExpression | None, list[cst.SimpleStatementLine],
                                        cst.BaseExpression, dict[str, cst.BaseExpression]] | None:
    """(OUT, the loaded name, its cast, the tail's statements, the stored value, the scalars the tail reads)
    where the kernel is the elementwise tail of its parameter `param` (the module's docstring), else None."""
    body = list(kernel.body.body)
    if not all(isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 for s in body):
        return None  # loops, branches, or several statements on a line
    params = [p.name.value for p in kernel.params.params]
    counts = assigned_names(kernel)
    if any(p in counts for p in params) or any(n > 1 for n in counts.values()) \
            or m.findall(kernel, m.AugAssign()):
        return None  # a parameter or a local changed on the way: the tail would see other values than it reads
    calls = [cst.ensure_type(c, cst.Call) for c in m.findall(kernel, m.Call())]
    loads = [c for c in calls if dotted(c.func) == "tl.load"]
    stores = [c for c in calls if dotted(c.func) == "tl.store"]
    if len(loads) != 1 or len(stores) != 1 or any(dotted(c.func).startswith("tl.atomic") for c in calls):
        return None
    load, store = loads[0], stores[0]
    at_load = next(i for i, s in enumerate(body) if any(c is load for c in m.findall(s, m.Call())))
    at_store = next(i for i, s in enumerate(body) if any(c is store for c in m.findall(s, m.Call())))
    if at_store != len(body) - 1 or at_store <= at_load or not isinstance(body[at_store].body[0], cst.Expr):  # type: ignore[attr-defined]
        return None
    taken = simple_assign(body[at_load])
    if taken is None:
        return None
    loaded, loaded_value = taken
    cast = None
    if loaded_value is not load:
        if not (m.matches(loaded_value, m.Call(func=m.Attribute(attr=m.Name("to")), args=[m.Arg(keyword=None)]))
                and cst.ensure_type(cst.ensure_type(loaded_value, cst.Call).func, cst.Attribute).value is load):
            return None
        cast = cst.ensure_type(loaded_value, cst.Call).args[0].value
    assigned = plain_assignments(kernel)
    if pointer_roots(load.args[0].value, assigned) != {param} or len(store.args) < 2:
        return None
    out_roots = pointer_roots(store.args[0].value, assigned)
    if len(out_roots) != 1 or param in out_roots:
        return None
    out = next(iter(out_roots))
    if not _same_elementwise_access(kernel, launch, load, store, param, out, product, parents):
        return None
    tail = [cst.ensure_type(s, cst.SimpleStatementLine) for s in body[at_load + 1:at_store]]
    value = store.args[1].value
    if cast is not None and not _elementwise(cast, set(), params, (param, out)):
        return None
    known = {loaded}
    for stmt in tail:
        assign = simple_assign(stmt)
        if assign is None or not _elementwise(assign[1], known, params, (param, out)):
            return None
        known.add(assign[0])
    if not _elementwise(value, known, params, (param, out)):
        return None
    read = set().union(*(_variables(s) for s in tail), _variables(value), _variables(cast) if cast is not None else set())
    bound = launch_arguments(kernel, launch)
    scalars: dict[str, cst.BaseExpression] = {}
    for p in kernel.params.params:
        name = p.name.value
        if name not in read:
            continue
        literal = p.default is not None and (isinstance(p.default, (cst.Integer, cst.Float, cst.SimpleString))
                                             or m.matches(p.default, m.Name("True") | m.Name("False")))
        if name in bound and bound[name].star == "":
            scalars[name] = bound[name].value
        elif name not in bound and literal and p.default is not None:
            scalars[name] = p.default  # the launch leaves it to its default: passed as written
        else:
            return None
    if out not in bound or bound[out].star != "":
        return None
    return out, loaded, cast, tail, value, scalars


def _same_elementwise_access(kernel: cst.FunctionDef, launch: cst.Call, load: cst.Call, store: cst.Call,
                             param: str, out: str, product: str, parents: Any) -> bool:
    """The load and the store at the same `pid * BLOCK + tl.arange(0, BLOCK)` past their pointers, under the
    same mask `offsets < N`, N bound at the launch to the product's numel."""
    accesses = [flat_access(kernel, call) for call in (load, store)]
    if accesses[0] is None or accesses[1] is None:
        return False
    loaded, stored = accesses[0], accesses[1]
    if not (m.matches(loaded.pointer, m.Name(param)) and m.matches(stored.pointer, m.Name(out))
            and code(loaded.offsets) == code(stored.offsets) and code(loaded.mask) == code(stored.mask)):
        return False
    count = launch_arguments(kernel, launch).get(loaded.bound)
    return count is not None and numel_of(count.value, product, launch, parents)


def _elementwise(expr: cst.BaseExpression, known: set[str], params: list[str], pointers: tuple[str, str]) -> bool:
    """Whether `expr` is elementwise arithmetic on names the tail knows and the kernel's scalar parameters."""
    for call in m.findall(expr, m.Call()):
        func = cst.ensure_type(call, cst.Call).func
        name = dotted(func)
        method = isinstance(func, cst.Attribute) and func.attr.value == "to"
        library = name.startswith(("libdevice.", "tl.math.", "tl.extra.")) or \
            (name.startswith("tl.") and name[3:] in _ELEMENTWISE)
        if not (method or library):
            return False
    if m.findall(expr, m.Subscript()) or m.findall(expr, m.Lambda()):
        return False
    allowed = known | (set(params) - set(pointers)) | {"tl", "libdevice", "triton"}
    return _variables(expr) <= allowed


def _variables(node: cst.CSTNode) -> set[str]:
    """The names `node` reads as variables: not an attribute's name (`tl.float32`'s float32), not a keyword."""
    return {n.value for n in names_read(node)}


def _fused_kernel(plan: _Plan) -> str:
    """The Triton GEMM whose epilogue is the kernel's tail, as source."""
    name = plan.kernel.name.value
    scalars = []
    for p in plan.kernel.params.params:
        if p.name.value in plan.scalars:
            scalars.append(code(p.with_changes(default=None, equal=cst.MaybeSentinel.DEFAULT,
                                               comma=cst.MaybeSentinel.DEFAULT)))
    c = f"_kb_c.to({code(plan.cast)})" if plan.cast is not None else "_kb_c"
    tail = "".join(f"    {code(s.with_changes(leading_lines=[])).strip()}\n" for s in plan.tail)  # comments above go
    return (
        "@triton.jit\n"
        f"def {plan.fused_name}(_kb_a_ptr, _kb_b_ptr, {plan.out}, _kb_M, _kb_N, _kb_K, _kb_sam, _kb_sak, _kb_sbk,"
        f" _kb_sbn, {''.join(s + ', ' for s in scalars)}"
        "_KB_BM: tl.constexpr, _KB_BN: tl.constexpr, _KB_BK: tl.constexpr, _KB_IEEE: tl.constexpr):\n"
        f"    # {name}'s tail applied to the tile of the product it would have loaded (fuse-matmul-epilogue)\n"
        "    _kb_rm = tl.program_id(0) * _KB_BM + tl.arange(0, _KB_BM)\n"
        "    _kb_rn = tl.program_id(1) * _KB_BN + tl.arange(0, _KB_BN)\n"
        "    _kb_rk = tl.arange(0, _KB_BK)\n"
        "    _kb_acc = tl.zeros((_KB_BM, _KB_BN), dtype=tl.float32)\n"
        "    for _kb_k in range(0, _kb_K, _KB_BK):\n"
        "        _kb_ks = _kb_k + _kb_rk\n"
        "        _kb_a = tl.load(_kb_a_ptr + _kb_rm[:, None] * _kb_sam + _kb_ks[None, :] * _kb_sak,\n"
        "                        mask=(_kb_rm[:, None] < _kb_M) & (_kb_ks[None, :] < _kb_K), other=0.0)\n"
        "        _kb_b = tl.load(_kb_b_ptr + _kb_ks[:, None] * _kb_sbk + _kb_rn[None, :] * _kb_sbn,\n"
        "                        mask=(_kb_ks[:, None] < _kb_K) & (_kb_rn[None, :] < _kb_N), other=0.0)\n"
        "        if _KB_IEEE:\n"
        "            _kb_acc = tl.dot(_kb_a, _kb_b, _kb_acc, input_precision=\"ieee\")\n"
        "        else:\n"
        "            _kb_acc = tl.dot(_kb_a, _kb_b, _kb_acc)\n"
        "    _kb_c = _kb_acc.to(_kb_a_ptr.dtype.element_ty)  # the product as torch returns it\n"
        f"    {plan.loaded} = {c}\n"
        f"{tail}"
        f"    tl.store({plan.out} + _kb_rm[:, None] * _kb_N + _kb_rn[None, :], {code(plan.value)},\n"
        "             mask=(_kb_rm[:, None] < _kb_M) & (_kb_rn[None, :] < _kb_N))\n")


_HELPER_SOURCE = f'''
def {_HELPER}(a, b, limit, dims=1):
    """Whether the fused kernel computes this product: two 2-D tensors of one floating dtype on one device,
    inner sizes matching, tensordot over one dimension, M x N x K within `limit`."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2
            and type(dims) is int and dims == 1 and a.dtype == b.dtype
            and a.dtype in (torch.float16, torch.bfloat16, torch.float32) and a.device == b.device
            and a.shape[1] == b.shape[0] and a.shape[0] * b.shape[1] > 0
            and a.shape[0] * b.shape[1] * a.shape[1] <= limit
            and triton.cdiv(b.shape[1], 64) <= 65535  # grid axis 1's limit
            and all((t.shape[0] - 1) * abs(t.stride(0)) + (t.shape[1] - 1) * abs(t.stride(1)) < 2**31 for t in (a, b))
            and a.shape[0] * b.shape[1] < 2**31)  # int32 offsets
'''


class _Fused(cst.CSTTransformer):
    def __init__(self, plan: _Plan, limit: int) -> None:
        self.plan, self.limit = plan, limit

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original is not self.plan.wrapper:
            return updated
        plan = self.plan
        body: list[cst.BaseStatement] = []
        for old, new in zip(original.body.body, updated.body.body, strict=True):
            if old is plan.product_statement:
                body += self._product()
            elif old is plan.launch_statement:
                body.append(self._launch(cst.ensure_type(new, cst.SimpleStatementLine)))
            else:
                assert isinstance(new, cst.BaseStatement)
                body.append(new)
        return updated.with_changes(body=updated.body.with_changes(body=body))

    def _product(self) -> list[cst.BaseStatement]:
        plan = self.plan
        a, b = (code(x) for x in plan.operands)
        dims = f", dims={code(plan.dims)}" if plan.dims is not None else ""
        value = simple_assign(plan.product_statement)[1]  # type: ignore[index]
        fallback = _with_operands(value, plan.operands)
        return [cst.parse_statement(f"_kb_a, _kb_b = {a}, {b}\n"),
                cst.parse_statement(f"_kb_fused = {_HELPER}(_kb_a, _kb_b, {self.limit}{dims})\n"),
                cst.parse_statement(
                    "if _kb_fused:  # the product is made by the fused kernel below: only its shape is read here\n"
                    f"    {plan.product} = torch.empty((_kb_a.shape[0], _kb_b.shape[1]), device=_kb_a.device, "
                    "dtype=_kb_a.dtype)\n"
                    "else:\n"
                    f"    {plan.product} = {code(fallback)}\n")]

    def _launch(self, launch: cst.SimpleStatementLine) -> cst.BaseStatement:
        plan = self.plan
        bound = launch_arguments(plan.kernel, plan.launch)
        scalars = "".join(f"{p}={code(v)}, " for p, v in plan.scalars.items())
        out = code(bound[plan.out].value)
        fused = cst.parse_statement(
            "if _kb_fused:\n"
            "    _kb_m, _kb_n, _kb_k = _kb_a.shape[0], _kb_b.shape[1], _kb_a.shape[1]\n"
            "    _kb_bm = min(64, max(16, triton.next_power_of_2(_kb_m)))\n"
            "    _kb_bn = min(64, max(16, triton.next_power_of_2(_kb_n)))\n"
            "    _kb_bk = min(32, max(16, triton.next_power_of_2(_kb_k)))\n"
            "    while triton.cdiv(_kb_m, _kb_bm) * triton.cdiv(_kb_n, _kb_bn) < 128 and max(_kb_bm, _kb_bn) > 16:\n"
            "        if _kb_bm >= _kb_bn:  # smaller tiles until the programs fill the SMs (FMA-bound small products)\n"
            "            _kb_bm //= 2\n"
            "        else:\n"
            "            _kb_bn //= 2\n"
            f"    {plan.fused_name}[(triton.cdiv(_kb_m, _kb_bm), triton.cdiv(_kb_n, _kb_bn))](\n"
            f"        _kb_a, _kb_b, {out}, _kb_m, _kb_n, _kb_k, _kb_a.stride(0), _kb_a.stride(1), _kb_b.stride(0),\n"
            f"        _kb_b.stride(1), {scalars}_KB_BM=_kb_bm, _KB_BN=_kb_bn, _KB_BK=_kb_bk,\n"
            "        _KB_IEEE=_kb_a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32)\n"
            "else:\n"
            "    pass\n")
        fused = cst.ensure_type(fused, cst.If)
        orelse = cst.ensure_type(fused.orelse, cst.Else)
        return fused.with_changes(orelse=orelse.with_changes(body=orelse.body.with_changes(body=[launch])))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = list(updated.body)
        at = next(i for i, s in enumerate(original.body) if s is self.plan.kernel)
        added = [*cst.parse_module(_fused_kernel(self.plan)).body, *cst.parse_module(_HELPER_SOURCE).body]
        blank = [cst.EmptyLine(), cst.EmptyLine()]
        added = [stmt.with_changes(leading_lines=blank) for stmt in added]
        return updated.with_changes(body=[*body[:at + 1], *added, *body[at + 1:]])


def _with_operands(value: cst.BaseExpression, operands: tuple[cst.BaseExpression, cst.BaseExpression]
                   ) -> cst.BaseExpression:
    """The product's expression with its operands replaced by `_kb_a` and `_kb_b` (evaluated once, before)."""
    a, b = cst.Name("_kb_a"), cst.Name("_kb_b")
    if isinstance(value, cst.BinaryOperation):
        return value.with_changes(left=a, right=b)
    call = cst.ensure_type(value, cst.Call)
    if isinstance(call.func, cst.Attribute) and call.func.value is operands[0]:
        return call.with_changes(func=call.func.with_changes(value=a), args=[call.args[0].with_changes(value=b)])
    args = list(call.args)
    args[0], args[1] = args[0].with_changes(value=a), args[1].with_changes(value=b)
    return call.with_changes(args=args)


@register("fuse-matmul-epilogue")
def fuse_matmul_epilogue(source: str, context: dict[str, Any]) -> list[Variant]:
    """The wrapper's matmul and the kernel's elementwise tail of it as one Triton GEMM below a size limit per
    variant (the module's docstring); [] where it does not apply."""
    if "tl.store" not in source or not any(p in source for p in ("matmul", "mm(", "tensordot", "@")):
        return []
    module = cst.parse_module(source)
    plan = _plan(module, context)
    if plan is None:
        return []
    return [Variant({"fused_up_to": f"{round(limit ** (1 / 3))}^3"}, with_torch(module.visit(_Fused(plan, limit))).code)
            for limit in LIMITS]
