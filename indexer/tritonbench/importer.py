"""`kb import tritonbench`: TritonBench-T's first drafts as a task suite `kb bench --suite` runs.

For each T operator, drafts are tried in a fixed model order (`source.model_order`, or the user's
`--models`) and the first that passes the judge's checks against the PyTorch reference becomes the
operator's task. Every verdict goes to a SQLite ledger in the output folder as it is reached, so a run
that is stopped or killed resumes where it was: judged drafts are not judged again, and a task folder
appears only complete (written aside, then renamed into place). Operators are checked several at a
time, each draft in the judge's own sandboxed workers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.backends import BackendName
from harness.errors import UserFacingError
from indexer.tritonbench.device_gate import DeviceGate
from indexer.tritonbench.drafts import Failure, extract_code, screen
from indexer.tritonbench.source import Draft, Operator, TritonBenchT
from indexer.tritonbench.taskgen import CasesProbe, write_cases_module, write_task

__all__ = ["DraftOutcome", "Failure", "ImportOptions", "ImportSummary", "import_tritonbench"]

LEDGER = "import.sqlite"


# The judge's reason, first match wins (harness/verdicts.py and the worker's messages word them).
_KINDS = [
    # out of memory with the device to itself: the reference's, no draft's verdict; a draft's, its own
    (Failure.CHECK, r"^judged alone: the judge's reference worker failed"),
    # whichever process it met: memory the checks beside it may have held (judged again alone)
    (Failure.DEVICE_MEMORY, r"OutOfMemoryError|(CUDA|NPU)( error:)? out of memory"),
    # the reference making its outputs, the inputs handed over, the task's formula: not the draft's code
    (Failure.CHECK, r"reference worker failed \((make|share)\): (?!CompilationError)|bytes/flops formula fails"),
    (Failure.HANG, r"timed out|\bhang\b"),  # not "changed", "ExchangeError"
    (Failure.TORCH_FALLBACK, r"no Triton kernel was launched|launched no Triton kernel|torch fallback"),
    (Failure.IMPORT, r"does not import"),
    (Failure.COMPILE, r"CompilationError|UnsupportedLanguageConstruct|OutOfResources|compil|ptxas|MLIR|triton\.language"),
    (Failure.WRONG_VALUES, r"wrong values|mismatch|shape \(|returned \d+ output|output \d+ is|unwritten|NaN"),
    (Failure.CRASH, r"died|killed|signal|segmentation|device fault|illegal memory"),
    (Failure.RAISED, r"Error|Exception|raised"),
]
# The classes a judge's reason is sorted into (the others come from screening the text): a verdict the
# ledger kept is sorted again when read, so a better rule reaches old verdicts without a rerun.
_JUDGED = {kind for kind, _ in _KINDS} | {Failure.OTHER}


@dataclass(frozen=True)
class DraftOutcome:
    op: str
    model: str
    record: int
    failure: Failure | None  # None: it passed
    reason: str
    seconds: float


@dataclass
class ImportOptions:
    out: Path
    models: list[str] | None = None  # draft files (stems), in the order tried; None: all, in model_order
    ops: list[str] | None = None
    backend: BackendName = "cuda"
    workers: int = 2  # operators checked at once
    seeds: int = 2
    timeout_s: float = 300.0
    # Timed cases the check covers: "all" (the 5 perf sets), "smallest" (the first; what the interpreter
    # can afford: its seconds grow with the size). Held-out cases (the test's calls) are always checked.
    perf_cases: str = "all"
    stop_at: float | None = None  # time.time() after which no draft's check starts (a GPU lent for minutes)


@dataclass
class ImportSummary:
    out: Path
    imported: dict[str, DraftOutcome] = field(default_factory=dict)  # op -> the passing draft
    failed: dict[str, list[DraftOutcome]] = field(default_factory=dict)  # op -> every draft's verdict
    unusable: dict[str, str] = field(default_factory=dict)  # op -> why no draft could be checked
    unmatched: int = 0  # drafts whose prompt names no T operator
    unfinished: list[str] = field(default_factory=list)  # operators left for a later run (--stop-after)


class _Ledger:
    """Verdicts as they are reached (one SQLite file; WAL so a kill leaves it consistent)."""

    def __init__(self, path: Path) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS drafts (op TEXT, model TEXT, record INTEGER, failure TEXT, "
                        "reason TEXT, seconds REAL, PRIMARY KEY (op, model))")
        self.db.execute("CREATE TABLE IF NOT EXISTS probes (op TEXT PRIMARY KEY, probe TEXT, problem TEXT)")

    def outcome(self, op: str, model: str) -> DraftOutcome | None:
        with self.lock:
            row = self.db.execute("SELECT record, failure, reason, seconds FROM drafts WHERE op=? AND model=?",
                                  (op, model)).fetchone()
        if row is None:
            return None
        return DraftOutcome(op, model, row[0], _stored_failure(row[1], row[2]), row[2], row[3])

    def record(self, outcome: DraftOutcome) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO drafts VALUES (?, ?, ?, ?, ?, ?)",
                            (outcome.op, outcome.model, outcome.record,
                             outcome.failure.value if outcome.failure else None, outcome.reason, outcome.seconds))

    def summary(self, out: Path, models: list[str], unmatched: int, unusable: dict[str, str]) -> ImportSummary:
        """The output folder's whole state, not only this run's operators: every operator with a verdict,
        imported when a draft passed and its folder is there, failed otherwise (drafts in `models` order)."""
        with self.lock:
            rows = self.db.execute("SELECT op, model, record, failure, reason, seconds FROM drafts").fetchall()
            problems = list(self.db.execute("SELECT op, problem FROM probes WHERE problem IS NOT NULL").fetchall())
        rank = {m: i for i, m in enumerate(models)}
        by_op: dict[str, list[DraftOutcome]] = {}
        checks: dict[str, list[str]] = {}
        for op, model, record, failure, reason, seconds in sorted(rows, key=lambda r: (r[0], rank.get(r[1], len(rank)))):
            outcome = DraftOutcome(op, model, record, _stored_failure(failure, reason), reason, seconds)
            if outcome.failure is Failure.CHECK:  # no verdict on the draft; twice, the operator's problem
                checks.setdefault(op, []).append(reason)
                if len(checks[op]) == _CHECKS_TO_SET_ASIDE:
                    problems.append((op, reason))
                continue
            by_op.setdefault(op, []).append(outcome)
        whole = ImportSummary(out, unmatched=unmatched, unusable={**dict(problems), **unusable})
        for op, outcomes in by_op.items():
            passed = next((o for o in outcomes if o.failure is None), None)
            if passed is not None and (out / op / "task.py").is_file():
                whole.imported[op] = passed
            elif op not in whole.unusable:
                whole.failed[op] = [o for o in outcomes if o.failure is not None]
        return whole

    def probe(self, op: str) -> tuple[CasesProbe | None, str | None] | None:
        with self.lock:
            row = self.db.execute("SELECT probe, problem FROM probes WHERE op=?", (op,)).fetchone()
        if row is None:
            return None
        return (_probe_from_json(row[0]) if row[0] else None), row[1]

    def set_probe(self, op: str, probe: CasesProbe | None, problem: str | None) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO probes VALUES (?, ?, ?)",
                            (op, json.dumps(asdict(probe)) if probe else None, problem))


def import_tritonbench(root: Path, options: ImportOptions,
                       progress: Callable[[str, DraftOutcome | None], None] | None = None) -> ImportSummary:
    """Import the T operators of the checkout at `root` into `options.out`; `progress(op, outcome)` is
    called after each draft judged (outcome) and when an operator is done (None)."""
    if _committable(options.out):
        raise UserFacingError(f"--out {options.out} is inside the kernel-kb repository where git would take it: the "
                              "imported drafts are third-party code that must not be committed",
                              "pick a folder outside the repository (or an ignored one, like build/)")
    bench = TritonBenchT(root)
    operators = bench.operators()
    wanted = options.ops or list(operators)
    unknown = [op for op in wanted if op not in operators]
    if unknown:
        raise UserFacingError(f"no TritonBench-T operator {', '.join(unknown)}",
                              f"pick among the {len(operators)} in {root / 'data/TritonBench_T_v1'}")
    models = options.models or bench.models()
    drafts: dict[str, list[Draft]] = {op: [] for op in wanted}
    unmatched = 0
    for model in models:
        for draft in bench.drafts(model, set(operators)):
            if draft.operator is None:
                unmatched += 1
            elif draft.operator in drafts:
                drafts[draft.operator].append(draft)
    options.out.mkdir(parents=True, exist_ok=True)
    ledger = _Ledger(options.out / LEDGER)
    # What this run learns that the ledger does not hold: operators no draft could be checked for, and
    # those a deadline left for later.
    unusable: dict[str, str] = {}
    unfinished: list[str] = []
    gate = DeviceGate()

    def one(op: str) -> None:
        _import_operator(operators[op], drafts[op], options, ledger, unusable, unfinished, root, gate, progress)
        if progress:
            progress(op, None)

    with ThreadPoolExecutor(max_workers=max(1, options.workers)) as pool:
        for future in [pool.submit(one, op) for op in wanted]:
            future.result()
    whole = ledger.summary(options.out, models, unmatched, unusable)
    whole.unfinished = sorted(unfinished)
    for op in whole.unfinished:  # its drafts judged so far failed, but later ones are still to come
        whole.failed.pop(op, None)
    write_summary(whole, models)
    return whole


def _import_operator(op: Operator, drafts: list[Draft], options: ImportOptions, ledger: _Ledger,
                     unusable: dict[str, str], unfinished: list[str], root: Path, gate: DeviceGate,
                     progress: Callable[[str, DraftOutcome | None], None] | None
                     ) -> None:
    final = options.out / op.name
    work = options.out / ".work" / op.name
    known = [ledger.outcome(op.name, d.model) for d in drafts]
    # Done when a draft passed and its folder is there, unless a draft before it is still to be judged (a
    # new model in the order, or out of memory beside other checks): that one may take its place.
    first = next((o for o in known if o is None or o.failure is None or _crowded_out(o)), None)
    if first is not None and first.failure is None and (final / "task.py").is_file():
        return
    probe, problem = _probed(op, work / "cases", ledger, options.timeout_s)
    if probe is None:
        unusable[op.name] = problem or "its cases could not be made"
        return
    checks = 0
    for draft, outcome in zip(drafts, known):
        if outcome is None or _undecided(outcome):
            if options.stop_at is not None and time.time() >= options.stop_at:
                unfinished.append(op.name)
                return
            outcome = _judge_draft(op, draft, probe, options, work, root, gate.shared)
            if outcome.failure is Failure.DEVICE_MEMORY:
                if options.workers > 1:  # the checks beside it may have held the memory: again, alone
                    with gate.alone():
                        outcome = _judge_draft(op, draft, probe, options, work, root, nullcontext)
                if outcome.failure is Failure.DEVICE_MEMORY:
                    reason = ALONE + outcome.reason
                    outcome = DraftOutcome(outcome.op, outcome.model, outcome.record, _classify(reason), reason,
                                           outcome.seconds)
            ledger.record(outcome)
            if progress:
                progress(op.name, outcome)
        if outcome.failure is Failure.CHECK:
            checks += 1
            if checks == _CHECKS_TO_SET_ASIDE:  # two drafts met it: so would the rest, which are not tried
                unusable[op.name] = outcome.reason
                return
            continue
        if outcome.failure is None:
            if final.exists():
                shutil.rmtree(final)
            os.replace(work / draft.model, final)  # the task folder appears complete or not at all
            shutil.rmtree(work, ignore_errors=True)
            return
    if not drafts:
        unusable[op.name] = "no draft's prompt names it"


# How a verdict of running out of memory says it was reached with the device to itself.
ALONE = "judged alone: "


def _crowded_out(outcome: DraftOutcome) -> bool:
    """Out of memory beside other checks: no verdict (a ledger of an import before the retry alone has them)."""
    return outcome.failure is Failure.DEVICE_MEMORY and not outcome.reason.startswith(ALONE)


def _undecided(outcome: DraftOutcome) -> bool:
    """Whether a judged draft is judged again: it passed but its folder was lost, the check could not judge
    it, or it was crowded out of the device's memory."""
    return outcome.failure in (None, Failure.CHECK) or _crowded_out(outcome)


