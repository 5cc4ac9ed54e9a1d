"""SASS: the machine code ptxas made of the PTX, as `cuobjdump -sass` prints it through Triton's own
`triton.tools.disasm.get_sass`. It is read only for what PTX leaves to ptxas: the memory barriers and
cache invalidations an ordered atomic or a fence becomes."""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["has_memory_ordering", "sass_opcode_counts"]

# Instruction lines, after get_sass's control-code column (wait mask : read : write : yield : stall):
# 32:1:2:-:4	ATOMG.E.ADD.F32x4.FTZ.RN.STRONG.GPU PT, RZ, desc[UR8][R2.64], R4 ;
# --:-:-:-:1	@P0 MEMBAR.ALL.GPU ;
# and raw cuobjdump lines:   /*0110*/                   CCTL.IVALL ;
_SASS_INSTRUCTION = re.compile(
    r"^(?:[-0-9a-fY:]+\t|\s*/\*[0-9a-f]{4,}\*/\s+)(?:@!?U?P[T\d]+\s+)?(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)",
    re.MULTILINE,
)
# PTX whose lowering PTX itself does not show: ordered atomics and loads/stores, fences, membar.
# 	@%p1 atom.global.gpu.acq_rel.add.f32 %r1, [ %rd11 + 0 ], %r2;
# 	fence.acq_rel.gpu;
_PTX_ORDERING = re.compile(
    r"^\s*(?:@!?%p\w*\s+)?(?:(?:atom|red|ld|st)\.[\w.]*?\.(?:acq_rel|acquire|release|sc)\b|fence\.|membar\.)",
    re.MULTILINE,
)


def has_memory_ordering(ptx: str) -> bool:
    """Whether the PTX has ordered memory operations or fences, whose cost only SASS shows."""
    return _PTX_ORDERING.search(ptx) is not None


def sass_opcode_counts(sass: str) -> Counter[str]:
    """Instructions by full opcode (`MEMBAR.ALL.GPU`, `ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU`)."""
    return Counter(m["op"] for m in _SASS_INSTRUCTION.finditer(sass))
