"""Syntax-aware chunking and symbol extraction for C++ and Python through tree-sitter grammar wheels.

Chunks follow the syntax tree: a function, class or struct is never cut in the middle unless it is
larger than the chunk budget by itself, in which case it is split between its members. Each chunk
keeps its line range, which citations need (llama-index's CodeSplitter drops line numbers, so the
packing is done here on the same principle: siblings packed up to a character budget).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["CodeUnit", "DEFAULT_MAX_CHARS", "grammar_versions", "parse_units"]

DEFAULT_MAX_CHARS = 1500  # the embedder truncates at 256 word pieces; ~1500 chars is the edge

# Node types that define a named symbol, per language.
_DEFINITIONS = {
    "cpp": {
        "function_definition": "function",
        "class_specifier": "class",
        "struct_specifier": "struct",
        "enum_specifier": "enum",
        "namespace_definition": "namespace",
        "preproc_function_def": "macro",
        "preproc_def": "macro",
    },
    "python": {"function_definition": "function", "class_definition": "class"},
}
# Containers whose children are chunked separately when the container is too large.
_CONTAINERS = {"namespace_definition", "class_specifier", "struct_specifier", "class_definition",
               "declaration_list", "field_declaration_list", "template_declaration", "linkage_specification",
               "block", "decorated_definition", "preproc_ifdef", "preproc_if", "translation_unit", "module"}


@functools.cache
def _parser(lang: str) -> Any:
    from tree_sitter import Language, Parser

    if lang == "cpp":
        import tree_sitter_cpp as grammar
    elif lang == "python":
        import tree_sitter_python as grammar
    else:
        raise ValueError(f"no grammar for {lang}")
    return Parser(Language(grammar.language()))


def grammar_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("tree-sitter", "tree-sitter-cpp", "tree-sitter-python")}


@dataclass
class CodeUnit:
    """A chunk of source with its line range and the symbols it defines.

    Attributes:
        text: the source text of the chunk.
        start_line, end_line: 1-based, inclusive.
        symbol: the main symbol (first definition) or "" for glue code.
        kind: that symbol's kind.
        definitions: (name, kind, line, end_line) of every definition inside the chunk.
    """

    text: str
    start_line: int
    end_line: int
    symbol: str
    kind: str
    definitions: list[tuple[str, str, int, int]]


def _name_of(node: Any, lang: str) -> str:
    if node.type == "decorated_definition":
        inner = node.child_by_field_name("definition")
        return _name_of(inner, lang) if inner is not None else ""
    name = node.child_by_field_name("name")
    if name is not None:
        return name.text.decode("utf-8", "replace")
    if lang == "cpp" and node.type == "function_definition":
        decl = node.child_by_field_name("declarator")
        while decl is not None and decl.type not in ("identifier", "field_identifier", "qualified_identifier",
                                                      "operator_name", "destructor_name"):
            decl = decl.child_by_field_name("declarator")
        if decl is not None:
            return decl.text.decode("utf-8", "replace")
    return ""


def _declared_function(node: Any) -> str:
    """Name of a C++ function declared (not defined) by `node`, e.g. `unsigned getMaskAlignment(Value);`."""
    decl = node.child_by_field_name("declarator")
    while decl is not None and decl.type in ("pointer_declarator", "reference_declarator"):
        decl = decl.child_by_field_name("declarator")
    if decl is None or decl.type != "function_declarator":
        return ""
    inner = decl.child_by_field_name("declarator")
    return inner.text.decode("utf-8", "replace") if inner is not None else ""


def _definitions(node: Any, lang: str, out: list[tuple[str, str, int, int]]) -> None:
    kind = _DEFINITIONS[lang].get(node.type)
    if lang == "cpp" and node.type in ("field_declaration", "declaration"):
        name = _declared_function(node)
        if name:
            out.append((name, "declaration", node.start_point[0] + 1, node.end_point[0] + 1))
    elif kind:
        name = _name_of(node, lang)
        if name:
            out.append((name, kind, node.start_point[0] + 1, node.end_point[0] + 1))
    for child in node.children:
        _definitions(child, lang, out)


def parse_units(source: bytes, lang: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[CodeUnit]:
    """Split a C++ or Python file into syntax-following chunks."""
    tree = _parser(lang).parse(source)
    lines = source.decode("utf-8", "replace").splitlines()
    pieces: list[tuple[int, int]] = []  # (start_row, end_row), 0-based inclusive
    _collect(tree.root_node, max_chars, pieces)
    units = []
    for start, end in _pack(pieces, lines, max_chars):
        text = "\n".join(lines[start : end + 1])
        if not text.strip():
            continue
        defs: list[tuple[str, str, int, int]] = []
        _definitions_in_range(tree.root_node, lang, start, end, defs)
        symbol, kind = (defs[0][0], defs[0][1]) if defs else ("", "code")
        units.append(CodeUnit(text, start + 1, end + 1, symbol, kind, defs))
    return units


def _definitions_in_range(node: Any, lang: str, start: int, end: int, out: list) -> None:
    for child in node.children:
        if child.end_point[0] < start or child.start_point[0] > end:
            continue
        if child.start_point[0] >= start and child.end_point[0] <= end:
            _definitions(child, lang, out)
        else:
            _definitions_in_range(child, lang, start, end, out)


def _collect(node: Any, max_chars: int, out: list[tuple[int, int]]) -> None:
    """Leaves of the split: nodes that fit the budget, or non-container nodes too big to split."""
    size = node.end_byte - node.start_byte
    if size <= max_chars or not node.children or node.type not in _CONTAINERS:
        out.append((node.start_point[0], node.end_point[0]))
        return
    covered = node.start_point[0]
    for child in node.children:
        if child.start_point[0] > covered:
            out.append((covered, child.start_point[0] - 1))  # comments/blank lines between children
        _collect(child, max_chars, out)
        covered = max(covered, child.end_point[0] + 1)


def _pack(pieces: list[tuple[int, int]], lines: list[str], max_chars: int) -> list[tuple[int, int]]:
    """Merge consecutive pieces into chunks of at most max_chars; a piece never straddles two chunks."""
    rows: list[tuple[int, int]] = []
    for start, end in sorted(pieces):
        if rows and start <= rows[-1][1]:
            start = rows[-1][1] + 1  # pieces on one line (e.g. `};`) merge into the previous
            if start > end:
                continue
        rows.append((start, end))
    chunks: list[tuple[int, int]] = []
    for start, end in rows:
        if chunks:
            c_start, c_end = chunks[-1]
            merged = sum(len(lines[i]) + 1 for i in range(c_start, min(end, len(lines) - 1) + 1))
            if merged <= max_chars:
                chunks[-1] = (c_start, end)
                continue
        chunks.append((start, end))
    return chunks
