"""Wrapper overhead: host work around the launches that the result does not need.

A host-bound kernel (the time flat across sizes, or the device idle for most of each call) pays for
what its Python wrapper does between launches (a launch-bound one, whose kernel itself takes a few
microseconds, is persistent-kernel's). The worst of it is a wait: a call that makes the host wait for
the device drains the stream, so the next launch's host latency is paid with the device idle, on every
call. `host_waits` finds them (L1's `host.sync` reports what it finds, so what L1 reports is what this
rewrite sees). Three removals need no knowledge of the kernel's values:

- `host-waits`: `torch.cuda.synchronize()` is dropped (the stream already orders the launches; the
  caller synchronizes when it reads the result), and so are `print(...)` / `logging.*(...)` /
  `logger.*(...)` / `warnings.warn(...)` statements; a scalar uploaded per call,
  `torch.tensor(x, dtype=D, device=V)`, is made on the device by a fill, `torch.full((), x, dtype=D,
  device=V)`: the same 0-d tensor, without a copy from pageable host memory, which PyTorch makes
  synchronous (TritonBench-T's first drafts upload `alpha` this way before every launch);
- `empty-outputs`: an output made with `torch.zeros` / `zeros_like` / `.new_zeros` and handed to a
  kernel launch is made with the `empty` counterpart: one fill kernel (a launch and a pass over the
  output's bytes) less. Only where the module has no atomics (which accumulate into the zeros) and its
  kernels store whatever the data (no early return, no store under an `if` or in a `while`, no store
  mask computed from loaded values): the judge's poisoned allocations reject a variant whose kernel
  leaves an element unwritten on the test's inputs, not on inputs that take another branch;
- both at once, where both apply.

Waits with no value-free fix (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`: the host reads what the
device computed) are reported, not changed. Only functions outside @triton.jit are touched; a statement
that is the only one in its block becomes `pass`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.aliasing import aliased_kernels, loads_what_it_stores
from diagnose.rewriters.base import InJit, Variant, dotted, is_jit, jit_functions, mask_argument, register
from diagnose.rewriters.blocks import names_in, number
from diagnose.rewriters.hints import reaching
from diagnose.rewriters.launch import jit_names

__all__ = ["HostWait", "host_waits", "trim_wrapper_overhead"]

_LOGGING_PREFIXES = ("logging.", "logger.", "log.", "LOGGER.", "_logger.")
_ZEROS = {"torch.zeros": "torch.empty", "torch.zeros_like": "torch.empty_like"}
# Methods that copy a tensor's values to the host: a wait whenever the tensor is on the device.
_READS_BACK = ("item", "tolist", "cpu", "numpy")
# A value torch.full infers the dtype of as torch.tensor does, when the call names no dtype.
_NUMBER = m.Integer() | m.Float() | m.Imaginary() | m.Name("True") | m.Name("False") \
    | m.UnaryOperation(operator=m.Minus(), expression=m.Integer() | m.Float())
# What torch.tensor takes that torch.full does not, or takes as the data it cannot fill with.
_COLLECTIONS = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.Dict, cst.Set, cst.SetComp, cst.DictComp)


@dataclass(frozen=True)
class HostWait:
    """A call in the wrapper that makes the host wait for the device."""

    line: int
    what: str  # "torch.cuda.synchronize()", "torch.tensor(..., device=)", ".item()", ...
    removable: bool  # whether trim-wrapper-overhead takes it out or makes it without the wait


def _scalar_upload(call: cst.Call) -> bool:
    """`torch.tensor(x, dtype=D, device=V)` of one value: the same tensor as `torch.full((), x, dtype=D,
    device=V)`. A dtype must be named unless x is a number literal, since torch.tensor keeps a NumPy
    scalar's dtype where torch.full takes the default; a value that is not one number (a list in a
    variable, a tensor of several elements) makes torch.full raise, which the judge rejects."""
    if dotted(call.func) != "torch.tensor" or not call.args or call.args[0].keyword is not None or call.args[0].star:
        return False
    keywords = {a.keyword.value for a in call.args[1:] if a.keyword is not None}
    if len(call.args) - 1 != len(keywords) or "device" not in keywords:
        return False  # a second positional argument is not torch.tensor's; no device: no upload
    value = call.args[0].value
    dtype = next((dotted(a.value) for a in call.args[1:] if a.keyword is not None and a.keyword.value == "dtype"), None)
    return not isinstance(value, _COLLECTIONS) and ("dtype" in keywords or m.matches(value, _NUMBER)) \
        and _fits(value, dtype)


# The largest magnitude each narrow dtype holds: torch.full raises past it where torch.tensor gives inf.
_LIMITS = {"torch.float16": 65504.0, "torch.half": 65504.0, "torch.bfloat16": 3.3895e38,
           "torch.float32": 3.4028234663852886e38, "torch.float": 3.4028234663852886e38,
           "torch.int8": 127, "torch.uint8": 255, "torch.int16": 32767, "torch.short": 32767,
           "torch.int32": 2**31 - 1, "torch.int": 2**31 - 1}


def _fits(value: cst.BaseExpression, dtype: str | None) -> bool:
    """Whether torch.full makes the tensor torch.tensor made: a literal within the dtype's range (1e40 in
    fp32 is inf from torch.tensor, an error from torch.full), or a value whose dtype is not a narrow one."""
    limit = _LIMITS.get(dtype or "")
    if limit is None:
        return True
    literal = number(value)
    if literal is None:
        return dtype not in ("torch.float16", "torch.half", "torch.int8", "torch.uint8", "torch.int16", "torch.short")
    return abs(literal) <= limit and not (dtype == "torch.uint8" and literal < 0)


def _upload(call: cst.Call) -> bool:
    return dotted(call.func) == "torch.tensor" and any(
        a.keyword is not None and a.keyword.value == "device" for a in call.args)


def _is_overhead(statement: cst.BaseSmallStatement) -> bool:
    if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
        return False
    name = dotted(statement.value.func)
    return (name in ("torch.cuda.synchronize", "print", "warnings.warn")
            or name.startswith(_LOGGING_PREFIXES))


class _DropOverhead(InJit):  # InJit.depth: inside a @triton.jit function, where nothing is touched
    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        if self.depth:
            return updated
        kept = [s for s in updated.body if not _is_overhead(s)]
        if len(kept) == len(updated.body):
            return updated
        self.dropped += len(updated.body) - len(kept)
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == len(kept) - 1 else s
                                          for i, s in enumerate(kept)])

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        if not updated.body:  # every statement of the block was overhead
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated


class _EmptyOutputs(InJit):
    """`out = torch.zeros(...)` -> `torch.empty(...)` for names a kernel launch receives."""

    def __init__(self, launched: set[str]) -> None:
        super().__init__()
        self.launched = launched

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if self.depth or len(updated.targets) != 1 or not isinstance(updated.targets[0].target, cst.Name) \
                or updated.targets[0].target.value not in self.launched or not isinstance(updated.value, cst.Call):
            return updated
        call = updated.value
        name = dotted(call.func)
        if name in _ZEROS:
            self.changed += 1
            return updated.with_changes(value=call.with_changes(func=cst.parse_expression(_ZEROS[name])))
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "new_zeros":
            self.changed += 1
            return updated.with_changes(value=call.with_changes(func=call.func.with_changes(attr=cst.Name("new_empty"))))
        return updated


class _FillScalars(InJit):
    """`torch.tensor(x, dtype=D, device=V)` -> `torch.full((), x, dtype=D, device=V)` outside kernels."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.depth or not _scalar_upload(original):
            return updated
        self.changed += 1
        empty_shape = cst.Arg(cst.Tuple([]), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(func=cst.parse_expression("torch.full"), args=[empty_shape, *updated.args])


class _Waits(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self) -> None:
        self.depth = 0
        self.found: list[HostWait] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += is_jit(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth -= is_jit(node)

    def visit_Call(self, node: cst.Call) -> None:
        if self.depth:
            return
        name = dotted(node.func)
        if name == "torch.cuda.synchronize":
            wait = HostWait(0, "torch.cuda.synchronize()", True)
        elif _upload(node):
            wait = HostWait(0, "torch.tensor(..., device=)", _scalar_upload(node))
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in _READS_BACK and not node.args:
            wait = HostWait(0, f".{node.func.attr.value}()", False)
        else:
            return
        line = self.get_metadata(cst.metadata.PositionProvider, node).start.line
        self.found.append(HostWait(line, wait.what, wait.removable))


def host_waits(source: str) -> list[HostWait]:
    """The calls outside @triton.jit functions that make the host wait for the device, in source order:
    syncs, uploads of host values (`torch.tensor(..., device=)`), and reads of device values
    (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`; these wait only when the tensor is on the device,
    which the source does not say). [] for a source that does not parse."""
    try:
        wrapper = cst.metadata.MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return []
    visitor = _Waits()
    wrapper.visit(visitor)
    return visitor.found


def _launch_arguments(module: cst.Module) -> set[str]:
    """Names passed (positionally or by keyword) to `kernel[grid](...)` launches of the module's kernels."""
    kernels = jit_names(module)
    names = set()
    for call in m.findall(module, m.Call(func=m.Subscript())):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Subscript)
        if dotted(call.func.value) in kernels:
            names |= {a.value.value for a in call.args if isinstance(a.value, cst.Name)}
    return names


def _stores_unconditionally(module: cst.Module) -> bool:
    """Whether every kernel of the module writes what it writes whatever the data: no early `return`, no
    store under an `if` or in a `while`, no store mask computed from loaded values (nor, in a jit helper,
    from its parameters, which its caller may have loaded). Only then does an
    output the judge saw written whole stay written whole for every input: Liger's cross entropy skips
    the rows whose target is ignore_index (`if y == ignore_index: return`) and leaves their zeros for the
    wrapper's sum, which random test targets never exercise. Nor may a kernel read an output it
    stores (`out = load(out) + x`, or the output passed again as an input): it reads the zeros."""
    store = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("store")))
    kernels = jit_functions(module)
    # a jit function another one calls: its parameters are its caller's values, loaded ones perhaps
    called = {dotted(cst.ensure_type(c, cst.Call).func) for fn in kernels.values() for c in m.findall(fn.body, m.Call())}
    if aliased_kernels(module):
        return False  # the output handed in again as an input: it reads the zeros an empty output would not hold
    for name, fn in kernels.items():
        if loads_what_it_stores(fn):
            return False  # `out = load(out) + x`: the same reading of its zeros
        passed = {p.name.value for p in fn.params.params} if name in called else set()
        branches = m.findall(fn, m.If() | m.While() | m.For())
        last = fn.body.body[-1] if fn.body.body else None
        early = any(m.findall(b, m.Return()) for b in branches) or any(
            m.findall(st, m.Return()) for st in fn.body.body if st is not last)  # a helper's final return is fine
        if early or any(m.findall(block, store) for block in m.findall(fn, m.If() | m.While())):
            return False
        for call in m.findall(fn, store):
            at = mask_argument(cst.ensure_type(call, cst.Call))
            mask = cst.ensure_type(call, cst.Call).args[at].value if at is not None else None
            if mask is None:
                continue
            values = reaching(fn, [mask])
            if any(m.findall(e, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")))) for e in values) \
                    or any(names_in(e) & passed for e in values):
                return False
    return True


def trim_wrapper_overhead(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    variants = []
    dropper, filler = _DropOverhead(), _FillScalars()
    waitless = module.visit(dropper).visit(filler)
    waits = {"statements": dropper.dropped, "uploads": filler.changed}
    if dropper.dropped or filler.changed:
        variants.append(Variant({"removed": "host-waits", **waits}, waitless.code))
    if not m.findall(module, m.Call(func=m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v.startswith("atomic_")))))) \
            and _stores_unconditionally(module):
        emptier = _EmptyOutputs(_launch_arguments(module))
        emptied = module.visit(emptier)
        if emptier.changed:
            variants.append(Variant({"removed": "empty-outputs", "allocations": emptier.changed}, emptied.code))
            if variants[0].params["removed"] == "host-waits":
                both = waitless.visit(_EmptyOutputs(_launch_arguments(waitless)))
                variants.append(Variant({"removed": "host-waits+empty-outputs", **waits,
                                         "allocations": emptier.changed}, both.code))
    return variants


register("trim-wrapper-overhead")(trim_wrapper_overhead)
