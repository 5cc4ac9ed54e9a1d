"""`kb bench`: conditions side by side over a suite, one worker per device, resumable after a kill;
the report. Jobs are real subprocesses with real rounds stores; their timing is the deterministic
judge of test_optimize, on the CPU interpreter."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cli import main
from diagnose.bench import BenchSpec, Condition, add_operators, create_bench, jobs, load_bench, run_bench, write_report
from harness.errors import UserFacingError

JOB = Path(__file__).resolve().parent / "bench_job.py"


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    for name in ("rowsum_a", "rowsum_b"):
        shutil.copytree(FIXTURES / "optimize", suite / name)
    return suite


def _command(deaths: dict[tuple[str, str], int]):
    def command(job, spec, stop_after):
        die = deaths.pop((job.condition.name, job.operator), None)
        return [sys.executable, str(JOB), str(job.task), str(job.run_dir), job.condition.home or "-",
                "-" if stop_after is None else f"{stop_after:.0f}", "-" if die is None else str(die)]
    return command


def test_conditions_run_side_by_side_and_a_killed_job_resumes(tmp_path):
    bench_dir = tmp_path / "bench"
    spec = BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"],
                     [Condition("fresh"), Condition("other", home=str(tmp_path / "home"))], rounds=2,
                     backend="interpreter")
    create_bench(bench_dir, spec)
    # The first job is killed (SIGKILL) while validating round 1; the others finish.
    first = run_bench(bench_dir, workers=2, command=_command({("fresh", "rowsum_a"): 2}))
    assert [(j.condition.name, j.operator, j.state) for j in first] == [
        ("fresh", "rowsum_a", "partial"), ("other", "rowsum_a", "finished"),
        ("fresh", "rowsum_b", "finished"), ("other", "rowsum_b", "finished")]
    devices = {p.read_text() for p in (bench_dir / "runs").glob("*/*.device")}
    assert devices == {"0", "1"}  # one worker per device
    again = run_bench(bench_dir, workers=2, command=_command({}))
    assert all(j.state == "finished" for j in again)
    data = write_report(bench_dir)
    rows = {(r["condition"], r["operator"]): r for r in data["operators"]}
    resumed = rows[("fresh", "rowsum_a")]
    assert resumed["rounds"] == 2 and resumed["speedup_measured"]
    assert resumed["patterns_tried"] == rows[("other", "rowsum_a")]["patterns_tried"]  # nothing lost or repeated
    suite = data["suite_by_condition"]["fresh"]
    assert suite["operators"] == 2 and suite["finished"] == 2 and suite["improved"] == 2
    assert suite["geomean"] == pytest.approx(rows[("fresh", "rowsum_a")]["speedup"] ** 0.5
                                             * rows[("fresh", "rowsum_b")]["speedup"] ** 0.5, rel=1e-3)
    assert suite["best_from_level"]["L1"] + suite["best_from_level"]["L3"] >= 1
    # The best kernel (70 µs in the test's cost model: pipelined, num_warps=2) against eager at 80 µs.
    assert suite["best_vs_eager"] == pytest.approx(80 / (100 * 0.7 * 1.0), rel=1e-3)
    assert suite["initial_vs_eager"] == pytest.approx(80 / (100 * 1.1), rel=1e-3)
    assert suite["eager_operators"] == 2  # both timed eager; one whose stand-in was not timed would not count
    md = (bench_dir / "report.md").read_text()
    assert "| rowsum_a | " in md and "| geomean speedup vs initial |" in md and "4.35" in md
    # Each round records how far its diagnosis escalated; the report counts those trajectories.
    assert all(r["deepest_level"] for r in data["operators"]) and suite["trajectories_reaching"]["L1"] == 2
    assert "| trajectories reaching L4 (runs that diagnosed, finished or not) |" in md
    out = CliRunner().invoke(main, ["bench-report", str(bench_dir), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["suite_by_condition"]["other"]["finished"] == 2
    # Two benches (our suite, imported first drafts) side by side, each condition a column.
    twin = tmp_path / "twin"
    shutil.copytree(bench_dir, twin)
    out = CliRunner().invoke(main, ["bench-report", str(bench_dir), str(twin), "--into", str(tmp_path / "cmp")])
    assert out.exit_code == 0, out.output
    header = next(line for line in out.stdout.splitlines() if line.startswith("| figure |"))
    assert header == "| figure | bench: fresh | bench: other | twin: fresh | twin: other | published |"
    geomean = next(line for line in out.stdout.splitlines() if line.startswith("| geomean speedup vs initial |"))
    assert geomean.endswith(f"| {suite['geomean']:.3f}x | 4.35 |")
    assert (tmp_path / "cmp" / "compare.md").read_text().strip() == out.stdout.strip()
    # The bench's rounds fold into pattern statistics in one call (the split-half experiment's step 2).
    folded = CliRunner().invoke(main, ["--home", str(tmp_path / "learned"), "synthesize", str(bench_dir), "--json"])
    assert folded.exit_code == 0, folded.output
    assert json.loads(folded.stdout)["rounds"] == 8


def test_a_deadline_starts_nothing_new_and_leaves_the_bench_resumable(tmp_path):
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"], [Condition("fresh")], rounds=2,
                                      backend="interpreter"))
    assert all(j.state == "new" for j in run_bench(bench_dir, stop_after=0, command=_command({})))
    data = write_report(bench_dir)
    assert data["suite_by_condition"]["fresh"]["finished"] == 0
    assert data["suite_by_condition"]["fresh"]["geomean"] is None  # nothing finished: no figure, not 0x
    with pytest.raises(Exception, match="already holds a bench"):
        create_bench(bench_dir, load_bench(bench_dir))
    assert [j.state for j in jobs(bench_dir, load_bench(bench_dir))] == ["new"]


@pytest.mark.parametrize("args, message", [
    (["bench", "--backend", "cuda", "--ops", "nope"], "no operator nope in"),
    (["bench", "--backend", "cuda", "--strategy", "deepest"], "unknown strategy 'deepest'"),
    (["bench", "--resume", "."], "is not a bench directory"),
])
def test_bench_cli_errors_are_one_line(args, message, tmp_path):
    out = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), *args])
    assert out.exit_code == 2 and message in out.output


def test_jobs_run_as_ray_tasks_one_gpu_each(tmp_path):
    """A local Ray cluster with two logical GPUs stands in for several hosts: each job is a Ray task
    that Ray pins to one GPU (CUDA_VISIBLE_DEVICES), and the bench finishes as with local workers."""
    ray = pytest.importorskip("ray")
    from diagnose.bench.schedule import REPO

    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("fresh")], rounds=1,
                                      backend="interpreter"))
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        done = run_bench(bench_dir, command=_command({}), ray_address="local")
    finally:
        ray.shutdown()
    assert [j.state for j in done] == ["finished", "finished"]
    assert {p.read_text() for p in (bench_dir / "runs").glob("*/*.device")} <= {"0", "1"}


def test_resumed_jobs_keep_the_budget_and_names_are_not_doubled(tmp_path):
    from diagnose.bench import optimize_command
    from diagnose.bench.job import JobRequest

    bench_dir = tmp_path / "bench"
    spec = create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_a"], [Condition("fresh")],
                                             rounds=2, time_budget_s=120, backend="cuda"))
    assert spec.operators == ["rowsum_a"]  # one run directory per operator
    (job,) = jobs(bench_dir, spec)
    job.state = "partial"
    request = JobRequest.from_json(optimize_command(job, spec, 300)[-1])
    assert request.resume and request.run_dir == str(job.run_dir)
    assert request.options.time_budget_s == 120 and request.stop_after == 300


_SLOW_JOB = """
import os, signal, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
def stop(*_):
    open(sys.argv[1] + ".interrupted", "w").write("yes")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
