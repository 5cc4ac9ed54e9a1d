"""The module a model's answer holds: TritonBench's recorded drafts (indexer/tritonbench) and the LLM
rewriter's replies (diagnose/llm_round) are the same kind of text, prose around fenced code, and are
read one way. Answers often split the kernel and its wrapper over two fences, so the python fences
are joined when they parse together; else the largest fence that parses is the module."""

from __future__ import annotations

import ast
import re

__all__ = ["answer_module", "python_fences"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}


def python_fences(text: str) -> list[str]:
    """The bodies of the answer's fenced blocks tagged python (or untagged), in order."""
    return [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]


def answer_module(text: str) -> str:
    """The fences joined when they parse together, else the largest one that parses, else all of them
    joined (to fail where the code does); an answer without fences is taken as raw code."""
    blocks = python_fences(text)
    if not blocks:
        return text
    joined = "\n\n".join(blocks)
    if _parses(joined):
        return joined
    parsing = [b for b in blocks if _parses(b)]
    return max(parsing, key=len) if parsing else joined


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True
