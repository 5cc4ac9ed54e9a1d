"""What there is to diagnose, from any kernel input: `request_from` is the one place a task file, a kernel
file with a call, a triton-ascend dump, or a rewritten kernel of the optimize loop becomes a request
(`kb why`, `kb diagnose`, the gold-set evaluation and the loop all come through here)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UserFacingError
from harness.ir.artifacts import Artifacts
from harness.launches import LaunchFacts
from harness.measurement import RunReport

if TYPE_CHECKING:
    from harness.capture import Interception
    from harness.task import Task, TaskSpec

__all__ = ["DEFAULT_TARGET", "DiagnosisRequest", "KernelInput", "diagnosed_case", "request_from"]

DEFAULT_TARGET = "cuda:90"  # what is compiled for without a GPU present, and what the patterns assume then


@dataclass
class DiagnosisRequest:
    """What there is to diagnose. Artifacts are produced lazily: compiling is what L3 costs.

    Attributes:
        kernel_file: the kernel's Python source (L1); None when only IR is at hand.
        artifacts: a callable that compiles (or reads) the kernel's Artifacts, called at most once.
        report: measurements of the kernel (L2), e.g. from `kb run --json --profile`.
        target: "cuda:90", "npu", ...; chooses the patterns' backend.
        launch_facts: a callable that intercepts the kernel's launches (no compile): the grid and the
            arguments' values L1 reads; None where there is no call to intercept (a dump, a rewrite).
        case_note: which case of a task L1 and L3 read, and why that one (`diagnosed_case`).
    """

    kernel_file: str | None
    artifacts: Callable[[], list[Artifacts]] | None
    report: RunReport | None = None
    target: str = DEFAULT_TARGET
    launch_facts: Callable[[], list[LaunchFacts]] | None = None
    case_note: str = ""
    _compiled: list[Artifacts] | None = field(default=None, repr=False)
    _facts: list[LaunchFacts] | None = field(default=None, repr=False)

    def compiled(self) -> list[Artifacts]:
        if self._compiled is None:
            self._compiled = self.artifacts() if self.artifacts else []
        return self._compiled

    def launches(self) -> list[LaunchFacts]:
        """The launches' facts, intercepted at most once ([] when there is no call to intercept)."""
        if self._facts is None:
            self._facts = self.launch_facts() if self.launch_facts else []
        return self._facts


@dataclass(frozen=True)
class KernelInput:
    """A kernel as a user (or the loop) names it; one of:

    - `task` (case `case` of a task file: its kernel, compiled on that case's inputs; None: the case
      `diagnosed_case` picks);
    - `kernel` with `call` (a kernel file from the wild and an expression that launches it);
    - `dump` (a triton-ascend TRITON_DEBUG dump directory), with `kernel` for its source if known;
    - `task` (or `kernel` with `call`) with `rewrite` (and its `entry`): a rewrite standing in for that
      kernel, compiled in a worker of its own, since the process asking may hold verdicts a rewrite
      must not reach.
    """

    task: str | None = None
    kernel: str | None = None
    call: str | None = None
    dump: str | None = None
    case: int | None = None
    rewrite: str | None = None
    entry: str | None = None

    def check_given(self) -> None:
        """One line when the input names no kernel, or several."""
        given = [x for x in (self.task, self.dump, self.kernel and self.call and "call") if x]
        if len(given) != 1:
            raise UserFacingError("give one of: a TASK file, --kernel FILE --call EXPR, or --dump DIR [--kernel FILE]",
                                  "e.g. kb diagnose corpora/operators/softmax/task.py")
        if self.rewrite is not None and (self.dump is not None or not self.entry):
            raise UserFacingError("a rewrite is diagnosed as its task's kernel: give the task and its entry too",
                                  "pass the task file (or kernel and call) the rewrite stands in for, and the entry's name")

    def spec(self) -> TaskSpec:
        """The task this input names, as the workers take it: its file, or its kernel and call."""
        from harness.task import TaskSpec

        return TaskSpec.of_file(self.task) if self.task is not None else TaskSpec(kernel=self.kernel, call=self.call)

    def check(self) -> None:
        """One line naming what is missing or wrong, before anything is compiled."""
        self.check_given()
        for path in (self.task, self.kernel, self.rewrite):
            if path is not None and not Path(path).is_file():
                raise UserFacingError(f"{path} does not exist", "pass the path of a task or kernel .py file")
        if self.dump is not None and not Path(self.dump).is_dir():
            raise UserFacingError(f"{self.dump} is not a directory", "pass the TRITON_DUMP_DIR of a TRITON_DEBUG=1 run")