time.sleep(120)
"""

_BENCH = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from diagnose.bench import run_bench
def command(job, spec, left):
    return [sys.executable, "-c", {job!r}, str(Path({marks!r}) / job.operator)]
run_bench(Path({bench!r}), workers=2, command=command)
"""


def test_ctrl_c_interrupts_the_running_jobs(tmp_path):
    """Jobs run in their own sessions, so a terminal's Ctrl-C reaches only the bench: it must pass the
    interrupt on (kb optimize then marks its run interrupted) instead of leaving the jobs running."""
    import os
    import signal
    import subprocess
    import time

    from diagnose.bench.schedule import REPO

    bench_dir, marks = tmp_path / "bench", tmp_path / "marks"
    marks.mkdir()
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("fresh")],
                                      backend="cuda"))
    script = _BENCH.format(repo=str(REPO), job=_SLOW_JOB, marks=str(marks), bench=str(bench_dir))
    bench = subprocess.Popen([sys.executable, "-c", script])
    pids = [marks / "rowsum_a", marks / "rowsum_b"]
    for _ in range(200):
        if all(p.is_file() and p.read_text() for p in pids):
            break
        time.sleep(0.1)
    bench.send_signal(signal.SIGINT)
    assert bench.wait(timeout=60) != 0
    assert all((marks / f"{p.name}.interrupted").is_file() for p in pids)  # each job got the interrupt
    for p in pids:
        try:
            os.kill(int(p.read_text()), 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive


def test_workers_take_their_devices_from_the_callers_visible_devices(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("fresh")],
                                      backend="cuda"))
    record = "import os, sys, time; time.sleep(0.5); open(sys.argv[1], 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    run_bench(bench_dir, workers=2, command=lambda job, spec, left: [sys.executable, "-c", record,
                                                                      str(marks / job.operator)])
    assert {p.read_text() for p in marks.iterdir()} == {"5", "7"}  # the GPUs the caller was given, not 0 and 1


