"""Wrapper overhead: host work around the launches that the result does not need.

A host-bound kernel (the time flat across sizes, or the device idle for most of each call) pays for
what its Python wrapper does between launches (a launch-bound one, whose kernel itself takes a few
microseconds, is persistent-kernel's). Two removals need no knowledge of the kernel's values:

- `syncs-and-logging`: `torch.cuda.synchronize()` (the stream already orders the launches; the caller
  synchronizes when it reads the result), and `print(...)` / `logging.*(...)` / `logger.*(...)` /
  `warnings.warn(...)` statements;
- `empty-outputs`: an output made with `torch.zeros` / `zeros_like` / `.new_zeros` and handed to a
  kernel launch is made with the `empty` counterpart: one fill kernel (a launch and a pass over the
  output's bytes) less. Only where the module has no atomics (which accumulate into the zeros); the
  judge's poisoned allocations reject the variant if the kernel leaves any element unwritten.

Only functions outside @triton.jit are touched; a statement that is the only one in its block becomes
`pass`.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from diagnose.rewriters.base import InJit, Variant, dotted, register
from diagnose.rewriters.launch import jit_names

__all__ = ["trim_wrapper_overhead"]

_LOGGING_PREFIXES = ("logging.", "logger.", "log.", "LOGGER.", "_logger.")
_ZEROS = {"torch.zeros": "torch.empty", "torch.zeros_like": "torch.empty_like"}


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


def _launch_arguments(module: cst.Module) -> set[str]:
    """Names passed (positionally or by keyword) to `kernel[grid](...)` launches of the module's kernels."""
    kernels = jit_names(module)
    names = set()
    for call in m.findall(module, m.Call(func=m.Subscript())):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Subscript)
        if dotted(call.func.value) in kernels:
            names |= {a.value.value for a in call.args if isinstance(a.value, cst.Name)}
    return names


def trim_wrapper_overhead(source: str, context: dict[str, Any]) -> list[Variant]:
    module = cst.parse_module(source)
    variants = []
    dropper = _DropOverhead()
    trimmed = module.visit(dropper)
    if dropper.dropped:
        variants.append(Variant({"removed": "syncs-and-logging", "statements": dropper.dropped}, trimmed.code))
    if not m.findall(module, m.Call(func=m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v.startswith("atomic_")))))):
        emptier = _EmptyOutputs(_launch_arguments(module))
        emptied = module.visit(emptier)
        if emptier.changed:
            variants.append(Variant({"removed": "empty-outputs", "allocations": emptier.changed}, emptied.code))
    return variants


register("trim-wrapper-overhead")(trim_wrapper_overhead)
