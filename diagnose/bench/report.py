"""The report of a bench directory: per operator and per condition, then the suite, in JSON, Markdown
and a PNG plot, beside the published figures (evaluation.md).

Everything is read from the runs' rounds stores, so the report of a bench cut short says so (its
unfinished runs are listed as such, their speedup the chained product of their accepted rounds).
Per operator the speedup is the geometric mean over its cases, measured best-vs-initial at the end
of a finished run; the suite figure is the geometric mean over operators.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.bench.schedule import jobs, load_bench
from diagnose.records import LEVELS
from harness.measurement import geomean
from harness.roofline import copy_summary

if TYPE_CHECKING:
    from diagnose.bench.schedule import Job


__all__ = ["PUBLISHED", "bench_report", "compare_markdown", "write_report"]

# The reference result (evaluation.md): 37 operators x 5 cases on Ascend, initial -> optimized kernel.
PUBLISHED = {"operators": 37, "geomean": 4.35, "median": 2.73, "above_2x": 22, "above_5x": 13, "median_best_round": 10}



def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

def _rooflines(report: dict[str, Any] | None, role: str) -> list[dict[str, Any]]:
    """The roofline placements of the timed cases of one kernel (`role`) in a run report."""
    run = next((r for r in (report or {}).get("runs", []) if r.get("role") == role), None)
    return [c["roofline"] for c in (run or {}).get("cases", []) if c.get("roofline")]


def _fraction(report: dict[str, Any] | None, role: str) -> float | None:
    """Median roofline fraction over the timed cases of one kernel in a run report."""
    fractions = [r["fraction"] for r in _rooflines(report, role)]
    return round(statistics.median(fractions), 4) if fractions else None


def _timing_noise(report: dict[str, Any] | None) -> float | None:
    """The end-of-run timing's noise: the widest repeat spread of its baseline and candidate cases, never
    below the loop's noise floor (what the loop's acceptance compares against); None without timings."""
    from diagnose.loop_options import OptimizeOptions

    spreads = [(c.get("timing") or {}).get("repeat_spread") for r in (report or {}).get("runs", [])
               if r.get("role") in ("baseline", "candidate") for c in r.get("cases", [])]
    known = [s for s in spreads if s is not None]
    return round(max([OptimizeOptions().noise_floor, *known]), 4) if known else None


def _memory_fractions(report: dict[str, Any] | None, role: str) -> list[float]:
    """Roofline fractions of the memory-bound cases of one kernel (achieved over measured copy bandwidth)."""
    return [round(r["fraction"], 4) for r in _rooflines(report, role) if r.get("bound") == "memory"]


def _speedup_bound(report: dict[str, Any] | None, role: str, floor_us: float | None = None) -> float | None:
    """The most any rewrite of this kernel could gain: the geometric mean over its cases of attainable /
    achieved, where attainable is the roofline's time or the device's launch floor, whichever is longer
    (`Roofline.bound_on_speedup`); 1.0 for a case already at or past its ceiling. A case placed against
    ceilings measured before the launch floor was (no `floor_us`) takes `floor_us`, the device's floor
    measured since; without one, the roofline alone, which overstates the bound of small cases: a
    4096-element copy cannot run in the 0.02 µs its bytes take at 4 TB/s."""
    from harness.measurement import Roofline

    run = next((r for r in (report or {}).get("runs", []) if r.get("role") == role), None)
    bounds = [Roofline(**{**c["roofline"], "floor_us": c["roofline"].get("floor_us") or floor_us})
              .bound_on_speedup(c["timing"]["median_us"])
              for c in (run or {}).get("cases", [])
              if c.get("roofline") and c["roofline"].get("fraction") and c.get("timing")]
    return _rounded(geomean(bounds)) if bounds else None


def _eager_untimed(report: dict[str, Any] | None) -> str | None:
    """Why the end-of-run report has no eager timing, from the judge's note on its first untimed case
    ("eager reference not timed for <case>: <why>"); None where it was timed or no note says."""
    prefix = "eager reference not timed for "
    return next((n.split(": ", 1)[1] for n in (report or {}).get("notes", []) if n.startswith(prefix) and ": " in n),
                None)


def _operator_row(job: Job, floor_us: float | None = None) -> dict[str, Any]:
    from diagnose.rounds import RoundsStore
    from diagnose.run_summary import report

    row: dict[str, Any] = {"operator": job.operator, "condition": job.condition.name, "state": job.state}
    if job.state == "new":
        return row
    store = RoundsStore(job.run_dir)
    try:
        summary = report(store)
        info = store.run()
        rounds = store.rounds()
    finally:
        store.close()
    best = next((r for r in rounds if r.idx == summary.best_round), None)
    reached = [lv for r in rounds for lv in (r.level, r.hypothesis.reached) if lv in LEVELS]
    final = info.final if info.final and info.final.get("best_round") == summary.best_round else {}
    final_report = final.get("report")
    best_role = "candidate" if summary.best_round else "baseline"
    row.update({
        "family": info.spec.family or "",
        "status": info.status,
        "rounds": summary.rounds,
        "accepted": sum(1 for r in rounds if r.outcome == "accepted"),
        "best_round": summary.best_round,
        "best_level": summary.best_level,
        "best_pattern": best.hypothesis.pattern if best else None,
        "best_untargeted": bool(best and best.hypothesis.untargeted),  # no finding asked for the best round
        # How far the diagnoses went (a run from before `reached` was recorded: its findings' levels).
        "deepest_level": max(reached, key=LEVELS.index) if reached else None,
        "speedup": summary.speedup_vs_initial,
        "speedup_measured": summary.speedup_vs_initial_measured,
        "per_case": summary.per_case_vs_initial or summary.per_case_best,
        "final_noise": _timing_noise(final_report),
        # Round time only, so a run paused between machines does not count the hours it waited.
        "seconds_to_best": _round_seconds(r for r in rounds if best and r.idx <= best.idx),
        "seconds": _round_seconds(rounds),
        "roofline_initial": _fraction(info.baseline, "baseline"),
        "speedup_bound": _speedup_bound(info.baseline, "baseline", floor_us),
        "roofline_best": _fraction((best.timings or {}).get("report"), "candidate") if best else
        _fraction(info.baseline, "baseline"),
        "vs_eager": {k: (final.get("vs_eager") or {}).get(k, {}).get("geomean") for k in ("initial", "best")},
        "eager_untimed": _eager_untimed(final_report),
        "vs_compiled": {k: (final.get("vs_compiled") or {}).get(k, {}).get("geomean") for k in ("initial", "best")},
        "memory_bound_fractions": _memory_fractions(final_report, best_role),
        "device": (info.baseline or {}).get("device"),
        "ceilings": (info.baseline or {}).get("ceilings"),
        "patterns_tried": [r.hypothesis.pattern for r in rounds],  # each round's own (a wide round's pick)
        "llm_cost": summary.llm_cost,
    })
    return row


def _round_seconds(rounds: Any) -> float:
    return round(sum(r.seconds or 0.0 for r in rounds), 1)


def _suite(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over the finished runs only: a paused run's figure is a chained product, a run whose own
    kernel failed its checks has none, and a stale run measured a task the suite no longer holds (each is
    listed per operator, not counted here)."""
    done = [r for r in rows if r.get("status") == "finished" and r.get("speedup") and r.get("state") != "stale"]
    speedups = [r["speedup"] for r in done]
    best_level = {lv: sum(1 for r in done if r.get("best_level") == lv and r["best_round"]) for lv in LEVELS}
    best_level["none"] = sum(1 for r in done if not r["best_round"])
    # A trajectory is how far a run's diagnoses escalated: every run that diagnosed has one, finished or not.
    reached = {lv: sum(1 for r in rows if r.get("deepest_level") and LEVELS.index(r["deepest_level"]) >= i)
               for i, lv in enumerate(LEVELS)}

    def vs(key: str, which: str) -> float | None:
        value = geomean([r[key][which] for r in done if r.get(key, {}).get(which)])
        return round(value, 4) if value else None

    memory = [f for r in done for f in r.get("memory_bound_fractions", [])]
    bounds = [r["speedup_bound"] for r in done if r.get("speedup_bound")]
    # Issues 26/27's goal: of the headroom the roofline leaves (operators whose bound is above 1.2x),
    # the share in log terms the optimized kernel took, ln(speedup) / ln(bound), averaged unclamped.
    headroom = [math.log(r["speedup"]) / math.log(r["speedup_bound"]) for r in done
                if (r.get("speedup_bound") or 0) > _HEADROOM_BOUND]
    worst = [min(r["per_case"].values()) for r in done if r.get("per_case")]
    # A case below its initial kernel by less than the end-of-run timing's own noise is not a measured
    # regression: kernels at the launch floor (a few us) repeat within 20% of themselves.
    beyond = [(s, r) for r in done for s in (r.get("per_case") or {}).values()
              if r.get("final_noise") is not None and s < 1 - r["final_noise"]]
    rooflines = [(r["roofline_initial"], r["roofline_best"]) for r in done
                 if r.get("roofline_initial") is not None and r.get("roofline_best") is not None]
    return {
        "operators": len(rows),
        "finished": sum(1 for r in rows if r.get("status") == "finished" and r.get("state") != "stale"),
        # An operator whose stand-in was not timed (it returned host tensors, or failed) has no eager figure.
        "eager_operators": sum(1 for r in done if (r.get("vs_eager") or {}).get("best")),
        "initial_vs_eager": vs("vs_eager", "initial"),
        "best_vs_eager": vs("vs_eager", "best"),
        "best_vs_compiled": vs("vs_compiled", "best"),
        "at_least_eager": sum(1 for r in done if (r.get("vs_eager") or {}).get("best") and r["vs_eager"]["best"] >= 1.0),
        "memory_bound_cases": len(memory),
        "memory_bound_median_fraction": round(statistics.median(memory), 4) if memory else None,
        "geomean": _rounded(geomean(speedups)),
        "median": round(statistics.median(speedups), 4) if speedups else None,
        "above_2x": sum(1 for s in speedups if s > 2),
        "above_5x": sum(1 for s in speedups if s > 5),
        "improved": sum(1 for r in done if r["best_round"]),
        # What every kernel at its roofline would give, over the operators with roofline data (every
        # operator with bytes or FLOPs per case, timed on a device with measured ceilings).
        "bound_geomean": _rounded(geomean(bounds)),
        "bound_median": round(statistics.median(bounds), 4) if bounds else None,
        "bound_above_2x": sum(1 for b in bounds if b > 2),
        "bound_above_5x": sum(1 for b in bounds if b > 5),
        "headroom_operators": len(headroom),
        "headroom_captured": round(statistics.mean(headroom), 4) if headroom else None,
        "worst_case_vs_initial": round(min(worst), 4) if worst else None,
        "cases_below_initial_beyond_noise": len(beyond),
        "roofline_initial_median": round(statistics.median(i for i, _ in rooflines), 4) if rooflines else None,
        "roofline_best_median": round(statistics.median(b for _, b in rooflines), 4) if rooflines else None,
        "median_best_round": statistics.median([r["best_round"] for r in done]) if done else None,
        "mean_best_round_improved": round(statistics.mean([r["best_round"] for r in done if r["best_round"]]), 2)
        if any(r["best_round"] for r in done) else None,
        "best_from_level": best_level,
        "best_untargeted": sum(1 for r in done if r["best_round"] and r.get("best_untargeted")),
        "trajectories_reaching": reached,
        "rounds": sum(r.get("rounds", 0) for r in rows),
        "seconds": round(sum(r.get("seconds", 0.0) for r in rows), 1),
        # What the model calls of every run cost (finished or not: the tokens were spent either way).
        "llm_calls": sum((r.get("llm_cost") or {}).get("calls", 0) for r in rows),
        "llm_tokens": sum((r.get("llm_cost") or {}).get("tokens_in", 0) + (r.get("llm_cost") or {}).get("tokens_out", 0)
                          for r in rows),
    }


