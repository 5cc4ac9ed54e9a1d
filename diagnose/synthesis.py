"""`kb synthesize`: finished optimize runs become pattern statistics and learned patterns.

For every finished round of every run given:

- a round a catalog pattern produced counts for that pattern: one try, a win if accepted, its
  speedup, and where it applied (run, round, task, finding) or failed (with the reason);
- an accepted round the LLM produced becomes a learned pattern (YAML) keyed by its diagnosis
  signature (finding kind, level) — or, when one with that signature exists, another win for it.

Statistics live in the KB home (`patterns/stats.json`), so curated YAML is never rewritten; learned
patterns go to the home's `patterns/learned/` or, with `into=DIR`, a directory in the repository
(`corpora/patterns/learned/`). Each round is counted once, however often synthesis runs. A pattern
whose record does not hold up (at least 3 tries, fewer than a third won) is demoted to high risk —
L1 ranks it last and never stops on it — and marked so; nothing is deleted.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from diagnose.rounds import Round, RoundsStore
from harness.errors import UserFacingError

if TYPE_CHECKING:
    from kb.home import KBHome

__all__ = ["DEMOTE_BELOW", "synthesize"]

DEMOTE_AFTER = 3  # tries before a record counts
DEMOTE_BELOW = 1 / 3  # win rate under which a pattern is demoted
_MAX_DIFF_LINES = 40


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"patterns": {}, "counted": []}
    except ValueError as exc:
        raise UserFacingError(f"{path} is not valid JSON ({exc})", "restore it from a backup or delete it to recount") from exc
    data.setdefault("patterns", {})
    data.setdefault("counted", [])
    return data


def _save(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)  # a crash mid-write leaves the old statistics, never half a file


def synthesize(home: KBHome, run_dirs: list[Path], into: Path | None = None) -> dict[str, Any]:
    """Count the finished rounds of `run_dirs` not counted before; returns what changed."""
    from kb.patterns import catalog_for

    stats_path = Path(home.patterns_dir) / "stats.json"
    learned_dir = into or Path(home.patterns_dir) / "learned"
    data = _load(stats_path)
    counted = set(data["counted"])
    known = {p.id: p for p in catalog_for(home)}
    learned_dir_patterns = {p.id: p for p in known.values() if p.provenance.get("kind") == "learned"}
    summary: dict[str, Any] = {"rounds": 0, "updated": set(), "learned": [], "demoted": []}
    for run_dir in run_dirs:
        store = RoundsStore(run_dir)
        try:
            info = store.run()
            for r in store.rounds():
                # Run ids are directory names and can repeat (a bench names runs by operator under each
                # condition): the creation time tells runs apart. Runs from before this key (their spec
                # carries no family) may have been counted under the id alone.
                key = f"{info.id}@{info.created:.6f}:{r.idx}"
                legacy = f"{info.id}:{r.idx}" if info.spec.family is None else None
                if r.state != "done" or key in counted or (legacy and legacy in counted):
                    continue
                counted.add(key)
                summary["rounds"] += 1
                pid = _pattern_of(r, info.task, learned_dir, learned_dir_patterns, known, run_dir, summary)
                if pid is not None:
                    _count(data["patterns"].setdefault(pid, _fresh()), r, info.id, info.task, info.spec.family or "")
                    summary["updated"].add(pid)
                # A wide round judged more patterns on the same parent: a try each, a win where its rewrite
                # was stacked into the accepted kernel.
                for other, outcome in r.hypotheses_tried()[1:]:
                    # outpaced: it beat the parent, another variant beat it; neither a win nor a failure
                    if other.rewriter == "pattern" and other.pattern in known and outcome != "outpaced":
                        _count(data["patterns"].setdefault(other.pattern, _fresh()), r, info.id, info.task,
                               info.spec.family or "", other.finding, outcome == "accepted")
                        summary["updated"].add(other.pattern)
        finally:
            store.close()
    for pid, s in data["patterns"].items():
        tries, wins = s.get("tries", 0), s.get("wins", 0)
        if tries >= DEMOTE_AFTER and wins / tries < DEMOTE_BELOW and s.get("status") != "demoted":
            s["status"], s["risk"] = "demoted", "high"
            summary["demoted"].append(pid)
    data["counted"] = sorted(counted)
    _save(stats_path, data)
    summary["updated"] = sorted(summary["updated"])
    summary["stats"] = {pid: {k: v for k, v in data["patterns"][pid].items() if k in ("tries", "wins", "status")}
                        for pid in summary["updated"]}
    return summary


def _fresh() -> dict[str, Any]:
    return {"tries": 0, "wins": 0, "speedups": [], "applied": [], "failed": []}


def _count(s: dict[str, Any], r: Round, run: str, task: str, family: str, finding: str | None = None,
           won: bool | None = None) -> None:
    """One try of a pattern in round `r`: the round's own (its finding and outcome), or with `finding` and
    `won` given, another pattern a wide round judged."""
    s["tries"] = s.get("tries", 0) + 1
    where = {"run": run, "round": r.idx, "task": task, "family": family,
             "finding": r.hypothesis.finding if finding is None else finding, "level": r.level}
    if (r.outcome == "accepted") if won is None else won:
        s["wins"] = s.get("wins", 0) + 1
        s.setdefault("speedups", []).append(round(float(r.speedup or 1.0), 4))
        s.setdefault("applied", []).append(where)
    else:
        s.setdefault("failed", []).append({**where, "why": (r.reason or "")[:200]})


def _pattern_of(r: Round, task: str, learned_dir: Path, learned: dict[str, Any], known: dict[str, Any],
                run_dir: Path, summary: dict[str, Any]) -> str | None:
    """The pattern a round counts for: its catalog pattern, or for an LLM round the learned pattern of
    its signature (written now if the round was accepted and none exists)."""
    if r.rewriter == "pattern":
        pid = r.hypothesis.pattern
        return pid if pid in known else None
    finding = r.hypothesis.finding or "free-form"
    pid = f"learned-{re.sub(r'[^a-z0-9]+', '-', finding.lower()).strip('-')}-{(r.level or 'l0').lower()}"
    if pid in learned or pid in known:
        return pid
    if r.outcome != "accepted":
        return None  # a failed free-form rewrite teaches no pattern
    _write_learned(pid, r, task, learned_dir, run_dir)
    learned[pid] = True
    summary["learned"].append(pid)
    return pid


def _write_learned(pid: str, r: Round, task: str, directory: Path, run_dir: Path) -> None:
    finding = r.hypothesis.finding or ""
    family = finding.split(".")[0] if finding else "learned"
    diff = "\n".join((r.diff or "").splitlines()[:_MAX_DIFF_LINES])
    diagnosis = run_dir / f"round-{r.idx:03d}.diagnosis.md"
    deciding = re.findall(r"Decided by: `([\w.-]+)`", diagnosis.read_text()) if diagnosis.is_file() else []
    pattern = {
        "id": pid,
        "title": f"Learned rewrite for {finding or 'a kernel without a diagnosed defect'} (diagnosed at {r.level})",
        "family": family,
        "backends": ["cuda"],
        "symptoms": [finding] if finding else [],
        "rewrite": {"kind": "learned-diff", "summary": f"The validated rewrite of {task} round {r.idx}; "
                    f"apply the same change where the same finding is diagnosed.", "before": "", "after": diff},
        "rationale": f"Accepted in run {run_dir.name} round {r.idx} on task {task} with a geometric-mean speedup "
                     f"of {float(r.speedup or 1.0):.3f}x over its parent, every case correct.",
        "compiler_refs": {"passes": deciding[:1]} if deciding else {},
        "risk": "medium",
        "provenance": {"kind": "learned", "runs": [run_dir.name], "rounds": [r.idx], "operators": [task],
                       "evidence": list(r.evidence), "rewriter": r.rewriter},
    }
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{pid}.yaml.tmp"
    tmp.write_text(yaml.safe_dump(pattern, sort_keys=False, width=100))
    os.replace(tmp, directory / f"{pid}.yaml")
