"""Syntax-aware chunking and symbol extraction for C++ and Python through tree-sitter grammar wheels.

Chunks follow the syntax tree: a class or struct larger than the chunk budget is split between its
members, and a function is never cut unless it is a giant (over 8x the budget), in which case it is
split between its top-level statements. Each chunk
keeps its line range, which citations need (llama-index's CodeSplitter drops line numbers, so the
packing is done here on the same principle: siblings packed up to a character budget).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any

from indexer.parsed import Fact, ParsedFile, SourceSymbol, Unit, source_lines

__all__ = ["DEFAULT_MAX_CHARS", "Piece", "grammar_versions", "pack_line_ranges", "parse_code"]

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
               "block", "decorated_definition", "preproc_ifdef", "preproc_if", "preproc_else", "preproc_elif",
               "translation_unit", "module", "ERROR"}
# A function is kept whole up to this size; beyond it (generated-looking giants such as a 75 KB
# pybind `init_triton_ir`) it is split between its top-level statements, never inside one.
_HUGE_FUNCTION_CHARS = 8 * DEFAULT_MAX_CHARS
_FUNCTIONS = {"function_definition"}


@functools.cache
def _parser(lang: str) -> Any:
    from tree_sitter import Language, Parser

    grammar: Any
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


def _innermost_function(functions: list[SourceSymbol]) -> Callable[[int], str]:
    """line -> qualified name of the innermost function holding it ("" outside any). Functions nest
    (a lambda's enclosing method), so the latest-starting one that still holds the line is it."""
    spans = sorted(functions, key=lambda f: (f.line, -f.end_line))
    starts = [f.line for f in spans]

    def enclosing(line: int) -> str:
        for f in reversed(spans[: bisect.bisect_right(starts, line)]):
            if f.end_line >= line:
                return _qualified(f)
        return ""

    return enclosing


def _units(tree: Any, lines: list[str], max_chars: int) -> list[tuple[str, int, int]]:
    """(text, start_line, end_line) of the syntax-following chunks; lines are 1-based, inclusive."""
    pieces: list[Piece] = []
    _collect(tree.root_node, max_chars, pieces)
    units = []
    for start, end in pack_line_ranges(pieces, lines, max_chars):
        text = "\n".join(lines[start : end + 1])
        if text.strip():
            units.append((text, start + 1, end + 1))
    return units


def parse_code(source: bytes, lang: str, max_chars: int = DEFAULT_MAX_CHARS) -> ParsedFile:
    """Chunks, definitions (with their class/namespace scope), call references and cross-layer facts."""
    tree = _parser(lang).parse(source)
    text = source.decode("utf-8", "replace")
    lines = source_lines(text)
    parsed = ParsedFile(lang=lang)
    defs: list[SourceSymbol] = []
    _definitions(tree.root_node, lang, [], defs, parsed.facts, lines)
    for chunk, start, end in _units(tree, lines, max_chars):
        main = _chunk_symbol(defs, start, end)
        parsed.units.append(Unit(chunk, start, end, main.name, main.kind, main.scope) if main
                            else Unit(chunk, start, end))
    for sym in defs:
        sym.unit = parsed.unit_at(sym.line)
    parsed.symbols.extend(defs)
    enclosing = _innermost_function([d for d in defs if d.kind in ("function", "method")])
    for name, line in _call_references(tree.root_node, lang):
        # The caller, as an emitted diagnostic names its emitter: "used in LoadVectorizer::matchAndRewrite".
        parsed.symbols.append(SourceSymbol(name, "call", line, line, "ref", enclosing(line), parsed.unit_at(line)))
    for severity, message, line in _diagnostics(text, lang):
        parsed.symbols.append(SourceSymbol(message, f"diagnostic:{severity}", line, line, "emit", enclosing(line),
                                           parsed.unit_at(line)))
    if lang == "python":
        for call, stage, line in _pipeline_calls(lines):
            parsed.symbols.append(SourceSymbol(call, f"pipeline-call:{stage}", line, line, "ref", "",
                                               parsed.unit_at(line)))
    if lang == "cpp":
        _cpp_facts(text, parsed.facts)
        # A pybind binding string is where the Python API name (`add_coalesce`) is defined.
        for fact in parsed.facts:
            if fact.kind == "binding":
                parsed.symbols.append(SourceSymbol(fact.a, "pybind", fact.line, fact.line, "def", fact.b,
                                                   parsed.unit_at(fact.line)))
    return parsed


def _chunk_symbol(defs: list[SourceSymbol], start: int, end: int) -> SourceSymbol | None:
    """What a chunk is about: the function it lies inside (a piece of a split giant function is
    that function's), else the largest definition it holds (a method, not the class around it),
    else the class it lies in. A namespace names a chunk only when it holds nothing else: it says
    where code is, not what it does."""
    named = [d for d in defs if d.role == "def" and d.kind != "namespace"]
    enclosing = sorted((d for d in named if d.line < start and end <= d.end_line), key=lambda d: d.end_line - d.line)
    function = next((d for d in enclosing if d.kind in ("function", "method")), None)
    if function is not None:
        return function
    inside = [d for d in named if start <= d.line <= end]
    if inside:  # packed small definitions: the one taking most of the chunk (the first on a tie)
        return max(inside, key=lambda d: min(d.end_line, end) - d.line)
    if enclosing:
        return enclosing[0]
    return next((d for d in defs if d.role == "def" and start <= d.line <= end), None)


def _qualified(sym: SourceSymbol) -> str:
    return f"{sym.scope}::{sym.name}" if sym.scope else sym.name


# Bases that make a class an MLIR rewrite pattern, capturing the op it matches.
_PATTERN_BASE = re.compile(
    r"\b(?:OpRewritePattern|OpConversionPattern|ConvertOpToLLVMPattern|OpInterfaceRewritePattern|"
    r"OpInterfaceConversionPattern|ConvertTritonGPUOpToLLVMPattern)\s*<\s*(?P<op>[\w:]+)"
)
_PASS_BASE = re.compile(r"\b(?:impl::)?(?P<name>\w+)Base\s*<")


def _definitions(node: Any, lang: str, scope: list[str], out: list[SourceSymbol], facts: list[Fact],
                        lines: list[str]) -> None:
    kind = _DEFINITIONS[lang].get(node.type)
    name = ""
    if lang == "cpp" and node.type in ("field_declaration", "declaration"):
        declared = _declared_function(node)
        if declared:
            out.append(_symbol(declared, "declaration", node, "decl", scope, lines))
    elif kind:
        name = _name_of(node, lang)
        if name:
            # `Planner::process` defined out of line is a method; `triton::createFooPass` is a function in
            # a namespace (LLVM names classes in CamelCase, namespaces in lower case).
            qualifier = name.split("::")[-2] if "::" in name else ""
            if kind == "function" and (scope and _is_class_scope(node) or any(c.isupper() for c in qualifier)):
                kind = "method"
            if kind in ("class", "struct") and lang == "cpp":
                bases = node.child_by_field_name("base_class_clause") or next(
                    (c for c in node.children if c.type == "base_class_clause"), None)
                base_text = bases.text.decode("utf-8", "replace") if bases is not None else ""
                if m := _PATTERN_BASE.search(base_text):
                    kind = "rewrite-pattern"
                    facts.append(Fact("rewrites-op", name, m["op"].split("::")[-1], node.start_point[0] + 1))
                for m in _PASS_BASE.finditer(base_text):
                    facts.append(Fact("implements-base", name, m["name"], node.start_point[0] + 1))
            out.append(_symbol(name.split("::")[-1], kind, node, "def",
                               scope + name.split("::")[:-1], lines))
    inner = scope + [name] if name and node.type in _SCOPES else scope
    for child in node.children:
        _definitions(child, lang, inner, out, facts, lines)


_SCOPES = {"namespace_definition", "class_specifier", "struct_specifier", "class_definition"}


def _is_class_scope(node: Any) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type in ("class_specifier", "struct_specifier", "class_definition"):
            return True
        if parent.type in ("namespace_definition", "translation_unit", "module", "function_definition"):
            return False
        parent = parent.parent
    return False


def _symbol(name: str, kind: str, node: Any, role: str, scope: list[str], lines: list[str]) -> SourceSymbol:
    start, end = node.start_point[0] + 1, node.end_point[0] + 1
    body = "\n".join(lines[start - 1 : end])
    digest = hashlib.sha1(body.encode()).hexdigest()[:12]
    return SourceSymbol(name, kind, start, end, role, "::".join(s for s in scope if s), -1, digest)


_CALL_NODES = {"cpp": "call_expression", "python": "call"}
_CALLEE_SPLIT = re.compile(r"::|\.|->")


def _call_references(root: Any, lang: str) -> list[tuple[str, int]]:
    """(callee name, line) of every call, deduplicated per line: `pm.addPass(createFoo())` gives both."""
    out: set[tuple[str, int]] = set()
    stack = [root]
    call_type = _CALL_NODES[lang]
    while stack:
        node = stack.pop()
        if node.type == call_type:
            fn = node.child_by_field_name("function")
            if fn is not None:
                callee = re.sub(r"<.*", "", fn.text.decode("utf-8", "replace"))
                name = _CALLEE_SPLIT.split(callee)[-1].strip()
                if len(name) >= 3 and name.replace("_", "a").isalnum():
                    out.add((name, node.start_point[0] + 1))
        stack.extend(node.children)
    return sorted(out, key=lambda x: (x[1], x[0]))


# op->emitRemark() << "..."   emitWarning(loc, "...")   rewriter.notifyMatchFailure(op, "...")
_CPP_DIAG = re.compile(r"\b(?P<sev>emitRemark|emitWarning|emitError|emitOpError|emitSilenceableError|"
                       r"notifyMatchFailure)\b")
# warnings.warn("...")   raise ValueError(f"...")
_PY_DIAG = re.compile(r"\b(?P<sev>warnings\.warn|raise\s+\w+)\s*\(")
_LITERAL = re.compile(r'(?:\bf|\bL|\bu8)?"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'')


def _diagnostics(text: str, lang: str) -> list[tuple[str, str, int]]:
    """(severity, message literal, line) for each diagnostic the code emits; messages join adjacent literals."""
    out = []
    pattern = _CPP_DIAG if lang == "cpp" else _PY_DIAG
    for m in pattern.finditer(text):
        statement = _statement(text, m.end(), lang)
        parts = [a if a else b for a, b in _LITERAL.findall(statement)]
        if lang == "cpp":
            parts = [p for p in parts if p not in ("'", "\\n")]
        message = " ".join("".join(parts).split())
        if len(message) >= 8:
            sev = m["sev"].split(".")[-1].split()[0]
            out.append((sev, message[:300], text.count("\n", 0, m.start()) + 1))
    return out


def _statement(text: str, start: int, lang: str, limit: int = 600) -> str:
    """Text from `start` to the end of the statement (`;` for C++, a closing paren at depth 0 for
    Python), skipping string literals, so `"failed; "` does not end it."""
    depth, i, n = 0, start, min(len(text), start + limit)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if lang == "python" and depth < 0:
                break
        elif ch == ";" and lang == "cpp" and depth <= 0:
            break
        i += 1
    return text[start:i]


# passes.ttgpuir.add_coalesce(pm)   nvidia.passes.ttnvgpuir.add_tma_lowering(pm)
_PIPELINE_CALL = re.compile(r"\b(?P<call>(?:\w+\.)*passes\.(?P<ns>\w+)\.add_(?P<name>\w+))\s*\(")
_STAGE_FN = re.compile(r"^\s*def (?P<name>make_\w+|add_stages|\w+_to_\w+)\(")


def _pipeline_calls(lines: list[str]) -> list[tuple[str, str, int]]:
    """(`passes.<ns>.add_<x>`, stage function it is in (make_ttgir, ...), line) of each pipeline call."""
    out = []
    stage = ""
    for lineno, line in enumerate(lines, start=1):
        if m := _STAGE_FN.match(line):
            stage = m["name"]
        for m in _PIPELINE_CALL.finditer(line):
            out.append(("passes." + m["call"].split("passes.", 1)[1], stage, lineno))  # passes.ttgpuir.add_coalesce
    return out


_GEN_PASS_DEF = re.compile(r"^[ \t]*#[ \t]*define[ \t]+GEN_PASS_DEF_(?P<name>\w+)", re.MULTILINE)
# ADD_PASS_WRAPPER_0("add_coalesce", createTritonGPUCoalesce);   ADD_PASS_OPTION_WRAPPER_1("add_x", createX, int);
_PASS_WRAPPER = re.compile(r'\bADD_PASS(?:_OPTION)?_WRAPPER_\d+\(\s*"(?P<py>\w+)"\s*,\s*(?P<fn>[\w:]+)')
# m.def("add_auto_blockify", [](mlir::PassManager &pm, ...) { pm.addPass(mlir::triton::createAutoBlockifyPass(opts)); });
_DEF_BINDING = re.compile(r'\.def\(\s*"(?P<py>add_\w+)"(?P<body>(?:(?!\.def\().){0,600}?)\b(?P<fn>create\w+)\s*[(<]',
                          re.DOTALL)


def _cpp_facts(text: str, facts: list[Fact]) -> None:
    for m in _GEN_PASS_DEF.finditer(text):
        facts.append(Fact("gen-pass-def", m["name"], "", text.count("\n", 0, m.start()) + 1))
    for m in _PASS_WRAPPER.finditer(text):
        facts.append(Fact("binding", m["py"], m["fn"].split("::")[-1], text.count("\n", 0, m.start()) + 1))
    for m in _DEF_BINDING.finditer(text):
        facts.append(Fact("binding", m["py"], m["fn"], text.count("\n", 0, m.start()) + 1))


# A piece of the split: (start_row, end_row, group), rows 0-based inclusive. Pieces pack together
# only within one group: 0 for top-level code, the first row of a giant function for its pieces.
Piece = tuple[int, int, int]


def _collect(node: Any, max_chars: int, out: list[Piece], group: int = 0) -> None:
    """Leaves of the split: nodes that fit the budget, or non-container nodes too big to split."""
    size = node.end_byte - node.start_byte
    splittable = node.type in _CONTAINERS or (node.type in _FUNCTIONS and size > _HUGE_FUNCTION_CHARS)
    if size <= max_chars or not node.children or not splittable:
        out.append((node.start_point[0], node.end_point[0], group))
        return
    if node.type in _FUNCTIONS:
        body = node.child_by_field_name("body")
        if body is not None and body.children:
            # The giant's pieces pack among themselves, never with its neighbours: its signature
            # must not end a chunk about the function before it.
            own = node.start_point[0] + 1
            out.append((node.start_point[0], body.children[0].end_point[0], own))  # signature and `{` (or `:`)
            for child in body.children[1:]:
                _collect(child, max_chars, out, own)
            return
    covered = node.start_point[0]
    lead: int | None = None  # first line of the comments right above the next child
    for child in node.children:
        if child.start_point[0] > covered:
            out.append((covered, child.start_point[0] - 1, group))  # blank lines between children
        if child.type == "comment":
            # A comment block directly above a definition documents it: it goes into the definition's
            # chunk (packed on its own it joined the chunk of the definition before).
            joined = lead is not None and child.start_point[0] <= covered
            lead = lead if joined else child.start_point[0]
            covered = max(covered, child.end_point[0] + 1)
            continue
        if lead is not None and (child.start_point[0] > covered or child.type in ("}", "{", ";")):
            out.append((lead, covered - 1, group))  # a comment apart from any definition keeps its own piece
            lead = None
        first = len(out)
        _collect(child, max_chars, out, group)
        if lead is not None:
            out[first] = (lead, out[first][1], out[first][2])  # the definition's piece starts at its comment
            lead = None
        covered = max(covered, child.end_point[0] + 1)
    if lead is not None:
        out.append((lead, covered - 1, group))


def pack_line_ranges(pieces: list[Piece], lines: list[str], max_chars: int) -> list[tuple[int, int]]:
    """Merge consecutive pieces of one group into chunks of at most max_chars; a piece never
    straddles two chunks. Shared by the C++/Python and the lit-test chunkers."""
    rows: list[Piece] = []
    for start, end, group in sorted(pieces):
        if rows and start <= rows[-1][1]:
            start = rows[-1][1] + 1  # pieces on one line (e.g. `};`) merge into the previous
            if start > end:
                continue
        rows.append((start, end, group))
    chunks: list[Piece] = []
    for start, end, group in rows:
        if chunks:
            c_start, c_end, c_group = chunks[-1]
            merged = sum(len(lines[i]) + 1 for i in range(c_start, min(end, len(lines) - 1) + 1))
            if merged <= max_chars and group == c_group:
                chunks[-1] = (c_start, end, group)
                continue
        chunks.append((start, end, group))
    return [(start, end) for start, end, _ in _absorb_glue(chunks, lines)]


# A chunk with less text than this is glue (`}`, `namespace mlir {`, `} // namespace`): alone it
# matches nothing and answers nothing, so it joins a neighbour even past the budget.
_GLUE_CHARS = 40


def _absorb_glue(chunks: list[Piece], lines: list[str]) -> list[Piece]:
    def glue(chunk: Piece) -> bool:
        return sum(len(lines[i].strip()) for i in range(chunk[0], min(chunk[1], len(lines) - 1) + 1)) < _GLUE_CHARS

    out: list[Piece] = []
    pending: Piece | None = None  # glue that opens the file or a group waits for the next chunk
    for chunk in chunks:
        if pending is not None and pending[2] == chunk[2]:
            chunk, pending = (pending[0], chunk[1], chunk[2]), None
        elif pending is not None:
            out.append(pending)
            pending = None
        if glue(chunk) and out and out[-1][2] == chunk[2]:
            out[-1] = (out[-1][0], chunk[1], chunk[2])
        elif glue(chunk):
            pending = chunk
        else:
            out.append(chunk)
    if pending is not None:
        out.append(pending)
    return out
