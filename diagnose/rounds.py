"""The rounds store: one SQLite file per optimize run, written before and after every step.

A run directory holds `rounds.sqlite` (WAL, so a kill -9 between statements loses nothing that was
committed), the baseline and every candidate kernel file, and `best.py`. A round moves through
states, each committed before the next step starts:

    planned    hypothesis chosen (finding, pattern, rewriter, parameters, evidence ids, level)
    rewritten  candidate file and diff written (an LLM round's cost with them)
    done       validated: accepted, or rejected with its reason, with per-case timings

Resuming re-enters the first round that is not done: a planned round is rewritten again (the rewrite
is deterministic or re-asked), a rewritten one is validated again; no done round is repeated.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from harness.errors import UserFacingError
from harness.task import TaskSpec

__all__ = ["Hypothesis", "Round", "RoundsStore", "RunInfo", "RunStatus"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, spec TEXT NOT NULL, options TEXT NOT NULL, created REAL NOT NULL,
    status TEXT NOT NULL, baseline TEXT, best_round INTEGER, best_path TEXT, note TEXT, final TEXT
);
CREATE TABLE IF NOT EXISTS rounds (
    idx INTEGER PRIMARY KEY, parent INTEGER, state TEXT NOT NULL, hypothesis TEXT NOT NULL, key TEXT NOT NULL,
    level TEXT, evidence TEXT, rewriter TEXT, candidate TEXT, diff TEXT, outcome TEXT, reason TEXT,
    timings TEXT, speedup REAL, started REAL, finished REAL, cost TEXT, worked REAL, others TEXT
);
"""



class RunStatus(StrEnum):
    """Where a run is. `to-retime`: a finished run whose end-of-run measurement a bench asked again."""

    RUNNING = "running"
    PAUSED = "paused"  # stopped at --stop-after, to --resume
    INTERRUPTED = "interrupted"  # Ctrl-C or a crash between rounds, to --resume
    FINISHED = "finished"
    FAILED = "failed"  # the task's own kernel is not correct: nothing to optimize
    TO_RETIME = "to-retime"


@dataclass
class Hypothesis:
    """What a round tries: a finding, the pattern that answers it, and who rewrites (the pattern's
    deterministic rewriter, or an LLM)."""

    finding: str  # finding kind ("" for the generic launch search)
    title: str
    pattern: str
    rewriter: str  # "pattern" | "llm"
    level: str
    evidence: list[str] = field(default_factory=list)
    record: float = 0.5  # the pattern's smoothed win rate for this finding when planned (0.5: no record)
    reached: str = ""  # the level the round's diagnosis escalated to (its trajectory), beyond the finding's own
    # The pattern's `unblock`: the source-level condition under which the compiler decides the other way,
    # which the rewrite is meant to make true. With the finding, what justified an accepted round.
    unblock: str = ""
    # No finding asked for it: the loop tried a rewrite that applies once the findings were spent.
    untargeted: bool = False
    # The launch options the round's diagnosis intercepted on its parent, by kernel ({num_warps,
    # num_stages}): a knob search steps from them where the source does not spell a value. Kept with
    # the round, so that a resumed round rewrites the same way.
    launched: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hypothesis:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        # Untargeted rounds recorded before the field was (2026-12-02, the H200 bench's fourth session)
        # said so in their title only.
        fields.setdefault("untargeted", str(data.get("title", "")).startswith("untargeted: "))
        return cls(**fields)


@dataclass
class RunInfo:
    id: str
    task: str
    spec: TaskSpec
    options: dict[str, Any]
    created: float
    status: RunStatus
    baseline: dict[str, Any] | None
    best_round: int | None
    best_path: str | None
    note: str | None
    final: dict[str, Any] | None = None  # the best kernel timed against the task's own, at the end


