"""TritonBench-T (thunlp/TritonBench) as a task suite: its PyTorch operators with the first LLM draft of
each that passes the judge (`kb import tritonbench`). Only the T half of a checkout is read."""

from indexer.tritonbench.importer import DraftOutcome, Failure, ImportOptions, ImportSummary, import_tritonbench

__all__ = ["DraftOutcome", "Failure", "ImportOptions", "ImportSummary", "import_tritonbench"]