def test_stand_ins_are_timed_once_per_operator_and_windows_reach_every_job(tmp_path):
    from diagnose.bench import optimize_command, set_timing_windows
    from diagnose.bench.job import JobRequest

    bench_dir = tmp_path / "bench"
    spec = create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"], [Condition("a"), Condition("b")],
                                             backend="cuda", references=["eager", "compiled"], rep_ms=100))
    first, second = jobs(bench_dir, spec)
    request = JobRequest.from_json(optimize_command(first, spec, None)[-1])
    assert request.options.references == ("eager", "compiled")
    # The same stand-ins are timed in condition a only: b's job times none.
    assert JobRequest.from_json(optimize_command(second, spec, None)[-1]).options.references == ()
    # A bench written before the rule times them in every condition, as it did.
    legacy = {k: v for k, v in json.loads((bench_dir / "bench.json").read_text()).items() if k != "references_once"}
    assert BenchSpec.from_dict(legacy).references_once is False
    assert request.options.rep_ms == 100 and request.options.warmup_ms is None
    # Resuming with new windows changes the jobs still to run and says so in the bench's note.
    out = CliRunner().invoke(main, ["bench", "--resume", str(bench_dir), "--warmup-ms", "50", "--stop-after", "0"])
    assert out.exit_code == 0, out.output
    spec = load_bench(bench_dir)
    assert (spec.warmup_ms, spec.rep_ms) == (50, 100) and "Timing windows set to warmup_ms 50" in spec.note
    assert set_timing_windows(bench_dir, 50, None).note == spec.note  # unchanged windows: no new note
    again = JobRequest.from_json(optimize_command(jobs(bench_dir, spec)[1], spec, None)[-1])
    assert again.options.warmup_ms == 50


def test_a_bench_hands_its_llm_settings_to_every_run(tmp_path):
    from diagnose.bench import optimize_command
    from diagnose.bench.job import JobRequest

    bench_dir = tmp_path / "bench"
    settings = {"candidates": 3, "repairs": 1, "max_tokens_per_run": 50000, "llm_first": True}
    spec = create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"], [Condition("a")], backend="cuda",
                                             llm="openai", llm_options=settings))
    options = JobRequest.from_json(optimize_command(jobs(bench_dir, spec)[0], spec, None)[-1]).options
    assert (options.llm, options.candidates, options.repairs, options.max_tokens_per_run, options.llm_first) == (
        "openai", 3, 1, 50000, True)
    assert load_bench(bench_dir).llm_options == settings  # kept in bench.json: a resumed bench asks the same way


def test_a_bench_hands_its_breadth_to_every_run_and_its_report_says_it(tmp_path):
    from diagnose.bench import optimize_command
    from diagnose.bench.job import JobRequest
    from diagnose.bench.report import bench_report, to_markdown

    bench_dir = tmp_path / "bench"
    spec = create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"], [Condition("a")], rounds=2,
                                             backend="cuda", breadth=3))
    assert JobRequest.from_json(optimize_command(jobs(bench_dir, spec)[0], spec, None)[-1]).options.breadth == 3
    assert load_bench(bench_dir).breadth == 3  # kept in bench.json: a resumed bench runs its rounds as wide
    assert "2 rounds per operator of 3 hypotheses each" in to_markdown(bench_report(bench_dir))


