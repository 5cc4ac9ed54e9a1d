"""From what a kernel worker reported to a verdict: the judge's reasons to reject, one line each.

Everything here is plain data in, plain text out: the worker's observations (harness.host), the
expected outputs' description (harness.reference) and the comparison counts. The first reason found
rejects the kernel; values outside tolerance are not a reason here but counts on the case's checks.
"""

from __future__ import annotations

from typing import Any

from harness.exchange import device_kind
from harness.guards import PLAIN_OUTPUTS

__all__ = ["call_reason", "import_reason", "output_reason", "overlap_reason", "timed_reason", "CALLS"]

# How each call of a check is named in a reason (harness.host's module docstring says what each does).
CALLS = ("", "on its second call", "on its third call (the same argument buffers, new values written in them)")


def _log_reason(log: dict[str, Any], state: list[str], tampered: list[str]) -> str | None:
    if tampered:
        return f"the kernel replaced {', '.join(tampered[:3])}: the harness's timer, launch counter or guards"
    if log.get("escapes"):
        escape = log["escapes"][0]
        if escape.startswith("asked "):
            return f"the kernel {escape}: a kernel that can tell it is judged cannot be trusted outside the judge"
        return f"the kernel switched the runtime torch guard off ({escape})"
    if log.get("torch_ops"):
        custom = next((op for op in log["torch_ops"] if not op.startswith("aten::")), None)
        fix = (f" (a custom op: if the task's own kernel is one, name it in the task's allow_torch, `{custom}`)"
               if custom else "")
        return f"torch fallback at runtime: {', '.join(log['torch_ops'][:3])}{fix}"
    if log.get("host_copies"):
        return f"torch fallback at runtime: {log['host_copies'][0]}, work done outside the kernel"
    if state:
        return f"the kernel changed process-wide state: {'; '.join(state[:3])}"
    return None


def call_reason(record: dict[str, Any], index: int, allow_copies: set[str] = frozenset(),  # type: ignore[assignment]
                strided_copies: bool = False) -> str | None:
    """Why one call of a check cannot be trusted, from what the worker saw during it. `allow_copies`:
    the torch copies the task's own kernel makes its outputs with (a rewrite may keep them);
    `strided_copies`: whether the task's own kernel copies strided views with torch (then so may a rewrite)."""
    log = record.get("log") or {}
    where = f" {CALLS[index]}" if index < len(CALLS) and CALLS[index] else ""
    reason = _log_reason(log, record.get("state", []), record.get("tampered", []))
    if not reason and record.get("foreign_output"):
        reason = record["foreign_output"]
    if reason:
        return reason + where
    made = [t for t in record.get("torch_outputs", []) if t["op"] not in allow_copies]
    if made:
        return f"torch fallback at runtime: output {made[0]['output']} was written by {made[0]['op']}, not by a kernel{where}"
    if log.get("strided_copies") and not strided_copies:
        return (f"torch fallback at runtime: {log['strided_copies'][0]}, data movement the task's own kernel "
                f"leaves to its kernels{where}")
    if log.get("forks"):
        return f"the kernel forked a process{where}"
    if not log.get("launches"):
        return f"no Triton kernel was launched{where}: the result came from torch or a cache, not the kernel"
    if log.get("foreign_streams"):
        return f"{log['foreign_streams'][0]} was launched on a side stream the timer does not see"
    return None


def import_reason(load: dict[str, Any], allowed_changes: set[str]) -> str | None:
    """What importing the kernel did that the task's own kernel's import did not."""
    if load.get("import_tampering"):
        return f"importing the kernel replaced {', '.join(load['import_tampering'][:3])}"
    changed = [c for c in load.get("import_changes", []) if c not in allowed_changes]
    if changed:
        return f"importing the kernel changed process-wide state: {'; '.join(changed[:3])}"
    return None