def _borrow_references(rows: list[dict[str, Any]]) -> None:
    """A run without its own stand-in timings (a bench times them in one condition only) takes them
    through its initial kernel, which every condition shares: best/eager = best/initial (its own run)
    x initial/eager (the run that timed eager). `references_from` names that run's condition."""
    for key in ("vs_eager", "vs_compiled"):
        timed: dict[str, dict[str, Any]] = {}
        for row in rows:
            if (row.get(key) or {}).get("initial"):
                timed.setdefault(row["operator"], row)
        for row in rows:
            source = timed.get(row["operator"])
            if source is None or (row.get(key) or {}).get("best") or not row.get("speedup_measured"):
                continue
            initial = source[key]["initial"]
            row[key] = {"initial": initial, "best": round(initial * row["speedup"], 4)}
            row["references_from"] = source["condition"]


def bench_report(bench_dir: Path) -> dict[str, Any]:
    spec = load_bench(bench_dir)
    rows = [_operator_row(j) for j in jobs(bench_dir, spec)]
    device = next((r["device"] for r in rows if r.get("device")), None)
    # The launch floor is the device's: one measured in any run of this device serves every run,
    # the ones whose ceilings were measured before there was a floor too.
    floored = next((r["ceilings"] for r in rows if (r.get("ceilings") or {}).get("launch_floor_us")
                    and r.get("device") == device), None)
    if floored and any(not (r.get("ceilings") or {}).get("launch_floor_us") for r in rows if r.get("ceilings")):
        rows = [_operator_row(j, floored["launch_floor_us"]) for j in jobs(bench_dir, spec)]
    _borrow_references(rows)
    by_condition = {c.name: [r for r in rows if r["condition"] == c.name] for c in spec.conditions}
    ceilings = floored or next((r["ceilings"] for r in rows if r.get("ceilings")), None)
    return {
        "bench": str(bench_dir), "created": spec.created, "suite": spec.suite, "rounds": spec.rounds,
        "time_budget_s": spec.time_budget_s, "llm": spec.llm, "backend": spec.backend, "note": spec.note,
        "breadth": spec.breadth, "device": device, "ceilings": ceilings,
        "conditions": [{"name": c.name, "strategy": c.strategy, "home": c.home} for c in spec.conditions],
        "suite_by_condition": {name: _suite(rs) for name, rs in by_condition.items()},
        "operators": rows, "published": PUBLISHED,
    }


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}{suffix}" if suffix == "x" else f"{value:.2f}{suffix}"
    return f"{value}{suffix}"