def _probed(op: Operator, directory: Path, ledger: _Ledger, timeout_s: float) -> tuple[CasesProbe | None, str | None]:
    known = ledger.probe(op.name)
    if known is not None and known[0] is not None and (directory / f"{op.name}_cases.py").is_file():
        return known  # a failed probe is tried again: it may need the GPU this run has
    directory.mkdir(parents=True, exist_ok=True)
    try:
        write_cases_module(op, directory)
        done = subprocess.run([sys.executable, "-m", "indexer.tritonbench.probe", str(directory), op.name],
                              capture_output=True, text=True, timeout=timeout_s, cwd=_repo_root(),
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_repo_root(), os.environ.get("PYTHONPATH")]))})
    except (ValueError, SyntaxError) as exc:
        result: tuple[CasesProbe | None, str | None] = (None, f"its perf script or test has a shape this importer does not read: {exc}")
    except subprocess.TimeoutExpired:
        result = (None, f"making its input sets took over {timeout_s:.0f} s")
    else:
        if done.returncode == 0:
            result = (_probe_from_json(done.stdout), None)
        else:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            result = (None, f"its own input code failed here: {last[:300]}")
    if result[0] is not None and result[0].sweep == 0:
        result = (None, "its perf sweep has no input set")
    ledger.set_probe(op.name, *result)
    return result


