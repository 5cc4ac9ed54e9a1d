"""One step of an optimize run driven by an agent host (`kb mcp`'s optimize_round): the host asks for the
current best kernel's diagnosis and rewrite prompt, writes the candidate itself, and hands it back to be
judged as the run's next round under the loop's own rules, in the loop's own store (diagnose/optimize.py
drives the same rounds without a host)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.judging import HarnessJudge, Judge
from diagnose.loop_options import OptimizeOptions
from diagnose.optimize import (
    best_kernel_path,
    check_rewritable,
    diagnose_kernel,
    diagnosis_markdown,
    ensure_baseline,
    finish_round,
    last_report,
    locked_run,
    open_run,
    source_sha,
)
from diagnose.records import Answer
from diagnose.rounds import Hypothesis, Round, RoundsStore
from harness.entries import entry_name
from harness.errors import UserFacingError
from harness.task import TaskSpec

if TYPE_CHECKING:
    from kb.home import KBHome

__all__ = ["AgentStep", "agent_step"]


@dataclass
class AgentStep:
    """One step of a run driven by an agent host (`kb mcp`'s optimize_round). Without a candidate: the
    current best kernel's diagnosis and the rewrite prompt the LLM rewriter would get. With one: the
    judge's verdict on it as a round of the run, under the loop's acceptance rules."""

    run: str
    round: int  # the round the candidate is (or would be) judged as
    parent: int  # the round whose kernel it rewrites (0: the task's own)
    judged: bool
    kernel: str = ""
    findings: list[dict[str, Any]] = field(default_factory=list)  # kind, title, level, confidence, evidence
    rules: str = ""
    prompt: str = ""
    outcome: str | None = None  # accepted | rejected | failed
    speedup: float | None = None
    reason: str | None = None
    best_round: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agent_step(spec: TaskSpec | None, options: OptimizeOptions, run_dir: Path, candidate: str | None = None,
               finding: str = "", home: KBHome | None = None, judge: Judge | None = None,
               log: Callable[[str], None] | None = None) -> AgentStep:
    """Diagnose the run's best kernel (`candidate` None), or judge the host's `candidate` source as the
    run's next round. The run is created from `spec` on the first step; the diagnosis a candidate
    answers is the one the last step returned for the same kernel (or a fresh one)."""
    from diagnose.llm_prompt import round_prompts
    from harness.task import load_job_task
    from kb.patterns import catalog_for

    say = log or (lambda _msg: None)
    with locked_run(run_dir):
        exists = RoundsStore.status_of(run_dir) is not None
        if not exists and spec is None:
            raise UserFacingError(f"{run_dir} holds no optimize run", "pass the task to start one there")
        if exists:
            with contextlib.closing(RoundsStore(run_dir)) as peek:
                spec = peek.run().spec
        assert spec is not None
        task = load_job_task(spec)
        entry = entry_name(task.entry)
        check_rewritable(task, entry)
        store, options = open_run(spec, options, run_dir, task, resume=exists)
        own_judge = HarnessJudge(options) if judge is None else None
        judge = judge or own_judge
        assert judge is not None
        try:
            ensure_baseline(store, spec, judge, entry, say, task, options, home)
            for pending in [r for r in store.rounds() if r.state != "done"]:  # a step killed mid-way
                finish_round(store, pending, spec, task, entry, judge, options, home, say)
            parent_idx, parent = best_kernel_path(store)
            idx = len(store.rounds()) + 1
            kept = store.dir / "agent-diagnosis.json"
            saved = json.loads(kept.read_text()) if kept.is_file() else {}
            if saved.get("parent") == parent_idx and saved.get("round") == idx:
                answer = Answer.from_dict(saved["answer"])
            else:
                say(f"diagnosing round {parent_idx}'s kernel")
                answer, _ = diagnose_kernel(store, task, parent, entry, options, home)
                kept.write_text(json.dumps({"parent": parent_idx, "round": idx, "answer": answer.to_dict()}))
            kinds = [f.kind for f in answer.findings]
            if finding and finding not in kinds:
                raise UserFacingError(f"{finding!r} is not a finding of round {parent_idx}'s diagnosis",
                                      f"name one of: {', '.join(kinds) or 'none (leave it empty)'}")
            top = answer.ranked()
            focus = next((f for f in answer.findings if f.kind == finding), top[0] if top else None)
            step = AgentStep(str(run_dir), idx, parent_idx, candidate is not None,
                             findings=[{"kind": f.kind, "title": f.title, "level": f.level, "confidence": f.confidence,
                                        "evidence": f.evidence} for f in answer.findings if not f.healthy])
            if candidate is None:
                done = [r for r in store.rounds() if r.state == "done"]
                prompt = round_prompts(answer, focus.kind if focus else "", parent.read_text(), entry,
                                       catalog_for(home), done, last_report(store), options.context_tokens, 1)[0]
                step.kernel, step.rules, step.prompt = parent.read_text(), prompt.system, prompt.user
                step.best_round = parent_idx
                return step
            hyp = Hypothesis(focus.kind if focus else "", focus.title if focus else "candidate from the agent host",
                             "host-rewrite", "host", focus.level if focus else answer.stopped_at or "L1",
                             list(focus.evidence) if focus else [])
            hyp.reached = answer.stopped_at
            (store.dir / f"round-{idx:03d}.host.py").write_text(candidate)
            (store.dir / f"round-{idx:03d}.diagnosis.md").write_text(diagnosis_markdown(answer))
            r = Round(idx, parent_idx, "planned", hyp, f"{source_sha(candidate)}:host", hyp.level, hyp.evidence, "host")
            store.plan(r)
            finish_round(store, r, spec, task, entry, judge, options, home, say)
            judged = next(x for x in store.rounds() if x.idx == idx)
            step.outcome, step.speedup, step.reason = judged.outcome, judged.speedup, judged.reason
            step.best_round = store.run().best_round or 0
            if options.backend == "interpreter":
                step.note = "timed on the CPU interpreter: the checks hold, the speedup is not kernel performance"
            return step
        finally:
            store.close()
            if own_judge is not None:
                own_judge.close()
