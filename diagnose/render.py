"""Answers as Markdown (terminal) and JSON. Every sentence printed comes from a record that cites Evidence."""

from __future__ import annotations

import json

from diagnose.records import Answer

__all__ = ["to_json", "to_markdown"]


def _refs(ids: list[str]) -> str:
    return " ".join(f"[{i}]" for i in ids)


def to_markdown(answer: Answer) -> str:
    out = [f"# {answer.question}", "",
           f"Kernel `{answer.kernel}` compiled for `{answer.target}`; compiler release `{answer.release}`; "
           f"levels reached: {', '.join(answer.levels) or 'none'} (strategy {answer.strategy}"
           + (f", stopped at {answer.stopped_at}" if answer.stopped_at else "") + ").", ""]
    defects = answer.ranked()
    opportunities = [f for f in answer.findings if not f.healthy and not f.defect]
    healthy = [f for f in answer.findings if f.healthy]
    out.append("## Findings")
    if not defects:
        out.append("No defect found." if not answer.question.startswith("why is this kernel slow")
                   else "No defect found at the levels reached.")
    for rank, f in enumerate(defects, 1):
        lines = ", ".join(str(n) for n in f.kernel_lines)
        out += [f"{rank}. **{f.title}**" + (f" (kernel line {lines})" if lines else "")
                + f" — {f.level}, confidence {f.confidence:.2f} {_refs(f.evidence)}",
                f"   {f.explanation}"]
        if f.deciding_pass:
            out.append(f"   Decided by: `{f.deciding_pass}`.")
    for f in opportunities:
        out.append(f"- Worth checking: {f.title} ({f.level}, confidence {f.confidence:.2f}) {_refs(f.evidence)}")
    for f in healthy:
        out.append(f"- OK: {f.title} {_refs(f.evidence)}")
    if answer.reasons:
        out += ["", "## Compiler-side reason"]
        out += [f"- {r.statement}" for r in answer.reasons]
    if answer.recommendations:
        out += ["", "## Recommended change"]
        for r in answer.recommendations:
            out += [f"- **{r.title}** (`{r.pattern_id}`, risk {r.risk}, for {r.for_finding}) {_refs(r.evidence)}",
                    f"  {r.summary}"]
            if r.preconditions:
                out.append("  Valid only if: " + "; ".join(r.preconditions) + ".")
            if r.after:
                out += ["", "  ```python", *("  " + ln for ln in r.after.rstrip().splitlines()), "  ```"]
    out += ["", "## Evidence", "", "| id | level | kind | where | claim |", "|---|---|---|---|---|"]
    for e in answer.evidence:
        claim = e.claim.replace("|", "\\|")
        out.append(f"| {e.id} | {e.level} | {e.kind} | `{e.source}` | {claim} |")
    excerpts = [e for e in answer.evidence if e.excerpt and e.kind in ("source", "remark", "ptx", "ttir", "ttgir", "ptxas", "sass")]
    if excerpts:
        out += ["", "### Excerpts"]
        for e in excerpts:
            out += [f"- {e.id} `{e.source}`", "", "  ```", *("  " + ln for ln in e.excerpt[:700].splitlines()), "  ```"]
    if answer.escalations:
        out += ["", "## How far it went"]
        out += [f"- {e.level} {e.action}: {e.reason}" for e in answer.escalations]
        if answer.timings:
            out.append("- time per level: " + ", ".join(f"{k} {v:.2f} s" for k, v in answer.timings.items()))
    if answer.narrative:
        out += ["", "## Narrative (LLM, over the evidence above)", "", answer.narrative]
    if answer.notes:
        out += ["", "## Notes"] + [f"- {n}" for n in answer.notes]
    return "\n".join(out) + "\n"


def to_json(answer: Answer) -> str:
    return json.dumps(answer.to_dict(), indent=2)
