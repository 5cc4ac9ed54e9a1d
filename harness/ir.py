"""The one parser of compiler text output: MLIR dump streams, diagnostics, MLIR locations, PTX, ptxas logs.

Regex-first on purpose: tree-sitter-mlir knows no Triton dialects, and dumps are line-oriented.
Every pattern carries a real example line. The indexer (`kb index ir`) and the diagnosis engine
both read IR through this module; nothing else parses IR text.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.artifacts import PtxasReport, Remark
from harness.files import entries_under, os_reason

__all__ = [
    "FuncArg",
    "IRDump",
    "IRParseError",
    "IRStage",
    "MemAccess",
    "PassSnapshot",
    "SourceLoc",
    "compile_config",
    "diff_op_counts",
    "func_args",
    "kernel_base",
    "mlir_locations",
    "op_counts",
    "op_source_lines",
    "parse_ptxas_log",
    "parse_remarks",
    "ptx_memory_accesses",
    "read_ir_dump",
    "split_pass_dumps",
    "stage_op_counts",
]


class IRParseError(ValueError):
    """Malformed IR text; the message names the input and line."""


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


# ---------------------------------------------------------------------------------------------
# MLIR_ENABLE_DUMP streams

# Triton (3.x) pass manager, e.g.
# // -----// IR Dump Before TritonGPUCoalesce: tritongpu-coalesce ('builtin.module' operation) //----- //
# // -----// IR Dump Before ConvertTritonGPUToLLVM: convert-triton-gpu-to-llvm{compute-capability=90} ('builtin.module' operation) //----- //
_TRITON_DUMP_HEADER = re.compile(
    r"^// -----// IR Dump (?P<when>Before|After) (?P<cls>[\w:.]+)(?P<failed> Failed)?: (?P<arg>[\w.-]+)"
    r"(?P<opts>\{.*?\})?\s*"
    r"\('(?P<anchor>[\w.]+)' operation(?::\s*@(?P<func>[\w.$]+))?\)\s*//----- //\s*$"
)
# Upstream MLIR / bishengir (--mlir-print-ir-after-all), e.g.
# // -----// IR Dump After CSE (cse) //----- //
# // -----// IR Dump After HIVMPlanMemory (hivm-plan-memory) ('func.func' operation: @add_kernel) //----- //
# // -----// IR Dump After HIVMLoadVectorize Failed (hivm-load-vectorize) //----- //   (--mlir-print-ir-after-failure)
_MLIR_DUMP_HEADER = re.compile(
    r"^// -----// IR Dump (?P<when>Before|After) (?P<cls>[\w:.]+)(?P<failed> Failed)? \((?P<arg>[\w.-]+)\)"
    r"(?:\s*\('(?P<anchor>[\w.]+)' operation(?::\s*@(?P<func>[\w.$]+))?\))?\s*//----- //\s*$"
)
# Either header, whole or in part, as a user pastes it from a log: "IR Dump Before TritonGPUCoalesce"
# names the class alone.
_HEADER_PASS = re.compile(r"IR Dump (?:Before|After) (?P<cls>[\w.]+(?:::[\w.]+)*)(?: Failed)?"
                          r"(?:(?::\s*|\s+\()(?P<arg>[\w.-]+))?")


def dump_header_pass(text: str) -> str | None:
    """The pass named in an "IR Dump Before/After X" header: its argument (`tritongpu-coalesce`)
    where the header has one, else its class (`TritonGPUCoalesce`); None for other text."""
    m = _HEADER_PASS.search(text)
    return (m["arg"] or m["cls"]) if m else None


# Triton's software pipeliner prints its own internal steps inside tritongpu-pipeline's section, e.g.
# // -----// SoftwarePipeliner internal IR Dump After: LowerLoops
_PIPELINER_HEADER = re.compile(r"^// -----// (?P<cls>SoftwarePipeliner) internal\s+(?:IR Dump\s+)?After: (?P<step>\w+)")


@dataclass
class PassSnapshot:
    """IR text as printed before (or after) one pass ran.

    Attributes:
        index: position in the stream, from 0.
        when: "Before" or "After".
        pass_class: C++ class name, e.g. "TritonGPUCoalesce".
        pass_arg: command-line argument, e.g. "tritongpu-coalesce" (links to TableGen `Pass<"...">`).
        options: the printed option block, e.g. "{num-stages=3}", or "".
        anchor: the op the pass ran on ("builtin.module", "tt.func", ...).
        header_line: 1-based line of the header in the stream.
        text: the IR that follows the header, up to the next header.
        func: the function a function-scoped pass ran on (`('func.func' operation: @add_kernel)`), else "".
        failed: an "IR Dump After X Failed" section (--mlir-print-ir-after-failure): the IR the pass left
            when it failed.
    """

    index: int
    when: str
    pass_class: str
    pass_arg: str
    options: str
    anchor: str
    header_line: int
    text: str = ""
    func: str = ""
    failed: bool = False


def _match_header(line: str) -> re.Match[str] | None:
    """A pass-manager dump header ("IR Dump Before/After X"); not a pass's own internal dumps."""
    if not line.startswith("// -----//"):
        return None
    return _TRITON_DUMP_HEADER.match(line) or _MLIR_DUMP_HEADER.match(line)


