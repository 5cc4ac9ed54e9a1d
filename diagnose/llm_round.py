"""An LLM rewrite round: several candidates, each repaired with the judge's exact words.

Candidate i is asked with its own prompt (the round's finding first, then the next findings, then
the same prompts again at a higher temperature). Its reply is data: only its ```python blocks
are used (joined when the kernel and the wrapper come in two, harness.answers), the module must
parse and define the entry, and it is never imported here: the judge's
sandboxed workers are the only place it runs (`check`). A reply that cannot be used, or a module the
judge rejects (compile error, wrong values, a torch fallback or any other guard), is answered with
that reason in the same conversation, up to `repairs` times. Candidates that pass every check are
returned for the loop to time against their parent like any pattern variant.

Every finished call is appended to the round's transcript (`round-NNN.llm.jsonl`, flushed and
fsynced before its reply is used), keyed by the model, temperature and messages: a round killed
midway asks the endpoint again only for what it had not yet been answered, and its cost counts each
call once. The run's token budget is checked before every new call.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.llm import LLMConfig, RequestRefused, Usage, complete
from diagnose.llm_prompt import Prompt
from diagnose.records import Answer
from diagnose.rewriters import Variant
from diagnose.rounds import Round, RoundsStore
from harness.answers import answer_module, python_fences
from harness.guards import binds_name

if TYPE_CHECKING:
    from diagnose.loop_options import OptimizeOptions
    from harness.measurement import RunReport
    from kb.patterns import Pattern

__all__ = ["Attempt", "LLMRoundResult", "ReplyError", "TokenBudget", "Transcript", "ask_for_round", "budget_left",
           "extract_module", "llm_round", "tokens_spent"]

# candidate file -> None when it passed every check, else the judge's reason
Check = Callable[[Path], str | None]
_SAMPLED_TEMPERATURE = 0.8


class ReplyError(ValueError):
    """A reply the loop cannot use as a module (no code block, a syntax error, no entry)."""


@dataclass
class Attempt:
    """One model turn of a candidate and what became of it."""

    candidate: int
    turn: int  # 0: the first ask; 1..: repair turns
    outcome: str  # passed | unusable | rejected | duplicate | refused (the endpoint refused the request)
    detail: str
    sha: str | None = None


@dataclass
class LLMRoundResult:
    variants: list[Variant]
    attempts: list[Attempt]
    cost: Usage
    note: str = ""  # why the round stopped asking early (the run's token budget), else ""

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": [asdict(a) for a in self.attempts], "cost": self.cost.to_dict(), "note": self.note}

    def why_none_passed(self) -> str:
        """Every turn's outcome, in order: the first try and each repair, with the judge's words."""
        turns = [f"candidate {a.candidate + 1}" + (f" repair {a.turn}" if a.turn else "") + f": {a.outcome}: {a.detail}"
                 for a in self.attempts]
        return "; ".join(turns + ([self.note] if self.note else [])) or "no reply"


class Transcript:
    """A round's finished model calls, one JSON line each: the replay cache of a resumed round."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._calls: dict[str, dict[str, Any]] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # the torn last line of a killed write: that call is asked again
                    continue
                self._calls[record["key"]] = record

    def get(self, key: str) -> tuple[str, Usage] | None:
        record = self._calls.get(key)
        return (record["reply"], Usage.from_dict(record["usage"])) if record else None

    def put(self, key: str, candidate: int, turn: int, messages: list[dict[str, Any]], reply: str, usage: Usage) -> None:
        record = {"key": key, "candidate": candidate, "turn": turn, "asked": messages[-1]["content"],
                  "reply": reply, "usage": usage.to_dict()}
        with open(self.path, "a") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self._calls[key] = record


def extract_module(reply: str, entry: str) -> str:
    """The module in a reply (its python fences, joined when the kernel and the wrapper come apart:
    harness.answers), which must parse and define `entry` (for an autograd Function's `Name.apply`,
    the class)."""
    if not python_fences(reply):
        raise ReplyError("the reply has no ```python code block")
    code = answer_module(reply).strip() + "\n"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ReplyError(f"the reply's code does not parse: line {exc.lineno}: {exc.msg}") from exc
    owner = entry.split(".")[0]  # "RMSNorm.apply": the module defines RMSNorm
    if not binds_name(tree, owner):
        raise ReplyError(f"the reply's code does not define the launch wrapper {entry!r} at module level")
    return code


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tokens_spent(rounds: list[Round]) -> int:
    """Tokens (in and out) the model calls of these rounds cost."""
    return sum(Usage.from_dict(r.cost).tokens for r in rounds if r.cost)


@dataclass
class TokenBudget:
    """The run's cap on tokens (None: no cap) and what the run spent before this round."""

    limit: int | None
    spent_before: int = 0
    spent: Usage = field(default_factory=Usage)

    def allows_another_call(self) -> bool:
        return self.limit is None or self.spent_before + self.spent.tokens < self.limit


