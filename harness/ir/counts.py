"""Ops counted per stage language: MLIR op names, LLVM IR instructions (with vector width), PTX mnemonics."""

from __future__ import annotations

import re
from collections import Counter

from harness.ir.mlir import op_counts, op_target

# %5 = load <4 x float>, ptr addrspace(1) %4, align 16      store <4 x float> %9, ptr addrspace(1) %8
# %12 = call float @llvm.nvvm.ex2.approx.f(float %11)
# %20 = tail call { i32, i32 } asm sideeffect "mov.u32 $0, 0x0;\0A\09@$3 ld.global.v2.b32 { $0, $1 }, [ $2 + 0 ];", ...
_LLVM_INST = re.compile(r"^\s*(?:%[\w.]+\s*=\s*)?(?:(?:tail|musttail|notail) )?(?P<inst>load|store|call|fmul|fadd|"
                        r"fdiv|atomicrmw|cmpxchg|getelementptr|shufflevector|extractelement|insertelement)\b"
                        r"(?P<rest>.*)$")
_LLVM_VEC = re.compile(r"<(?P<n>\d+) x (?P<t>\w+)>")
_LLVM_CALLEE = re.compile(r"@(?P<callee>[\w.$]+)\(")
_PTX_INST = re.compile(r"^\s*(?:@!?%p\w*\s+)?(?P<inst>[a-z][\w.]*)\s")


def stage_op_counts(text: str, lang: str) -> Counter[str]:
    """Op counts comparable along a pipeline: MLIR ops, LLVM instructions (with vector width and
    callee, e.g. `load <4 x float>`, `call @llvm.nvvm.ex2.approx.f`), PTX mnemonics (`ld.global.v4.b32`)."""
    if lang == "mlir":
        return op_counts(text)
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if lang == "llvm":
            m = _LLVM_INST.match(line)
            if m is None:
                continue
            inst, rest = m["inst"], m["rest"]
            if inst == "call":
                callee = _LLVM_CALLEE.search(rest)
                if callee:
                    counts[f"call @{callee['callee']}"] += 1
                elif " asm " in rest:  # call void asm sideeffect "@$2 st.global.v4.b32 ...", "..."(...)
                    counts[f"call asm({op_target('llvm.inline_asm', rest)})"] += 1
                else:
                    counts["call"] += 1
            elif inst in ("load", "store") and (vec := _LLVM_VEC.search(rest)):
                counts[f"{inst} <{vec['n']} x {vec['t']}>"] += 1
            else:
                counts[inst] += 1
        elif lang == "ptx":
            m = _PTX_INST.match(line)
            if m and not line.lstrip().startswith((".", "//", "$")):
                counts[m["inst"]] += 1
    return counts
