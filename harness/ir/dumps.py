"""IR dumps on disk: every format `kb index ir` accepts (dump directories, pass-dump streams, triton-ascend
TRITON_DEBUG output), read into one list of stages."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.ir.common import IRParseError
from harness.ir.files import entries_under, os_reason
from harness.ir.streams import DIAGNOSTIC_LINE, split_pass_dumps

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
    chosen = (public or defined)[:1]
    return chosen[0]["name"] if chosen else None


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
        body = "\n".join("" if DIAGNOSTIC_LINE.match(ln) else ln for ln in snap.text.splitlines())
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
