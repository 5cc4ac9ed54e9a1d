"""The worker process, `python -m harness.worker_main`; the caller's handle on it is harness.sandbox.Worker.

The first line on stdin is the parent's hello: a secret and the worker's exchange directory. The
worker answers each later JSON request with one line on its original stdout, `MARK secret JSON`, so
that nothing else on that channel counts: not a profiler's banner, and not a line a kernel prints there
in the worker's name, since the kernel cannot know the secret without reading this process's memory.
The kernel's own prints go to stderr.

A worker hosts one thing for its life, fixed by its first request: a task's reference (`task`, the
judge's side, see harness.reference), a kernel (`load`, see harness.host), or a compile capture
(`capture`). It decides nothing: it reports what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

MARK = "@@kernel-kb@@ "

_KERNEL_OPS = {"load", "stage", "unstage", "check", "time", "burn_in", "forget_tunings", "profile", "artifacts"}
_REFERENCE_OPS = {"task", "make", "share", "release", "expect", "contract", "compare", "ceilings", "memory"}


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # print() in user code must not reach the protocol
    sys.stdout = sys.stderr
    hello = json.loads(sys.stdin.readline() or "{}")
    secret, directory = str(hello.get("secret", "")), Path(hello.get("dir") or ".")
    backend_name = str(hello.get("backend", "cuda"))
    del hello

    from harness.processes import become_subreaper, reap

    become_subreaper()  # before any kernel is imported: whatever it forks stays in our tree

    # Bound before any kernel is imported: a kernel that patches json.dumps does not write our answers.
    encode = json.JSONEncoder().encode
    decode = json.JSONDecoder().decode

    def send(message: dict[str, Any]) -> None:
        channel.write(MARK + secret + " " + encode(message) + "\n")
        channel.flush()

    import torch  # noqa: F401 - import before answering ready, so job time limits exclude it
    import triton  # noqa: F401

    from harness.errors import UserFacingError, first_line

    send({"ready": True, "pid": os.getpid()})
    service = _Service(backend_name, directory)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = service.handle(decode(line))
            send({"ok": True, "answer": answer})
            if answer.get("fatal"):
                return  # a device fault: this context is unusable
        except UserFacingError as exc:
            send({"ok": False, "user_error": exc.problem, "fix": exc.fix})
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            send({"ok": False, "failure": f"{type(exc).__name__}: {first_line(exc)}",
                  "traceback": traceback.format_exc(limit=8)})
        reap()  # what exited of ours and of the orphans we adopted as subreaper: no zombie lingers


class _Service:
    def __init__(self, backend_name: str, directory: Path) -> None:
        self.backend_name = backend_name
        self.directory = directory
        self.kernel: Any = None
        self.reference: Any = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "warm":
            return self._warm()
        if op == "capture":
            return _capture(request)
        if op in _REFERENCE_OPS:
            return self._reference_op(op, request)
        if op in _KERNEL_OPS:
            return self._kernel_op(op, request)
        raise ValueError(f"unknown request {op!r}")

    def _warm(self) -> dict[str, Any]:
        """A spare worker, idle until a kernel comes: set up the device now (the CUDA context, Triton's
        driver), so the kernel's first call does not pay for it. Before any kernel is imported, so the
        state a kernel is judged against includes it."""
        device = self._device()
        if device != "cpu":
            import torch
            from triton.runtime.driver import driver

            torch.empty(1, device=device)
            driver.active.get_current_device()
        return {"device": device}

    def _device(self) -> str:
        from harness.backends import select_backend

        return select_backend(self.backend_name).device

    def _kernel_op(self, op: str, r: dict[str, Any]) -> dict[str, Any]:
        from harness.host import KernelHost

        if self.reference is not None:
            raise ValueError("this worker holds a task's reference: kernels run in workers of their own")
        if self.kernel is None:
            self.kernel = KernelHost(self._device(), self.directory)
        host = self.kernel
        if op == "load":
            return host.load(r)
        if op == "stage":
            return host.stage(r["key"], r["set"])
        if op == "unstage":
            return host.unstage(r["keys"])
        if op == "check":
            answer = host.check(r["name"], r["a"], r["b"], r.get("pin"), list(r.get("exempt", [])),
                                list(r.get("inouts", [])))
            answer["fatal"] = any(c.get("fatal") for c in answer["calls"])
            return answer
        if op == "time":
            return host.time(r["name"], list(r["keys"]), dict(r["probe"]), int(r["warmup_ms"]), int(r["rep_ms"]),
                             bool(r.get("warm_cache")), list(r.get("exempt", [])), list(r.get("expect_kernels", [])),
                             list(r.get("allow_copies", [])), list(r.get("inouts", [])))
        if op == "burn_in":
            return host.burn_in(r["names"], r["key"], float(r["seconds"]))
        if op == "forget_tunings":
            return host.forget_tunings()
        if op == "profile":
            return host.profile(r["name"], r["key"], int(r.get("repeat", 3)))
        return host.artifacts()

    def _reference_op(self, op: str, r: dict[str, Any]) -> dict[str, Any]:
        from harness.reference import ReferenceHost

        if self.kernel is not None:
            raise ValueError("this worker holds a kernel: a task's reference never shares its process")
        if self.reference is None:
            self.reference = ReferenceHost(self._device(), self.directory)
        ref = self.reference
        if op == "task":
            from harness.backends import select_backend

            answer = ref.load(r["spec"], int(r["seed"]), int(r.get("generated", 0)))
            return {**answer, "device": select_backend(self.backend_name).device_name()}
        if op == "make":
            return ref.make(r["key"], int(r["case"]), int(r["seed"]), bool(r.get("expected", True)))
        if op == "share":
            return ref.share(r["keys"], r["worker"], r["dir"])
        if op == "release":
            return ref.release(r.get("keys"), r.get("worker"))
        if op == "expect":
            return ref.expect(r["key"], r["outputs"], r["dir"])
        if op == "contract":
            return ref.contract(int(r["case"]), r["outputs"])
        if op == "compare":
            return ref.compare(r["keys"], r["calls"], r["dir"], int(r["case"]))
        if op == "memory":
            return ref.memory()
        from harness.roofline import ceilings

        return {"ceilings": ceilings()}


def _capture(r: dict[str, Any]) -> dict[str, Any]:
    """One case of a kernel file's entry, intercepted: its launches' facts (grid, arguments, options),
    and unless `compile` is false, each launch compiled as it specializes it (the diagnosis of a
    rewritten kernel imports it here, not in the optimize loop's own process)."""
    from harness.capture import device_for, intercept_entry
    from harness.entries import attribute_path
    from harness.errors import UserFacingError
    from harness.loading import load_rewrite
    from harness.task import TaskSpec, load_job_task

    with device_for(r.get("target")):  # libraries that ask the GPU at import (attorch) load on a CPU too
        task = load_job_task(TaskSpec.from_json(r["task"]))
        # a rewrite imports as if it sat where the kernel file does; the entry is its own or the layer's
        module = load_rewrite(r["file"], task.kernel_file or task.source_file, task.source_file, str(r["entry"]))
    case = task.cases[int(r.get("case", 0))]
    entry = attribute_path(module, r["entry"])  # `fn`, or `Function.apply` for an autograd entry
    if entry is None:
        raise UserFacingError(f"{Path(r['file']).name} defines no {r['entry']}", "keep the entry's name in the rewrite")
    # the arguments are made inside the capture: on its device, from its seed
    intercepted = intercept_entry(entry, lambda: task.arguments(case), vars(module), r.get("target"),
                                  what=f"{Path(r['file']).name} case {case}")
    answer: dict[str, Any] = {"facts": [f.to_dict() for f in intercepted.facts()]}
    if r.get("compile", True):
        answer["artifacts"] = [a.to_json() for a in intercepted.compile(r.get("cache_dir"))]
    return answer


if __name__ == "__main__":
    main()