def split_pass_dumps(text: str, unreadable: list[int] | None = None) -> list[PassSnapshot]:
    """Split an MLIR_ENABLE_DUMP / --mlir-print-ir-*-all stream into per-pass snapshots.

    Lines that are not IR (diagnostics, ptxas output) stay inside the section they appear in;
    `parse_remarks` uses the same sectioning to name the pass that emitted each diagnostic. Dump
    headers that cannot be read (cut short by a killed run, or of an unknown form) also stay in the
    section before; their line numbers are appended to `unreadable` when given.
    """
    snapshots: list[PassSnapshot] = []
    body: list[str] = []
    internal = False  # inside a pass's own internal dump (the pipeliner's LowerLoops, ExpandLoops)
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _match_header(line)
        if m is None:
            if line.startswith("// -----//") and _PIPELINER_HEADER.match(line):
                # A mid-pass module: neither what the pass received nor what it left. Kept out of the
                # section, or the pass before would seem to triple the module's ops.
                internal = True
                continue
            if unreadable is not None and line.startswith("// -----// IR Dump"):
                unreadable.append(lineno)
            if snapshots and not internal:
                body.append(line)
            elif internal and _DIAGNOSTIC.match(line):
                body.append(line)  # the pass is still running: its diagnostics stay in its section
            continue
        internal = False
        if snapshots:
            snapshots[-1].text = "\n".join(body).strip("\n")
        body = []
        groups = m.groupdict()
        snapshots.append(
            PassSnapshot(
                index=len(snapshots),
                when=groups.get("when") or "Before",
                pass_class=groups["cls"],
                pass_arg=groups["arg"],
                options=groups.get("opts") or "",
                anchor=groups.get("anchor") or "",
                header_line=lineno,
                func=groups.get("func") or "",
                failed=bool(groups.get("failed")),
            )
        )
    if snapshots:
        snapshots[-1].text = "\n".join(body).strip("\n")
    return snapshots


# ---------------------------------------------------------------------------------------------
# Diagnostics (MLIR_ENABLE_DIAGNOSTICS=remarks,warnings)

# /tmp/k/scale.py:8:9: remark: Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1
# /tmp/k/mm.py:15:16: note: Target compute capability (90) supports MMA v3.
_DIAGNOSTIC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<sev>remark|warning|note|error): (?P<msg>.*\S)\s*$"
)


def parse_remarks(text: str) -> list[Remark]:
    """Compiler diagnostics in `text`, each tagged with the pass whose dump section it appeared in.

    A pass's diagnostics print while it runs, i.e. after its own "IR Dump Before" header and before
    the next one, so the enclosing section names the emitting pass. Duplicates (the same diagnostic
    printed for several pattern applications) are kept once.
    """
    remarks: list[Remark] = []
    seen: set[tuple[str, int, int, str, str]] = set()
    current_pass = ""
    for line in text.splitlines():
        header = _match_header(line)
        if header is not None:
            current_pass = header.group("arg") if "when" in header.groupdict() else ""
            if header.groupdict().get("when") == "After":
                # An "After X" dump prints once X is done: what follows belongs to no known pass yet.
                current_pass = ""
            continue
        m = _DIAGNOSTIC.match(line)
        if m is None:
            continue
        key = (m["file"], int(m["line"]), int(m["col"]), m["sev"], m["msg"])
        if key in seen:
            continue
        seen.add(key)
        remarks.append(
            Remark(
                file=m["file"],
                line=int(m["line"]),
                col=int(m["col"]),
                severity=m["sev"],
                message=m["msg"],
                pass_name=current_pass,
            )
        )
    return remarks


