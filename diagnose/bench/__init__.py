"""`kb bench`: the optimize loop over a suite of operators, resumable, and what it came to.

- `schedule`: the bench directory, its jobs, and running them (one worker per GPU, or on Ray);
- `job`: one job, the optimize loop in a process of its own, from the same options record `kb optimize`
  builds;
- `report`: the bench's report (JSON, Markdown, PNG) against the published reference result.
"""

from diagnose.bench.report import PUBLISHED, bench_report, compare_markdown, write_report
from diagnose.bench.schedule import (
                                     DEFAULT_SUITE,
                                     BenchSpec,
                                     Condition,
                                     Job,
                                     add_operators,
                                     bench_runs,
                                     create_bench,
                                     jobs,
                                     load_bench,
                                     load_suite,
                                     optimize_command,
                                     rejudge,
                                     rerun,
                                     retime,
                                     run_bench,
                                     set_timing_windows,
)

__all__ = ["DEFAULT_SUITE", "PUBLISHED", "BenchSpec", "Condition", "Job", "add_operators", "bench_report", "bench_runs", "compare_markdown",
           "create_bench", "jobs", "load_bench", "load_suite", "optimize_command", "rejudge", "rerun", "retime", "run_bench",
           "set_timing_windows", "write_report"]