def test_conditions_without_stand_ins_borrow_them_through_the_initial_kernel():
    from diagnose.bench.report import _borrow_references

    rows = [{"operator": "x", "condition": "a", "speedup": 1.5, "speedup_measured": True,
             "vs_eager": {"initial": 2.0, "best": 3.0}, "vs_compiled": {"initial": None, "best": None}},
            {"operator": "x", "condition": "b", "speedup": 1.2, "speedup_measured": True,
             "vs_eager": {"initial": None, "best": None}, "vs_compiled": {"initial": None, "best": None}},
            {"operator": "y", "condition": "b", "speedup": 1.0, "speedup_measured": True,
             "vs_eager": {"initial": None, "best": None}}]
    _borrow_references(rows)
    assert rows[1]["vs_eager"] == {"initial": 2.0, "best": 2.4} and rows[1]["references_from"] == "a"
    assert rows[0]["vs_eager"]["best"] == 3.0 and "references_from" not in rows[0]  # its own, kept
    assert rows[2]["vs_eager"]["best"] is None  # no run of y timed the stand-ins: nothing to borrow


def test_the_roofline_bound_is_what_every_case_at_its_ceiling_would_give():
    from diagnose.bench.report import _speedup_bound, _suite

    def case(fraction, median_us=100.0, floor_us=None):
        return {"timing": {"median_us": median_us},
                "roofline": {"bytes": 1e6, "flops": None, "achieved_gbps": None, "achieved_tflops": None,
                             "fraction": fraction, "bound": "memory", "floor_us": floor_us}}

    baseline = {"runs": [{"role": "baseline", "cases": [case(0.5), case(0.25), case(1.2), {"roofline": None}]}]}
    # 2x and 4x of headroom; a case past the measured ceiling has none (1.0), not less than none.
    assert _speedup_bound(baseline, "baseline") == pytest.approx((2 * 4 * 1) ** (1 / 3), rel=1e-3)
    assert _speedup_bound({"runs": []}, "baseline") is None
    # A small case: 5 µs at 1% of the copy roofline is 100x from the bandwidth line, but no launch
    # takes less than the 4 µs floor: 1.25x is all a rewrite could gain. Without a floor: 100x.
    tiny = {"runs": [{"role": "baseline", "cases": [case(0.01, median_us=5.0, floor_us=4.0)]}]}
    assert _speedup_bound(tiny, "baseline") == pytest.approx(1.25)
    tiny["runs"][0]["cases"][0]["roofline"]["floor_us"] = None
    assert _speedup_bound(tiny, "baseline") == pytest.approx(100.0)
    # Placed before the floor was measured: the device's floor measured since serves it.
    assert _speedup_bound(tiny, "baseline", floor_us=4.0) == pytest.approx(1.25)
    rows = [{"status": "finished", "speedup": 1.1, "best_round": 1, "speedup_bound": b} for b in (1.5, 2.5, 6.0)]
    suite = _suite(rows)
    assert suite["bound_geomean"] == pytest.approx((1.5 * 2.5 * 6.0) ** (1 / 3), rel=1e-3)
    assert (suite["bound_median"], suite["bound_above_2x"], suite["bound_above_5x"]) == (2.5, 2, 1)


def test_the_suite_counts_what_every_runs_model_calls_cost():
    from diagnose.bench.report import _suite, to_markdown

    rows = [{"status": "finished", "speedup": 1.2, "best_round": 1, "llm_cost": {"calls": 3, "tokens_in": 900,
                                                                                 "tokens_out": 100}},
            {"status": "paused", "speedup": 1.0, "best_round": 0, "llm_cost": {"calls": 1, "tokens_in": 50,
                                                                               "tokens_out": 50}},
            {"status": "finished", "speedup": 1.0, "best_round": 0, "llm_cost": None}]
    suite = _suite(rows)
    assert (suite["llm_calls"], suite["llm_tokens"]) == (4, 1100)  # a paused run spent its tokens too
    data = {"bench": "b", "created": "now", "suite": "s", "rounds": 3, "llm": "openai", "conditions": [{"name": "c"}],
            "suite_by_condition": {"c": suite}, "operators": [], "published": {"operators": 37, "geomean": 4.35,
            "median": 2.73, "above_2x": 22, "above_5x": 13, "median_best_round": 10}}
    assert "| LLM tokens in + out (all runs) | 1100 |" in to_markdown(data)


