"""Index IR dumps: what each pass (or compile stage) changed, searchable and traceable.

Reads dumps through `harness.ir.read_ir_dump` (the one IR parser), then for every snapshot that
differs from the one before it records the op-count change, the kernel source lines of the ops it
introduced or removed, and a short diff. Those records become chunks (corpus `ir`, release = the
dump's name), `ir-pass` symbols and `introduces` / `removes` links, and a timeline file that
`kb ir trace` reads to answer "which pass introduced this convert_layout".
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UserFacingError
from harness.ir import (
    IRDump,
    IRStage,
    alias_resolver,
    attribute_kinds,
    op_source_lines,
    read_ir_dump,
    stage_op_counts,
    without_names,
)
from kb.home import KBHome
from kb.index import Chunk, Manifest, publish, texts_to_embed
from kb.releases import IR_CORPUS, check_release_name
from kb.symbols import Link, SourceFile, Symbol, SymbolStore

if TYPE_CHECKING:
    from kb.embed import OfflineEmbedding


__all__ = ["IR_CORPUS", "StepChange", "Timeline", "describe_config", "index_ir_dump", "load_timeline",
           "summarize_dump"]

_DIFF_LINES = 40


@dataclass
class StepChange:
    """What one pass or stage did to the IR, relative to the snapshot before it.

    Attributes:
        index: position in the kernel's pipeline, from 0.
        kernel, name, pass_arg, kind, source, line: from the snapshot (see `harness.ir.IRStage`).
        counts_before: op -> count in the IR this step received.
        counts: op -> count in the IR this step left (equal to counts_before when unknown: the last
            pass of a "Before" stream has no later snapshot; see `after_known`).
        delta: op -> change in count (only ops that changed).
        introduced_at: op -> kernel source lines ("file:line") of the ops this step added.
        diff: a short unified diff of the op lines (SSA names and locations normalized away).
    """

    index: int
    kernel: str
    name: str
    pass_arg: str
    kind: str
    source: str
    line: int
    counts_before: dict[str, int]
    counts: dict[str, int]
    after_known: bool = True
    delta: dict[str, int] = field(default_factory=dict)
    introduced_at: dict[str, list[str]] = field(default_factory=dict)
    diff: str = ""
    # False when the snapshot before is in another IR language (ttgir -> llir): counts_before is
    # then unknown, and the ops present are new in this IR rather than added by the step.
    compared: bool = True
    # Passes whose malformed sections were left out inside this change: it is theirs as much as this step's.
    spans_left_out: list[str] = field(default_factory=list)
    # op -> [lines added, lines removed], for every op whose lines changed (MLIR). A pass that turns two
    # convert_layouts into two others changes no count: this is where it shows (+2/-2).
    churn: dict[str, list[int]] = field(default_factory=dict)
    # Layout (attribute) kinds that first appear in the IR this step left, or that it was the last to
    # hold: accelerate-matmul brings `nvidia_mma` in by rewriting a convert_layout, which changes no count.
    layouts_new: list[str] = field(default_factory=list)
    layouts_gone: list[str] = field(default_factory=list)
    # The kinds in a kernel's first snapshot: no step before it to have brought them in.
    layouts_at_start: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.delta or self.diff or self.churn or self.layouts_new or self.layouts_gone)


def _normalized_ops(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#loc", "//")):
            continue
        out.append(without_names(stripped))
    return out


@dataclass
class _Measured:
    """What a snapshot is compared on, computed once per snapshot."""

    counts: dict[str, int]
    locations: dict[str, list[str]]  # op -> kernel lines ("file:line") where it appears (MLIR only)
    ops: list[str]  # normalized op lines, for the diff
    lines: dict[str, Counter[str]] = field(default_factory=dict)  # op -> its lines, layouts spelled out (MLIR only)
    layouts: frozenset[str] = frozenset()  # attribute kinds named anywhere in the module (MLIR only)


def _measure(stage: IRStage) -> _Measured:
    if stage.lang != "mlir":
        return _Measured(dict(stage_op_counts(stage.text, stage.lang)), {}, _normalized_ops(stage.text))
    lines = op_source_lines(stage.text)  # one pass over the module serves counts, locations and lines
    counts = dict(Counter(op.key for op in lines))
    locations: dict[str, list[str]] = {}
    spelled_out = alias_resolver(stage.text)
    by_op: dict[str, Counter[str]] = {}
    for op in lines:
        by_op.setdefault(op.key, Counter())[spelled_out(without_names(op.text))] += 1
        if op.loc is not None:
            where = f"{Path(op.loc.file).name}:{op.loc.line}"
            if where not in locations.setdefault(op.key, []):
                locations[op.key].append(where)
    return _Measured(counts, locations, _normalized_ops(stage.text), by_op,
                     frozenset(attribute_kinds(stage.text)))


def _churn(before: _Measured, after: _Measured) -> dict[str, list[int]]:
    churn = {}
    for op in sorted(set(before.lines) | set(after.lines)):
        old, new = before.lines.get(op, Counter()), after.lines.get(op, Counter())
        added, removed = sum((new - old).values()), sum((old - new).values())
        if added or removed:
            churn[op] = [added, removed]
    return churn


def summarize_dump(dump: IRDump, progress: Callable[[int, int], None] | None = None) -> list[StepChange]:
    """Per-kernel sequence of steps with what each changed; `progress(done, total)` after each snapshot
    (measuring a large run's hundreds of modules takes seconds).

    With "Before" dumps a pass's effect shows in the next snapshot, so each change is attributed to
    the pass whose Before-snapshot precedes it; with "After" dumps (bishengir, upstream MLIR), to the
    pass named in the header. Stage files are compared with the previous stage.
    """
    steps: list[StepChange] = []
    by_kernel: dict[str, list[IRStage]] = {}
    for stage in dump.stages:
        by_kernel.setdefault(stage.kernel, []).append(stage)
    for kernel, stages in by_kernel.items():
        previous: IRStage | None = None
        previous_measured: _Measured | None = None
        kernel_steps: list[StepChange] = []
        for i, stage in enumerate(stages):
            measured = _measure(stage)
            if progress:
                progress(len(steps) + i + 1, len(dump.stages))
            counts = measured.counts
            before_dump = stage.kind == "pass" and stage.when == "Before"
            # A Before-snapshot is what the pass receives; what it leaves shows in the next snapshot.
            step = StepChange(i, kernel, stage.name, stage.pass_arg, stage.kind, stage.source, stage.line,
                              counts_before=counts if before_dump else {}, counts=counts, after_known=not before_dump)
            if previous is not None and previous_measured is not None and previous.lang == stage.lang:
                owner = kernel_steps[-1] if before_dump else step
                before = owner.counts_before if before_dump else kernel_steps[-1].counts
                if before_dump:
                    owner.counts, owner.after_known = counts, True
                else:
                    step.counts_before = before
                owner.delta = {op: counts.get(op, 0) - before.get(op, 0) for op in sorted(set(counts) | set(before))
                               if counts.get(op, 0) != before.get(op, 0)}
                before_locs, after_locs = previous_measured.locations, measured.locations
                owner.churn = _churn(previous_measured, measured)
                owner.layouts_new = sorted(measured.layouts - previous_measured.layouts)
                owner.layouts_gone = sorted(previous_measured.layouts - measured.layouts)
                owner.introduced_at = {op: [w for w in after_locs.get(op, []) if w not in before_locs.get(op, [])]
                                       or after_locs.get(op, [])[:3]
                                       for op, (added, _) in owner.churn.items() if added and op in after_locs}
                diff = list(difflib.unified_diff(previous_measured.ops, measured.ops, lineterm="", n=0))[2:]
                owner.diff = "\n".join(diff[:_DIFF_LINES]) + (f"\n... {len(diff) - _DIFF_LINES} more lines"
                                                              if len(diff) > _DIFF_LINES else "")
                owner.spans_left_out = list(stage.left_out_before)
            elif not before_dump:
                # An After snapshot or a stage file shows what its step left; what the kernel's first
                # one received is not in the dump, nor what a step in another IR language received.
                step.counts_before = {}
                step.compared = False
            if i == 0:
                step.layouts_at_start = sorted(measured.layouts)
            kernel_steps.append(step)
            previous, previous_measured = stage, measured
        steps.extend(kernel_steps)
    return steps


def describe_config(config: dict[str, object]) -> str:
    """`cuda:90, num_warps=8, num_stages=3, ...` for a kernel's compile options (see `harness.ir.compile_config`)."""
    return ", ".join(str(v) if k == "target" else f"{k}={v}" for k, v in config.items())


def _chunk_text(step: StepChange, total: int, config: dict[str, object] | None = None) -> str:
    label = f"{step.name} ({step.pass_arg})" if step.kind == "pass" else f"stage {step.name}"
    lines = [f"IR {step.kind} {step.index + 1}/{total} of kernel {step.kernel}: {label}  [{step.source}:{step.line}]"]
    if config and step.index == 0:
        lines.append(f"compiled with {describe_config(config)}")
    if step.kind == "stage" or step.index == 0:
        lines.append("ops after it: " + ", ".join(f"{op} x{n}" for op, n in sorted(step.counts.items(), key=lambda x: -x[1])[:25]))
    if step.delta:
        lines.append("op count changes: " + ", ".join(f"{op} {d:+d}" for op, d in step.delta.items()))
        added = [op for op, d in step.delta.items() if d > 0]
        removed = [op for op, d in step.delta.items() if d < 0]
        if added:
            lines.append("introduced: " + ", ".join(
                f"{op}" + (f" at {', '.join(step.introduced_at[op][:3])}" if step.introduced_at.get(op) else "")
                for op in added))
        if removed:
            lines.append("removed (disappeared): " + ", ".join(removed))
    rewritten = {op: ar for op, ar in step.churn.items() if not step.delta.get(op)}
    if rewritten:
        lines.append("rewritten, same count: " + ", ".join(f"{op} +{a}/-{r}" for op, (a, r) in rewritten.items()))
    elif step.diff and not step.delta:
        lines.append("rewrote ops without changing their counts")
    if step.layouts_new:
        lines.append("layouts (attribute kinds) first seen here: " + ", ".join(step.layouts_new))
    if step.layouts_gone:
        lines.append("layouts (attribute kinds) gone after it: " + ", ".join(step.layouts_gone))
    if step.diff:
        lines.append("diff:\n" + step.diff)
    return "\n".join(lines)


def index_ir_dump(home: KBHome, embedder: OfflineEmbedding, path: Path, name: str,
                  progress: Callable[[str, int, int], None] | None = None,
                  publish_lock: Callable[[], AbstractContextManager[None]] | None = None,
                  ) -> tuple[Manifest, IRDump, list[StepChange]]:
    """Read, summarize and publish one dump as release `name` of corpus `ir`.

    The caller holds the home's write lock, or, with `publish_lock` (`home.lock(write=True)`), its
    build lock: the dump is then read and embedded with queries still answering, and the write lock
    is taken only to store and publish.
    """
    from harness.ir import IRParseError

    check_release_name(home, name, ir_dump=True)
    try:
        dump = read_ir_dump(path)
    except IRParseError as exc:
        raise UserFacingError(str(exc), "pass a dump file or directory (see `kb index ir --help`)") from exc
    if not dump.stages:
        why = "; ".join((dump.problems + dump.skipped)[:3]) or "it is empty"
        raise UserFacingError(
            f"no IR found in {path} ({why})",
            "pass an MLIR_ENABLE_DUMP stream, a TRITON_DUMP_DIR/TRITON_KERNEL_DUMP or TRITON_DEBUG directory, "
            "or --mlir-print-ir-after-all output",
        )
    steps = summarize_dump(dump, (lambda done, total: progress("summarize", done, total)) if progress else None)
    per_kernel: dict[str, int] = {}
    for s in steps:
        per_kernel[s.kernel] = per_kernel.get(s.kernel, 0) + 1
    chunks: list[Chunk] = []
    symbols: list[Symbol] = []
    links: list[Link] = []
    for step in steps:
        if not step.changed and step.kind == "pass" and step.index > 0:
            # Nothing to search for, but `kb symbols` (a pasted dump header) should find that it ran.
            # The last pass of a "Before" stream has no snapshot after it: what it did is unknown.
            outcome = "changed nothing" if step.after_known else "no snapshot after it"
            for pass_name in dict.fromkeys((step.pass_arg, step.name)):
                symbols.append(Symbol(name, pass_name, f"ir-{step.kind} ({outcome})", "mlir", step.source,
                                      step.line, step.line, "def", "", step.kernel))
            continue
        text = _chunk_text(step, per_kernel[step.kernel], dump.configs.get(step.kernel))
        cid = f"{step.kernel}#{step.index}:{step.pass_arg}"
        chunks.append(Chunk(cid, text, {
            "file": step.source, "start_line": step.line, "end_line": step.line, "symbol": step.name,
            "kind": f"ir-{step.kind}", "lang": "mlir", "release": name, "pass_arg": step.pass_arg,
            "kernel": step.kernel, "step": step.index,
            # What the step added and removed, for questions asking which pass did one or the other.
            "ops_added": " ".join(op for op, d in step.delta.items() if d > 0),
            "ops_removed": " ".join(op for op, d in step.delta.items() if d < 0),
            "layouts_added": " ".join(step.layouts_new), "layouts_removed": " ".join(step.layouts_gone)}))
        symbols.append(Symbol(name, step.pass_arg, f"ir-{step.kind}", "mlir", step.source, step.line, step.line,
                              "def", cid, step.kernel))
        if step.name != step.pass_arg:
            symbols.append(Symbol(name, step.name, f"ir-{step.kind}", "mlir", step.source, step.line, step.line,
                                  "def", cid, step.kernel))
        for op in sorted(set(step.delta) | set(step.churn)):
            d = step.delta.get(op, 0)
            added, removed = step.churn.get(op, (max(d, 0), max(-d, 0)))
            relation = "introduces" if d > 0 else "removes" if d < 0 else "rewrites"
            lines_note = f" (+{added}/-{removed} lines)" if added and removed else ""
            links.append(Link(name, f"ir-{step.kind}", step.pass_arg, relation, "op", op,
                              f"{d:+d}{lines_note} at {step.source}:{step.line}"))
            kind = "ir-op-introduced" if d > 0 else "ir-op-removed" if d < 0 else "ir-op-rewritten"
            symbols.append(Symbol(name, op, kind, "mlir", step.source, step.line, step.line, "ref", cid, step.pass_arg))
        # `kb symbols nvidia_mma --release RUN`: where a layout came in and went, like an op.
        for layout, relation, kind in [*((k, "introduces", "ir-layout-introduced") for k in step.layouts_new),
                                       *((k, "removes", "ir-layout-removed") for k in step.layouts_gone)]:
            links.append(Link(name, f"ir-{step.kind}", step.pass_arg, relation, "layout", layout,
                              f"{'first seen' if relation == 'introduces' else 'gone'} after it, at {step.source}:{step.line}"))
            symbols.append(Symbol(name, layout, kind, "mlir", step.source, step.line, step.line, "ref", cid,
                                  step.pass_arg))
    if publish_lock is not None:
        texts = texts_to_embed(chunks)
        embedder.fill_cache(texts, on_progress=(lambda done: progress("embed", done, len(texts))) if progress else None)
    with publish_lock() if publish_lock is not None else nullcontext():
        manifest = _publish_dump(home, embedder, path, name, dump, steps, chunks, symbols, links,
                                 (lambda done, total: progress("store" if publish_lock else "embed", done, total))
                                 if progress else None)
    return manifest, dump, steps


def _publish_dump(home: KBHome, embedder: OfflineEmbedding, path: Path, name: str, dump: IRDump, steps: list[StepChange],
                  chunks: list[Chunk], symbols: list[Symbol], links: list[Link],
                  progress: Callable[[int, int], None] | None) -> Manifest:
    # The timeline is written under a fresh build name and named by the manifest, so a kill at any
    # point leaves `kb ir trace` and `kb search` reading the same build.
    home.ir_dir.mkdir(parents=True, exist_ok=True)
    timeline = home.ir_dir / f"{re.sub(r'[^A-Za-z0-9._-]', '-', name)}.b{uuid.uuid4().hex[:8]}.json"
    timeline.write_text(json.dumps({"name": name, "path": str(path), "problems": dump.problems,
                                    "skipped": dump.skipped, "configs": dump.configs,
                                    "steps": [asdict(s) for s in steps]}))
    files = sorted({s.source for s in steps})
    store = SymbolStore(home.symbols_db)
    try:
        manifest = publish(home, IR_CORPUS, name, chunks, chunker={"kind": "ir-steps", "diff_lines": _DIFF_LINES},
                           source={"kind": "ir-dump", "path": str(path.resolve()), "snapshots": len(steps),
                                   "timeline": timeline.name},
                           embedder=embedder, progress=progress,
                           before_switch=lambda collection: store.mark_publishing(name, collection))
        store.replace_release(name, symbols, [], links, [SourceFile(name, f, "", "ir", 0) for f in files])
    finally:
        store.close()
    for stale in home.timeline_files(name):
        if stale != timeline:
            stale.unlink(missing_ok=True)
    return manifest


@dataclass
class Timeline:
    """An indexed dump as `kb ir trace` reads it: every step, kernel by kernel, and each kernel's
    compile options (where the dump tells them: a metadata JSON, or a TTGIR module's attributes)."""

    steps: list[StepChange]
    configs: dict[str, dict[str, object]]


def load_timeline(home: KBHome, name: str) -> Timeline:
    from kb.index import load_manifest

    manifest = load_manifest(home, IR_CORPUS, name)
    path = home.ir_dir / str(manifest.source.get("timeline", "")) if manifest else None
    if path is None or not path.is_file():
        from kb.index import list_manifests

        if any(m.release == name and m.corpus != IR_CORPUS for m in list_manifests(home)):
            raise UserFacingError(f"{name!r} is a source release, not an IR dump",
                                  "trace a dump's ops with `kb ir trace DUMP OP` (dumps: `kb releases list`, corpus ir)")
        if manifest is not None:
            raise UserFacingError(f"the pass timeline of IR dump {name!r} is missing ({path})",
                                  f"index it again: kb index ir {manifest.source.get('path', 'PATH')} --name {name}")
        raise UserFacingError(f"no IR dump named {name!r} is indexed", "index one with `kb index ir PATH --name NAME`")
    data = json.loads(path.read_text())
    # Timelines written before compile options were read have no "configs".
    return Timeline([StepChange(**s) for s in data["steps"]], data.get("configs", {}))