_X = ("geomean", "median", "initial_vs_eager", "best_vs_eager", "best_vs_compiled", "bound_geomean", "bound_median")
_HEADROOM_BOUND = 1.2  # operators with less headroom than this are left out of the captured share

_SUITE_ROWS = [  # (key of _suite's figures, label, key of PUBLISHED or None)
    ("operators", "operators", "operators"), ("finished", "runs finished", None),
    ("geomean", "geomean speedup vs initial", "geomean"), ("median", "median speedup", "median"),
    ("above_2x", "operators above 2x", "above_2x"), ("above_5x", "operators above 5x", "above_5x"),
    ("improved", "operators improved (a round accepted)", None),
    ("bound_geomean", "roofline bound on the geomean speedup vs initial", None),
    ("bound_median", "roofline bound on the median speedup", None),
    ("bound_above_2x", "operators whose roofline bound is above 2x", None),
    ("bound_above_5x", "operators whose roofline bound is above 5x", None),
    ("headroom_operators", "operators whose roofline bound is above 1.2x", None),
    ("headroom_captured", "log-headroom captured: mean ln(speedup) / ln(bound) over those (goal 0.6 / 0.7)", None),
    ("worst_case_vs_initial", "slowest case of any operator vs its initial kernel (goal >= 0.98)", None),
    ("cases_below_initial_beyond_noise", "timed cases below their initial kernel by more than the end-of-run timing's noise",
     None),
    ("roofline_initial_median", "roofline position of the initial kernels (median)", None),
    ("roofline_best_median", "roofline position of the optimized kernels (median)", None),
    ("eager_operators", "operators with a PyTorch eager timing (the two rows below are over these)", None),
    ("initial_vs_eager", "initial kernel vs PyTorch eager (geomean)", None),
    ("best_vs_eager", "optimized kernel vs PyTorch eager (geomean; goal 1.0)", None),
    ("best_vs_compiled", "optimized kernel vs torch.compile (geomean)", None),
    ("at_least_eager", "operators at least as fast as eager", None),
    ("memory_bound_median_fraction", "memory-bound cases: median fraction of copy bandwidth (goal 0.80)", None),
    ("median_best_round", "median best-round index", "median_best_round"),
    ("mean_best_round_improved", "mean best-round index, improved operators", None),
    ("best_untargeted", "best round untargeted (no finding asked for it)", None),
    ("rounds", "rounds run", None), ("seconds", "seconds (sum over runs)", None),
    ("llm_calls", "LLM calls (all runs)", None), ("llm_tokens", "LLM tokens in + out (all runs)", None)]


