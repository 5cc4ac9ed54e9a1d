"""MLIR text: locations, ops and the source lines they come from, op counts, kernel arguments."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from harness.ir.common import IRParseError, SourceLoc

# MLIR locations and ops

# #loc = loc("/tmp/k/scale.py":4:1)
# #loc19 = loc("x"(#loc6))            (a named location wrapping another)
# #loc40 = loc(callsite(#loc38 at #loc39))
_LOC_DEF = re.compile(r'^(?P<id>#loc\d*)\s*=\s*loc\((?P<body>.*)\)\s*$')
_LOC_FILE = re.compile(r'^"(?P<file>[^"]+)":(?P<line>\d+):(?P<col>\d+)')
_LOC_NAMED = re.compile(r'^"[^"]*"\((?P<inner>#loc\d*)\)$')
_LOC_CALLSITE = re.compile(r"^callsite\((?P<callee>#loc\d*) at (?P<caller>#loc\d*)\)$")
# %x_5 = tt.load %x_4, %mask_3 : tensor<1024x!tt.ptr<f32>, #blocked> loc(#loc20)
# tt.store %1, %3, %mask : ... loc("/tmp/k/scale.py":9:5)
_OP_LINE = re.compile(
    r"^\s*(?:(?P<results>%[\w#:, %-]+?)\s*=\s*)?\"?(?P<op>[a-z_][\w]*\.[\w.]+)\"?[\s(<{]"
)
_TRAILING_LOC = re.compile(r'loc\((?P<ref>#loc\d*|"[^"]+":\d+:\d+)\)\s*$')


def mlir_locations(text: str) -> dict[str, SourceLoc]:
    """Resolve every `#locN` alias in an MLIR module to a file:line:col (innermost file location)."""
    raw: dict[str, str] = {}
    for line in text.splitlines():
        m = _LOC_DEF.match(line.strip())
        if m:
            raw[m["id"]] = m["body"].strip()
    resolved: dict[str, SourceLoc] = {}

    def resolve(ref: str, depth: int = 0) -> SourceLoc | None:
        if ref in resolved:
            return resolved[ref]
        body = raw.get(ref)
        if body is None or depth > 32:
            return None
        loc: SourceLoc | None = None
        if m := _LOC_FILE.match(body):
            loc = SourceLoc(m["file"], int(m["line"]), int(m["col"]))
        elif m := _LOC_NAMED.match(body):
            loc = resolve(m["inner"], depth + 1)
        elif m := _LOC_CALLSITE.match(body):
            # The callee location is where the op is written; the caller is the call site. An op written in
            # another file (tl.sum's reduce, in triton/language/standard.py) is the kernel's at its call.
            callee, caller = resolve(m["callee"], depth + 1), resolve(m["caller"], depth + 1)
            loc = caller if callee is not None and caller is not None and callee.file != caller.file else callee
        if loc is not None:
            resolved[ref] = loc
        return loc

    for ref in raw:
        resolve(ref)
    return resolved


def _op_loc(line: str, locs: dict[str, SourceLoc]) -> SourceLoc | None:
    m = _TRAILING_LOC.search(line)
    if m is None:
        return None
    ref = m["ref"]
    if ref.startswith("#"):
        return locs.get(ref)
    fm = _LOC_FILE.match(ref)
    return SourceLoc(fm["file"], int(fm["line"]), int(fm["col"])) if fm else None


@dataclass(frozen=True)
class OpLine:
    """One MLIR operation line with its resolved source location.

    Attributes:
        target: what an opaque op stands for: the PTX instruction of an `llvm.inline_asm`
            (`ld.global.v4.b32`), the callee of a call (`@__nv_erff`); "" for other ops.
    """

    ir_line: int
    op: str
    text: str
    loc: SourceLoc | None
    target: str = ""

    @property
    def key(self) -> str:
        """The op as counted along a pipeline: `llvm.inline_asm(ld.global.v4.b32)`, `llvm.call(@__nv_erff)`,
        `tt.load`. Lowering to LLVM turns loads and MMAs into inline asm; keyed by the op alone they
        would all look like one op."""
        return f"{self.op}({self.target})" if self.target else self.op


# "mov.u32 $0, 0x0;\0A\09@$5 ld.global.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ];"  (MLIR escapes \n as \0A)
_ASM_STRING = re.compile(r'"(?P<asm>(?:[^"\\]|\\.)*)"')
_ASM_STATEMENT = re.compile(r"(?:^|;|\\0A|\\09|\{|\})\s*(?:@!?\$\w+\s+)?(?P<mnemonic>[a-z][\w]*(?:\.[\w]+)+)")
_CALLEE = re.compile(r"\b[a-z_]\w*\.call\s+@(?P<callee>[\w$.]+)")


def op_target(op: str, line: str) -> str:
    if op == "llvm.inline_asm":
        asm = _ASM_STRING.search(line)
        mnemonics = [m["mnemonic"] for m in _ASM_STATEMENT.finditer(asm["asm"])] if asm else []
        # Register set-up (mov) precedes the instruction that matters: a load, a store, an MMA.
        return next((m for m in mnemonics if not m.startswith("mov.")), mnemonics[0] if mnemonics else "")
    if op.endswith(".call"):
        callee = _CALLEE.search(line)
        return f"@{callee['callee']}" if callee else ""
    return ""


def op_source_lines(text: str, ops: set[str] | None = None) -> list[OpLine]:
    """Operation lines of an MLIR module (optionally only `ops`), mapped back to kernel source lines."""
    locs = mlir_locations(text)
    lines = text.splitlines()
    out: list[OpLine] = []
    for lineno, line in enumerate(lines, start=1):
        if line.lstrip().startswith(("#", "//", "module", "}")):
            continue
        m = _OP_LINE.match(line)
        if m is None:
            continue
        op = m["op"]
        if ops is not None and op not in ops:
            continue
        loc = _op_loc(line, locs)
        if loc is None and line.split(" loc(")[0].rstrip().endswith("({"):
            loc = _op_loc(region_end(lines, lineno), locs)
        out.append(OpLine(lineno, op, line.strip(), loc, op_target(op, line)))
    return out


def region_end(lines: list[str], opening: int) -> str:
    """The line that closes the region an op opens on line `opening` (1-based): a generic-form op with a
    region (`"tt.reduce"(%x) <{axis = 0 : i32}> ({`) prints its operand types and location there,
    `}) : (tensor<16xf32, #blocked>) -> f32 loc(#loc9)`."""
    depth = 0
    for text in lines[opening - 1:]:
        code = text.split(" loc(")[0]
        depth += code.count("{") - code.count("}")
        if depth <= 0:
            return text
    return ""


def op_counts(text: str) -> Counter[str]:
    """How many times each dialect op appears in an MLIR module, keyed as `OpLine.key`."""
    return Counter(o.key for o in op_source_lines(text))


def diff_op_counts(before: str, after: str) -> dict[str, int]:
    """Per-op count change from `before` to `after` (only ops whose count changed)."""
    a, b = op_counts(before), op_counts(after)
    return {op: b[op] - a[op] for op in sorted(set(a) | set(b)) if b[op] != a[op]}


# tt.func public @scale_kernel(%x_ptr: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) ...
_FUNC_HEADER = re.compile(r"^\s*tt\.func\s+(?:public\s+|private\s+)?@(?P<name>[\w$.]+)\((?P<args>.*)\)")
_FUNC_ARG = re.compile(
    r"%(?P<name>[\w.$-]+)\s*:\s*(?P<type>!tt\.ptr<[^>]*>|tensor<[^>]*>|[\w!.<>x]+?)"
    r"(?:\s*\{(?P<attrs>[^}]*)\})?(?:\s*loc\([^()]*(?:\([^()]*\))?\))?\s*(?:,|$)"
)


@dataclass(frozen=True)
class FuncArg:
    """A kernel argument as it appears in TTIR, with its specialization attributes."""

    index: int
    name: str
    type: str
    divisibility: int | None

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("!tt.ptr")


def func_args(ttir: str) -> list[FuncArg]:
    """Arguments of the first `tt.func` in a TTIR module."""
    for line in ttir.splitlines():
        m = _FUNC_HEADER.match(line)
        if not m:
            continue
        args = []
        for i, am in enumerate(_FUNC_ARG.finditer(m["args"])):
            div = re.search(r"tt\.divisibility\s*=\s*(\d+)", am["attrs"] or "")
            args.append(FuncArg(i, am["name"], am["type"], int(div.group(1)) if div else None))
        return args
    raise IRParseError("TTIR has no tt.func header: is this Triton IR?")


# --- values, types, attributes, aliases, regions: the syntax analyzers and indexers read through ---

# %5 = arith.muli %3, %4 : i32        %x:2 = scf.for ...        %cst = arith.constant dense<0.0> : ...
_SSA_DEF = re.compile(r"\s*(%[\w.$-]+)(?::\d+)?\s*=\s*(.*)")
# %x_5, %arg0, %c1_i32: an SSA value's name; `%1#0` (result 0 of %1) names %1
_SSA_NAME = re.compile(r"%[\w.$-]+")
# the same with its result index, as a line is normalized for comparison (%1#0 whole)
_SSA_REF = re.compile(r"%[\w.#-]+")
# ... loc(#loc20)     ... loc("/tmp/k/scale.py":9:5)     ... loc(callsite(#loc3 at #loc4))
_LOC_SUFFIX = re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)\s*$")
# tensor<128x64xf16, #blocked>   tensor<1024x!tt.ptr<f32>, #blocked>   tensor<?x4xi64>   memref<16x32xf32>
_SHAPED = re.compile(r"(?P<kind>tensor|memref)<(?P<shape>[\d?]+(?:x[\d?]+)*)x(?P<elt>!?[\w.]+(?:<[^<>]*>)?)"
                     r"(?:,\s*(?P<enc>#[\w.]+))?")
# inputPrecision = tf32    axis = 1 : i32    pendings = 0    {tt.divisibility = 16 : i32}
_ATTRIBUTE = "(?<![\\w.]){name}\\s*=\\s*(?P<value>[\\w.]+)"
# sizePerThread = [1, 4]    warpsPerCTA = [4, 1]
_INT_LIST = "(?<![\\w.]){name}\\s*=\\s*\\[(?P<values>[\\d, ]+)\\]"
# #blocked1 = #ttg.blocked<{sizePerThread = [4], ...}>   #mma = #ttg.nvidia_mma<{versionMajor = 3, ...}>
_ALIAS_DEF = re.compile(r"^(?P<name>#(?!loc)[A-Za-z_][\w.]*)\s*=\s*(?P<value>.+?)\s*$", re.MULTILINE)
ALIAS_REF = re.compile(r"#(?!loc)[A-Za-z_][\w.]*")
# `#ttg.nvidia_mma<{...}>`, `#ttg.shared_memory`, `#hivm.address_space<gm>`: a dialect attribute's kind.
_ATTRIBUTE_KIND = re.compile(r"#[A-Za-z_]\w*\.([A-Za-z_]\w*)")
# tt.func public @scale_kernel(...)   func.func @f()   llvm.func @k(...) attributes {nvvm.kernel = 1 : ui1}
_FUNCTION = re.compile(r"^\s*(?:tt\.func|func\.func|llvm\.func|func)\s+(?:public\s+|private\s+)?@(?P<name>[\w$.]+)")
# %5 = scf.for %arg3 = %c0 to %c8 step %c1 iter_args(...) -> (tensor<...>) {      scf.while (...) : (...) -> ... {
_LOOP_OPEN = re.compile(r"=?\s*scf\.(for|while)\b")


@dataclass(frozen=True)
class ShapedType:
    """A tensor or memref type: `tensor<128x64xf16, #blocked>` is ("tensor", (128, 64), "f16", "#blocked");
    a dynamic dimension (`?`) is -1."""

    kind: str
    shape: tuple[int, ...]
    element: str
    encoding: str = ""

    @property
    def static(self) -> bool:
        return -1 not in self.shape

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n if self.static else 0


def shaped_types(text: str, kind: str = "tensor") -> list[ShapedType]:
    """Every `kind` type (tensor or memref) written in `text`, in order."""
    return [ShapedType(m["kind"], tuple(-1 if d == "?" else int(d) for d in m["shape"].split("x")), m["elt"],
                       m["enc"] or "") for m in _SHAPED.finditer(text) if m["kind"] == kind]


def attribute(text: str, name: str) -> str | None:
    """The value of attribute `name` on an op line (`inputPrecision = tf32` -> "tf32"), if written."""
    m = re.search(_ATTRIBUTE.format(name=re.escape(name)), text)
    return m["value"] if m else None


def ssa_defs(text: str) -> dict[str, str]:
    """SSA value -> the rest of its defining line (`%5 = arith.muli %3, %4 : i32` -> "arith.muli ...")."""
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _SSA_DEF.match(line))}


def ssa_names(text: str) -> list[str]:
    """The SSA values named in `text`, in order (`arith.divsi %5, %c8_i32 : i32` -> ["%5", "%c8_i32"])."""
    return _SSA_NAME.findall(text)


def unused_results(text: str, ops: list[OpLine]) -> list[OpLine]:
    """Those of `ops` (lines of `text`) whose result no other line names: `%5 = tt.atomic_rmw ...` with %5
    read nowhere. An op without a result is not one of them."""
    counts = Counter(_SSA_NAME.findall(text))
    out = []
    for op in ops:
        m = _SSA_DEF.match(op.text)
        if m is not None and counts[m.group(1)] == 1:
            out.append(op)
    return out


def int_list_attribute(text: str, name: str) -> list[int]:
    """An integer-array attribute (`warpsPerCTA = [4, 1]` -> [4, 1]); [] when not written."""
    m = re.search(_INT_LIST.format(name=re.escape(name)), text)
    return [int(v) for v in m["values"].split(",")] if m else []


def blocked_layouts(text: str) -> dict[str, str]:
    """The module's blocked-layout aliases: `#blocked1` -> `#ttg.blocked<{sizePerThread = [4], ...}>`."""
    return {name: value for name, value in attribute_aliases(text).items()
            if value.startswith("#ttg.blocked<{") and value.endswith("}>")}


