"""Measure an operator's cases module, in a process of its own: `python -m indexer.tritonbench.probe DIR OP`.

It runs TritonBench's own input code (never a draft), so a perf script that needs a GPU, hangs or
crashes costs that operator only. Input sets are made on torch's meta device where the code allows
(shapes, bytes and flops need no data), else on the CPU. Prints a `CasesProbe` as JSON.
"""

from __future__ import annotations

import ast
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from indexer.tritonbench.taskgen import CasesProbe, describe_shapes, timed_indices

__all__ = ["probe"]

_RUNTIME_MS = 1000.0  # get_gbps(x, 1000 ms) * 1e9 is the bytes the formula counts; likewise TFLOP/s


def probe(directory: Path, op: str) -> CasesProbe:
    import itertools

    import torch

    sys.path.insert(0, str(directory))
    cases = __import__(f"{op}_cases")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sweep = _static_length(directory / f"{op}_cases.py")
    if sweep is None:
        sweep = _made(lambda: sum(1 for _ in cases.PerfMetrics().sweep()), torch, device)
    if sweep is None:
        raise RuntimeError("its perf sweep can be counted only on a GPU (the meta device lacks an op it uses)")
    result = CasesProbe(sweep=sweep)
    for index in timed_indices(sweep):
        x = _made(lambda i=index: next(itertools.islice(cases.PerfMetrics().sweep(), i, None)), torch, device)
        if x is None:
            result.sizes[index] = "?"
            continue
        result.sizes[index] = describe_shapes(x)
        metrics = cases.PerfMetrics()
        for attr, scale, table in (("get_gbps", 1e9, result.bytes), ("get_tflops", 1e12, result.flops)):
            with contextlib.suppress(Exception):  # a formula that reads values, not shapes: no figure
                table[index] = float(getattr(metrics, attr)(x, _RUNTIME_MS)) * scale
    with torch.device(device):
        result.tests = len(cases.heldout_calls())
        result.tests_dropped = len(cases.test_calls()) - result.tests
    return result


def _static_length(path: Path) -> int | None:
    """len(range(a, b, c)) of a sweep that is one `for` over literal range bounds yielding once."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    sweep = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "PerfMetrics"
                  for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "sweep"), None)
    loops = [n for n in ast.walk(sweep) if isinstance(n, (ast.For, ast.While))] if sweep else []
    yields = [n for n in ast.walk(sweep) if isinstance(n, ast.Yield)] if sweep else []
    if len(loops) != 1 or len(yields) != 1 or not isinstance(loops[0], ast.For):
        return None
    try:
        bounds = ast.literal_eval(ast.unparse(loops[0].iter).removeprefix("range"))
    except (ValueError, SyntaxError):
        return None
    bounds = bounds if isinstance(bounds, tuple) else (bounds,)
    return len(range(*bounds)) if ast.unparse(loops[0].iter).startswith("range(") else None


def _made(make: Any, torch: Any, device: str) -> Any:
    """`make()` on the meta device (shapes only), else on a GPU; None when only the CPU is left: the
    largest sets are gigabytes, not for the machine that imports to materialise."""
    for where in ("meta", device):
        if where == "cpu":
            return None
        try:
            with torch.device(where):
                return make()
        except Exception:  # noqa: BLE001 - meta lacks an op the code uses
            continue
    return None


def main(argv: list[str]) -> int:
    directory, op = Path(argv[1]), argv[2]
    with contextlib.redirect_stdout(sys.stderr):  # tests print; stdout carries the result only
        result = probe(directory, op)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
