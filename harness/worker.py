"""A sandbox worker: `python -m harness.worker` reads one JSON job per line on stdin and answers one
line per job on its original stdout, prefixed with `MARK` so that anything else on that channel (a
profiler's banner) is ignored. The kernel's own prints go to stderr. See harness.sandbox."""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "@@kernel-kb@@ "


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # print() in user code must not corrupt the protocol
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        channel.write(MARK + json.dumps(message) + "\n")
        channel.flush()

    import torch  # noqa: F401 - import before answering ready, so job time limits exclude it
    import triton  # noqa: F401

    from harness.errors import UserFacingError, first_line
    from harness.runner import WorkerPoisoned, execute

    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            send({"ok": True, "report": execute(json.loads(line))})
        except UserFacingError as exc:
            send({"ok": False, "user_error": exc.problem, "fix": exc.fix})
        except WorkerPoisoned as exc:
            send({"ok": False, "failure": str(exc), "fatal": True})
            return
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            send({"ok": False, "failure": f"{type(exc).__name__}: {first_line(exc)}",
                  "traceback": traceback.format_exc(limit=8)})


if __name__ == "__main__":
    main()