@dataclass
class Round:
    idx: int
    parent: int | None  # the round whose kernel this one rewrote (None: the task's own kernel)
    state: str  # planned | rewritten | done
    hypothesis: Hypothesis
    key: str  # what was tried, on which parent: never retried blindly
    level: str | None = None
    evidence: list[str] = field(default_factory=list)
    rewriter: str | None = None
    candidate: str | None = None
    diff: str | None = None
    outcome: str | None = None  # accepted | rejected | failed
    reason: str | None = None
    timings: dict[str, Any] | None = None
    speedup: float | None = None
    started: float | None = None
    finished: float | None = None
    # What the round's model calls cost (diagnose.llm.Usage as a dict); None for a round that asked none.
    cost: dict[str, Any] | None = None
    # Seconds its rewrite and validation took, summed over the invocations that worked on it (a round
    # resumed in a later session is not charged the time between); None for rounds recorded before.
    worked: float | None = None
    # A wide round's further hypotheses (`OptimizeOptions.breadth`): their variants are judged beside the
    # first's, and the round's `hypothesis` becomes the one whose variant it picked. What became of each
    # is in `timings["others"]` once the round is done (`hypotheses_tried`).
    others: list[Hypothesis] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        """The round's work time: `worked`, else (an older record) from its start to its end."""
        if self.worked is not None:
            return self.worked
        return self.finished - self.started if self.finished and self.started else None

    def hypotheses_tried(self) -> list[tuple[Hypothesis, str]]:
        """Every hypothesis the finished round judged, with what became of it: the round's own with its
        outcome; a wide round's others "accepted" where its rewrite is part of the accepted kernel (composed
        into it), "outpaced" where a variant of it beat the parent but the pick beat that, else "rejected"
        (no variant of it beat the parent, or the round was rejected)."""
        if self.state != "done":
            return []
        outcomes = {o.get("pattern"): o.get("outcome") for o in (self.timings or {}).get("others", [])}
        out = [(self.hypothesis, self.outcome or "")]
        for h in self.others:
            mark = outcomes.get(h.pattern)
            if self.outcome == "accepted" and mark == "composed":
                out.append((h, "accepted"))
            else:
                out.append((h, "outpaced" if mark == "outpaced" else "rejected"))
        return out


