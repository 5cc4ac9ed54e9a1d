"""Which case of a task the diagnosis reads (L1's launch, L3's IR): where the headroom is. A task may
list its sizes smallest first (TritonBench-T's sweeps do); read at 4096 elements, a sum on one program
is no finding at all, and the loop tuned warps where the grid was the defect."""

from __future__ import annotations

import textwrap

from diagnose.engine import diagnose
from diagnose.request import KernelInput, diagnosed_case, request_from
from harness.measurement import CaseResult, KernelRun, Roofline, RunReport, Timing
from harness.task import Task, load_task

# One program sums the whole vector, 1024 lanes a step: fine at 4096 elements, 1/132 of the device at 2^20.
KERNEL = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr, tl.sum(acc))


    def vector_sum(x):
        out = torch.empty((), dtype=torch.float32, device=x.device)
        sum_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        return out
    ''')

TASK = textwrap.dedent('''\
    import torch

    from vsum import vector_sum as entry  # noqa: F401


    def inputs(n):
        return (torch.randn(n),)


    def reference(x):
        return x.sum()


    def bytes(n):
        return 4 * n


    cases = [dict(n=4096), dict(n=1 << 20), dict(n=65536)]
    ''')


def _task_file(tmp_path, task: str = TASK) -> str:
    (tmp_path / "vsum.py").write_text(KERNEL)
    (tmp_path / "task.py").write_text(task)
    return str(tmp_path / "task.py")


def _task(tmp_path, task: str = TASK) -> Task:
    return load_task(_task_file(tmp_path, task))


def _measured(medians: list[float], fractions: list[float]) -> RunReport:
    cases = [CaseResult(case={"n": n}, label=f"n={n}", timing=Timing(m, m, m, 10),
                        roofline=Roofline(4.0 * n, None, None, None, "memory", f, floor_us=3.5))
             for n, m, f in zip((4096, 1 << 20, 65536), medians, fractions)]
    return RunReport(task="vsum", backend="cuda", device="H200", runs=[KernelRun("baseline", "vsum.py", cases)])


def test_without_measurements_the_case_moving_the_most_bytes_is_read(tmp_path):
    case, note = diagnosed_case(_task(tmp_path), None)
    assert case == 1 and "n=1048576" in note and "bytes" in note
    # Without a byte count: the FLOPs, else the first case, as the task lists it.
    assert diagnosed_case(_task(tmp_path, TASK.replace("def bytes(n)", "def flops(n)")), None)[0] == 1
    assert diagnosed_case(_task(tmp_path, TASK.replace("def bytes(n)", "def _unused(n)")), None) == (0, "")


def test_with_measurements_the_case_with_the_most_headroom_is_read(tmp_path):
    # The small case at 60 us against a 3.5 us launch floor has more room (17x) than the large one at 0.5
    # of its roofline (2x): the small one is read.
    case, note = diagnosed_case(_task(tmp_path), _measured([60.0, 400.0, 20.0], [0.01, 0.5, 0.2]))
    assert case == 0 and "17.1x" in note
    case, _ = diagnosed_case(_task(tmp_path), _measured([5.0, 400.0, 20.0], [0.01, 0.05, 0.2]))
    assert case == 1


def test_the_underfilled_grid_is_found_at_the_size_it_costs_and_the_answer_says_which_case(tmp_path):
    task = _task_file(tmp_path)
    answer = diagnose(request_from(KernelInput(task=task)), None, level_max="L1")
    idle = [f for f in answer.findings if f.kind == "parallelism.grid-underfilled"]
    assert idle and "1 program(s) for" in idle[0].title
    assert any("L1 and L3 read case n=1048576" in note for note in answer.notes)
    # The case a user names is the case read: at 4096 elements one program costs nothing measurable.
    small = diagnose(request_from(KernelInput(task=task, case=0)), None, level_max="L1")
    assert not [f for f in small.findings if f.kind == "parallelism.grid-underfilled"]
    assert not any("L1 and L3 read case" in note for note in small.notes)


def test_cases_at_the_host_floor_are_not_read_for_the_kernels_facts(tmp_path):
    """TritonBench-T's o1 draft of fused_mv_sigmoid_sub on the H100: a scalar uploaded every call holds its
    small cases at one time (the most headroom to the launch floor), while at 32768 x 32768 its row loop runs
    256 times and reduces every iteration; read at 64 x 64, that loop ran once and the finding was dropped."""
    # 4096 and 65536 elements both at ~100 us: flat over 16x the work, a host floor; 2^20 at 7% of its roof.
    case, note = diagnosed_case(_task(tmp_path), _measured([100.0, 800.0, 104.0], [0.001, 0.07, 0.01]))
    assert case == 1 and "not the 2 at the host floor" in note
    # Where every case is at the floor, the headroom alone decides, as before.
    case, note = diagnosed_case(_task(tmp_path), _measured([100.0, 104.0, 102.0], [0.001, 0.5, 0.5]))
    assert case == 0 and "host floor" not in note