def _judge_draft(op: Operator, draft: Draft, probe: CasesProbe, options: ImportOptions, work: Path,
                 root: Path, device: Callable[[], AbstractContextManager[object]]) -> DraftOutcome:
    start = time.monotonic()

    def outcome(failure: Failure | None, reason: str) -> DraftOutcome:
        return DraftOutcome(op.name, draft.model, draft.record, failure, reason, round(time.monotonic() - start, 1))

    wrappers = [w for w in (draft.wrapper, op.name, op.reference_name) if w]
    screened = screen(extract_code(draft.predict), wrappers)
    if screened.problem is not None:
        return outcome(screened.failure, screened.problem)
    directory = work / draft.model
    if directory.exists():
        shutil.rmtree(directory)
    shutil.copytree(work / "cases", directory)
    draft_file = directory / f"{op.name}_draft.py"
    draft_file.write_text(screened.code, encoding="utf-8")
    from harness.guards import torch_calls

    assert screened.wrapper is not None
    allow = list(torch_calls(str(draft_file), screened.wrapper))
    for _ in range(_ALLOW_ROUNDS):
        task = write_task(op, draft, screened, probe, allow, directory, root)
        with device():
            failure, reason = _verdict(task, options)
        more = [name for name in _runtime_torch_ops(reason) if name not in allow]
        if failure is not Failure.TORCH_FALLBACK or not more:
            break
        allow += more  # torch work the wrapper does by operator (`alpha * y`), which no static reading names
    return outcome(failure, reason)


