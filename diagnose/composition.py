"""Wide rounds: several hypotheses judged side by side on one parent, and the winners' rewrites stacked.

One hypothesis a round spends a round on each rewrite, in the diagnosis's order, and a fixed budget of
rounds then decides which rewrites are ever measured: attention's exp2 fold (1.14-1.15x on the H100 and
the H200) waited behind two rounds of tile and launch searches that paid 1.02x or nothing. With
`OptimizeOptions.breadth` > 1 a round rewrites the parent under the first `breadth` hypotheses that apply,
judges all their variants against the same parent, and keeps the best. Where variants of two or more
patterns each beat the parent beyond the noise, their rewrites usually touch different things (the
exponential, a loop's masks, the launch), so the round also judges them stacked: the next winner's
rewriter applied to the best winner's kernel, then the one after on that, each stack a variant of its
own, checked and timed like the rest. A stack wins only by measurement; a rewrite that no longer applies
to the stacked kernel is left out of it.

Every variant of a wide round carries its pattern in its params line (`{'pattern': ..., ...}`), and a
stack lists the patterns it holds (`{'stack': [...], ...}`), so what a round picked, and from which
hypotheses, is read back from the round's own files on resume.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnose.judging import Judge, Judged, acceptable, improvement, validate_variants
from diagnose.loop_options import OptimizeOptions
from diagnose.rewriters.base import Variant
from diagnose.rounds import Hypothesis, Round, RoundsStore
from harness.task import TaskSpec

__all__ = ["STACK_KEY", "Winner", "judged_stacks", "patterns_of", "picked", "stacked_variants", "tagged", "winners"]

STACK_KEY = "stack"


def tagged(pattern: str, params: dict[str, Any]) -> str:
    """A wide round's params line for a variant of `pattern`."""
    return repr({"pattern": pattern, **params})


def _parsed(line: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


def patterns_of(line: str) -> list[str]:
    """The patterns whose rewrites a wide round's variant holds, read from its params line: one for a
    variant, several for a stack, for a small-shape path those of the variant it runs on the large inputs,
    then those of the one it runs on the small (where that is one of the round's); [] for a line of a round
    of one hypothesis."""
    params = _parsed(line)
    if STACK_KEY in params:
        return [str(p) for p in params[STACK_KEY]]
    if "pattern" in params:
        return [str(params["pattern"])]
    if "over" in params:  # a small-shape path (diagnose/small_shapes.py) over one of the round's variants
        held = patterns_of(str(params["over"]))  # the large inputs' rewrite first: the round is its
        return held + [p for p in patterns_of(str(params.get("under", ""))) if p not in held]
    return []


@dataclass(frozen=True)
class Winner:
    """A pattern's best variant in a wide round, where it beat the parent beyond the noise."""

    pattern: str
    params: dict[str, Any]  # the variant's own params, without the pattern
    source: str
    geomean: float


def winners(judged: list[Judged], options: OptimizeOptions) -> list[Winner]:
    """Each pattern's best variant among those that pass every check and bar and win beyond the noise,
    best first; stacks and small-shape paths are not winners of one pattern."""
    best: dict[str, Winner] = {}
    for file, line, report, (figure, _, _) in judged:
        params = _parsed(line)
        if figure is None or "pattern" not in params or improvement(report, options) is None:
            continue
        pattern = str(params.pop("pattern"))
        if pattern not in best or figure > best[pattern].geomean:
            best[pattern] = Winner(pattern, params, file.read_text(), figure)
    return sorted(best.values(), key=lambda w: -w.geomean)


def stacked_variants(directory: Path, idx: int, judged: list[Judged], options: OptimizeOptions,
                     rewrite_with: Callable[[str, str], list[Variant]]) -> list[tuple[Path, str]]:
    """Round `idx`'s winners stacked, written beside its variants (files and params lines): the best
    winner's kernel with the next winner's rewrite, then the one after on that, and so on; from each
    rewrite the variant with the winner's own params (else its first). [] with fewer than two winners, and
    for a round that has its stacks already (a resumed one)."""
    listing = directory / f"round-{idx:03d}.variants"
    lines = listing.read_text().splitlines() if listing.is_file() else []
    if any(STACK_KEY in _parsed(line) for line in lines):
        return []
    found = winners(judged, options)
    if len(found) < 2:
        return []
    known = {file.read_text() for file, *_ in judged}
    source, held, steps = found[0].source, [found[0].pattern], []
    out: list[tuple[Path, str]] = []
    for w in found[1:]:
        variants = rewrite_with(w.pattern, source)
        pick = next((v for v in variants if v.params == w.params), variants[0] if variants else None)
        if pick is None or pick.source in known:
            continue  # the rewrite does not apply to the stacked kernel, or makes one already judged
        source, known = pick.source, known | {pick.source}
        held.append(w.pattern)
        steps.append(pick.params)
        path = directory / f"round-{idx:03d}.v{len(lines)}.py"
        path.write_text(source)
        line = repr({STACK_KEY: list(held), "over": tagged(found[0].pattern, found[0].params), "then": list(steps)})
        lines.append(line)
        out.append((path, line))
    if out:
        listing.write_text("\n".join(lines) + "\n")
    return out


def judged_stacks(directory: Path, idx: int, judge: Judge, spec: TaskSpec, parent: Path, entry: str,
                  options: OptimizeOptions, judged: list[Judged], rewrite_with: Callable[[str, str], list[Variant]],
                  say: Callable[[str], None]) -> list[Judged]:
    """Round `idx`'s winners stacked (`stacked_variants`), judged against the same parent as its other
    variants; [] where there are none (or the device could not hold them)."""

    def guarded(pattern: str, source: str) -> list[Variant]:
        try:
            return rewrite_with(pattern, source)
        except Exception:  # noqa: BLE001 - a rewriter that fails on a stacked kernel leaves its rewrite out of the stack
            return []

    stacks = stacked_variants(directory, idx, judged, options, guarded)
    if not stacks:
        return []
    say(f"validating {len(stacks)} stack(s) of the winners: " + ", ".join(line for _, line in stacks))
    reports = validate_variants(judge, spec, parent, [path for path, _ in stacks], entry, say)
    if isinstance(reports, str):
        return []
    return [(path, line, report, acceptable(report, options)) for (path, line), report in zip(stacks, reports)]


def picked(store: RoundsStore, r: Round, line: str, beat: set[str]) -> tuple[Hypothesis, list[dict[str, str]]]:
    """The hypothesis whose rewrite a wide round's pick (its params `line`) holds first, made the round's
    own whatever the verdict (the round's kernel, diff and figures are the pick's), and the others'
    outcomes: "composed" into the pick, "outpaced" (its variant beat the parent, `beat`, but the pick
    beat it and does not hold it), or "lost" (none of its variants beat the parent)."""
    held = patterns_of(line)
    hyps = [r.hypothesis, *r.others]
    hyp = next((h for h in hyps if held and h.pattern == held[0]), r.hypothesis)
    others = [h for h in hyps if h is not hyp]
    if hyp is not r.hypothesis:
        store.picked(r.idx, hyp, others)
    return hyp, [{"pattern": h.pattern, "finding": h.finding,
                  "outcome": "composed" if h.pattern in held else "outpaced" if h.pattern in beat else "lost"}
                 for h in others]