def test_an_operator_whose_eager_stand_in_was_not_timed_says_why_and_leaves_the_eager_figures():
    from diagnose.bench.report import _eager_untimed, _suite, to_markdown

    why = "9 of 9 timed calls returned host tensors: their work ran on the CPU, which the device events do not time"
    final = {"notes": ["compiled reference not timed for n=1: other", f"eager reference not timed for n=1: {why}",
                       "eager reference not timed for n=2: later"]}
    assert _eager_untimed(final) == why and _eager_untimed({"notes": []}) is None and _eager_untimed(None) is None
    rows = [{"operator": "ones_like", "status": "finished", "speedup": 1.0, "best_round": 0, "eager_untimed": why,
             "vs_eager": {"initial": None, "best": None}},
            {"operator": "relu", "status": "finished", "speedup": 1.0, "best_round": 0,
             "vs_eager": {"initial": 1.02, "best": 1.02}}]
    suite = _suite(rows)
    assert suite["eager_operators"] == 1 and suite["best_vs_eager"] == pytest.approx(1.02)
    data = {"bench": "b", "created": "now", "suite": "s", "rounds": 3, "llm": "none", "conditions": [{"name": "c"}],
            "suite_by_condition": {"c": suite}, "operators": [dict(r, condition="c") for r in rows],
            "published": {"operators": 37, "geomean": 4.35, "median": 2.73, "above_2x": 22, "above_5x": 13,
                          "median_best_round": 10}}
    md = to_markdown(data)
    assert f"No eager figure (its stand-in was not timed): ones_like, {why}." in md
    assert "| operators with a PyTorch eager timing (the two rows below are over these) | 1 |" in md


def test_trajectories_count_how_far_every_run_diagnosed_finished_or_not():
    from diagnose.bench.report import _suite

    rows = [{"status": "paused", "deepest_level": "L4", "speedup": 1.0, "best_round": 0},  # cut short after L4
            {"status": "finished", "deepest_level": "L2", "speedup": 1.1, "best_round": 1},
            {"status": "finished", "deepest_level": None, "speedup": 1.0, "best_round": 0}]  # no round diagnosed
    assert _suite(rows)["trajectories_reaching"] == {"L1": 2, "L2": 2, "L3": 1, "L4": 1}


def test_the_suite_counts_best_rounds_that_no_finding_asked_for():
    from diagnose.bench.report import _suite

    rows = [{"status": "finished", "speedup": 1.1, "best_round": 3, "best_untargeted": True},
            {"status": "finished", "speedup": 1.2, "best_round": 1, "best_untargeted": False},
            {"status": "paused", "speedup": 1.3, "best_round": 2, "best_untargeted": True},  # not finished
            {"status": "finished", "speedup": 1.0, "best_round": 0, "best_untargeted": False}]
    assert _suite(rows)["best_untargeted"] == 1


def test_retime_measures_the_end_again_and_repeats_no_round(tmp_path):
    from diagnose.bench import retime
    from diagnose.rounds import RoundsStore

    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("only")], rounds=1,
                                      backend="interpreter"))
    assert all(j.state == "finished" for j in run_bench(bench_dir, workers=2, command=_command({})))

    def state(op):
        store = RoundsStore(bench_dir / "runs" / "only" / op)
        try:
            return store.run(), [(r.idx, r.started) for r in store.rounds()]
        finally:
            store.close()

    before, rounds_before = state("rowsum_a")
    assert before.final and before.final.get("vs_eager")
    with pytest.raises(Exception, match="no operator nope"):
        retime(bench_dir, ["nope"])
    # A typo in --retime changes nothing, the windows included.
    out = CliRunner().invoke(main, ["bench", "--resume", str(bench_dir), "--retime", "nope", "--rep-ms", "99"])
    assert out.exit_code == 2 and load_bench(bench_dir).rep_ms is None
    assert [j.operator for j in retime(bench_dir, ["rowsum_a"])] == ["rowsum_a"]
    assert [j.state for j in jobs(bench_dir, load_bench(bench_dir))] == ["partial", "finished"]
    # A run whose note says why it stopped keeps it through the re-timing.
    store = RoundsStore(bench_dir / "runs" / "only" / "rowsum_b")
    store.update_run(note="time budget of 60 s reached after 1 rounds")
    store.close()
    retime(bench_dir, ["rowsum_b"])
    assert state("rowsum_a")[0].final is None
    again = run_bench(bench_dir, workers=1, command=_command({}))
    assert [j.state for j in again] == ["finished", "finished"]
    assert state("rowsum_b")[0].note == "time budget of 60 s reached after 1 rounds"
    after, rounds_after = state("rowsum_a")
    assert after.final and after.final["best_round"] == before.final["best_round"] and rounds_after == rounds_before
    assert after.options["rounds"] == len(rounds_before)  # no second budget
    out = CliRunner().invoke(main, ["bench", "--bench-dir", str(tmp_path / "other"), "--retime", "rowsum_a"])
    assert out.exit_code == 2 and "--retime works on an existing bench" in out.output


