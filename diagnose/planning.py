"""What the optimize loop tries next, in order: each finding's patterns as the diagnosis ranked them and
their records re-rank them, the launch search, the rewrites no finding asked for; and, per round, the
pairs its kernel's lineage rejected or accepted before moved behind the rest, those rejected on the
kernel itself dropped (`breadth_first`)."""

from __future__ import annotations

from typing import Any

from diagnose.baseline_repair import REPAIRS
from diagnose.loop_options import OptimizeOptions
from diagnose.records import Answer
from diagnose.rewriters import REWRITERS
from diagnose.rounds import Hypothesis, Round

__all__ = ["FALLBACK", "REPAIR_PATTERNS", "breadth_first", "hypotheses"]

# Rewrites that change a kernel's values to repair them.
REPAIR_PATTERNS = frozenset(REPAIRS.values())

_RISK_ORDER = {"low": 0, "medium": 1, "high": 2}

# The launch configuration search: the hypothesis every round can fall back on.
FALLBACK = ("autotune-configs", "launch configuration search")


def breadth_first(planned: list[Hypothesis], rounds: list[Round], lineage: set[int]) -> list[Hypothesis]:
    """What the loop may try on the lineage's newest kernel (`max(lineage)`, the round's parent), in order.

    A finding-and-pattern pair the lineage already accepted moves behind the other targeted ones and the
    launch search (ahead of the untargeted): a finding that outlives its accepted rewrite asks for the
    same pattern again, which then only widens what it just wrote. On the H200 both matmul and attention
    spent their second round so, dot.tile-underused -> autotune-configs widening the tile search's own
    configs (attention: 1.002x, rejected; matmul: 28 more configs, unfinished in the call), while
    attention's exp2 fold (1.148x) waited for round 3 and its key-loop peel got none; with this order all
    three of attention's rounds were accepted (1.219x). The launch search (no finding) keeps climbing from
    its last point as before.

    A pair rejected (or failed) on this very kernel is not tried again. One rejected on an ancestor is
    tried once more, after the untried targeted pairs: an accepted round has changed the kernel since,
    and what did not pay before may pay now. Attention's tiles measured 0.683x of SDPA with `tl.exp` and
    0.853x once exp2 and the key-loop split were in (docs/device/2026-12-03-h200-attention): the bench's
    run rejected the tile search in round 1, accepted exp2 in round 3, and never asked for tiles again. A
    pair rejected twice in the lineage stays out."""
    parent = max(lineage)
    key = lambda h: (h.finding, h.pattern, h.rewriter)  # noqa: E731
    rejected: dict[tuple[str, str, str | None], list[int]] = {}
    for r in rounds:  # a wide round judged several pairs on its parent: each counts as tried there
        for h, outcome in r.hypotheses_tried() if (r.parent or 0) in lineage else []:
            if outcome in ("rejected", "failed", "outpaced"):  # outpaced: beaten on that parent, tried once more later
                rejected.setdefault(key(h), []).append(r.parent or 0)
    blocked = {k for k, parents in rejected.items() if parent in parents or len(parents) > 1}
    accepted = {key(h) for r in rounds if r.idx in lineage for h, outcome in r.hypotheses_tried()
                if outcome == "accepted" and h.finding}
    open_ = [h for h in planned if key(h) not in blocked]
    retry = [h for h in open_ if key(h) in rejected]
    again = [h for h in open_ if key(h) in accepted and h not in retry]
    fresh = [h for h in open_ if h not in again and h not in retry]
    first = [h for h in fresh if not h.untargeted]
    later = [h for h in fresh if h.untargeted] + [h for h in retry if h.untargeted]  # never before a finding's
    return first + [h for h in retry if not h.untargeted] + again + later


