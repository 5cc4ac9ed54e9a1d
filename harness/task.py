"""Tasks: what to run, as a small Python module.

A task file defines:

    entry      the launch wrapper (a callable that launches the Triton kernel)
    inputs     a callable: inputs(**case) -> tuple of positional arguments for `entry`
    cases      a list of dicts, each one case (shapes, dtypes, ...); at least one
    reference  optional PyTorch callable with the same signature (default: the task's own entry)
    tolerances optional dict, e.g. {"atol": 1e-5, "rtol": 1e-5}

The kernel may be defined in the task file or imported from a sibling module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.artifacts import Artifacts
from harness.capture import capture_callable, load_kernel_module
from harness.errors import UserFacingError

__all__ = ["Task", "capture_task", "load_task"]


@dataclass
class Task:
    name: str
    entry: Callable[..., Any]
    inputs: Callable[..., tuple[Any, ...]]
    cases: list[dict[str, Any]]
    reference: Callable[..., Any] | None = None
    tolerances: dict[str, float] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)


def load_task(path: str | os.PathLike[str]) -> Task:
    module = load_kernel_module(path)
    ns = vars(module)
    missing = [name for name in ("entry", "inputs", "cases") if name not in ns]
    if missing:
        raise UserFacingError(f"task file {path} lacks {', '.join(missing)}",
                              "define entry (launch wrapper), inputs(**case) and cases (list of dicts)")
    if not callable(ns["entry"]) or not callable(ns["inputs"]):
        raise UserFacingError(f"task file {path}: entry and inputs must be callables", "see harness/task.py")
    cases = ns["cases"]
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) for c in cases):
        raise UserFacingError(f"task file {path}: cases must be a non-empty list of dicts", "e.g. cases = [dict(n=4096)]")
    return Task(
        name=os.path.splitext(os.path.basename(str(path)))[0],
        entry=ns["entry"],
        inputs=ns["inputs"],
        cases=cases,
        reference=ns.get("reference"),
        tolerances=dict(ns.get("tolerances", {})),
        namespace=ns,
    )


def capture_task(path: str | os.PathLike[str], case: int = 0, target: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> list[Artifacts]:
    """Compile the launches of one case of a task (the first by default)."""
    task = load_task(path)
    if not 0 <= case < len(task.cases):
        raise UserFacingError(f"task {task.name} has {len(task.cases)} cases, not {case + 1}", "pick a valid case")
    params = task.cases[case]
    return capture_callable(lambda ns: task.entry(*task.inputs(**params)), task.namespace, target, cache_dir,
                            what=f"task {task.name} case {params}")
