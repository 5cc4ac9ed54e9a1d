"""A draft's code, out of a model's answer, screened before the sandbox sees it.

Answers come as raw modules or as prose with fenced blocks (several, split between kernel and
wrapper). What can be told from the text alone is told here, with a reason a person can act on: it
does not parse, it defines no wrapper of the asked name, it has no Triton kernel (a PyTorch-only
draft), its wrapper is itself a kernel. What runs is the sandbox's to judge.

Drafts often run a demo at import (`x = torch.randn(..., device="cuda"); print(add(x, x))`): module
statements that call something are dropped, so the module defines its kernels and wrapper and does
nothing else; how many were dropped is recorded in the task.
"""

from __future__ import annotations

import ast
import enum
import re
from dataclasses import dataclass

from harness.answers import answer_module

__all__ = ["Failure", "Screened", "extract_code", "screen"]



class Failure(enum.Enum):
    """Why a draft is not the operator's first draft: from its text (here), or from the judge (importer)."""

    NO_CODE = "no code"
    SYNTAX = "does not parse"
    NO_WRAPPER = "no wrapper of the asked name"
    TORCH_ONLY = "PyTorch only (no Triton kernel)"
    WRAPPER_IS_KERNEL = "the wrapper is a @triton.jit kernel"
    IMPORT = "does not import"
    COMPILE = "compile error"
    WRONG_VALUES = "wrong values"
    TORCH_FALLBACK = "torch fallback at runtime"
    HANG = "hang or timeout"
    CRASH = "crash"
    RAISED = "raised at runtime"
    OTHER = "other"
    # The check itself could not judge the draft: the reference failed on the operator's inputs, the
    # judge cannot hand those inputs over, the task's formula failed. No draft keeps this as its verdict
    # (it is judged again on the next run); once two drafts meet it, the operator is set aside.
    CHECK = "the check could not judge it"
    # The device's memory ran out: beside other checks that is the neighbours' doing, and the draft is
    # judged again alone; alone, it is this device's verdict on the draft (kept, with the reason saying so).
    DEVICE_MEMORY = "the device ran out of memory"


@dataclass(frozen=True)
class Screened:
    code: str  # the module as it will be judged ("" when refused)
    wrapper: str | None  # the function that is the task's entry
    problem: str | None  # why it is refused before running (None: it goes to the sandbox)
    failure: Failure | None = None  # the problem's class
    dropped: int = 0  # module statements dropped (demos run at import)
    added_imports: tuple[str, ...] = ()  # standard imports the draft uses without making


def extract_code(predict: str) -> str:
    """The module in an answer (harness.answers: the python fences joined when they parse together,
    else the largest one that parses, else the answer as it is)."""
    return answer_module(predict)


def screen(code: str, wrappers: list[str]) -> Screened:
    """`code` checked for a wrapper named one of `wrappers` (in preference order) and a Triton kernel."""
    if not code.strip():
        return Screened("", None, "the answer has no code", Failure.NO_CODE)
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        if not re.search(r"^\s*(def|import|from|class|@)\b", code, re.MULTILINE):
            return Screened("", None, "the answer has no code", Failure.NO_CODE)  # prose: a refusal or an explanation
        return Screened("", None, f"does not parse: line {exc.lineno}: {exc.msg}", Failure.SYNTAX)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    wrapper = next((w for w in wrappers if w in functions), None)
    if wrapper is None:
        return Screened("", None, f"defines no function {' or '.join(dict.fromkeys(wrappers))}", Failure.NO_WRAPPER)
    if not any(_is_kernel(f) for f in functions.values()):
        return Screened("", wrapper, "no @triton.jit kernel: a PyTorch-only draft", Failure.TORCH_ONLY)
    if _is_kernel(functions[wrapper]):
        return Screened("", wrapper, f"the wrapper {wrapper} is itself a @triton.jit kernel: Python cannot call it",
                        Failure.WRAPPER_IS_KERNEL)
    dropped = [n for n in tree.body if _runs_something(n, set(functions))]
    lines = code.splitlines(keepends=True)
    for node in dropped:  # by line span, so the draft's comments and layout stay as written
        for i in range(node.lineno - 1, node.end_lineno or node.lineno):
            lines[i] = ""
    added = _missing_imports(tree)
    body = "".join(added) + "".join(lines)
    return Screened(body if body.endswith("\n") else body + "\n", wrapper, None, None, len(dropped),
                    tuple(line.strip() for line in added))


# Names drafts use without importing them (in code or in annotations, which run at import): answers
# often leave the header out (a model answering "the kernel and its wrapper"). These imports are added.
_STANDARD = {"math": "import math\n", "torch": "import torch\n", "triton": "import triton\n",
             "tl": "import triton.language as tl\n", "F": "import torch.nn.functional as F\n",
             "nn": "import torch.nn as nn\n", "np": "import numpy as np\n", "Tensor": "from torch import Tensor\n",
             "Optimizer": "from torch.optim import Optimizer\n",
             **{name: f"from typing import {name}\n" for name in
                ("Optional", "Union", "List", "Tuple", "Dict", "Sequence", "Callable", "Any")}}


def _missing_imports(tree: ast.Module) -> list[str]:
    bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    bound |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    bound |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return [line for name, line in _STANDARD.items() if name in used and name not in bound]


def _is_kernel(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


_FACTORIES = {"randn", "rand", "randint", "empty", "zeros", "ones", "full", "tensor", "arange", "linspace",
              "randn_like", "rand_like", "empty_like", "zeros_like", "ones_like"}


def _runs_something(node: ast.stmt, own: set[str]) -> bool:
    """A module statement that does work at import: a call, a loop, a `with`, an `if __name__` block,
    or an assignment from a tensor factory or from the module's own functions (a demo's input or
    result). Definitions, imports, `try: import` blocks and constants (`DEVICE = torch.device(...)`)
    stay. `own`: the module's function names."""
    if isinstance(node, ast.Expr):
        return not isinstance(node.value, ast.Constant)  # a docstring stays
    if isinstance(node, (ast.For, ast.While, ast.With, ast.AsyncFor, ast.AsyncWith)):
        return True
    if isinstance(node, ast.If):
        return "__name__" in ast.unparse(node.test)
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        for call in (n for n in ast.walk(node.value) if isinstance(n, ast.Call)):
            name = ast.unparse(call.func)
            if name in own or name.split(".")[-1] in _FACTORIES:
                return True
    return False
