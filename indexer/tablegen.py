"""A small TableGen reader for MLIR pass definitions (`def X : Pass<"arg", "anchor"> { let ... }`).

No tree-sitter grammar for TableGen exists on PyPI and llvm-tblgen is not shipped, so this lexes
just what pass records use: `[{ ... }]` code blocks, string literals concatenated across lines,
comments (including `/*default*/` inside `Option<...>`), nested `<...>` and `[...]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["TableGenPass", "parse_passes"]

# def TritonGPUCoalesce: Pass<"tritongpu-coalesce", "mlir::ModuleOp"> {
_PASS_DEF = re.compile(r'\bdef\s+(?P<name>\w+)\s*:\s*(?:Interface)?Pass<\s*"(?P<arg>[^"]+)"(?:\s*,\s*"(?P<anchor>[^"]*)")?')


@dataclass
class TableGenPass:
    def_name: str
    argument: str
    anchor: str
    summary: str
    description: str
    options: list[dict[str, str]] = field(default_factory=list)
    line: int = 0
    end_line: int = 0
    text: str = ""


def _strip_comments(text: str) -> str:
    """Blank out comments (keeping offsets and newlines) outside strings and code blocks."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("[{", i):
            end = text.find("}]", i + 2)
            i = n if end < 0 else end + 2
        elif text[i] == '"':
            i = _string_end(text, i)
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            for j in range(i, end):
                out[j] = " "
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for j in range(i, end):
                if out[j] != "\n":
                    out[j] = " "
            i = end
        else:
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _block_end(text: str, open_brace: int) -> int:
    """Index just past the `}` matching the `{` at `open_brace`."""
    depth, i = 0, open_brace
    while i < len(text):
        if text.startswith("[{", i):
            end = text.find("}]", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        ch = text[i]
        if ch == '"':
            i = _string_end(text, i)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _value(body: str, key: str) -> str:
    """The value of `let key = ...;`: a code block or concatenated string literals."""
    m = re.search(rf"\blet\s+{key}\s*=\s*", body)
    if m is None:
        return ""
    rest = body[m.end():]
    if rest.startswith("[{"):
        end = rest.find("}]")
        return _dedent(rest[2 : end if end >= 0 else len(rest)])
    parts = []
    i = 0
    while i < len(rest) and rest[i] != ";":
        if rest[i] == '"':
            end = _string_end(rest, i)
            parts.append(rest[i + 1 : end - 1])
            i = end
        else:
            i += 1
    return "".join(parts)


def _dedent(text: str) -> str:
    lines = text.strip("\n").splitlines()
    indents = [len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(ln[cut:] for ln in lines).strip()


# Option<"numStages", "num-stages", "int32_t", /*default*/"3", "number of pipeline stages">
_OPTION = re.compile(r"\b(?:List)?Option<(?P<args>(?:[^<>]|<[^<>]*>)*)>")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _options(body: str) -> list[dict[str, str]]:
    m = re.search(r"\blet\s+options\s*=\s*\[", body)
    if m is None:
        return []
    section = body[m.end():]
    options = []
    for om in _OPTION.finditer(section[: section.find("];") if "];" in section else len(section)]):
        strings = _STRING.findall(om["args"])
        if len(strings) >= 3:
            keys = ("cpp_name", "argument", "type", "default", "description")
            if len(strings) == 4:  # ListOption has no default
                keys = ("cpp_name", "argument", "type", "description")
            options.append(dict(zip(keys, strings)))
    return options


def parse_passes(text: str) -> list[TableGenPass]:
    """Every pass record in one .td file, with 1-based line ranges."""
    clean = _strip_comments(text)
    passes = []
    for m in _PASS_DEF.finditer(clean):
        brace = clean.find("{", m.end())
        semicolon = clean.find(";", m.end())
        if brace < 0 or (0 <= semicolon < brace):
            end = semicolon + 1 if semicolon >= 0 else m.end()
            body = ""
        else:
            end = _block_end(clean, brace)
            body = clean[brace:end]
        passes.append(
            TableGenPass(
                def_name=m["name"],
                argument=m["arg"],
                anchor=m["anchor"] or "",
                summary=" ".join(_value(body, "summary").split()),
                description=_value(body, "description"),
                options=_options(body),
                line=clean.count("\n", 0, m.start()) + 1,
                end_line=clean.count("\n", 0, end) + 1,
                text=text[m.start():end],
            )
        )
    return passes