# A check that fails outside the draft's code (Failure.CHECK) could still be a draft's doing (its import
# patched torch in the reference's process): the operator is set aside when a second draft meets it too.
_CHECKS_TO_SET_ASIDE = 2

# The judge names at most three disallowed aten ops per rejection; a draft doing more in torch than
# rounds x 3 ops is a torch implementation with a kernel on the side, and stays rejected.
_ALLOW_ROUNDS = 3


def _runtime_torch_ops(reason: str) -> list[str]:
    """`torch fallback at runtime: aten::mul, aten::add` -> ["mul", "add"]; nothing for the other
    fallbacks (no kernel launched, an output written by torch), which no allowance makes a draft."""
    match = re.search(r"torch fallback at runtime: ((?:aten::\w+(?:\.\w+)?(?:, )?)+)$", reason)
    return [op.removeprefix("aten::").split(".")[0] for op in match.group(1).split(", ")] if match else []


def _verdict(task: Path, options: ImportOptions) -> tuple[Failure | None, str]:
    from harness.run import RunOptions, run_task
    from harness.task import TaskSpec

    run_options = RunOptions(backend=options.backend, time=False, seeds=options.seeds, timeout_s=options.timeout_s,
                             generated_heldout=0, cases=[0] if options.perf_cases == "smallest" else None)
    try:
        report = run_task(TaskSpec.of_file(task), run_options)
    except UserFacingError as exc:
        return _classify(str(exc)), str(exc)
    run = report.run("baseline")
    if run is not None and run.correct:
        return None, "passed"
    reason = report.failure or (run.rejected if run else None) or _case_reason(run)
    return _classify(reason), reason


