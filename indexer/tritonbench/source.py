"""The T half of a TritonBench checkout, read as records: its PyTorch operators, their perf sweeps, and
the drafts each model wrote for them.

Only three places of the tree are read (the G half is held out for evaluation and never opened):

    data/TritonBench_T_v1/<op>.py                          reference function, a line of '#', test function
    performance_metrics/perf_T/golden_metrics/<op>_perf.py a Performance_Metrics subclass: sweep, GB/s, TFLOP/s
    LLM_generated/Bench_T_{general_purpose,coder_specific}/<model>.jsonl
                                                           one record per operator: prompt, `predict`

A record names no operator: its prompt's "Wrapper Entry Information: NAME(" does (`linalg.svd` for
`svd`; the last dotted part is the operator). Two prompts name none (TritonBench's `mean` and
`solve`): their drafts are listed as unmatched, never guessed from the record's position.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserFacingError

__all__ = ["DATA", "DRAFTS", "PERF", "Draft", "Operator", "TritonBenchT", "model_order"]

DATA = Path("data/TritonBench_T_v1")
PERF = Path("performance_metrics/perf_T/golden_metrics")
DRAFTS = (Path("LLM_generated/Bench_T_general_purpose"), Path("LLM_generated/Bench_T_coder_specific"))

_SEPARATOR = re.compile(r"^#{20,}\s*$", re.MULTILINE)
_WRAPPER = re.compile(r"Wrapper Entry Information:\s*(?:def\s+)?([A-Za-z_][\w.]*)\s*\(")


@dataclass(frozen=True)
class Operator:
    """One TritonBench-T operator: its PyTorch reference, its test, its perf script."""

    name: str  # the data file's stem
    reference_name: str  # the reference function's name (quantize_dynamic's is dynamic_custom)
    reference_source: str  # the data file above its separator line
    test_source: str  # below it
    perf_source: str | None
    data_file: Path
    perf_file: Path | None


@dataclass(frozen=True)
class Draft:
    """One model's answer for one operator's prompt."""

    model: str  # the jsonl file's stem ("output_gpt-4o", "qwen_full_rag")
    file: Path  # relative to the checkout
    record: int  # 0-based line of the file
    operator: str | None  # None: the prompt names no wrapper, or one that is no T operator
    wrapper: str | None  # the wrapper the prompt asks for (its last dotted part)
    predict: str


def model_order(models: list[str]) -> list[str]:
    """The fixed order drafts are tried in: a first draft from the prompt alone before one written with
    retrieved examples (no `_rag`), general-purpose models before coder-specific ones (`output_`
    files), then by name. Documented in docs/tritonbench.md; `--models` overrides it."""
    return sorted(models, key=lambda m: ("rag" in m.split("_"), not m.startswith("output_"), m.lower()))


class TritonBenchT:
    """A TritonBench checkout (a work tree): its T operators and drafts."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        missing = [str(p) for p in (DATA, PERF) if not (self.root / p).is_dir()]
        if missing:
            raise UserFacingError(f"{root} is not a TritonBench checkout: it lacks {', '.join(missing)}",
                                  "pass the root of a clone of thunlp/TritonBench")

    def operators(self) -> dict[str, Operator]:
        out = {}
        for path in sorted((self.root / DATA).glob("*.py")):
            perf = self.root / PERF / f"{path.stem}_perf.py"
            out[path.stem] = _operator(path, perf if perf.is_file() else None)
        return out

    def models(self) -> list[str]:
        """Every draft file's stem, in `model_order`."""
        return model_order([p.stem for d in DRAFTS for p in (self.root / d).glob("*.jsonl")])

    def drafts(self, model: str, operators: set[str]) -> list[Draft]:
        files = [self.root / d / f"{model}.jsonl" for d in DRAFTS if (self.root / d / f"{model}.jsonl").is_file()]
        if not files:
            raise UserFacingError(f"no draft file {model}.jsonl under {' or '.join(map(str, DRAFTS))}",
                                  f"pick models among: {', '.join(self.models())}")
        out = []
        for i, line in enumerate(files[0].read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise UserFacingError(f"{files[0]} line {i + 1} is not JSON: {exc}", "restore the file from the clone") from exc
            prompt = str(record.get("instruction") or record.get("prompt") or "")
            match = _WRAPPER.search(prompt)
            wrapper = match.group(1).split(".")[-1] if match else None
            out.append(Draft(model, files[0].relative_to(self.root), i, wrapper if wrapper in operators else None,
                             wrapper, str(record.get("predict") or "")))
        return out


def _operator(path: Path, perf: Path | None) -> Operator:
    text = path.read_text(encoding="utf-8")
    parts = _SEPARATOR.split(text, maxsplit=1)
    if len(parts) != 2:
        raise UserFacingError(f"{path}: no line of '#' between the reference and its test",
                              "is this a TritonBench-T data file?")
    reference, test = parts
    try:
        functions = [n.name for n in ast.parse(reference).body if isinstance(n, ast.FunctionDef)]
    except SyntaxError as exc:
        raise UserFacingError(f"{path}: the reference does not parse: {exc}", "restore the file from the clone") from exc
    if not functions:
        raise UserFacingError(f"{path}: no reference function above the separator", "is this a TritonBench-T data file?")
    name = path.stem if path.stem in functions else functions[-1]
    return Operator(path.stem, name, reference, test, perf.read_text(encoding="utf-8") if perf else None, path, perf)