def _suite_table(columns: list[tuple[str, dict[str, Any]]], published: dict[str, Any]) -> list[str]:
    """The suite figures of each column (a condition's, or a bench's condition's) beside the published ones."""
    lines = ["| figure | " + " | ".join(name for name, _ in columns) + " | published |",
             "|---|" + "---|" * (len(columns) + 1)]
    for key, label, pub in _SUITE_ROWS:
        cells = [_fmt(suite.get(key), "x" if key in _X else "") for _, suite in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(published[pub] if pub else None)} |")
    for lv in (*LEVELS, "none"):
        label = f"best round diagnosed at {lv}" if lv != "none" else "no round accepted"
        lines.append(f"| {label} | " + " | ".join(str(suite["best_from_level"][lv]) for _, suite in columns) + " | - |")
    for lv in LEVELS:
        lines.append(f"| trajectories reaching {lv} (runs that diagnosed, finished or not) | "
                     + " | ".join(str(suite["trajectories_reaching"][lv]) for _, suite in columns) + " | - |")
    return lines


def compare_markdown(reports: list[dict[str, Any]]) -> str:
    """Several benches side by side (our suite, imported first drafts, ...): each condition of each bench a
    column, with the published figures."""
    columns = [(f"{Path(r['bench']).name}: {c['name']}", r["suite_by_condition"][c["name"]])
               for r in reports for c in r["conditions"]]
    lines = ["# Benches side by side", ""]
    lines += [f"- `{Path(r['bench']).name}`: suite `{r['suite']}`, {r['rounds']} rounds per operator, "
              f"device {r.get('device') or '-'}, created {r['created']}" for r in reports]
    return "\n".join(lines + ["", *_suite_table(columns, PUBLISHED), ""])


