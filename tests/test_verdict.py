"""The acceptance rules on reports written here: a round wins by its geomean beyond the noise bar, or by
a case beyond twice that case's own noise with the geomean above 1 and no case slower beyond the bar (issue
27; a host-bound GEMV draft on the H200)."""

from __future__ import annotations

from diagnose.judging import acceptable, case_noise, improvement, verdict
from diagnose.loop_options import OptimizeOptions
from harness.measurement import CaseResult, KernelRun, RunReport, Timing

OPTIONS = OptimizeOptions(noise_floor=0.02)


def _report(cases: dict[str, tuple[float, float, float]]) -> RunReport:
    """label -> (parent µs, candidate µs, spread of both timings)."""
    def run(role: str, which: int) -> KernelRun:
        return KernelRun(role, f"{role}.py", [CaseResult({"n": label}, label, timing=Timing(
            t[which], t[which], t[which], 100, repeat_spread=t[2])) for label, t in cases.items()])
    return RunReport("gemv", "cuda", "H200", [run("baseline", 0), run("candidate", 1)])


# A host-bound wrapper (the shape of `kb run` on the H200): three small cases at ~140 µs whatever the
# kernel does, one of them 40% noisy; the large case, where the work is, steady and 1.5x faster.
HOST_BOUND_WIN = {"64": (140.0, 138.0, 0.40), "256": (139.0, 141.0, 0.03), "1024": (140.0, 144.0, 0.012),
                  "8192": (310.0, 207.0, 0.086)}


def test_each_case_has_its_own_noise_and_the_bar_is_the_loudest():
    report = _report(HOST_BOUND_WIN)
    assert case_noise(report, OPTIONS) == {"64": 0.40, "256": 0.03, "1024": 0.02, "8192": 0.086}
    figure, noise, _ = verdict(report, OPTIONS)
    assert noise == 0.40 and 1.0 < figure < 1 + noise


def test_a_clear_win_where_the_work_is_counts_though_the_geomean_is_within_the_bar():
    report = _report(HOST_BOUND_WIN)
    assert acceptable(report, OPTIONS)[0] is not None
    why = improvement(report, OPTIONS)
    assert why is not None and why.startswith("case 8192 1.498x of the parent, above twice its own noise 8.6%")


def test_no_win_without_a_case_beyond_its_own_noise():
    small = {**HOST_BOUND_WIN, "8192": (310.0, 270.0, 0.086)}  # 1.148x: beyond its 8.6%, not beyond twice it
    assert acceptable(_report(small), OPTIONS)[0] is not None and improvement(_report(small), OPTIONS) is None
    noisy = {**HOST_BOUND_WIN, "8192": (310.0, 207.0, 0.60)}  # 1.5x, but its timings 60% apart
    assert improvement(_report(noisy), OPTIONS) is None
    below_one = {**HOST_BOUND_WIN, "8192": (310.0, 270.0, 0.03), "64": (140.0, 200.0, 0.40)}  # geomean < 1
    assert verdict(_report(below_one), OPTIONS)[0] < 1 and improvement(_report(below_one), OPTIONS) is None


def test_a_steady_win_on_every_case_still_wins_by_its_geomean():
    steady = {label: (t, t / 1.3, 0.02) for label, t in (("64", 140.0), ("8192", 310.0))}
    assert improvement(_report(steady), OPTIONS).startswith("geomean speedup 1.300x over the parent, above noise 2.0%")


def test_a_stand_in_timed_beside_the_two_kernels_does_not_widen_their_bar():
    # The end of a run on the H100 (2026-12-06): eager's timings 7.3% apart, the two kernels' within 0.4%;
    # the best kernel 0.95x of the initial one at 1M must count as slower.
    report = _report({"1M": (7.6, 8.0, 0.004), "8M": (30.3, 30.6, 0.001)})
    report.runs.append(KernelRun("eager", "eager", [CaseResult({"n": label}, label, timing=Timing(
        10.0, 10.0, 10.0, 100, repeat_spread=0.073)) for label in ("1M", "8M")]))
    figure, noise, _ = verdict(report, OPTIONS)
    assert noise == OPTIONS.noise_floor and figure < 1
    kept, _, why = acceptable(report, OPTIONS)
    assert kept is None and why.startswith("geomean 0.970x, but case 1M is 0.950x of the parent")
