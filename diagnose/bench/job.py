"""One bench job: the optimize loop on one operator, in a process of its own.

`python -m diagnose.bench.job REQUEST` runs what `kb optimize` runs, from a `JobRequest` (JSON): the
same `OptimizeOptions` record the command line builds, so no flag is spelled twice and the bench does
not reach up into the CLI. The job's process is what the scheduler pins to a device
(CUDA_VISIBLE_DEVICES), stops (SIGINT: the run is left resumable) and kills; its stdout is the run's
summary as JSON, its stderr the loop's progress.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diagnose.optimize import OptimizeOptions

__all__ = ["JobRequest", "main"]


@dataclass
class JobRequest:
    """A job as the scheduler hands it over: start the task's run in `run_dir`, or resume it."""

    task: str
    run_dir: str
    resume: bool
    options: OptimizeOptions = field(default_factory=OptimizeOptions)
    home: str | None = None  # the KB home the loop reads (None: $KB_HOME, else the default)
    stop_after: float | None = None  # seconds from the start after which no round starts

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobRequest:
        data: dict[str, Any] = json.loads(text)
        options = dict(data.pop("options"))
        options["references"] = tuple(options.get("references", ()))
        return cls(options=OptimizeOptions(**options), **data)

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "diagnose.bench.job", self.to_json()]


def main(argv: list[str]) -> int:
    from diagnose.optimize import optimize
    from diagnose.run_summary import report
    from harness.errors import UserFacingError
    from harness.task import TaskSpec
    from kb.home import KBHome

    request = JobRequest.from_json(argv[1])
    stop_at = time.time() + request.stop_after if request.stop_after is not None else None
    try:
        home = KBHome.if_present(request.home)
        print(f"run: {request.run_dir}", file=sys.stderr, flush=True)
        store = optimize(TaskSpec.of_file(request.task), request.options, Path(request.run_dir),
                         home, log=lambda message: print(message, file=sys.stderr, flush=True),
                         resume=request.resume, stop_at=stop_at)
    except UserFacingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the run in {request.run_dir} is resumable", file=sys.stderr)
        return 130
    print(json.dumps(report(store).to_dict(), indent=1))
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
