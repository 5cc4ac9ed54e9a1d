"""A verdict no candidate can forge: every way of cheating the judge we know of, tried as an adversary
would (tests/fixtures/adversarial/, one kernel per cheat), and the honest kernels that must pass beside
them. Each cheat's test asserts the reason it is rejected with; where two guards stand in line (the
static check, then the runtime one), the runtime guard is also tested with the static one switched off,
so that removing either guard fails a test.

Everything runs through the real judge: a reference worker, one fresh worker per kernel. On the CPU
interpreter by default (tensors handed over as files); `KB_TEST_BACKEND=cuda` runs the same suite on a
GPU (CUDA IPC hand-overs, device timing)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from harness.judge import Judge, KernelSpec
from harness.run import RunOptions, run_candidates, run_task
from harness.task import TaskSpec

ADVERSARIAL = FIXTURES / "adversarial"
BACKEND = os.environ.get("KB_TEST_BACKEND", "interpreter")
OPTIONS = RunOptions(backend=BACKEND, seeds=1, timeout_s=60, time=False)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixtures: some cheats rewrite files beside them or leave a pid file."""
    return Path(shutil.copytree(ADVERSARIAL, tmp_path_factory.mktemp("adversarial") / "suite"))


@pytest.fixture(scope="module")
def judge(suite: Path):
    session = Judge(TaskSpec(path=str(suite / "task_softmax.py")), BACKEND, timeout_s=60, spares=2)
    yield session
    session.close()