def output_reason(refs: list[dict[str, Any]], contract: list[dict[str, Any]] | None, has_exempt: bool) -> str | None:
    """Count, dtype, shape and device of a call's outputs against the task's own kernel's (the contract:
    harness.session)."""
    if not refs:
        return ("the entry returned no tensor: return the output(s), or declare `outputs` in the task"
                if not has_exempt else "the call produced no output")
    if contract is None:
        return None
    if len(refs) != len(contract):
        return f"the kernel returned {len(refs)} output(s), the task's own kernel {len(contract)}"
    for i, (ref, exp) in enumerate(zip(refs, contract)):
        if ref["dtype"] != exp["dtype"]:
            return f"output {i} is {ref['dtype']}, the task's own kernel's {exp['dtype']}"
        if list(ref["shape"]) != list(exp["shape"]):
            return f"output {i} has shape {tuple(ref['shape'])}, the task's own kernel's {tuple(exp['shape'])}"
        if device_kind(ref["device"]) != device_kind(exp["device"]):
            return f"output {i} is on {ref['device']}, the task's own kernel's on {exp['device']}"
    return None


def overlap_reason(record: dict[str, Any]) -> str | None:
    """An output sharing memory with an input, or with an output of an earlier call still alive."""
    exempt = int(record.get("exempt_outputs", 0))
    outputs = record.get("output_spans", [])[exempt:]
    for i, out in enumerate(outputs, start=exempt):
        for j, arg in enumerate(record.get("input_spans", [])):
            if arg is not None and arg[1] and out[1] and _overlaps(out, arg):
                return f"output {i} aliases input argument {j} (shares its memory): write results to a new tensor"
        for earlier in record.get("earlier_spans", []):
            if out[1] and _overlaps(out, earlier):
                return (f"output {i} is the buffer an earlier call returned (a cached result): "
                        "allocate each call's output afresh")
    return None


def host_outputs_reason(answer: dict[str, Any]) -> str | None:
    """Why a PyTorch stand-in's timing is no comparison: its calls returned host tensors, and the device
    events around a call see only the work it queued on the device. (Kernels are not held to it: one
    that hands its result back with `.cpu()` is timed with the copy and the wait, which is fair.)"""
    if not answer.get("host_outputs"):
        return None
    return (f"{answer['host_outputs']} of {answer['calls']} timed calls returned host tensors: their work ran on the "
            "CPU, which the device events do not time")


def timed_reason(answer: dict[str, Any], wall_s: float) -> str | None:
    """Why a timing job's figures cannot be trusted."""
    log = answer.get("log") or {}
    reason = _log_reason(log, answer.get("state", []), answer.get("tampered", []))
    if reason:
        return reason + " while being timed"
    if answer.get("foreign_outputs"):
        return (f"{answer['foreign_outputs']} of {answer['calls']} timed calls returned a container or tensor "
                f"subclass: {PLAIN_OUTPUTS}")
    if answer.get("no_launch"):
        return (f"{answer['no_launch']} of {answer['calls']} timed calls launched no Triton kernel "
                "(a cached result, or work done elsewhere)")
    if answer.get("torch_outputs"):
        return (f"torch fallback at runtime: {answer['torch_outputs']} of {answer['calls']} timed calls returned "
                "an output a torch copy wrote, not a kernel")
    if answer.get("other_kernels"):
        return (f"{answer['other_kernels']} of {answer['calls']} timed calls launched none of the kernels its checked "
                "calls launched (a stand-in kernel while timed)")
    if log.get("foreign_streams"):
        return f"{log['foreign_streams'][0]} was launched on a side stream the timer does not see"
    if not answer.get("probed"):
        return "the timing job did not run its probe call"
    measured_s = sum(answer.get("samples_ms", [])) / 1000.0
    if measured_s > wall_s * 1.05 + 0.05:
        return (f"its timings add up to {measured_s:.2f} s in a job that took {wall_s:.2f} s of wall time: "
                "the timer was tampered with")
    return None


def _overlaps(a: list[int], b: list[int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]