def to_markdown(data: dict[str, Any]) -> str:
    names = [c["name"] for c in data["conditions"]]
    lines = [f"# Bench {Path(data['bench']).name}", "",
             f"Created {data['created']}; suite `{data['suite']}`; {data['rounds']} rounds per operator"
             + (f" of {data['breadth']} hypotheses each" if data.get("breadth", 1) > 1 else "")
             + (f", {data['time_budget_s']:g} s per operator" if data.get("time_budget_s") else "")
             + f"; LLM: {data['llm']}; device: {data.get('device') or '-'}.", ""]
    if data.get("note"):
        lines += [data["note"], ""]
    if data.get("ceilings"):
        c = data["ceilings"]
        lines += [f"Ceilings measured on this device: {copy_summary(c)}, bf16 matmul "
                  f"{c.get('matmul_bf16_tflops', 0):.0f} TFLOP/s, fp32 matmul {c.get('matmul_fp32_tflops', 0):.0f} "
                  f"TFLOP/s, " + (f"launch floor {c['launch_floor_us']:.2f} µs" if c.get("launch_floor_us") else
                                  "no launch floor (measured before it was: the bounds ignore launch latency)")
                  + f" ({c.get('measured', '')}).", ""]
    lines += ["## Suite", ""] + _suite_table([(n, data["suite_by_condition"][n]) for n in names], data["published"])
    lines += ["", "## Operators", "",
              "| operator | family | " + " | ".join(f"{n}: speedup | {n}: best round (level, pattern) | {n}: best vs eager"
                                                 for n in names)
              + " | initial vs eager | roofline initial | roofline bound |",
              "|---|---|" + "---|---|---|" * len(names) + "---|---|---|"]
    by_key = {(r["operator"], r["condition"]): r for r in data["operators"]}
    for op in dict.fromkeys(r["operator"] for r in data["operators"]):
        rows = [by_key.get((op, n), {}) for n in names]
        family = next((r.get("family") for r in rows if r.get("family")), "")
        cells = []
        for r in rows:
            if not r.get("speedup"):
                cells += [r.get("state", "-"), "-", "-"]
                continue
            # A finished run that accepted nothing kept the initial kernel: 1.0 exactly, nothing to time.
            exact = r.get("speedup_measured") or (r.get("status") == "finished" and not r["best_round"])
            mark = "" if exact else " (chained)"
            best = f"{r['best_round']} ({r.get('best_level') or '-'}, {r.get('best_pattern') or '-'})" \
                if r["best_round"] else "0 (none accepted)"
            cells += [f"{r['speedup']:.3f}x{mark}" + ("" if r.get("status") == "finished" else f", {r.get('status')}")
                      + (", stale: its task changed since" if r.get("state") == "stale" else ""),
                      best, _fmt((r.get("vs_eager") or {}).get("best"), "x")]
        roof = next((r.get("roofline_initial") for r in rows if r.get("roofline_initial") is not None), None)
        eager = next(((r.get("vs_eager") or {}).get("initial") for r in rows if (r.get("vs_eager") or {}).get("initial")),
                     None)
        bound = next((r.get("speedup_bound") for r in rows if r.get("speedup_bound") is not None), None)
        lines.append(f"| {op} | {family} | " + " | ".join(cells) + f" | {_fmt(eager, 'x')} | {_fmt(roof)} | "
                     f"{_fmt(bound, 'x')} |")
    lines += ["", "Speedups are the geometric mean over an operator's cases of the best kernel against the "
              "initial one, timed together at the end of the run with the PyTorch stand-in (eager: the task's "
              "eager version, else its reference, as written; a figure above 1 means the kernel is faster); '(chained)' marks a run not "
              "finished, whose figure is the product of its accepted rounds. Roofline: median over cases of "
              "achieved / attainable at the case's arithmetic intensity, against the ceilings above. Roofline "
              "bound: the geometric mean over cases of attainable / achieved for the initial kernel, the most "
              "any rewrite could gain (a case at or past its ceiling counts 1.0; attainable is never faster than "
              "the launch floor, where one was measured); the suite's bound rows are "
              "the same statistics over these per-operator bounds."]
    untimed = {r["operator"]: r["eager_untimed"] for r in data["operators"] if r.get("eager_untimed")}
    if untimed:
        lines += ["", "No eager figure (its stand-in was not timed): "
                  + "; ".join(f"{op}, {why}" for op, why in sorted(untimed.items())) + "."]
    borrowed = sorted({r["references_from"] for r in data["operators"] if r.get("references_from")})
    if borrowed:
        lines += ["", f"The PyTorch stand-ins were timed in the {', '.join(borrowed)} runs only; the other "
                  "conditions' figures against them go through the shared initial kernel (best/initial of their "
                  "own run x initial/eager of that run)."]
    return "\n".join(lines + [""])


