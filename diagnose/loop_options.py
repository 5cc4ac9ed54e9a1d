"""The optimize loop's options: what a run is started with, and which of them a resumed run keeps."""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends import BackendName

__all__ = ["KEPT_ON_RESUME", "OptimizeOptions"]


@dataclass
class OptimizeOptions:
    rounds: int = 5
    time_budget_s: float | None = None
    llm: str = "none"  # "none" | "openai"
    strategy: str = "progressive"
    backend: BackendName = "cuda"
    seeds: int = 2
    timeout_s: float = 300.0
    # PyTorch stand-ins timed beside the initial and best kernels at the end ("eager", "compiled").
    references: tuple[str, ...] = ("eager",)
    noise_floor: float = 0.02
    release: str | None = None
    # do_bench windows of each timing (None: the harness defaults); each Timing record keeps its own.
    warmup_ms: int | None = None
    rep_ms: int | None = None
    # Worker processes that check a round's variants side by side (None: by the host's cores).
    check_workers: int | None = None
    # The LLM rewriter: candidates a round, repair turns per candidate, the prompt's token budget,
    # the run's token cap (None: none) and the model (None: KB_LLM_MODEL).
    candidates: int = 2
    repairs: int = 2
    context_tokens: int = 8000
    max_tokens_per_run: int | None = None
    llm_model: str | None = None
    llm_first: bool = False  # ask the model before the deterministic rewrites of each finding
    # Once the diagnosis's findings and the launch search are spent, try the catalog's other rewrites
    # whose preconditions hold on the kernel (untargeted rounds: no finding asked for them).
    untargeted: bool = True
    # A task's own kernel that fails its checks: start from the repair its diagnosis names (a sum the IR
    # adds in bf16 -> fp32-accumulation), checked first, instead of stopping (diagnose/baseline_repair.py).
    repair_baseline: bool = False
    # Hypotheses a round judges side by side (pattern rewriters only): each one's variants against the same
    # parent, the round keeping the best; where two or more beat the parent, their rewrites stacked on the
    # best one's kernel are judged too (diagnose/composition.py). 1: one hypothesis a round.
    breadth: int = 1


# Options a resumed run keeps from its start (a run's rounds must be comparable with each other).
KEPT_ON_RESUME = ("rounds", "llm", "strategy", "backend", "candidates", "repairs", "context_tokens",
                   "max_tokens_per_run", "llm_model", "llm_first", "untargeted",
                   "repair_baseline", "breadth")