@pytest.fixture
def runtime_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The static checks switched off: what the runtime guards catch alone."""
    import harness.guards as guards

    monkeypatch.setattr(guards, "static_guards", lambda *args, **kwargs: [])
    monkeypatch.setattr(guards, "escape_guards", lambda *args, **kwargs: [])


def judged(judge: Judge, suite: Path, name: str, options: RunOptions = OPTIONS):
    report = run_task(judge.spec, options, candidate=str(suite / name), judge=judge)
    assert report.run("baseline").correct, report.to_dict()  # the task's own kernel is never the problem
    return report.run("candidate")


def wrong_values(run) -> int:
    return sum(c.mismatched + c.nan_mismatch + c.unwritten for case in run.cases for c in case.checks)


# --- torch doing the work ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["getattr_fallback.py", "alias_fallback.py", "thread_fallback.py"])
def test_torch_reached_around_the_static_check_is_caught_at_runtime(judge, suite, name):
    run = judged(judge, suite, name)
    assert not run.correct and "torch fallback at runtime: aten::_softmax" in run.rejected


@pytest.mark.parametrize("name, static", [
    ("local_alias_fallback.py", "torch fallback: .softmax() in softmax (local_alias_fallback.py:"),
    ("stack_reference.py", "the kernel imports importlib (stack_reference.py:2)"),
])
def test_a_fallback_the_source_shows_is_named_early_and_caught_at_runtime_too(judge, suite, name, static, monkeypatch):
    assert static in judged(judge, suite, name).rejected
    import harness.guards as guards

    monkeypatch.setattr(guards, "static_guards", lambda *args, **kwargs: [])
    monkeypatch.setattr(guards, "escape_guards", lambda *args, **kwargs: [])
    assert "torch fallback at runtime: aten::_softmax" in judged(judge, suite, name).rejected


def test_an_output_made_by_torch_copies_is_torch_doing_the_work(suite):
    """A transpose is data movement: `x.t().contiguous()` does it with ops a wrapper may use. What
    gives it away is where the output came from."""
    with Judge(TaskSpec(path=str(suite / "task_transpose.py")), BACKEND, timeout_s=60) as session:
        report = run_task(session.spec, OPTIONS, candidate=str(suite / "transpose_copy.py"), judge=session)
    assert report.run("baseline").correct
    assert "torch fallback at runtime: output 0 was written by aten::clone, not by a kernel" in \
        report.run("candidate").rejected
    with Judge(TaskSpec(path=str(suite / "task_cast.py")), BACKEND, timeout_s=60) as session:
        kept = run_task(session.spec, OPTIONS, candidate=str(suite / "cast_rewrite.py"), judge=session)
    assert [r.verdict for r in kept.runs] == ["correct", "correct"]  # the task's own wrapper casts too


def test_switching_the_runtime_guard_off_is_itself_caught(judge, suite, monkeypatch):
    # the source reaches for torch's private dispatch module: named before it runs ...
    run = judged(judge, suite, "guard_off.py")
    assert "reads _python_dispatch._disable_current_modes" in run.rejected
    # ... and, the static check switched off, the switch is caught when thrown
    import harness.guards as guards

    monkeypatch.setattr(guards, "static_guards", lambda *args, **kwargs: [])
    monkeypatch.setattr(guards, "escape_guards", lambda *args, **kwargs: [])
    run = judged(judge, suite, "guard_off.py")
    assert "switched the runtime torch guard off (_disable_current_modes)" in run.rejected


# --- results that were not computed by this call ---------------------------------------------------

def test_a_result_cached_by_address_is_caught_on_the_call_that_reuses_the_buffers(judge, suite):
    run = judged(judge, suite, "ptr_cache.py")
    assert "no Triton kernel was launched on its third call (the same argument buffers" in run.rejected
    shown = judged(judge, suite, "ptr_cache_show.py")  # a kernel launched for show does not help
    assert "output 0 was written by aten::clone, not by a kernel" in shown.rejected


def test_computing_only_when_a_buffer_comes_back_poisoned_is_wrong_on_the_unpoisoned_call(judge, suite):
    run = judged(judge, suite, "poison_sniff.py")
    assert not run.correct and wrong_values(run) > 0


def test_returning_memory_never_written_is_caught_by_its_poison(judge, suite):
    run = judged(judge, suite, "empty_result.py")  # KernelBench's "uninitialized output" hack
    assert not run.correct and run.cases[0].checks[0].unwritten == run.cases[0].checks[0].shape[0] * 32


@pytest.mark.parametrize("name, reason", [
    ("count_cache.py", "a timed call's output differs from the reference"),
    ("count_cache_silent.py", "timed calls launched no Triton kernel"),
    ("stand_in_kernel.py", "launched none of the kernels its checked calls launched"),
])
def test_a_kernel_that_stops_computing_once_timed_is_caught_by_the_timing_probe(judge, suite, name, reason):
    """Each computes honestly for as many calls on a buffer as a check makes, so the checks pass; the
    timing's probe writes new values into a repetition's buffers and compares that call's output.

    The checks pass it unless the allocator hands a later case of the same shape (the held-out case's
    x16 copy) a buffer at the address an earlier case's had: the cheat's count per address then runs out
    during the checks, which reject it for serving a result it made before. The probe must catch it
    either way: the timed sets are of another shape, so its count starts again there."""
    judge.begin()
    try:
        checked = judge.check(KernelSpec("candidate", file=str(suite / name)), seeds=1)
        assert checked.run.correct or any(caught in (checked.run.rejected or "") for caught in (
            "is the buffer an earlier call returned", "no Triton kernel was launched")), checked.run.rejected
        # Long enough for each of the 8 rotated input sets to come round more than three times.
        timed = judge.time([KernelSpec("baseline"), KernelSpec("candidate", file=str(suite / name))],
                           cases=[0], warmup_ms=2, rep_ms=150)
    finally:
        judge.end()
    assert reason in timed.rejected["candidate"] and "baseline" not in timed.rejected


# --- tampering with the harness, the channel, the files, the process tree -----------------------------

@pytest.mark.parametrize("name, static, runtime", [
    ("patch_timer.py", "assigns to triton.testing.do_bench",
     "importing the kernel replaced torch.cuda.synchronize, triton.testing.do_bench"),
    ("patch_harness.py", "the kernel imports harness (patch_harness.py:4)",
     "importing the kernel replaced harness.host.outputs_of"),
    # through names that stand for another module's objects (`from harness import tripwires as _tw`, `_T = torch.Tensor`)
    ("patch_allowed_ops.py", "the kernel imports harness (patch_allowed_ops.py:6)",
     "importing the kernel replaced harness.tripwires.ALLOWED_OPS"),
    ("patch_tensor_method.py", "assigns to torch.Tensor.detach (patch_tensor_method.py:",
     "importing the kernel replaced torch.Tensor"),
    # an operator library of the kernel's: a softmax under aten::view's name, or a custom op named view
    ("aten_override.py", "uses torch.library.Library (aten_override.py:7)",
     "torch operator libraries opened by the kernel (torch.library): 0 -> 1"),
    # any module the worker's machinery calls: its answers go out through json
    ("json_scrub.py", "assigns to json.dumps", "importing the kernel replaced json"),
    # the tripwires let torch's own calls through, told by the file a frame's code comes from
    ("name_spoof.py", "assigns to __name__", "switched the runtime torch guard off (_ExcludeDispatchKeyGuard)"),
    ("fork_survivor.py", "the kernel calls os.fork (fork_survivor.py:", "outlived the kernel's import"),
    ("tf32_in_call.py", "assigns to torch.backends.cuda.matmul.allow_tf32",
     "torch.backends.cuda.matmul.allow_tf32: False -> True"),
])
def test_tampering_is_named_by_the_source_and_caught_at_runtime(judge, suite, name, static, runtime, monkeypatch):
    assert static in judged(judge, suite, name).rejected
    import harness.guards as guards

    monkeypatch.setattr(guards, "escape_guards", lambda *args, **kwargs: [])
    assert runtime in judged(judge, suite, name).rejected


@pytest.mark.parametrize("name, reason", [
    # the harness reads outputs after the call: what it reads must not run the kernel's code
    ("lazy_list_output.py", "the entry returned a _Lazy, a list with its own iteration: outputs are plain tensors"),
    ("lazy_tensor_output.py", "the entry returned a _Lazy, a tensor subclass"),
    # code below the guard: a subclass's own dispatch, Triton's launch (hooks, pointer arguments' data_ptr())
    ("dispatch_subclass.py", "switched the runtime torch guard off (a tensor subclass, _W, through aten::view)"),
    ("pre_run_hook.py", "switched the runtime torch guard off (a pre-run hook on noop_kernel, which Triton runs"),
    ("duck_pointer.py", "switched the runtime torch guard off (an argument of noop_kernel that is a _Ptr, not a tensor"),
    # switches below the mode stack, and a tripwire's original reached through the wrapper
    ("exclude_python_key.py", "switched the runtime torch guard off (_ExcludeDispatchKeyGuard)"),
    ("unwrapped_tripwire.py", "has no attribute '__wrapped__'"),
    # honest only while a dispatch mode is on
    ("judge_aware.py", "the kernel asked whether a dispatch mode is on (_get_current_dispatch_mode)"),
    # a name torch bound to a switch before its tripwire went in
    ("no_dispatch_alias.py", "switched the runtime torch guard off (_DisableTorchDispatch)"),
    # the zones the guard stands aside in, entered by the kernel: an autotuner's benchmark, a grid callable
    ("bench_zone.py", "torch fallback at runtime: aten::_softmax"),
    ("grid_callable.py", "torch fallback at runtime: aten::_softmax"),
    ("number_subclass.py", "a number with methods of its own: Triton compares and hashes it in the launch"),
    # an output no hand-over carries is the kernel's rejection, not a worker failure
    ("meta_output.py", "an output could not be handed over (NotImplementedError"),
])
def test_code_the_harness_would_run_unwatched_is_refused(judge, suite, name, reason, runtime_only):
    run = judged(judge, suite, name)
    assert not run.correct and reason in run.rejected, run.rejected


def test_a_custom_op_is_named_by_its_namespace_not_its_bare_name(judge, suite, runtime_only):
    assert "torch fallback at runtime: kbcheat::view" in judged(judge, suite, "custom_op.py").rejected


def test_a_process_left_behind_is_killed(judge, suite, runtime_only):
    pid_file = suite / "survivor.pid"
    pid_file.unlink(missing_ok=True)
    assert "outlived the kernel's import" in judged(judge, suite, "fork_survivor.py").rejected
    pid, started = pid_file.read_text().split()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return  # gone
    assert fields[19] != started or fields[0] == "Z", f"process {pid} is still running"


def test_a_forged_answer_on_the_protocol_channel_is_refused(judge, suite):
    run = judged(judge, suite, "forged_channel.py")
    assert "did not carry this worker's secret" in run.rejected


def test_a_rewritten_task_file_is_caught_and_restored(judge, suite):
    task = suite / "task_softmax.py"
    before = task.read_bytes()
    assert "task_softmax.py was rewritten while the kernel ran (restored)" in judged(judge, suite, "rewrite_task.py").rejected
    assert task.read_bytes() == before
    assert judged(judge, suite, "softmax.py").correct  # and the next candidate is judged as before


def test_global_state_changed_at_import_is_named(judge, suite):
    run = judged(judge, suite, "default_dtype.py")
    assert "importing the kernel changed process-wide state: torch default dtype: torch.float32 -> torch.float16" \
        in run.rejected


def test_one_candidates_import_cannot_reach_the_next_candidates_verdict(judge, suite):
    """A deposits its softmax on the torch module; B returns it when it finds it, garbage otherwise."""
    reports = run_candidates(judge.spec, OPTIONS, str(suite / "softmax.py"),
                             [str(suite / "deposit.py"), str(suite / "freeloader.py")], "softmax", judge)
    freeloader = reports[1].run("candidate")
    assert not freeloader.correct and wrong_values(freeloader) > 0
    # The same pair in one process: B would have passed.
    shared = subprocess.run([sys.executable, "-c", (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import deposit, freeloader; "
        "x = torch.randn(3, 20); print(torch.allclose(freeloader.softmax(x), torch.softmax(x, -1)))"),
        str(suite)], capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": ""})
    assert shared.stdout.strip() == "True", shared.stderr


def test_the_judging_process_never_imports_a_kernel_under_judgement(judge, suite):
    judged(judge, suite, "getattr_fallback.py")
    loaded = [m for m in list(sys.modules.values()) if str(getattr(m, "__file__", "") or "").startswith(str(suite))]
    assert loaded == []


# --- outputs -------------------------------------------------------------------------------

def test_an_fp16_output_for_an_fp32_operator_is_refused(judge, suite):
    assert "output 0 is float16, the task's own kernel's float32" in judged(judge, suite, "fp16_output.py").rejected


def test_fewer_outputs_than_the_reference_is_refused(suite):
    with Judge(TaskSpec(path=str(suite / "task_minmax.py")), BACKEND, timeout_s=60) as minmax:
        report = run_task(minmax.spec, OPTIONS, candidate=str(suite / "fewer_outputs.py"), judge=minmax)
    assert "the kernel returned 1 output(s), the task's own kernel 2" in report.run("candidate").rejected


def test_what_outputs_must_be_is_the_task_kernels_when_the_reference_widens(suite):
    with Judge(TaskSpec(path=str(suite / "task_wide_sum.py")), BACKEND, timeout_s=60) as session:
        report = run_task(session.spec, OPTIONS, candidate=str(suite / "wide_sum_fp16.py"), judge=session)
    base, cand = report.run("baseline"), report.run("candidate")
    assert base.correct and base.cases[0].checks[0].dtype == "float32"  # not the reference's float64
    assert base.cases[0].checks[0].rtol == pytest.approx(1e-4)  # fp32's tolerance, not float64's
    assert "output 0 is float16, the task's own kernel's float32" in cand.rejected


# --- inputs it could have read in the task file ----------------------------------------------------

def test_held_out_cases_are_drawn_per_run_so_a_kernel_for_the_listed_shapes_fails(judge, suite):
    fixed = replace(OPTIONS, seed=5)
    run = judged(judge, suite, "listed_shapes.py", fixed)
    bad = next(c for c in run.cases if not c.correct)
    assert bad.generated and int(bad.case["n"]) not in (32, 100, 17)
    assert judged(judge, suite, "listed_shapes.py", replace(fixed, generated_heldout=0)).correct  # listed alone: fooled
    first, second = (run_task(judge.spec, replace(OPTIONS, seed=s), judge=judge) for s in (5, 6))
    drawn = [[c.label for c in r.run("baseline").cases if c.generated] for r in (first, second)]
    assert drawn[0] and drawn[0] != drawn[1] and first.seed == 5


def test_inputs_from_a_fixed_seed_cannot_be_recognised(judge, suite):
    """The cheat remembers the inputs a fixed-seed harness makes (ours did: 1000 * case + seed)."""
    shared = subprocess.run([sys.executable, "-c", (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import seed_replay; torch.manual_seed(1000); "
        "x = torch.randn(3, 100); print(torch.allclose(seed_replay.softmax(x), torch.softmax(x, -1)))"),
        str(suite)], capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": ""})
    assert shared.stdout.strip() == "True", shared.stderr  # against fixed seeds it would have passed
    run = judged(judge, suite, "seed_replay.py")
    assert not run.correct and wrong_values(run) > 0


# --- honest kernels pass ---------------------------------------------------------------------

@pytest.mark.parametrize("task, kernel", [
    ("task_softmax.py", "online_softmax.py"),
    ("task_softmax.py", "autotuned_softmax.py"),
    ("task_minmax.py", "minmax.py"),
    ("task_add_out.py", "add_out.py"),
    ("task_log.py", "log_kernel.py"),
    ("task_axpy_inplace.py", "axpy_inplace.py"),  # an input updated in place, timed call after timed call
])
def test_honest_kernels_pass_every_guard(suite, task, kernel):
    with Judge(TaskSpec(path=str(suite / task)), BACKEND, timeout_s=60) as session:
        report = run_task(session.spec, replace(OPTIONS, seeds=2), candidate=str(suite / kernel), judge=session)
        for run in report.runs:
            assert run.verdict == "correct" and run.compared_with == "the reference", (run.role, run.rejected)
        if task == "task_log.py":
            check = report.run("candidate").cases[0].checks[0]
            assert check.nan_mismatch == 0 and check.inf_mismatch == 0
        session.begin()
        try:  # and their timed calls pass the probe
            # long enough for each rotated input set to come round several times (an inout accumulates)
            timed = session.time([KernelSpec("baseline"), KernelSpec("candidate", file=str(suite / kernel))], cases=[0],
                                 warmup_ms=2, rep_ms=150)
        finally:
            session.end()
        assert timed.rejected == {}, timed.rejected


def test_the_cli_names_the_cheat_in_one_line(suite):
    result = CliRunner().invoke(__import__("cli", fromlist=["main"]).main, [
        "run", str(suite / "task_softmax.py"), "--candidate", str(suite / "alias_fallback.py"), "--backend",
        BACKEND, "--seeds", "1", "--json", "--no-time"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    candidate = next(r for r in report["runs"] if r["role"] == "candidate")
    assert candidate["verdict"] == "rejected" and "torch fallback at runtime: aten::_softmax" in candidate["rejected"]
    assert isinstance(report["seed"], int)


@pytest.mark.skipif(BACKEND != "interpreter", reason="the loop's test judge checks on the interpreter")
def test_an_optimize_round_records_the_cheat_that_rejected_its_rewrite(tmp_path, monkeypatch):
    import threading
    from http.server import HTTPServer

    from test_engine import _ChatHandler
    from test_optimize import KERNEL, SPEC, TimedJudge

    from diagnose.optimize import OptimizeOptions, optimize

    cheat = KERNEL.read_text().replace("    return out\n", "    return getattr(torch, 'su' + 'm')(x, -1)\n")

    class Handler(_ChatHandler):
        def reply_text(self, body: dict) -> str:
            return f"```python\n{cheat}```\n"

    Handler.requests = []
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KB_LLM_BASE_URL", f"http://127.0.0.1:{server.server_port}/v1")
    monkeypatch.setenv("KB_LLM_RETRIES", "0")
    judge = TimedJudge(pipelining_pays=False)
    try:
        store = optimize(SPEC, OptimizeOptions(rounds=5, backend=BACKEND, seeds=1, llm="openai"),
                         tmp_path / "run", judge=judge)
    finally:
        server.shutdown()
        judge.close()
    llm_rounds = [r for r in store.rounds() if r.rewriter == "llm"]
    assert llm_rounds and all(r.outcome == "rejected" for r in llm_rounds)
    assert "torch fallback at runtime: aten::sum" in llm_rounds[0].reason
    store.close()


def test_the_reference_worker_reports_free_memory_on_cuda_only(judge):
    """check_in_parallel caps parallel checks by the device's free memory, asked of the reference worker;
    off CUDA there is nothing to cap and it answers nothing."""
    judge.begin()
    try:
        assert judge.device_memory() == {}
    finally:
        judge.end()


def test_a_custom_op_the_task_names_is_allowed(suite, runtime_only):
    """A task whose own kernel is wrapped as a custom op says so in allow_torch; the same op then passes."""
    task = suite / "task_softmax_custom_op.py"
    task.write_text((suite / "task_softmax.py").read_text() + '\nallow_torch = ["kbcheat::*"]\n')
    with Judge(TaskSpec(path=str(task)), BACKEND, timeout_s=60) as session:
        report = run_task(session.spec, OPTIONS, candidate=str(suite / "custom_op.py"), judge=session)
    assert report.run("candidate").correct, report.run("candidate").rejected
