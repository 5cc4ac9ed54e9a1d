"""The LLM rewriter (issue 28): a scripted local OpenAI-compatible server, the real `openai` client,
and, in the loop tests, the real sandboxed judge on the CPU interpreter (time set by a marker)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import FIXTURES
from llm_server import ScriptedEndpoint, Slow, Status, module
from marker_judge import MarkerJudge

from diagnose.llm import EndpointError, LLMConfig, RequestRefused, complete
from diagnose.llm_prompt import CaseFacts, RewriteContext, Tried, rewrite_prompt
from diagnose.llm_round import ReplyError, TokenBudget, Transcript, extract_module, llm_round
from diagnose.optimize import OptimizeOptions, optimize
from diagnose.records import Answer, Evidence, Finding
from diagnose.rounds import RoundsStore, RunStatus
from diagnose.run_summary import report
from harness.task import TaskSpec

TASK = FIXTURES / "optimize" / "task.py"
KERNEL = FIXTURES / "optimize" / "rowsum.py"
SOURCE = KERNEL.read_text()
MARK = "# rewritten by the model"
GOOD = SOURCE + MARK + "\n"
UNDEFINED = GOOD.replace("acc += tl.load(x_ptr + row * N + cols)", "acc += tl.load(x_ptr + row * N + colz)")
WRONG = GOOD.replace("tl.sum(acc, axis=0))", "tl.sum(acc, axis=0) * 2)")
CHEAT = GOOD.replace("    rowsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=128, num_warps=1)\n    return out",
                     "    return x.sum(dim=-1)")


def _config(endpoint: ScriptedEndpoint, **kw) -> LLMConfig:
    return LLMConfig(endpoint.url, kw.pop("model", "scripted"), "test-key", **{"timeout_s": 5.0, "max_retries": 0, **kw})


def _use(monkeypatch, endpoint: ScriptedEndpoint | str, timeout: float = 10, retries: int = 0) -> None:
    monkeypatch.setenv("KB_LLM_BASE_URL", endpoint if isinstance(endpoint, str) else endpoint.url)
    monkeypatch.setenv("KB_LLM_MODEL", "scripted")
    monkeypatch.setenv("KB_LLM_TIMEOUT", str(timeout))
    monkeypatch.setenv("KB_LLM_RETRIES", str(retries))


# ------------------------------------------------------------------------------------------ replies are data
def test_only_a_fenced_module_that_defines_the_entry_is_used():
    with pytest.raises(ReplyError, match="no ```python code block"):
        extract_module("Sure! Just call torch.sum.", "row_sum")
    with pytest.raises(ReplyError, match="does not parse: line 1"):
        extract_module(module("def row_sum(x:\n    pass"), "row_sum")
    with pytest.raises(ReplyError, match="does not define the launch wrapper 'row_sum'"):
        extract_module(module("def helper(x):\n    return x"), "row_sum")
    # Kernel and wrapper in two fences are one module; an assignment defines the entry too.
    reply = "The kernel:\n```python\nimport triton\n```\nThe wrapper:\n" + module("class F:\n    pass\n\nrow_sum = F\n")
    joined = extract_module(reply, "row_sum")
    assert joined.startswith("import triton") and joined.endswith("row_sum = F\n")
    # A fence that does not parse beside one that does: the one that parses is the module.
    assert extract_module("```python\ndef (:\n```\n" + module("def row_sum(x):\n    return x"), "row_sum").startswith(
        "def row_sum")
    assert "class RowSum" in extract_module(module("class RowSum:\n    apply = staticmethod(print)\n"), "RowSum.apply")
    with pytest.raises(ReplyError, match="'RowSum.apply'"):
        extract_module(module("def row_sum(x):\n    return x"), "RowSum.apply")


# ------------------------------------------------------------------------------------------ the prompt
def _answer() -> Answer:
    evidence = [Evidence("E1", "L3", "ttgir", "the loop is not pipelined", "rowsum.ttgir:12", "scf.for %i = ..."),
                Evidence("E2", "L1", "kernel", "one program per row", "rowsum.py:6", "row = tl.program_id(0)")]
    findings = [Finding("pipelining.none", "pipelining", "loads wait on each other", "No num_stages.", ["E1"],
                        level="L3", confidence=0.9, gain=1.4),
                Finding("parallelism.grid-underfilled", "parallelism", "4 programs on 132 SMs", "Grid too small.",
                        ["E2"], level="L1", confidence=0.8)]
    return Answer("q", "rowsum.py", "cuda", "triton-3.9.0", findings, [], [], evidence, ["L1", "L3"])


def test_the_prompt_carries_the_evidence_and_history_and_is_cut_to_the_budget_by_rank():
    history = [Tried(i, i - 1, "pipelining.none", "tl-range-pipelining", "pattern", "rejected", 0.99,
                     f"within noise {i}") for i in range(1, 41)]
    ctx = RewriteContext(SOURCE, "row_sum", _answer(), "pipelining.none",
                         [("tl-range-pipelining", "pipeline the loop", "for i in range(n):", "for i in tl.range(n, num_stages=3):")],
                         "the loop is an innermost scf.for with tt.num_stages > 1",
                         [CaseFacts("m=4,n=256", 12.5, "memory", 0.31)], history)
    full = rewrite_prompt(ctx, 100_000)
    assert not full.left_out
    for needed in ("rowsum_kernel", "[E1] L3 ttgir at rowsum.ttgir:12", "scf.for %i = ...", "gain up to 1.40x",
                   "tt.num_stages > 1", "m=4,n=256: 12.5 us, 0.31 of the memory roofline",
                   "round 40 (on round 39's kernel): pipelining.none -> tl-range-pipelining (pattern): rejected 0.990x",
                   "parallelism.grid-underfilled", "for i in tl.range(n, num_stages=3):"):
        assert needed in full.user, needed
    assert "row_sum" in full.system and "no torch fallback" in full.system
    small = rewrite_prompt(ctx, full.tokens - 400)
    assert small.tokens <= full.tokens - 400 and "rowsum_kernel" in small.user and "[E1]" in small.user
    # The oldest rounds go first; the latest is kept, and the prompt says what was left out.
    assert "round 40 " in small.user and "round 1 " not in small.user
    assert any(x.startswith("this run so far:") for x in small.left_out) and "Left out for the token budget" in small.user
    # The kernel and the finding are sent even when they alone exceed the budget.
    tiny = rewrite_prompt(ctx, 10)
    assert "rowsum_kernel" in tiny.user and "pipelining.none" in tiny.user and "round 40" not in tiny.user


# ------------------------------------------------------------------------------------------ one round
def _prompts():
    ctx = RewriteContext(SOURCE, "row_sum", _answer(), "pipelining.none")
    return [rewrite_prompt(ctx, 8000), rewrite_prompt(RewriteContext(SOURCE, "row_sum", _answer(),
                                                                     "parallelism.grid-underfilled"), 8000)]


def _check(path: Path) -> str | None:
    text = path.read_text()
    return "case m=4,n=256: NameError: name 'colz' is not defined" if "colz" in text else None


def test_a_candidate_is_repaired_with_the_exact_error_and_a_resumed_round_replays_its_transcript(tmp_path):
    script = ["I would rather not write code.", module("def row_sum(x:\n    return x"), module(UNDEFINED),
              module(GOOD)]
    with ScriptedEndpoint(script) as llm:
        result = llm_round(_config(llm), _prompts(), "row_sum", _check, tmp_path, "round-001", candidates=1,
                           repairs=3, budget=TokenBudget(None), transcript=Transcript(tmp_path / "t.jsonl"))
    assert [(a.turn, a.outcome) for a in result.attempts] == [
        (0, "unusable"), (1, "unusable"), (2, "rejected"), (3, "passed")]
    assert [v.source for v in result.variants] == [GOOD.rstrip() + "\n"]
    assert "no ```python code block" in llm.asked(1)
    assert "does not parse: line 1" in llm.asked(2)
    assert "NameError: name 'colz' is not defined" in llm.asked(3)  # the judge's words, not a paraphrase
    assert [m["role"] for m in llm.requests[3]["messages"]] == ["system", "user"] + ["assistant", "user"] * 3
    assert result.cost.calls == 4 and result.cost.tokens_in > 0 and not result.cost.estimated
    # The same round again (a resumed run): every answer comes from the transcript, none from the endpoint.
    with ScriptedEndpoint([]) as silent:
        again = llm_round(_config(silent), _prompts(), "row_sum", _check, tmp_path, "round-001", candidates=1,
                          repairs=3, budget=TokenBudget(None), transcript=Transcript(tmp_path / "t.jsonl"))
    assert silent.requests == [] and [v.source for v in again.variants] == [GOOD.rstrip() + "\n"]
    assert again.cost == result.cost


def test_candidates_follow_the_findings_then_sample_and_a_repeated_module_is_not_judged_twice(tmp_path):
    second = GOOD.replace(MARK, MARK + " again")
    judged = []

    def check(path: Path) -> str | None:
        judged.append(path.read_text())
        return None

    with ScriptedEndpoint([module(GOOD), module(second), module(GOOD)]) as llm:
        result = llm_round(_config(llm), _prompts(), "row_sum", check, tmp_path, "r", candidates=3, repairs=0,
                           budget=TokenBudget(None), transcript=Transcript(tmp_path / "a.jsonl"))
    assert "What to fix\n- pipelining.none" in llm.asked(0)
    assert "What to fix\n- parallelism.grid-underfilled" in llm.asked(1)
    # Two prompts, three candidates: the third samples the first prompt again, hotter.
    assert llm.requests[2]["messages"][1] == llm.requests[0]["messages"][1]
    assert llm.requests[2]["temperature"] > llm.requests[0]["temperature"]
    assert [a.outcome for a in result.attempts] == ["passed", "passed", "duplicate"]
    assert len(result.variants) == 2 and len(judged) == 2


def test_the_run_token_budget_is_checked_before_every_call(tmp_path):
    with ScriptedEndpoint([module(UNDEFINED), module(GOOD)]) as llm:
        result = llm_round(_config(llm), _prompts(), "row_sum", _check, tmp_path, "r", candidates=2, repairs=2,
                           budget=TokenBudget(limit=1000, spent_before=990), transcript=Transcript(tmp_path / "b.jsonl"))
    assert len(llm.requests) == 1  # the first call spent the rest of the budget: no repair turn was asked
    assert result.variants == [] and "token budget (1000) is spent" in result.note
    assert "token budget" in result.why_none_passed()


def test_a_request_the_endpoint_refuses_drops_that_candidate_not_the_run(tmp_path):
    # A 400 (a prompt past the model's context, say) would come back for the same request: that
    # candidate ends there, with the reason, and the next one is asked.
    with ScriptedEndpoint([Status(400), module(GOOD)]) as llm:
        result = llm_round(_config(llm), _prompts(), "row_sum", _check, tmp_path, "r", candidates=2, repairs=2,
                           budget=TokenBudget(None), transcript=Transcript(tmp_path / "c.jsonl"))
    assert [(a.candidate, a.outcome) for a in result.attempts] == [(0, "refused"), (1, "passed")]
    assert "HTTP 400" in result.attempts[0].detail and "--context-tokens" in result.attempts[0].detail
    assert len(llm.requests) == 2 and len(result.variants) == 1


# ------------------------------------------------------------------------------------------ the endpoint
def test_endpoint_failures_are_one_line_errors_and_429_is_retried(tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    with ScriptedEndpoint([Status(429), "fine"]) as llm:
        text, usage = complete(_config(llm, max_retries=2), messages)
    assert text == "fine" and len(llm.requests) == 2 and usage.calls == 1
    with ScriptedEndpoint([Status(429), Status(429)]) as llm, pytest.raises(EndpointError, match="still rate-limiting"):
        complete(_config(llm, max_retries=1), messages)
    with ScriptedEndpoint([], models=("qwen-coder", "llama")) as llm:
        with pytest.raises(EndpointError) as wrong:
            complete(_config(llm, model="gpt-9"), messages)
    assert "does not serve model 'gpt-9' (it serves: llama, qwen-coder)" in str(wrong.value)
    with ScriptedEndpoint([Status(413)]) as llm, pytest.raises(RequestRefused, match="too large"):
        complete(_config(llm), messages)
    with ScriptedEndpoint([Slow(3, "late")]) as llm, pytest.raises(EndpointError, match=r"did not answer within 0.5 s"):
        complete(_config(llm, timeout_s=0.5), messages)
    with ScriptedEndpoint([]) as llm:
        closed = llm.url
    with pytest.raises(EndpointError) as unreachable:
        complete(LLMConfig(closed, "scripted", "k", timeout_s=2, max_retries=0), messages)
    assert f"cannot reach the LLM endpoint {closed}" in str(unreachable.value)
    for err in (wrong.value, unreachable.value):
        assert "\n" not in str(err) and "resume" in err.fix


# ------------------------------------------------------------------------------------------ in the loop
def _loop(tmp_path: Path, run: str = "run", resume: bool = False, **kw) -> RoundsStore:
    judge = kw.pop("judge", None) or MarkerJudge(KERNEL, MARK, fast_us=50)
    options = OptimizeOptions(**{"rounds": 1, "backend": "interpreter", "seeds": 1, "llm": "openai", "llm_first": True,
                                 "candidates": 1, "repairs": 1, "references": (), **kw})
    try:
        return optimize(TaskSpec(path=str(TASK)), options, tmp_path / run, judge=judge, resume=resume)
    finally:
        judge.close()


def test_the_loop_accepts_a_candidate_the_judge_made_it_repair(tmp_path, monkeypatch):
    with ScriptedEndpoint([module(UNDEFINED), module(GOOD)]) as llm:
        _use(monkeypatch, llm)
        store = _loop(tmp_path)
    (r,) = store.rounds()
    assert (r.rewriter, r.outcome) == ("llm", "accepted") and r.speedup == pytest.approx(2.0)
    assert """NameError("name 'colz' is not defined")""" in llm.asked(1)  # the sandboxed judge's own words
    attempts = r.timings["llm"]["attempts"]
    assert [(a["turn"], a["outcome"]) for a in attempts] == [(0, "rejected"), (1, "passed")]
    assert r.cost["calls"] == 2 and report(store).llm_cost["calls"] == 2
    prompt = llm.requests[0]["messages"][1]["content"]
    assert "## Kernel module" in prompt and "## What to fix" in prompt and "m=4,n=256" in prompt
    assert MARK in (store.dir / "best.py").read_text()
    store.close()


def test_a_cheating_candidate_is_rejected_with_the_judges_reason(tmp_path, monkeypatch):
    with ScriptedEndpoint([module(CHEAT), module(WRONG)]) as llm:
        _use(monkeypatch, llm)
        store = _loop(tmp_path)
    (r,) = store.rounds()
    assert (r.rewriter, r.outcome) == ("llm", "rejected")
    assert "torch fallback: .sum() in row_sum" in r.reason and "outputs differ from the reference" in r.reason
    assert "torch fallback" in llm.asked(1)
    assert store.run().best_round in (None, 0) and not (store.dir / "best.py").exists()
    store.close()


def test_an_endpoint_timeout_interrupts_the_run_which_resumes_where_it_stopped(tmp_path, monkeypatch):
    with ScriptedEndpoint([module(UNDEFINED), Slow(4, module(GOOD))]) as llm:
        _use(monkeypatch, llm, timeout=1)
        with pytest.raises(EndpointError, match="did not answer within 1 s") as err:
            _loop(tmp_path)
    assert "\n" not in str(err.value)
    store = RoundsStore(tmp_path / "run")
    assert store.run().status == RunStatus.INTERRUPTED and "did not answer" in store.run().note
    assert [(r.idx, r.state) for r in store.rounds()] == [(1, "planned")]
    store.close()
    with ScriptedEndpoint([module(GOOD)]) as back:
        _use(monkeypatch, back)
        store = _loop(tmp_path, resume=True)
    assert len(back.requests) == 1 and "colz" in back.asked(0)  # only the repair turn was asked again
    assert [(r.idx, r.outcome) for r in store.rounds()] == [(1, "accepted")]
    assert store.run().status == RunStatus.FINISHED
    store.close()


class _DyingJudge(MarkerJudge):
    """Killed (SIGKILL: a lost machine) while checking its second LLM candidate."""

    checks = 0

    def check(self, spec, baseline, candidate, entry):
        type(self).checks += 1
        if type(self).checks == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().check(spec, baseline, candidate, entry)


def _dying_run(tmp: str) -> None:
    _loop(Path(tmp), judge=_DyingJudge(KERNEL, MARK, fast_us=50), candidates=2, repairs=0)


def test_a_run_killed_mid_round_resumes_without_asking_again(tmp_path, monkeypatch):
    second = GOOD.replace(MARK, MARK + " (second)")
    with ScriptedEndpoint([module(GOOD), module(second)]) as llm:
        _use(monkeypatch, llm)
        child = multiprocessing.get_context("spawn").Process(target=_dying_run, args=(str(tmp_path),))
        child.start()
        child.join(300)
    assert child.exitcode == -signal.SIGKILL and len(llm.requests) == 2
    lines = (tmp_path / "run" / "round-001.llm.jsonl").read_text().splitlines()
    assert len(lines) == 2
    with ScriptedEndpoint([]) as silent:
        _use(monkeypatch, silent)
        started = time.time()
        store = _loop(tmp_path, resume=True, candidates=2, repairs=0)
    assert silent.requests == []  # both answers came from the transcript
    (r,) = store.rounds()
    assert r.outcome == "accepted" and r.finished > started and r.cost["calls"] == 2
    assert [a["outcome"] for a in r.timings["llm"]["attempts"]] == ["passed", "passed"]
    store.close()