# ---------------------------------------------------------------------------------------------
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
            # The callee location is where the op is written; the caller is the call site.
            loc = resolve(m["callee"], depth + 1)
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


def _op_target(op: str, line: str) -> str:
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
    out: list[OpLine] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("#", "//", "module", "}")):
            continue
        m = _OP_LINE.match(line)
        if m is None:
            continue
        op = m["op"]
        if ops is not None and op not in ops:
            continue
        out.append(OpLine(lineno, op, line.strip(), _op_loc(line, locs), _op_target(op, line)))
    return out


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


# ---------------------------------------------------------------------------------------------
# PTX

# 	.file	1 "/tmp/k/scale.py"
_PTX_FILE = re.compile(r'^\s*\.file\s+(?P<id>\d+)\s+"(?P<path>[^"]+)"')
# 	.loc	1 8 9                           // scale.py:8:9
_PTX_LOC = re.compile(r"^\s*\.loc\s+(?P<id>\d+)\s+(?P<line>\d+)\s+(?P<col>\d+)")
# 	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
# 	st.global.b32 [ %rd3 + 0 ], { %r9 };
# 	atom.global.gpu.acq_rel.add.f32 %f1, [%rd1], %f2;
_PTX_MEM = re.compile(
    r"^\s*(?P<pred>@!?%p\w*\s+)?(?P<inst>(?P<kind>ld|st|atom|red)\.global[\w.]*)\s"
)
_PTX_VEC = re.compile(r"\.v(?P<n>[248])\b")
_PTX_WIDTH = re.compile(r"\.[bfsu](?P<bits>8|16|32|64|128)\b")


@dataclass(frozen=True)
class MemAccess:
    """One global-memory instruction in PTX.

    Attributes:
        kind: "load", "store" or "atomic".
        instruction: the mnemonic, e.g. "ld.global.v4.b32".
        vector: elements per instruction (1, 2, 4 or 8).
        element_bits: bits per element of the instruction type.
        predicated: guarded by a predicate (a mask, or a redundant-thread guard).
        ptx_line: 1-based line in the PTX text.
        loc: kernel source location from the preceding `.loc` directive.
    """

    kind: str
    instruction: str
    vector: int
    element_bits: int
    predicated: bool
    ptx_line: int
    loc: SourceLoc | None

    @property
    def bits(self) -> int:
        return self.vector * self.element_bits


_KIND = {"ld": "load", "st": "store", "atom": "atomic", "red": "atomic"}