def test_jobs_sharing_a_host_keep_torch_compile_to_one_process_each(monkeypatch):
    from diagnose.bench.schedule import _job_env

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    shared = _job_env("1")
    assert shared["CUDA_VISIBLE_DEVICES"] == "1" and shared["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in _job_env()  # one job alone keeps Inductor's pool
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")
    assert _job_env("0")["TORCHINDUCTOR_COMPILE_THREADS"] == "4"  # the user's own setting wins


def test_a_job_runs_the_loop_from_the_options_record_in_a_process_of_its_own(tmp_path):
    """What a bench job runs (diagnose/bench/job.py), end to end: no rounds, so only the baseline is judged."""
    from diagnose.bench.job import JobRequest
    from diagnose.optimize import OptimizeOptions

    task = _suite(tmp_path) / "rowsum_a" / "task.py"
    request = JobRequest(str(task), str(tmp_path / "run"), resume=False, home=str(tmp_path / "no-home"),
                         options=OptimizeOptions(rounds=0, backend="interpreter", seeds=1, references=()))
    assert JobRequest.from_json(request.to_json()) == request
    done = subprocess.run(request.argv(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "finished" and summary["rounds"] == 0 and summary["run"] == "run"
    missing = replace(request, task=str(tmp_path / "nope.py"), run_dir=str(tmp_path / "run2"))
    failed = subprocess.run(missing.argv(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert failed.returncode == 2 and failed.stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in failed.stderr


def test_the_suite_reports_the_share_of_log_headroom_taken_and_the_slowest_case():
    """Issues 26/27's goals as the report computes them: ln(speedup) / ln(bound) over operators with a
    bound above 1.2x, unclamped; the slowest single case against its initial kernel; roofline medians."""
    from diagnose.bench.report import _suite

    def row(speedup, bound, cases, before, after, noise=0.02):
        return {"status": "finished", "speedup": speedup, "speedup_bound": bound, "best_round": 1,
                "per_case": cases, "roofline_initial": before, "roofline_best": after, "final_noise": noise}

    suite = _suite([row(2.0, 4.0, {"a": 2.5, "b": 1.6}, 0.25, 0.5),   # half the headroom, in log terms
                    row(3.0, 1.5, {"a": 3.0}, 0.6, 0.9),              # past its bound: counted as measured
                    row(1.05, 1.1, {"a": 1.2, "b": 0.97}, 0.9, 0.95),  # too little headroom to count
                    row(0.97, 1.1, {"a": 0.82, "b": 1.05}, None, None, noise=0.234)])  # at the launch floor
    assert suite["headroom_operators"] == 2
    assert suite["headroom_captured"] == round((0.5 + math.log(3) / math.log(1.5)) / 2, 4)
    assert suite["worst_case_vs_initial"] == 0.82
    assert suite["cases_below_initial_beyond_noise"] == 1  # 0.97 beyond a 2% noise; 0.82 within 23.4%
    assert (suite["roofline_initial_median"], suite["roofline_best_median"]) == (0.6, 0.9)


def test_a_resumed_bench_takes_operators_a_later_session_adds(tmp_path):
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"], [Condition("a"), Condition("b")], rounds=1,
                                      backend="interpreter"))
    assert add_operators(bench_dir, ["rowsum_a", "rowsum_b", "rowsum_b"]) == ["rowsum_b"]
    spec = load_bench(bench_dir)
    assert spec.operators == ["rowsum_a", "rowsum_b"] and "Operators added on" in spec.note and "rowsum_b" in spec.note
    assert sorted((j.condition.name, j.operator, j.state) for j in jobs(bench_dir, spec)) == [
        ("a", "rowsum_a", "new"), ("a", "rowsum_b", "new"), ("b", "rowsum_a", "new"), ("b", "rowsum_b", "new")]
    assert add_operators(bench_dir, ["rowsum_b"]) == [] and load_bench(bench_dir).note == spec.note
    with pytest.raises(UserFacingError, match="no operator nope in"):
        add_operators(bench_dir, ["nope"])
    assert load_bench(bench_dir).operators == ["rowsum_a", "rowsum_b"]  # the bad call changed nothing
    out = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "bench", "--resume", str(bench_dir), "--ops", "nope",
                                    "--stop-after", "0"])
    assert out.exit_code == 2 and "no operator nope in" in out.output


def test_a_bench_says_once_when_its_deep_strategies_cannot_search_the_kb(tmp_path, monkeypatch, capsys):
    # a GPU image without the KB stack: progressive and always-deep runs then stop at L3, and the report says so
    from kb.home import KBHome

    home = KBHome(tmp_path / "home").ensure()
    monkeypatch.setitem(sys.modules, "kb.retrieve", None)  # import kb.retrieve now raises ImportError
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a"],
                                      [Condition("deep", home=str(home.root)),
                                       Condition("profile", strategy="profile-only", home=str(home.root))],
                                      rounds=1, backend="interpreter"))
    for _ in range(2):  # a resume says it on stderr again, and keeps one note
        run_bench(bench_dir, stop_after=0, command=_command({}))
        assert "warning: the knowledge base at" in capsys.readouterr().err
    note = load_bench(bench_dir).note
    assert note.count("cannot be searched here (kb.retrieve is not installed): the deep runs resumed from") == 1
    assert "profile runs" not in note and "no L1 retrieval and no L4" in note
    assert note in write_report(bench_dir)["note"]


