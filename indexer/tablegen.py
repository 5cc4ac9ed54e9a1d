"""A small TableGen reader for MLIR pass definitions (`def X : Pass<"arg", "anchor"> { let ... }`).

No tree-sitter grammar for TableGen exists on PyPI and llvm-tblgen is not shipped, so this lexes
just what pass records use: `[{ ... }]` code blocks, string literals concatenated across lines,
comments (including `/*default*/` inside `Option<...>`), nested `<...>` and `[...]`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field

from indexer.parsed import ParsedFile, SourceSymbol, Unit, source_lines

__all__ = ["TableGenPass", "TableGenRecord", "op_names", "parse_passes", "parse_records", "parse_tablegen"]

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
    constructor: str = ""  # `let constructor = "mlir::createFooPass()"`, the C++ factory, when given
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


def _record_extent(clean: str, head_end: int) -> tuple[int, str]:
    """Where a record whose header ends at `head_end` ends, and its `{ ... }` body ("" for `def X : Y<...>;`)."""
    brace = clean.find("{", head_end)
    semicolon = clean.find(";", head_end)
    if brace < 0 or (0 <= semicolon < brace):
        return (semicolon + 1 if semicolon >= 0 else head_end), ""
    end = _block_end(clean, brace)
    return end, clean[brace:end]


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
            keys: tuple[str, ...] = ("cpp_name", "argument", "type", "default", "description")
            if len(strings) == 4:  # ListOption has no default
                keys = ("cpp_name", "argument", "type", "description")
            options.append(dict(zip(keys, strings)))
    return options


def parse_passes(text: str) -> list[TableGenPass]:
    """Every pass record in one .td file, with 1-based line ranges."""
    clean = _strip_comments(text)
    passes = []
    for m in _PASS_DEF.finditer(clean):
        end, body = _record_extent(clean, m.end())
        passes.append(
            TableGenPass(
                def_name=m["name"],
                argument=m["arg"],
                anchor=m["anchor"] or "",
                summary=" ".join(_value(body, "summary").split()),
                description=_value(body, "description"),
                options=_options(body),
                constructor=_value(body, "constructor").split("(")[0].strip(),
                line=clean.count("\n", 0, m.start()) + 1,
                end_line=clean.count("\n", 0, end) + 1,
                text=text[m.start():end],
            )
        )
    return passes


# def TTG_ConvertLayoutOp : TTG_Op<"convert_layout", [...]> {
# class HIVM_Op<string mnemonic, list<Trait> traits = []> : Op<HIVM_Dialect, !strconcat("hir.", mnemonic), traits> {
# def TritonGPU_Dialect : Dialect {
_RECORD_HEAD = re.compile(
    r"^(?P<what>def|class)\s+(?P<name>\w+)\s*(?:<(?P<params>(?:[^<>]|<[^<>]*>)*)>)?\s*"
    r"(?::\s*(?P<parent>\w+)\s*(?:<(?P<args>[^;{]*))?)?",
    re.MULTILINE,
)
_STRCONCAT_PREFIX = re.compile(r'!strconcat\(\s*"(?P<prefix>[^"]*)"\s*,\s*mnemonic')


@dataclass
class TableGenRecord:
    """A `def` or `class` record: enough to name MLIR ops (`tt.load`) after their dialect.

    Attributes:
        parent: the first base class (`TTG_Op`, `Op`, `Dialect`, `Pass`, ...).
        first_string: the first string literal argument to the parent (an op mnemonic for op defs).
        dialect_arg: for `Op<Dialect, ...>` parents, the dialect record named.
        mnemonic_prefix: what the class prepends to its mnemonic (`!strconcat("hir.", mnemonic)`).
        dialect_name: for `Dialect` records, `let name = "ttg"`.
    """

    what: str
    name: str
    parent: str
    first_string: str
    dialect_arg: str
    mnemonic_prefix: str
    dialect_name: str
    line: int
    end_line: int


def parse_records(text: str) -> list[TableGenRecord]:
    clean = _strip_comments(text)
    records = []
    for m in _RECORD_HEAD.finditer(clean):
        end, body = _record_extent(clean, m.end())
        args = m["args"] or ""
        first = _STRING.search(args)
        prefix = _STRCONCAT_PREFIX.search(args)
        parent = m["parent"] or ""
        dialect_arg = args.split(",")[0].strip() if parent == "Op" else ""
        records.append(TableGenRecord(
            what=m["what"], name=m["name"], parent=parent,
            first_string=first.group(1) if first and not prefix else (prefix["prefix"] if prefix else ""),
            dialect_arg=dialect_arg, mnemonic_prefix=prefix["prefix"] if prefix else "",
            dialect_name=_value(body, "name") if parent == "Dialect" else "",
            line=clean.count("\n", 0, m.start()) + 1, end_line=clean.count("\n", 0, end) + 1,
        ))
    return records


def op_names(records: list[TableGenRecord]) -> list[tuple[TableGenRecord, str]]:
    """Op defs with their full op name (`TTG_ConvertLayoutOp` -> `ttg.convert_layout`), across all records given.

    Walks each op def's class chain up to `Op<Dialect, ...>`, collecting `!strconcat` prefixes,
    then prefixes the dialect's `let name`. Defs whose chain does not reach a known dialect are left out.
    """
    classes = {r.name: r for r in records if r.what == "class"}
    dialects = {r.name: r.dialect_name for r in records if r.parent == "Dialect" and r.dialect_name}
    out: list[tuple[TableGenRecord, str]] = []
    for r in records:
        if r.what != "def" or not r.first_string or r.parent not in classes and r.parent != "Op":
            continue
        mnemonic, cls, dialect, seen = r.first_string, r.parent, "", set()
        if r.parent == "Op":
            dialect = r.dialect_arg
        while cls in classes and cls not in seen:
            seen.add(cls)
            c = classes[cls]
            mnemonic = c.mnemonic_prefix + mnemonic
            if c.parent == "Op":
                dialect = c.dialect_arg
                break
            cls = c.parent
        if dialect in dialects:
            out.append((r, f"{dialects[dialect]}.{mnemonic}"))
    return out


_NAME_LIKE = re.compile(r"^[A-Za-z_][\w.-]*$")


def parse_tablegen(source: bytes, max_chars: int = 1500) -> ParsedFile:
    """Pass records become one chunk each; other records (ops, attributes, dialects) are packed whole
    into chunks; every record is a `def` symbol, and records are kept for naming ops afterwards."""
    text = source.decode("utf-8", "replace")
    lines = source_lines(text)
    parsed = ParsedFile(lang="tablegen")
    passes = parse_passes(text)
    pass_lines: set[int] = set()
    for p in passes:
        options = "; ".join(f"{o.get('argument')}={o.get('default', '')} ({o.get('description', '')})"
                            for o in p.options)
        doc = (f"Pass {p.def_name} ({p.argument}): {p.summary}\n{p.description}\n"
               + (f"Options: {options}\n" if options else "") + f"\n{p.text}")
        unit = len(parsed.units)
        parsed.units.append(Unit(doc[:6000], p.line, p.end_line, p.def_name, "pass"))
        digest = hashlib.sha1(p.text.encode()).hexdigest()[:12]
        for name in (p.def_name, p.argument):
            parsed.symbols.append(SourceSymbol(name, "pass", p.line, p.end_line, "def", "", unit, digest))
        for option in p.options:
            if option.get("argument"):
                parsed.symbols.append(SourceSymbol(option["argument"], "pass-option", p.line, p.end_line, "def",
                                                   p.argument, unit))
        parsed.passes.append({k: v for k, v in asdict(p).items() if k != "text"})
        pass_lines.update(range(p.line, p.end_line + 1))
    records = [r for r in parse_records(text) if r.line not in pass_lines]
    parsed.records = [asdict(r) for r in records]
    group: list[TableGenRecord] = []
    size = 0
    for r in records:
        record_len = sum(len(lines[i]) + 1 for i in range(r.line - 1, min(r.end_line, len(lines))))
        if group and size + record_len > max_chars:
            _emit_group(group, lines, parsed)
            group, size = [], 0
        group.append(r)
        size += record_len
    if group:
        _emit_group(group, lines, parsed)
    return parsed


def _emit_group(group: list[TableGenRecord], lines: list[str], parsed: ParsedFile) -> None:
    start, end = group[0].line, max(r.end_line for r in group)
    body = "\n".join(lines[start - 1 : end]).strip()
    if not body:
        return
    unit = len(parsed.units)
    parsed.units.append(Unit(body, start, end, group[0].name, "tablegen-" + group[0].what))
    for r in group:
        digest = hashlib.sha1("\n".join(lines[r.line - 1 : r.end_line]).encode()).hexdigest()[:12]
        parsed.symbols.append(SourceSymbol(r.name, "tablegen-" + r.what, r.line, r.end_line, "def", "", unit, digest))
        if r.what == "def" and _NAME_LIKE.match(r.first_string):
            # The name a record gives its parent: an op mnemonic (`convert_layout`), an attribute or
            # option name; users paste these, not the record's def name.
            parsed.symbols.append(SourceSymbol(r.first_string, "tablegen-name", r.line, r.end_line, "def", r.name,
                                               unit))
