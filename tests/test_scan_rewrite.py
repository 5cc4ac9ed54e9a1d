"""Chunked linear scans (issue 27, scans and recurrences): a recurrence h = a * h + b stepped one time
step per iteration becomes chunks of steps combined by tl.associative_scan, the state carried between
chunks; the result matches the reference under the real judge (interpreter) for sequences that do and do
not fill their last chunk; anything beyond loads, the update, stores of h and pointer advances makes it
decline; L1 reports the loops it rewrites."""

from __future__ import annotations

import textwrap

import pytest

from diagnose.features import kernel_features
from diagnose.records import EvidenceLog
from diagnose.rewriters import rewrite
from diagnose.triage import triage
from harness.run import RunOptions, run_task
from harness.task import TaskSpec
from kb.patterns import load_catalog

PATTERN = "chunked-linear-scan"

# HGRN's shape (a gated linear recurrence over time, one program per column block and sequence)
GATED = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def gated_kernel(x, g, o, T, D, BD: tl.constexpr):
        o_d = tl.program_id(0) * BD + tl.arange(0, BD)
        mask = o_d < D
        p_x = x + tl.program_id(1) * T * D + o_d
        p_g = g + tl.program_id(1) * T * D + o_d
        p_o = o + tl.program_id(1) * T * D + o_d
        b_h = tl.zeros([BD], dtype=tl.float32)
        for _ in range(0, T):
            b_x = tl.load(p_x, mask=mask, other=0).to(tl.float32)
            b_g = tl.load(p_g, mask=mask, other=0).to(tl.float32)
            b_h = tl.exp(b_g) * b_h + b_x
            tl.store(p_o, b_h.to(p_o.dtype.element_ty), mask=mask)
            p_x += D
            p_g += D
            p_o += D


    def gated(x, g):
        B, T, D = x.shape
        o = torch.empty_like(x)
        gated_kernel[(triton.cdiv(D, 32), B)](x, g, o, T, D, BD=32)
        return o
    ''')

REFERENCE = textwrap.dedent('''\
    lambda x, g: torch.stack([h for h in __import__("itertools").accumulate(
        zip(x.double().unbind(1), g.double().exp().unbind(1)), lambda h, xg: h * xg[1] + xg[0],
        initial=torch.zeros_like(x[:, 0]).double())][1:], 1).float()''').replace("\n", " ")


def _check(tmp_path, source: str, call: str) -> None:
    (tmp_path / "gated.py").write_text(GATED)
    candidate = tmp_path / "gated_scan.py"
    candidate.write_text(source)
    spec = TaskSpec(kernel=str(tmp_path / "gated.py"), call=call, reference=REFERENCE)
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=2), candidate=str(candidate),
                      candidate_entry="gated")
    assert report.run("candidate").correct, report.to_dict()


def test_a_gated_recurrence_is_solved_a_chunk_at_a_time_and_stays_correct(tmp_path):
    variants = rewrite(PATTERN, GATED, {})
    assert [v.params["chunk"] for v in variants] == [16, 64]
    source = variants[0].source
    assert "def _kb_linear_recurrence(a1, b1, a2, b2):\n" in source and "return a1 * a2, b1 * a2 + b2" in source
    assert "    for _kb_t0 in range(0, T, 16):\n" in source and "for _ in range(0, T)" not in source
    assert "b_x = tl.load(p_x + _kb_steps[:, None] * D, mask=_kb_live & mask[None, :], other=0).to(tl.float32)" \
        in source
    assert "_kb_a = tl.where(_kb_live, tl.exp(b_g), 1.0)" in source  # past T: the identity step (1, 0)
    assert "b_h = tl.sum(tl.where(_kb_steps[:, None] == 15, _kb_h, 0.0), axis=0)" in source
    assert "        p_x += 16 * D\n" in source
    # its values, against a float64 reference, for partial, exact and single chunks
    for steps in (37, 32, 5):
        _check(tmp_path, source, f"gated(torch.randn(2, {steps}, 40), -torch.rand(2, {steps}, 40))")
    _check(tmp_path, variants[1].source, "gated(torch.randn(2, 70, 40), -torch.rand(2, 70, 40))")


def test_a_recurrence_the_loop_already_pipelined_is_still_found_and_chunked(tmp_path):
    """On the H200, fla's HGRN got tl-range-pipelining in round 1 (2.51x); its next diagnosis no longer
    saw the recurrence in `tl.range(0, T, num_stages=3)`, so the scan was never tried. It is found there
    now, and the chunk loop keeps the pipelining option."""
    (piped,) = [v for v in rewrite("tl-range-pipelining", GATED, {"features": "loop"}) if v.params.get("num_stages") == 3]
    assert "for _ in tl.range(0, T, num_stages=3):" in piped.source
    kernel = tmp_path / "piped.py"
    kernel.write_text(piped.source)
    assert any(f.kind == "recurrence.step-at-a-time" for f in triage(kernel_features(kernel), EvidenceLog()))
    variants = rewrite(PATTERN, piped.source, {})
    assert [v.params["chunk"] for v in variants] == [16, 64]
    assert "    for _kb_t0 in tl.range(0, T, 16, num_stages=3):\n" in variants[0].source
    _check(tmp_path, variants[0].source, "gated(torch.randn(2, 37, 40), -torch.rand(2, 37, 40))")
    stepped = piped.source.replace("tl.range(0, T, num_stages=3)", "tl.range(0, T, 2, num_stages=3)")
    assert rewrite(PATTERN, stepped, {}) == []  # a step other than 1 is not a recurrence over every step


@pytest.mark.parametrize("change, why", [
    (("for _ in range(0, T):", "for t in range(0, T):\n        b_x = b_x + t"), "the loop variable read in the body"),
    (("b_h = tl.exp(b_g) * b_h + b_x", "b_h = tl.maximum(b_h, b_x)"), "no linear update"),
    (("b_h = tl.exp(b_g) * b_h + b_x", "b_h = b_h * b_h + b_x"), "the state in its own coefficient"),
    (("        p_g += D\n", "        p_g += 2 * D\n"), "pointers advanced by different strides"),
    (("        p_o += D\n", ""), "a pointer that is used but not advanced"),
    (("tl.store(p_o, b_h.to(p_o.dtype.element_ty), mask=mask)", "tl.store(p_o, b_x, mask=mask)"),
     "a store of something else than the state"),
    (("b_h = tl.zeros([BD], dtype=tl.float32)", "b_h = tl.zeros([BD, 2], dtype=tl.float32)"), "a 2-D state"),
    (("        b_h = tl.exp(b_g) * b_h + b_x\n", "        b_h = tl.exp(b_g) * b_h + b_x\n        if T > 4:\n"
      "            b_h = b_h * 0.5\n"), "control flow in the body"),
])
def test_it_declines_anything_but_loads_a_linear_update_stores_of_it_and_pointer_advances(change, why):
    old, new = change
    source = GATED.replace(old, new)
    assert source != GATED
    assert rewrite(PATTERN, source, {}) == [], why


def test_l1_reports_the_recurrence_and_the_catalog_answers_with_the_scan(tmp_path):
    kernel = tmp_path / "gated.py"
    kernel.write_text(GATED)
    line = GATED.splitlines().index("    for _ in range(0, T):") + 1
    (finding,) = [f for f in triage(kernel_features(kernel), EvidenceLog()) if f.kind == "recurrence.step-at-a-time"]
    assert finding.kernel_lines == [line] and finding.title.endswith("runs one step per iteration")
    assert [p.id for p in load_catalog() if finding.kind in p.symptoms] == [PATTERN]
    kernel.write_text(GATED.replace("b_h = tl.exp(b_g) * b_h + b_x", "b_h = tl.maximum(b_h, b_x)"))
    assert not any(f.kind == "recurrence.step-at-a-time" for f in triage(kernel_features(kernel), EvidenceLog()))