def test_a_run_whose_task_changed_is_set_aside_and_its_job_starts_afresh(tmp_path):
    """An import that judges an earlier draft again hands its operator a new kernel; a bench resumed over
    that suite must not mix the run of the old kernel into its figures (the H100's T bench, 2026-12-05)."""
    suite = _suite(tmp_path)
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(suite), ["rowsum_a", "rowsum_b"], [Condition("only")], rounds=1,
                                      backend="interpreter"))
    assert all(j.state == "finished" for j in run_bench(bench_dir, workers=2, command=_command({})))
    assert (bench_dir / "runs" / "only" / "rowsum_a" / "task.sha").is_file()
    kernel = next(p for p in (suite / "rowsum_a").glob("*.py") if p.name != "task.py")
    kernel.write_text(kernel.read_text() + "\n# another draft\n")
    # A run from before stamps cannot tell: it stands.
    (bench_dir / "runs" / "only" / "rowsum_b" / "task.sha").unlink()
    other = next(p for p in (suite / "rowsum_b").glob("*.py") if p.name != "task.py")
    other.write_text(other.read_text() + "\n# changed too\n")
    assert [j.state for j in jobs(bench_dir, load_bench(bench_dir))] == ["stale", "finished"]
    data = write_report(bench_dir)
    assert data["suite_by_condition"]["only"]["finished"] == 1  # the stale run is listed, not counted
    assert "stale: its task changed since" in (bench_dir / "report.md").read_text()
    events = []
    again = run_bench(bench_dir, command=_command({}), on_event=lambda what, job: events.append((what, job.operator)))
    assert ("replaced", "rowsum_a") in events and [j.state for j in again] == ["finished", "finished"]
    (aside,) = (bench_dir / "replaced" / "only").iterdir()
    assert aside.name.startswith("rowsum_a-") and (aside / "rounds.sqlite").is_file()
    assert (aside / "only.rowsum_a.log").is_file()  # the old run's log goes with it
    assert "Runs of rowsum_a set aside on" in load_bench(bench_dir).note
    assert write_report(bench_dir)["suite_by_condition"]["only"]["finished"] == 2