def llm_round(config: LLMConfig, prompts: list[Prompt], entry: str, check: Check, workdir: Path, prefix: str,
              candidates: int, repairs: int, budget: TokenBudget, transcript: Transcript,
              temperature: float = 0.2) -> LLMRoundResult:
    """Ask for `candidates` rewrites, repair each up to `repairs` times, return those that pass `check`.

    Raises `diagnose.llm.EndpointError` when the endpoint cannot answer (the caller leaves the round
    to be resumed; the transcript keeps what was answered)."""
    attempts: list[Attempt] = []
    variants: list[Variant] = []
    verdicts: dict[str, str | None] = {}  # sha -> check outcome, so a repeated module is not judged twice
    note = ""
    for c in range(candidates):
        prompt = prompts[c % len(prompts)]
        heat = temperature if c < len(prompts) else _SAMPLED_TEMPERATURE
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.system},
                                          {"role": "user", "content": prompt.user}]
        for turn in range(repairs + 1):
            key = _sha(json.dumps([config.model, heat, c, messages], sort_keys=True))
            cached = transcript.get(key)
            if cached is None:
                if not budget.allows_another_call():
                    note = f"the run's token budget ({budget.limit}) is spent"
                    break
                try:
                    reply, usage = complete(config, messages, heat)
                except RequestRefused as exc:  # the same request would be refused again: next candidate
                    attempts.append(Attempt(c, turn, "refused", str(exc)))
                    break
                transcript.put(key, c, turn, messages, reply, usage)
            else:
                reply, usage = cached
            budget.spent.add(usage)
            messages.append({"role": "assistant", "content": reply})
            try:
                code = extract_module(reply, entry)
            except ReplyError as exc:
                attempts.append(Attempt(c, turn, "unusable", str(exc)))
                messages.append({"role": "user", "content": f"Your reply could not be used: {exc}. Reply with the "
                                 "complete module in one ```python code block."})
                continue
            sha = _sha(code)
            if sha not in verdicts:
                candidate_file = workdir / f"{prefix}.c{c}.t{turn}.py"
                candidate_file.write_text(code)
                verdicts[sha] = check(candidate_file)
            elif verdicts[sha] is None:
                attempts.append(Attempt(c, turn, "duplicate", "the same module as an earlier candidate", sha))
                break
            verdict = verdicts[sha]
            if verdict is None:
                attempts.append(Attempt(c, turn, "passed", "every check passed", sha))
                variants.append(Variant({"llm": config.model, "candidate": c + 1, "repairs": turn}, code))
                break
            attempts.append(Attempt(c, turn, "rejected", verdict, sha))
            messages.append({"role": "user", "content": f"The judge ran that module and rejected it: {verdict}\n"
                             "Fix exactly this and reply with the complete corrected module in one ```python code "
                             "block."})
        if note:
            break
    return LLMRoundResult(variants, attempts, budget.spent, note)


def budget_left(rounds: list[Round], limit: int | None) -> bool:
    """Whether a run whose rounds these are may still ask the model (`--max-tokens-per-run`)."""
    return limit is None or tokens_spent(rounds) < limit


def ask_for_round(store: RoundsStore, r: Round, source: str, entry: str, options: OptimizeOptions,
                  catalog: list[Pattern], report: RunReport | None, check: Check) -> LLMRoundResult:
    """A loop round's candidates: its diagnosis as planned (round-NNN.diagnosis.json), the run's
    finished rounds as the history, `report` (the parent's last measurements) for the cases; each
    candidate checked by `check`, every call kept in the round's transcript."""
    from diagnose.llm_prompt import round_prompts
    from harness.errors import UserFacingError

    config = LLMConfig.from_env(options.llm_model)
    if config is None:
        raise UserFacingError("--llm openai needs KB_LLM_BASE_URL", "set KB_LLM_BASE_URL, KB_LLM_MODEL, KB_LLM_API_KEY")
    answer = Answer.from_dict(json.loads((store.dir / f"round-{r.idx:03d}.diagnosis.json").read_text()))
    rounds = store.rounds()
    prompts = round_prompts(answer, r.hypothesis.finding, source, entry, catalog,
                            [x for x in rounds if x.state == "done"], report, options.context_tokens,
                            options.candidates, r.hypothesis.unblock)
    budget = TokenBudget(options.max_tokens_per_run, tokens_spent([x for x in rounds if x.idx != r.idx]))
    return llm_round(config, prompts, entry, check, store.dir, f"round-{r.idx:03d}", options.candidates,
                     options.repairs, budget, Transcript(store.dir / f"round-{r.idx:03d}.llm.jsonl"))