def _scale(axis: Any, values: list[float]) -> None:
    """Wide ranges on a log axis written as plain numbers; a narrow one starts near 1 so a few percent show."""
    if max(values, default=0) > 4:
        from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

        axis.set_yscale("log")
        # Powers of two: a log axis between 0.2 and 8 would otherwise label 1 alone.
        low, high = min((v for v in values if v), default=1.0), max(values)
        axis.yaxis.set_major_locator(FixedLocator([2.0 ** k for k in range(-6, 8)
                                                   if low / 2 <= 2.0 ** k <= high * 2]))
        axis.yaxis.set_major_formatter(ScalarFormatter())
        axis.yaxis.set_minor_locator(NullLocator())
        axis.yaxis.set_minor_formatter(NullFormatter())
    elif any(values):
        axis.set_ylim(bottom=min(0.9, 0.95 * min(v for v in values if v)))


def plot(data: dict[str, Any], path: Path) -> bool:
    """Per operator and condition: speedup vs initial (with the initial kernel's roofline bound), the
    best kernel vs PyTorch eager, and the best-round index. False when matplotlib is missing (the `plots` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [c["name"] for c in data["conditions"]]
    # Operators not run yet would be empty slots: a bench cut short plots what it has.
    ops = list(dict.fromkeys(r["operator"] for r in data["operators"] if r.get("state") != "new")) or \
        list(dict.fromkeys(r["operator"] for r in data["operators"]))
    by_key = {(r["operator"], r["condition"]): r for r in data["operators"]}
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(min(18, max(8, 0.3 * len(ops) * len(names) + 2)), 9),
                                              sharex=True)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [k + i * width for k in range(len(ops))]
        rows = [by_key.get((op, name), {}) for op in ops]
        top.bar(xs, [r.get("speedup") or 0 for r in rows], width, label=name)
        middle.bar(xs, [(r.get("vs_eager") or {}).get("best") or 0 for r in rows], width, label=name)
        bottom.bar(xs, [r.get("best_round") or 0 for r in rows], width, label=name)
    # The roofline bound of each operator's initial kernel: how far its bars could have gone.
    bounds = [next((by_key.get((op, n), {}).get("speedup_bound") for n in names
                    if by_key.get((op, n), {}).get("speedup_bound")), None) for op in ops]
    marked = [(k + 0.4 - width / 2, b) for k, b in enumerate(bounds) if b]
    if marked:
        top.scatter(*zip(*marked), marker="_", s=400, color="black", zorder=3, label="roofline bound")
    for axis, key in ((top, "speedup"), (middle, "vs_eager")):
        axis.axhline(1.0, color="grey", lw=0.8)
        values = [(r.get(key) or 0) if key == "speedup" else ((r.get(key) or {}).get("best") or 0)
                  for r in data["operators"]]
        _scale(axis, values + ([b for b in bounds if b] if key == "speedup" else []))
    top.set_ylabel("speedup vs initial")
    top.legend()
    middle.set_ylabel("best vs PyTorch eager")
    bottom.set_ylabel("best-round index")
    bottom.set_xticks([k + 0.4 - width / 2 for k in range(len(ops))], ops, rotation=45, ha="right")
    top.set_title(f"bench {Path(data['bench']).name}: {data['rounds']} rounds per operator, {data.get('device') or ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(bench_dir: Path, into: Path | None = None) -> dict[str, Any]:
    """report.json, report.md and report.png in `into` (default: the bench directory)."""
    into = into or bench_dir
    into.mkdir(parents=True, exist_ok=True)
    data = bench_report(bench_dir)
    (into / "report.json").write_text(json.dumps(data, indent=1))
    (into / "report.md").write_text(to_markdown(data))
    data["plot"] = str(into / "report.png") if plot(data, into / "report.png") else None
    return data