def test_a_resumed_bench_judges_its_finished_ends_again_by_the_rules_as_they_are(tmp_path):
    """A rule mended after a run ended (what counts as noise) applies to that run on the next --resume,
    from its stored end-of-run timing: the best kernel it now rejects hands the initial one back."""
    from diagnose.bench import rejudge
    from diagnose.rounds import RoundsStore

    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("only")], rounds=1,
                                      backend="interpreter"))
    assert all(j.state == "finished" for j in run_bench(bench_dir, workers=2, command=_command({})))
    assert rejudge(bench_dir) == {}  # the runs' own verdicts stand: nothing changes
    store = RoundsStore(bench_dir / "runs" / "only" / "rowsum_a")
    info = store.run()
    best = info.best_round
    assert best and info.final["best_round"] == best
    # The stored timing as a looser rule once read it: one case 0.95x of the initial kernel, both kernels'
    # timings 0.4% apart, the stand-in's 30%.
    final = info.final
    for run in final["report"]["runs"]:
        for case in run["cases"]:
            if case.get("timing"):
                case["timing"]["repeat_spread"] = 0.3 if run["role"] == "eager" else 0.004
    slow = next(c for run in final["report"]["runs"] if run["role"] == "candidate" for c in run["cases"] if c.get("timing"))
    base = next(c for run in final["report"]["runs"] if run["role"] == "baseline" for c in run["cases"]
                if c["label"] == slow["label"])
    slow["timing"]["median_us"] = base["timing"]["median_us"] / 0.95
    store.update_run(final=final)
    store.close()
    out = CliRunner().invoke(main, ["bench", "--resume", str(bench_dir), "--stop-after", "0"])
    assert out.exit_code == 0, out.output
    assert "only/rowsum_a: its best kernel does not hold up in its end-of-run timing judged again (geomean" in out.output
    store = RoundsStore(bench_dir / "runs" / "only" / "rowsum_a")
    info = store.run()
    store.close()
    assert info.best_round == 0 and info.final["best_round"] == 0 and set(info.final["per_case"].values()) == {1.0}
    assert "did not hold up in the end-of-run timing" in info.note
    assert f"the initial kernel. Round {best}'s kernel" in (bench_dir / "runs" / "only" / "rowsum_a" / "best.py").read_text()
    assert "the initial kernel stands for only/rowsum_a" in load_bench(bench_dir).note
    assert rejudge(bench_dir) == {}  # judged once: a second resume changes nothing


def test_rerun_sets_finished_runs_aside_and_runs_them_afresh(tmp_path):
    """After a change the task's digest cannot see (a new rewrite), `--rerun` sets the named runs aside, whole,
    with the reason in the bench's note; a typo or a missing reason changes nothing."""
    bench_dir = tmp_path / "bench"
    create_bench(bench_dir, BenchSpec(str(_suite(tmp_path)), ["rowsum_a", "rowsum_b"], [Condition("only")], rounds=1,
                                      backend="interpreter"))
    assert all(j.state == "finished" for j in run_bench(bench_dir, workers=2, command=_command({})))
    for args, message in ((["--rerun", "rowsum_a,nope", "--why", "x"], "no operator nope in the bench"),
                          (["--rerun", "rowsum_a"], "--rerun needs a reason")):
        out = CliRunner().invoke(main, ["bench", "--resume", str(bench_dir), *args, "--stop-after", "0"])
        assert out.exit_code == 2 and message in out.output, out.output
    assert [j.state for j in jobs(bench_dir, load_bench(bench_dir))] == ["finished", "finished"]
    out = CliRunner().invoke(main, ["bench", "--resume", str(bench_dir), "--rerun", "rowsum_a",
                                    "--why", "fuse-matmul-epilogue is new: 71afbff", "--stop-after", "0"])
    assert out.exit_code == 0, out.output
    assert "1 run(s) set aside" in out.output
    (aside,) = (bench_dir / "replaced" / "only").iterdir()
    assert aside.name.startswith("rowsum_a-") and (aside / "rounds.sqlite").is_file()
    assert (aside / "only.rowsum_a.log").is_file()
    assert "Runs of rowsum_a set aside on " in load_bench(bench_dir).note
    assert "(fuse-matmul-epilogue is new: 71afbff) and run again." in load_bench(bench_dir).note
    assert [j.state for j in jobs(bench_dir, load_bench(bench_dir))] == ["new", "finished"]
    assert [j.state for j in run_bench(bench_dir, workers=1, command=_command({}))] == ["finished", "finished"]
    out = CliRunner().invoke(main, ["bench", "--bench-dir", str(tmp_path / "other"), "--rerun", "rowsum_a"])
    assert out.exit_code == 2 and "--rerun works on an existing bench" in out.output
