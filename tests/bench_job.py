"""A bench job for tests: what `kb optimize` does for `kb bench`, but on the CPU interpreter with the
deterministic judge of test_optimize (the interpreter's time means nothing). Run as a subprocess:

    python tests/bench_job.py TASK RUN_DIR HOME|- STOP_AFTER|- DIE_ON_CALL|-
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_optimize import TimedJudge  # noqa: E402

from diagnose.optimize import OptimizeOptions, optimize  # noqa: E402
from harness.task import TaskSpec
from kb.home import KBHome  # noqa: E402


def main() -> None:
    task, run_dir, home, stop_after, die = sys.argv[1:6]
    run = Path(run_dir)
    run.parent.mkdir(parents=True, exist_ok=True)
    (run.parent / f"{run.name}.device").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    judge = TimedJudge(die_on_call=None if die == "-" else int(die))
    try:
        optimize(TaskSpec(path=task), OptimizeOptions(rounds=2, backend="interpreter", seeds=1), run,
                 home=None if home == "-" else KBHome(Path(home)), judge=judge,
                 resume=(run / "rounds.sqlite").is_file(),
                 stop_at=None if stop_after == "-" else time.time() + float(stop_after))
    finally:
        judge.close()


if __name__ == "__main__":
    main()
