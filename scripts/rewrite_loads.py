"""What a rewrite does to a kernel's global memory instructions and registers, compiled for sm90 on this
machine (no GPU needed: Triton compiles and ptxas runs at compile time): the kernel module as written
and each variant of a pattern's rewrite, at one call.

    PYTHONPATH=. python scripts/rewrite_loads.py PATTERN MODULE CALL
    PYTHONPATH=. python scripts/rewrite_loads.py contiguous-innermost-axis tests/fixtures/wild/column_gather.py \\
        "col_sum(torch.randn(4096, 4096))"

Prints a Markdown table: registers, spill stores (bytes), the PTX global loads, stores and atomics counted
by instruction (`ld.global.v4.b32` x 4: four 16-byte vector loads in the program's code), and, where the
PTX orders memory (an acq_rel atomic, a fence), the memory barriers and L1 invalidations in its SASS.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from pathlib import Path

from diagnose.rewriters import rewrite
from harness import ir
from harness.capture import capture_call

_ACCESS = re.compile(r"\b(?:ld|st|atom|red)\.global(?:\.\w+)*")


def _row(module: Path, call: str) -> str:
    compiled = capture_call(module, call, target="cuda:90")[0]
    accesses = Counter(_ACCESS.findall(compiled.stages["ptx"]))
    listed = ", ".join(f"`{a}` x {n}" for a, n in sorted(accesses.items()))
    sass = ir.sass_opcode_counts(compiled.stages.get("sass", ""))
    fences = ", ".join(f"`{op}` x {n}" for op, n in sorted(sass.items()) if op.startswith(("MEMBAR", "CCTL", "ATOMG",
                                                                                              "REDG")))
    return f"{compiled.ptxas.registers} | {compiled.ptxas.spill_stores} | {listed} | {fences or '(no ordered PTX)'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pattern", help="a catalog pattern id with a rewriter")
    parser.add_argument("module", type=Path, help="the kernel module (kernel and launch wrapper)")
    parser.add_argument("call", help="an expression that launches it, e.g. \"col_sum(torch.randn(4096, 4096))\"")
    args = parser.parse_args()
    variants = rewrite(args.pattern, args.module.read_text(), {})
    if not variants:
        raise SystemExit(f"error: {args.pattern} does not apply to {args.module}; try a module its rewriter reads")
    print("| kernel | registers | spill stores (B) | global loads, stores, atomics | SASS barriers, atomics |")
    print("|---|---|---|---|---|")
    print(f"| as written | {_row(args.module, args.call)} |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            path = Path(tmp) / args.module.name  # the wrapper may import the module by its own name
            path.write_text(variant.source)
            shown = ", ".join(f"{k}={v}" for k, v in variant.params.items() if k not in ("kernel",))
            print(f"| {shown} | {_row(path, args.call)} |", flush=True)


if __name__ == "__main__":
    main()