def alias_resolver(text: str) -> Callable[[str], str]:
    """Replaces the module's attribute aliases by what they stand for. The printer numbers aliases anew
    in every dump (#blocked1 in one is #blocked2 in the next), so only spelled-out lines compare."""
    aliases = attribute_aliases(text)
    for name, value in aliases.items():  # one level of nesting: #ttg.dot_op<{parent = #mma}>
        aliases[name] = ALIAS_REF.sub(lambda m: aliases.get(m[0], m[0]) if m[0] != name else m[0], value)
    return lambda line: ALIAS_REF.sub(lambda m: aliases.get(m[0], m[0]), line) if aliases else line


def without_names(line: str) -> str:
    """An op line as it compares across snapshots: its location dropped, its SSA names all `%_`."""
    return _SSA_REF.sub("%_", _LOC_SUFFIX.sub("", line))


def attribute_aliases(text: str) -> dict[str, str]:
    """Module-level attribute aliases (`#blocked1` -> `#ttg.blocked<{...}>`), locations excluded."""
    return {m["name"]: m["value"] for m in _ALIAS_DEF.finditer(text)}


def attribute_kinds(text: str) -> set[str]:
    """The dialect attribute kinds named in `text` (`#ttg.nvidia_mma<...>` -> nvidia_mma)."""
    return set(_ATTRIBUTE_KIND.findall(text))


def function_name(line: str) -> str | None:
    """The function a line defines (`tt.func public @scale_kernel(` -> scale_kernel), if it defines one."""
    m = _FUNCTION.match(line)
    return m["name"] if m else None


def in_loops(text: str) -> set[int]:
    """1-based line numbers of an MLIR module that lie inside an scf.for / scf.while body.

    Brace depth is tracked from each loop's opening line; MLIR prints one op per line, so region
    braces are the only braces that open and close across lines.
    """
    inside: set[int] = set()
    stack: list[int] = []  # brace depth at which each open loop started
    depth = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        code = line.split(" loc(")[0]
        if stack:
            inside.add(lineno)
        if _LOOP_OPEN.search(code) and code.rstrip().endswith("{"):
            stack.append(depth)
        depth += code.count("{") - code.count("}")
        while stack and depth <= stack[-1]:
            stack.pop()
    return inside