def ptx_memory_accesses(ptx: str) -> list[MemAccess]:
    """Global loads, stores and atomics in PTX, each mapped to its kernel source line."""
    lines = ptx.splitlines()
    files = {m["id"]: m["path"] for line in lines if (m := _PTX_FILE.match(line))}
    out: list[MemAccess] = []
    loc: SourceLoc | None = None
    for lineno, line in enumerate(lines, start=1):
        if m := _PTX_LOC.match(line):
            path = files.get(m["id"])
            if path is None and "//" in line:
                path = line.split("//", 1)[1].strip().rsplit(":", 2)[0]
            loc = SourceLoc(path or f"file{m['id']}", int(m["line"]), int(m["col"]))
            continue
        m = _PTX_MEM.match(line)
        if m is None:
            continue
        inst = m["inst"]
        vec = _PTX_VEC.search(inst)
        width = _PTX_WIDTH.findall(inst)
        out.append(
            MemAccess(
                kind=_KIND[m["kind"]],
                instruction=inst,
                vector=int(vec["n"]) if vec else 1,
                element_bits=int(width[-1]) if width else 0,
                predicated=bool(m["pred"]),
                ptx_line=lineno,
                loc=loc,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# ptxas -v

# ptxas-blackwell info    : Function properties for center_kernel
#     2976 bytes stack frame, 7880 bytes spill stores, 10368 bytes spill loads
# ptxas-blackwell info    : Used 64 registers, used 0 barriers, 2976 bytes cumulative stack size
# ptxas info    : Used 40 registers, 16384 bytes smem, 380 bytes cmem[0]
_PTXAS_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (?P<regs>\d+) registers")
_PTXAS_SMEM = re.compile(r"(?P<smem>\d+) bytes smem")


def parse_ptxas_log(text: str) -> PtxasReport | None:
    """The resource report in a `ptxas -v` log, or None when `text` holds none."""
    lines = [ln for ln in text.splitlines() if "ptxas" in ln or "bytes stack frame" in ln]
    joined = "\n".join(lines)
    regs = _PTXAS_REGS.search(joined)
    if regs is None:
        return None
    frame = _PTXAS_FRAME.search(joined)
    smem = _PTXAS_SMEM.search(joined)
    return PtxasReport(
        registers=int(regs["regs"]),
        spill_stores=int(frame["stores"]) if frame else 0,
        spill_loads=int(frame["loads"]) if frame else 0,
        stack_frame=int(frame["stack"]) if frame else 0,
        shared_bytes=int(smem["smem"]) if smem else 0,
        raw=joined,
    )


# ---------------------------------------------------------------------------------------------
# IR dumps on disk: every format `kb index ir` accepts, read into one list of stages

# Compile-stage files, in pipeline order. Triton's TRITON_KERNEL_DUMP / TRITON_DUMP_DIR write
# `<hash>/<kernel>.{ttir,ttgir,llir,ptx,json}`; triton-ascend's TRITON_DEBUG writes
# `kernel.ttir.mlir`, `kernel.ttadapter.mlir` (after triton-adapter) and `kernel.mlir` (bishengir input).
STAGE_ORDER = (".source", ".ttir", ".ttir.mlir", ".ttgir", ".ttadapter.mlir", ".mlir", ".llir", ".ll", ".ptx",
               ".amdgcn")
_STAGE_LANG = {".ttir": "mlir", ".ttir.mlir": "mlir", ".ttgir": "mlir", ".ttadapter.mlir": "mlir", ".mlir": "mlir",
               ".llir": "llvm", ".ll": "llvm", ".ptx": "ptx", ".amdgcn": "amdgcn", ".source": "python"}
_DUMP_TEXT_SUFFIXES = (".txt", ".log", ".err", ".dump", ".stderr")
# A whole run's MLIR_ENABLE_DUMP stream of a few kernels is tens of MB; past this a file is read whole
# into memory for nothing a trace could show.
MAX_DUMP_BYTES = 512 * 2**20
_MAX_BAD_BYTES = 16  # stray non-UTF-8 bytes replaced before a file counts as another encoding


@dataclass
class IRStage:
    """One snapshot of a kernel's IR: a pass dump section or a whole compile-stage file.

    Attributes:
        kernel: the kernel's function name (`copy_kernel`; `copy_kernel#2` for a second compile of it in
            one stream), else the dump file's stem.
        name: pass class (`TritonGPUCoalesce`) or stage (`ttgir`).
        pass_arg: pass argument (`tritongpu-coalesce`), or the stage name for stage files.
        kind: "pass" (a section of a dump stream) or "stage" (a compile-stage file).
        when: "Before" / "After" for pass sections, "" for stage files.
        lang: "mlir", "llvm", "ptx", ...
        source: the file it was read from; line: 1-based line of its header there (1 for files).
        left_out_before: passes whose sections just before this one were malformed and left out:
            a change measured against the snapshot before them is theirs too.
    """

    kernel: str
    name: str
    pass_arg: str
    kind: str
    when: str
    lang: str
    text: str
    source: str
    line: int
    left_out_before: list[str] = field(default_factory=list)


@dataclass
class IRDump:
    stages: list[IRStage]
    problems: list[str]  # "file:line: what is wrong" for sections that could not be read
    skipped: list[str]  # files left out, with why
    notes: list[str] = field(default_factory=list)  # "file:line: ..." worth knowing, not errors (a failed pass)
    # kernel -> its compile options, from the `<kernel>.json` Triton writes beside the stage files in
    # TRITON_CACHE_DIR, else from its TTGIR module's attributes: what tells two compiles of a kernel apart.
    configs: dict[str, dict[str, object]] = field(default_factory=dict)


# The options that change the code a kernel compiles to, in the order they are shown.
_CONFIG_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "shared", "enable_fp_fusion", "triton_version")


def compile_config(metadata: dict[str, object]) -> dict[str, object]:
    """The compile options worth showing from a Triton metadata JSON: target (`cuda:90`), warps,
    stages, CTAs, register cap, shared memory bytes, fp fusion and Triton version, where present."""
    config: dict[str, object] = {}
    target = metadata.get("target")
    if isinstance(target, dict) and "backend" in target:
        config["target"] = f"{target['backend']}:{target.get('arch', '?')}"
    for key in _CONFIG_KEYS:
        if metadata.get(key) is not None:
            config[key] = metadata[key]
    return config


def _stage_suffix(name: str) -> str:
    for suffix in sorted(STAGE_ORDER, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return ""


def _brace_problem(text: str, first_line: int = 1) -> tuple[int, str]:
    """A truncated module shows as unbalanced braces; strings are skipped so `"{"` does not count.
    Returns (the line to look at, what is wrong), or (0, "") when the braces balance. Line numbers
    count from `first_line` (the text's line in its file)."""
    depth, first_open = 0, 0
    for lineno, line in enumerate(text.splitlines(), start=first_line):
        code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line.split("//", 1)[0] if line.lstrip().startswith("//") else line)
        for ch in code:
            if ch == "{":
                if depth == 0:
                    first_open = lineno
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth < 0:
                    return lineno, f"unexpected '}}' at line {lineno}"
    if depth:
        return first_open, f"{depth} unclosed '{{' (the block opened at line {first_open} never closes: truncated?)"
    return 0, ""


def read_ir_dump(path: str | os.PathLike[str]) -> IRDump:
    """Read a dump file or directory into ordered stages.

    Accepts an MLIR_ENABLE_DUMP / `--mlir-print-ir-after-all` stream, a TRITON_KERNEL_DUMP /
    TRITON_DUMP_DIR directory (one subdirectory per kernel hash), a triton-ascend TRITON_DEBUG
    directory, or a single stage file. Malformed sections are reported in `problems` with file and
    line and left out; they never raise.
    """
    root = Path(path)
    if not root.exists():
        raise IRParseError(f"{root}: no such file or directory")
    dump = IRDump([], [], [])
    files = [root] if root.is_file() else [p for p in entries_under(
        root, lambda rel, reason: dump.skipped.append(f"{rel}/: unreadable directory ({reason})")) if p.is_file()]
    stage_files: dict[tuple[str, str], list[tuple[str, Path, str]]] = {}  # (stem, directory) -> stages
    metadata_files: dict[tuple[str, str], tuple[str, str]] = {}  # (stem, directory) -> (rel, text)
    for file in files:
        rel = file.name if file == root else file.relative_to(root).as_posix()
        try:
            size = file.stat().st_size
            with open(file, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:  # unreadable (permissions, gone since the walk): skipped and named
            dump.skipped.append(f"{rel}: unreadable ({os_reason(exc)})")
            continue
        if b"\0" in head:
            dump.skipped.append(f"{rel}: binary")
            continue
        if size > MAX_DUMP_BYTES:
            dump.skipped.append(f"{rel}: too large ({size / 2**20:,.0f} MiB, the limit is "
                                f"{MAX_DUMP_BYTES // 2**20} MiB); dump one kernel: MLIR_ENABLE_DUMP=<kernel name>")
            continue
        try:
            raw = file.read_bytes()
        except OSError as exc:
            dump.skipped.append(f"{rel}: unreadable ({os_reason(exc)})")
            continue
        text = _dump_text(rel, raw, dump)
        if text is None:
            continue
        suffix = _stage_suffix(file.name)
        if "// -----// IR Dump" in text:
            _read_stream(text, rel, file.stem, dump)
        elif suffix and suffix != ".source":
            stage_files.setdefault(_stage_kernel(root, file, suffix), []).append((suffix, file, text))
        elif file.suffix == ".json" and not file.name.startswith("__grp__"):
            metadata_files[_stage_kernel(root, file, ".json")] = (rel, text)
        elif file.suffix == ".json" or file.suffix in _DUMP_TEXT_SUFFIXES or suffix == ".source":
            dump.skipped.append(f"{rel}: no IR in it")
        else:
            dump.skipped.append(f"{rel}: not a known IR dump file")
    # A kernel is named as its function is; the dump directory (a cache hash) only tells apart two
    # compiles of one kernel. triton-ascend's TRITON_DEBUG files are all `kernel.*`.
    names = {key: key[0] if key[0] != "kernel" else _kernel_function(items[0][2]) or key[1]
             for key, items in stage_files.items()}
    compiles = Counter(names.values())
    for (stem, directory), items in sorted(stage_files.items()):
        base = names[stem, directory]
        kernel = base if compiles[base] == 1 else f"{base}@{directory[:12]}"
        if (stem, directory) in metadata_files:
            _read_metadata(*metadata_files.pop((stem, directory)), kernel, dump)
        for suffix, file, text in sorted(items, key=lambda item: STAGE_ORDER.index(item[0])):
            rel = file.name if file == root else file.relative_to(root).as_posix()
            lang = _STAGE_LANG[suffix]
            line, problem = _brace_problem(text) if lang in ("mlir", "llvm") else (0, "")
            if not text.strip():
                dump.problems.append(f"{rel}:1: empty {suffix} file")
                continue
            if problem:
                dump.problems.append(f"{rel}:{line}: {problem}")
                continue
            dump.stages.append(IRStage(kernel, file.name, suffix.lstrip(".").removesuffix(".mlir") or "mlir", "stage",
                                       "", lang, text, rel, 1))
            if kernel not in dump.configs and suffix == ".ttgir" and (config := _module_config(text)):
                dump.configs[kernel] = config  # TRITON_DUMP_DIR has no metadata JSON
    dump.skipped.extend(f"{rel}: no IR in it" for rel, _ in metadata_files.values())
    dump.skipped.sort()
    return dump


def _dump_text(rel: str, raw: bytes, dump: IRDump) -> str | None:
    """The file's text; a few stray bytes (a Latin-1 path in a location) are replaced and noted, more
    mean another encoding and skip the file."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        text = raw.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        if bad > max(_MAX_BAD_BYTES, len(raw) // 100):
            dump.skipped.append(f"{rel}: not UTF-8 ({bad} undecodable bytes, the first at line {line})")
            return None
        dump.notes.append(f"{rel}:{line}: {bad} byte(s) that are not UTF-8 replaced by U+FFFD")
        return text


# module attributes {"ttg.num-ctas" = 1 : i32, "ttg.num-warps" = 4 : i32, ttg.target = "cuda:90", ...}
_MODULE_ATTR = re.compile(r'"?ttg\.(?P<key>num-warps|num-ctas|target)"?\s*=\s*(?:(?P<n>\d+)|"(?P<s>[^"]*)")')


def _module_config(ttgir: str) -> dict[str, object]:
    """Target, warps and CTAs from a TTGIR module's attributes: what a dump without metadata JSON tells."""
    head = _MODULE_START.search(ttgir)
    line = ttgir[head.start(): ttgir.find("\n", head.start())] if head else ""
    found = {m["key"]: int(m["n"]) if m["n"] else m["s"] for m in _MODULE_ATTR.finditer(line)}
    config: dict[str, object] = {"target": found["target"]} if "target" in found else {}
    config.update({f"num_{k[4:]}": found[k] for k in ("num-warps", "num-ctas") if k in found})
    return config


def _read_metadata(rel: str, text: str, kernel: str, dump: IRDump) -> None:
    try:
        metadata = json.loads(text)
    except json.JSONDecodeError as exc:
        dump.problems.append(f"{rel}:{exc.lineno}: compile metadata is not valid JSON ({exc.msg}); "
                             "the kernel's stages are kept without it")
        return
    if not isinstance(metadata, dict):
        dump.problems.append(f"{rel}:1: compile metadata is a JSON {type(metadata).__name__}, not an object; "
                             "the kernel's stages are kept without it")
        return
    dump.configs[kernel] = compile_config(metadata)


def kernel_base(kernel: str) -> str:
    """The kernel a compile belongs to, as `read_ir_dump` names compiles: `scale_kernel#2` (the second
    compile in a stream) and `scale_kernel@<cache hash>` (one of several in a directory) -> `scale_kernel`."""
    return re.split(r"[#@]", kernel)[0]


def _stage_kernel(root: Path, file: Path, suffix: str) -> tuple[str, str]:
    """(file stem, its directory's name) of a compile-stage file: `<hash>/copy_kernel.ttgir` ->
    ("copy_kernel", "<hash>")."""
    directory = file.parent.relative_to(root).as_posix() if file != root else ""
    return file.name[: -len(suffix)], root.name if directory in ("", ".") else directory


# tt.func public @copy_kernel(...) {   llvm.func @copy_kernel(...) attributes {nvvm.kernel = 1 : ui1, ...} {
# func.func @add_kernel(...) {         but not a declaration: llvm.func @__nv_erff(f32) -> f32
_FUNC_DEF = re.compile(r"^\s*(?:tt|llvm|func)\.func\s+(?P<vis>(?:public|private|internal)\s+)?@(?P<name>[\w$.]+)"
                       r"(?P<rest>.*)$", re.MULTILINE)


def _kernel_function(ir: str) -> str | None:
    """The kernel a module holds: its first function defined with a body that is not private (libdevice
    and other callees are declarations or private helpers)."""
    defined = [m for m in _FUNC_DEF.finditer(ir) if m["rest"].rstrip().endswith("{") and (m["vis"] or "").strip()
               != "private"]
    public = [m for m in defined if (m["vis"] or "").strip() == "public" or "nvvm.kernel" in m["rest"]]
    chosen = (public or defined or [None])[0]
    return chosen["name"] if chosen else None


def _lowering_level(ir: str) -> int:
    """How far down Triton's pipeline a module is: 0 TTIR, 1 TTGIR (layouts), 2 LLVM dialect."""
    if re.search(r"^\s*llvm\.func\b", ir, re.MULTILINE):
        return 2
    return 1 if "ttg." in ir else 0


_MODULE_START = re.compile(r"^module\b", re.MULTILINE)


def _read_stream(text: str, rel: str, stem: str, dump: IRDump) -> None:
    """Sections of one stream, each credited to the kernel whose function it holds: the stream of
    a whole run holds the pipelines of several kernels one after another, or of several compiles of
    one (autotuning). A module-scoped section naming another kernel than the module-scoped one
    before it, or a module back at a higher level than its kernel was last seen at, starts a new
    compile. Function-scoped sections (`('func.func' operation: @f)`) interleave the functions of
    one module and go each to its function's pipeline."""
    labels: dict[str, str] = {}  # function -> its pipeline's kernel name (`copy_kernel#2`)
    levels: dict[str, int] = {}  # function -> lowering level of its latest section
    compiles: Counter[str] = Counter()
    module_name = name = stem
    left_out: list[str] = []  # malformed sections since the last stage kept
    unreadable: list[int] = []
    snapshots = split_pass_dumps(text, unreadable)
    # A header cut short (a killed run) or of an unknown form would otherwise vanish into the section before.
    dump.notes += [f"{rel}:{lineno}: a dump header kb cannot read (cut short?); what follows it is counted with "
                   "the section before" for lineno in unreadable]
    for snap in snapshots:
        # Triton anchors passes on functions too (`('llvm.func' operation: @__nv_erff)`) but prints the
        # whole module; only a section that holds no module shows that one function.
        func = snap.func if snap.func and not _MODULE_START.search(snap.text) else ""
        this_name = func or _kernel_function(snap.text) or name
        this_level = _lowering_level(snap.text)
        switched = not func and this_name != module_name and module_name in labels
        if this_name not in labels or this_level < levels[this_name] or switched:
            compiles[this_name] += 1
            labels[this_name] = this_name if compiles[this_name] == 1 else f"{this_name}#{compiles[this_name]}"
        levels[this_name], name = this_level, this_name
        if not func:
            module_name = this_name
        kernel = labels[this_name]
        where = f"{rel}:{snap.header_line}"
        if snap.failed:
            dump.notes.append(f"{where}: {snap.pass_arg} failed on {kernel}; its section holds the IR it left")
        # Diagnostics print inside sections; blanking them keeps line numbers true to the file.
        body = "\n".join("" if _DIAGNOSTIC.match(ln) else ln for ln in snap.text.splitlines())
        if not body.strip():
            dump.problems.append(f"{where}: empty IR section after the header for {snap.pass_arg}")
            left_out.append(snap.pass_arg)
            continue
        _, problem = _brace_problem(_module_part(body), snap.header_line + 1)
        if problem:
            dump.problems.append(f"{where}: section for {snap.pass_arg}: {problem}")
            left_out.append(snap.pass_arg)
            continue
        dump.stages.append(IRStage(kernel, snap.pass_class, snap.pass_arg, "pass", snap.when, "mlir", body, rel,
                                   snap.header_line, left_out))
        left_out = []


def _module_part(body: str) -> str:
    """The IR of a section without trailing tool output (a ptxas log, Python prints): everything up
    to the last `}` or `#loc` line after the module opens. A module that never closes keeps all its
    lines, so the brace check sees the truncation."""
    lines = body.splitlines()
    opened = next((i for i, ln in enumerate(lines) if "{" in ln and not ln.startswith("#")), None)
    if opened is None:
        return body
    last = max((i for i, ln in enumerate(lines) if i > opened and ln.startswith(("}", "#loc"))), default=None)
    return body if last is None else "\n".join(lines[: last + 1])


# %5 = load <4 x float>, ptr addrspace(1) %4, align 16      store <4 x float> %9, ptr addrspace(1) %8
# %12 = call float @llvm.nvvm.ex2.approx.f(float %11)
# %20 = tail call { i32, i32 } asm sideeffect "mov.u32 $0, 0x0;\0A\09@$3 ld.global.v2.b32 { $0, $1 }, [ $2 + 0 ];", ...
_LLVM_INST = re.compile(r"^\s*(?:%[\w.]+\s*=\s*)?(?:(?:tail|musttail|notail) )?(?P<inst>load|store|call|fmul|fadd|"
                        r"fdiv|atomicrmw|cmpxchg|getelementptr|shufflevector|extractelement|insertelement)\b"
                        r"(?P<rest>.*)$")
_LLVM_VEC = re.compile(r"<(?P<n>\d+) x (?P<t>\w+)>")
_LLVM_CALLEE = re.compile(r"@(?P<callee>[\w.$]+)\(")
_PTX_INST = re.compile(r"^\s*(?:@!?%p\w*\s+)?(?P<inst>[a-z][\w.]*)\s")


def stage_op_counts(text: str, lang: str) -> Counter[str]:
    """Op counts comparable along a pipeline: MLIR ops, LLVM instructions (with vector width and
    callee, e.g. `load <4 x float>`, `call @llvm.nvvm.ex2.approx.f`), PTX mnemonics (`ld.global.v4.b32`)."""
    if lang == "mlir":
        return op_counts(text)
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if lang == "llvm":
            m = _LLVM_INST.match(line)
            if m is None:
                continue
            inst, rest = m["inst"], m["rest"]
            if inst == "call":
                callee = _LLVM_CALLEE.search(rest)
                if callee:
                    counts[f"call @{callee['callee']}"] += 1
                elif " asm " in rest:  # call void asm sideeffect "@$2 st.global.v4.b32 ...", "..."(...)
                    counts[f"call asm({_op_target('llvm.inline_asm', rest)})"] += 1
                else:
                    counts["call"] += 1
            elif inst in ("load", "store") and (vec := _LLVM_VEC.search(rest)):
                counts[f"{inst} <{vec['n']} x {vec['t']}>"] += 1
            else:
                counts[inst] += 1
        elif lang == "ptx":
            m = _PTX_INST.match(line)
            if m and not line.lstrip().startswith((".", "//", "$")):
                counts[m["inst"]] += 1
    return counts
