"""What an optimize run came to: its rounds as `kb rounds show`, `kb optimize` and the bench list them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.llm import Usage
from diagnose.rounds import Round, RoundsStore, RunStatus

__all__ = ["Rejection", "RoundLine", "RunSummary", "report"]


@dataclass(frozen=True)
class RoundLine:
    """One round as a run's summary lists it."""

    round: int
    parent: int | None
    state: str
    finding: str
    pattern: str
    rewriter: str | None
    level: str | None
    outcome: str | None
    speedup: float | None
    reason: str | None
    cost: dict[str, Any] | None = None  # the round's model calls (LLM rounds only)
    # A wide round's other patterns, each "pattern (outcome)": composed into the pick, outpaced by it or lost
    # (none of its variants beat the parent); the round's state while it is not done.
    others: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Rejection:
    round: int
    pattern: str
    why: str | None


@dataclass(frozen=True)
class RunSummary:
    """What a run came to (`kb optimize`, `kb rounds show`, the bench's rows): `to_dict` is its JSON."""

    run: str
    task: str
    status: RunStatus
    note: str | None
    dir: str
    rounds: int
    best_round: int
    best_level: str | None
    # Measured best-vs-initial when the run finished; the product of per-round speedups otherwise.
    speedup_vs_initial: float
    speedup_vs_initial_measured: bool
    per_case_vs_initial: dict[str, float] | None
    levels: dict[int, str | None]
    rejected: list[Rejection]
    per_case_best: dict[str, float] | None
    history: list[RoundLine]
    llm_cost: dict[str, Any] | None = None  # the run's model calls, summed over its rounds (None: none made)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _others(r: Round) -> list[str]:
    outcomes = {o.get("pattern"): o.get("outcome") for o in (r.timings or {}).get("others", [])}
    return [f"{h.pattern} ({outcomes.get(h.pattern) or r.state})" for h in r.others]


def report(store: RoundsStore) -> RunSummary:
    info = store.run()
    rounds = store.rounds()
    accepted = [r for r in rounds if r.outcome == "accepted"]
    best = next((r for r in rounds if r.idx == info.best_round), None)
    chain = 1.0
    for r in accepted:
        chain *= r.speedup or 1.0
    final = info.final if info.final and info.final.get("best_round") == info.best_round else None
    measured = bool(final and final.get("geomean"))
    return RunSummary(
        run=info.id, task=info.task, status=info.status, note=info.note, dir=str(store.dir), rounds=len(rounds),
        best_round=info.best_round or 0, best_level=best.level if best else None,
        speedup_vs_initial=round(final["geomean"], 4) if final and measured else round(chain, 4),
        speedup_vs_initial_measured=measured,
        per_case_vs_initial=final["per_case"] if final else None,
        levels={r.idx: r.level for r in rounds},
        rejected=[Rejection(r.idx, r.hypothesis.pattern, r.reason) for r in rounds
                  if r.outcome in ("rejected", "failed")],
        per_case_best=(best.timings or {}).get("per_case") if best else None,
        history=[RoundLine(r.idx, r.parent, r.state, r.hypothesis.finding, r.hypothesis.pattern, r.rewriter, r.level,
                           r.outcome, r.speedup, r.reason, r.cost, _others(r)) for r in rounds],
        llm_cost=_total_cost(rounds),
    )


def _total_cost(rounds: list[Round]) -> dict[str, Any] | None:
    costs = [r.cost for r in rounds if r.cost]
    if not costs:
        return None
    total = Usage()
    for cost in costs:
        total.add(Usage.from_dict(cost))
    return total.to_dict()