class RoundsStore:
    def __init__(self, run_dir: str | Path, create: bool = False) -> None:
        self.dir = Path(run_dir)
        path = self.dir / "rounds.sqlite"
        if not create and not path.is_file():
            raise UserFacingError(f"{self.dir} is not an optimize run (no rounds.sqlite)",
                                  "pass a directory written by `kb optimize` (see `kb rounds list`)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(run)")}
        if "final" not in columns:  # a run written before the final measurement existed
            self._db.execute("ALTER TABLE run ADD COLUMN final TEXT")
        round_columns = {row[1] for row in self._db.execute("PRAGMA table_info(rounds)")}
        if "cost" not in round_columns:  # before LLM costs
            self._db.execute("ALTER TABLE rounds ADD COLUMN cost TEXT")
        if "worked" not in round_columns:  # before a round's work was summed over the invocations it took
            self._db.execute("ALTER TABLE rounds ADD COLUMN worked REAL")
        if "others" not in round_columns:  # before wide rounds
            self._db.execute("ALTER TABLE rounds ADD COLUMN others TEXT")

    def close(self) -> None:
        self._db.close()

    @classmethod
    def status_of(cls, run_dir: str | Path) -> RunStatus | None:
        """The run's status, or None when `run_dir` holds no run (no store, or a store killed before
        its run record was written)."""
        if not (Path(run_dir) / "rounds.sqlite").is_file():
            return None
        store = cls(run_dir)
        try:
            return store.run().status
        except UserFacingError:
            return None
        finally:
            store.close()

    # ---------------------------------------------------------------- run
    def create_run(self, run_id: str, task: str, spec: TaskSpec, options: dict[str, Any]) -> None:
        self._db.execute("INSERT INTO run (id, task, spec, options, created, status) VALUES (?, ?, ?, ?, ?, 'running')",
                         (run_id, task, json.dumps(spec.to_json()), json.dumps(options), time.time()))

    def run(self) -> RunInfo:
        row = self._db.execute("SELECT id, task, spec, options, created, status, baseline, best_round, best_path, note, "
                               "final FROM run").fetchone()
        if row is None:
            raise UserFacingError(f"{self.dir} holds no run record", "start a new run with `kb optimize TASK`")
        return RunInfo(row[0], row[1], TaskSpec.from_json(json.loads(row[2])), json.loads(row[3]), row[4], RunStatus(row[5]),
                       json.loads(row[6]) if row[6] else None, row[7], row[8], row[9],
                       json.loads(row[10]) if row[10] else None)

    def update_run(self, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        values = [json.dumps(v) if k in ("baseline", "final", "options") else v for k, v in fields.items()]
        self._db.execute(f"UPDATE run SET {cols}", values)

    # ---------------------------------------------------------------- rounds
    def plan(self, r: Round) -> None:
        self._db.execute(
            "INSERT INTO rounds (idx, parent, state, hypothesis, key, level, evidence, rewriter, started, others) "
            "VALUES (?, ?, 'planned', ?, ?, ?, ?, ?, ?, ?)",
            (r.idx, r.parent, json.dumps(asdict(r.hypothesis)), r.key, r.level, json.dumps(r.evidence), r.rewriter, time.time(),
             json.dumps([asdict(h) for h in r.others])))

    def picked(self, idx: int, hypothesis: Hypothesis, others: list[Hypothesis]) -> None:
        """A wide round's pick was another hypothesis's variant: that hypothesis becomes the round's (its
        finding, level and evidence are what justified the kernel), the one planned first joins the others."""
        self._db.execute("UPDATE rounds SET hypothesis = ?, level = ?, evidence = ?, rewriter = ?, others = ? "
                         "WHERE idx = ?", (json.dumps(asdict(hypothesis)), hypothesis.level,
                                           json.dumps(hypothesis.evidence), hypothesis.rewriter,
                                           json.dumps([asdict(h) for h in others]), idx))

    def rewritten(self, idx: int, candidate: str, diff: str) -> None:
        self._db.execute("UPDATE rounds SET state = 'rewritten', candidate = ?, diff = ? WHERE idx = ?",
                         (candidate, diff, idx))

    def set_cost(self, idx: int, cost: dict[str, Any]) -> None:
        self._db.execute("UPDATE rounds SET cost = ? WHERE idx = ?", (json.dumps(cost), idx))

    def done(self, idx: int, outcome: str, reason: str, timings: dict[str, Any] | None = None,
             speedup: float | None = None) -> None:
        self._db.execute("UPDATE rounds SET state = 'done', outcome = ?, reason = ?, timings = ?, speedup = ?, "
                         "finished = ? WHERE idx = ?",
                         (outcome, reason, json.dumps(timings) if timings is not None else None, speedup, time.time(),
                          idx))

    def add_work(self, idx: int, seconds: float) -> None:
        self._db.execute("UPDATE rounds SET worked = COALESCE(worked, 0) + ? WHERE idx = ?", (seconds, idx))

    def rounds(self) -> list[Round]:
        rows = self._db.execute("SELECT idx, parent, state, hypothesis, key, level, evidence, rewriter, candidate, diff, "
                                "outcome, reason, timings, speedup, started, finished, cost, worked, others FROM rounds "
                                "ORDER BY idx")
        return [Round(r[0], r[1], r[2], Hypothesis.from_json(json.loads(r[3])), r[4], r[5], json.loads(r[6] or "[]"), r[7], r[8], r[9],
                      r[10], r[11], json.loads(r[12]) if r[12] else None, r[13], r[14], r[15],
                      json.loads(r[16]) if r[16] else None, r[17],
                      [Hypothesis.from_json(h) for h in json.loads(r[18] or "[]")]) for r in rows]

    def variants(self, idx: int) -> tuple[list[Path], list[str]]:
        """Round `idx`'s variant files in order (`round-NNN.vI.py`) and their params lines (`round-NNN.variants`).
        Every writer writes a variant's file, then its line (the rewrite, a small-shape path, a stack): a file
        past the listed lines is one a kill left unrecorded, and is removed here, for its writer to make again
        on resume rather than have it judged without its params, or twice."""
        listing = self.dir / f"round-{idx:03d}.variants"
        lines = listing.read_text().splitlines() if listing.is_file() else []
        numbered = ((f, re.fullmatch(rf"round-{idx:03d}\.v(\d+)\.py", f.name)) for f in self.dir.glob(f"round-{idx:03d}.v*.py"))
        files = [f for f, _ in sorted(((f, int(n.group(1))) for f, n in numbered if n), key=lambda x: x[1])]
        for orphan in files[len(lines):]:
            orphan.unlink()
        return files[:len(lines)], lines[:len(files)]

    def tried(self) -> dict[str, str]:
        """key -> outcome of every finished round (a rejected hypothesis on the same parent is not retried)."""
        return {r.key: r.outcome or "" for r in self.rounds() if r.state == "done"}