def _case_reason(run: object) -> str:
    for case in getattr(run, "cases", []):
        if case.error:
            return f"case {case.label}: {case.error}"
        for check in case.checks:
            if not check.ok:
                return (f"wrong values on case {case.label}, output {check.output}: {check.mismatched} element(s) "
                        f"outside tolerance, max abs error {check.max_abs_err:.3g}"
                        + (f", {check.unwritten} never written" if check.unwritten else ""))
    return "rejected without a reason"


def _stored_failure(failure: str | None, reason: str) -> Failure | None:
    """A ledger row's class: None for a pass, the judge's reason sorted by today's rules, else as stored."""
    if not failure:
        return None
    stored = Failure(failure)
    return _classify(reason) if stored in _JUDGED else stored


def _classify(reason: str) -> Failure:
    return next((kind for kind, pattern in _KINDS if re.search(pattern, reason)), Failure.OTHER)


def _probe_from_json(text: str) -> CasesProbe:
    data = json.loads(text)
    for key in ("sizes", "bytes", "flops"):
        data[key] = {int(k): v for k, v in data[key].items()}
    return CasesProbe(**data)


def _committable(path: Path) -> bool:
    """Whether `path` lies in this checkout where git would track it (not under an ignored folder)."""
    repository = Path(_repo_root())
    target = path.resolve()
    if not (repository / ".git").exists() or not target.is_relative_to(repository):
        return False
    try:
        ignored = subprocess.run(["git", "-C", str(repository), "check-ignore", "-q", str(target)], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return ignored.returncode != 0


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def write_summary(summary: ImportSummary, models: list[str]) -> Path:
    """IMPORT.md in the output folder: what was imported from which draft, and for every operator
    without a passing draft, each draft's failure."""
    lines = [f"# TritonBench-T first drafts ({len(summary.imported)} operators imported)", "",
             f"Models in the order tried: {', '.join(models)}.", "",
             "| operator | draft | record | seconds |", "|---|---|---|---|"]
    for op, o in sorted(summary.imported.items()):
        lines.append(f"| {op} | {o.model} | {o.record} | {o.seconds} |")
    lines += ["", f"## No passing draft ({len(summary.failed)} operators)", ""]
    for op, outcomes in sorted(summary.failed.items()):
        lines.append(f"- **{op}**: " + ("; ".join(f"{o.model}: {o.failure.value if o.failure else 'passed'} "
                                                   f"({o.reason[:160]})" for o in outcomes) or "no draft"))
    if summary.unusable:
        lines += ["", f"## Not importable ({len(summary.unusable)} operators)", ""]
        lines += [f"- **{op}**: {why}" for op, why in sorted(summary.unusable.items())]
    if summary.unfinished:
        lines += ["", f"Not finished (stopped by --stop-after; run the same command again): {', '.join(summary.unfinished)}."]
    lines += ["", f"Drafts whose prompt names no T operator: {summary.unmatched}."]
    path = summary.out / "IMPORT.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