def hypotheses(answer: Answer, options: OptimizeOptions, catalog: list[Any] | None = None) -> list[Hypothesis]:
    """Each finding's patterns (ranked findings first, then opportunities), with an LLM rewrite of that
    finding after its patterns when an endpoint is in use; then the generic launch search; then a
    free-form LLM rewrite (with `llm_first`, each LLM rewrite comes before what it sits beside). That
    diagnosis order is then re-ranked by record: a pattern that has won for this finding before (`kb
    synthesize` statistics) moves up, one that kept failing moves down, behind the search if the
    search's record is better. The sort is stable, so without statistics (every record 0.5) the
    diagnosis order stands."""
    findings = answer.ranked() + [f for f in answer.findings if not f.healthy and not f.defect]
    by_finding: dict[str, list[str]] = {}
    for rec in answer.recommendations:
        by_finding.setdefault(rec.for_finding, []).append(rec.pattern_id)
    # Opportunities carry no recommendation: their patterns come from the catalog. A finding's
    # recommendations are its two best patterns; the catalog's other rewrites for it (not launch knobs,
    # which the search covers) follow them, lowest risk first. The loop skips those whose rewriter
    # declines the kernel, so a structural rewrite ranked third (cross entropy's spills: the warp search,
    # the elementwise row split, then the chunked row loop) is still reached.
    backend = "npu" if options.backend == "npu" else "cuda"
    ranked = sorted(catalog or [], key=lambda p: _RISK_ORDER.get(p.risk, len(_RISK_ORDER)))
    for f in findings:
        if f.kind not in by_finding:
            by_finding[f.kind] = [p.id for p in ranked if f.kind in p.symptoms and backend in p.backends]
            continue
        listed = by_finding[f.kind]
        listed += [p.id for p in ranked if f.kind in p.symptoms and backend in p.backends and p.id not in listed
                   and p.rewrite.kind != "launch-config-search"]
    out: list[Hypothesis] = []
    asks = options.llm == "openai"
    for f in findings:
        # A repair changes the kernel's values (toward its reference): it starts a run whose kernel fails
        # its checks (diagnose/baseline_repair.py), and is never a speed round.
        patterns = [Hypothesis(f.kind, f.title, pattern, "pattern", f.level, list(f.evidence))
                    for pattern in by_finding.get(f.kind, []) if pattern not in REPAIR_PATTERNS]
        model = [Hypothesis(f.kind, f.title, "llm-rewrite", "llm", f.level, list(f.evidence))] if asks else []
        out += model + patterns if options.llm_first else patterns + model
    search = [Hypothesis("", FALLBACK[1], FALLBACK[0], "pattern", answer.stopped_at or "L1")]
    free = [Hypothesis("", "free-form optimization", "llm-rewrite", "llm", answer.stopped_at or "L1")] if asks else []
    out += free + search if options.llm_first else search + free
    later = _untargeted(out, options, catalog or [], answer.stopped_at or "L1") if options.untargeted else []
    records = {p.id: p for p in catalog or []}
    for hyp in out + later:
        hyp.reached = answer.stopped_at
        if hyp.rewriter == "pattern" and hyp.pattern in records:
            hyp.record = round(records[hyp.pattern].win_rate(hyp.finding), 4)
            hyp.unblock = records[hyp.pattern].unblock
    # An untargeted rewrite never outranks one a finding asked for, whatever its record.
    return sorted(out, key=lambda h: -h.record) + sorted(later, key=lambda h: -h.record)


def _untargeted(planned: list[Hypothesis], options: OptimizeOptions, catalog: list[Any], level: str) -> list[Hypothesis]:
    """The catalog's rewrites that no finding asked for and the launch search does not cover, lowest
    risk first (catalog order within a risk): what the loop tries when the diagnosis has nothing
    untried and rounds are left, rather than stopping with budget in hand (22 of the first 26
    TritonBench-T drafts benched on the H200 stopped after one or two of their three rounds). `_plan`
    takes one only where its rewriter applies to the kernel; the round records no finding, and its
    title says so."""
    backend = "npu" if options.backend == "npu" else "cuda"
    asked = {h.pattern for h in planned} | REPAIR_PATTERNS
    fresh = [p for p in catalog if p.id in REWRITERS and p.id not in asked and backend in p.backends
             and p.rewrite.kind != "launch-config-search"]
    fresh.sort(key=lambda p: _RISK_ORDER.get(p.risk, len(_RISK_ORDER)))
    return [Hypothesis("", f"untargeted: {p.title} (no finding asked for it; its rewriter applies to the kernel)",
                       p.id, "pattern", level, untargeted=True) for p in fresh]