def request_from(kernel: KernelInput, target: str | None = None, cache_dir: str | Path | None = None,
                 report: RunReport | None = None) -> DiagnosisRequest:
    """The request for `kernel`, compiled for `target` (None: the GPU present, else cuda:90; a dump is
    what the NPU compiler made) on first use, into `cache_dir`."""
    kernel.check()
    if kernel.dump is not None:
        dump, source = kernel.dump, str(Path(kernel.kernel).resolve()) if kernel.kernel else ""
        return DiagnosisRequest(kernel.kernel, lambda: _ascend_dumps(dump, source), report, "npu")
    task_source, case, case_note = None, kernel.case, ""
    if kernel.task is not None:
        from harness.capture import device_for
        from harness.task import load_task

        with device_for(target):
            loaded = load_task(kernel.task)
        task_source = loaded.source_file
        if case is None:
            case, case_note = diagnosed_case(loaded, report)
    if kernel.rewrite is not None:
        spec, rewrite, entry = kernel.spec(), kernel.rewrite, str(kernel.entry)

        def compile_rewrite() -> list[Artifacts]:
            from harness.run import capture_kernel

            return capture_kernel(spec, rewrite, entry, cache_dir=str(cache_dir) if cache_dir else None, case=case or 0)

        def rewrite_launches() -> list[LaunchFacts]:
            # The optimize loop diagnoses each round's parent this way: without its launches, L1 knew nothing
            # of the grid (8 programs for 132 SMs was never a finding there, only under `kb diagnose`).
            from harness.run import kernel_launch_facts

            try:
                return kernel_launch_facts(spec, rewrite, entry, case=case or 0, target=target)
            except UserFacingError as exc:  # the judge ran it; a failed interception costs L1 its launch only
                print(f"note: L1 without the launch of {Path(rewrite).name}: {exc}", file=sys.stderr)
                return []

        return DiagnosisRequest(rewrite, compile_rewrite, report, target or DEFAULT_TARGET,
                                launch_facts=rewrite_launches, case_note=case_note)
    if kernel.task is not None:
        from harness.task import intercept_task

        task_file, source = kernel.task, str(task_source)
        intercepted = _once(lambda: intercept_task(task_file, case or 0, target))
    else:
        from harness.capture import intercept_call

        source, call = str(kernel.kernel), str(kernel.call)
        intercepted = _once(lambda: intercept_call(source, call, target))
    return DiagnosisRequest(source, lambda: intercepted().compile(cache_dir), report, target or DEFAULT_TARGET,
                            launch_facts=lambda: intercepted().facts(), case_note=case_note)


def diagnosed_case(task: Task, report: RunReport | None) -> tuple[int, str]:
    """The timed case of a task whose launch and IR the diagnosis reads, and a note saying why.

    Where the headroom is: the case the last measurement (`report`'s baseline) leaves the most room on,
    to the roofline or the launch floor (ties: the later case). Without measurements, the case that moves
    the most bytes (else does the most FLOPs, else the first listed): the sizes a kernel is slow at are
    the large ones, and a task may list its cases smallest first (TritonBench-T's sweeps do), where a
    grid of one program on a 4096-element vector is no finding at all."""
    if len(task.cases) <= 1:
        return 0, ""
    labels = [task.case_label(c) for c in task.cases]
    baseline = report.run("baseline") if report is not None else None
    room = {c.label: c.roofline.bound_on_speedup(c.timing.median_us) for c in (baseline.cases if baseline else [])
            if not c.heldout and c.roofline is not None and c.timing is not None and c.label in labels}
    if room:
        from diagnose.bottleneck import flat_floor

        # Cases at the run's host floor (the time flat while the work grows: a sync or an upload per call) show
        # what the wrapper costs, which L1 reads from the source at any case; the kernel's own facts (its loops'
        # trips, its grid) are read where the time follows the work. A row kernel whose loop runs once at
        # 64 x 64 and 256 times at 32768 x 32768 reduces once per iteration only at the sizes that take time.
        assert baseline is not None
        floor = flat_floor([(c.roofline.bytes, c.timing.median_us, c.label) for c in baseline.cases
                            if c.label in room and c.roofline is not None and c.roofline.bytes and c.timing is not None])
        flat = {label for _, _, label in floor or []}
        above = {label: r for label, r in room.items() if label not in flat}
        if flat and above:
            best = max(range(len(labels)), key=lambda i: (above.get(labels[i], 0.0), i))
            return best, (f"L1 and L3 read case {labels[best]}: the most headroom in the last measurement "
                          f"({room[labels[best]]:.1f}x) among the cases whose time follows the work (not the "
                          f"{len(flat)} at the host floor)")
        best = max(range(len(labels)), key=lambda i: (room.get(labels[i], 0.0), i))
        return best, f"L1 and L3 read case {labels[best]}: the most headroom in the last measurement ({room[labels[best]]:.1f}x)"
    for name, figure in (("bytes", task.case_bytes), ("FLOPs", task.case_flops)):
        sizes = [figure(c) for c in task.cases]
        if any(s is not None for s in sizes):
            best = max(range(len(labels)), key=lambda i: (sizes[i] or 0.0, i))
            return best, f"L1 and L3 read case {labels[best]}: the most {name} of the task's cases (no measurement yet)"
    return 0, ""  # a task that counts neither is read at its first case, as its author listed it


def _once(make: Callable[[], Interception]) -> Callable[[], Interception]:
    """`make`, run on the first call only: L1's facts and L3's compile share one interception."""
    made: list[Interception] = []

    def get() -> Interception:
        if not made:
            made.append(make())
        return made[0]

    return get


def _ascend_dumps(dump_dir: str, source_file: str) -> list[Artifacts]:
    """The Artifacts of a triton-ascend TRITON_DEBUG dump directory, mapped to the kernel source's lines."""
    from harness.npu import collect_debug_dumps

    arts = collect_debug_dumps(dump_dir, write=False, source_file=source_file)
    if not arts:
        raise UserFacingError(f"{dump_dir} holds no triton-ascend dumps (kernel.ttir.mlir, kernel.ttadapter.mlir)",
                              "run with TRITON_DEBUG=1 and pass TRITON_DUMP_DIR")
    return arts
