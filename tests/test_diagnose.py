"""L3 analyzers and `why` on real sm90 compiles, with and without a KB."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, FIXTURES, REPO

from diagnose.engine import question_topics, why
from harness import ir
from harness.capture import capture_call
from harness.errors import UserFacingError


def test_masked_vector_add_names_the_mask_cause(scale_artifacts):
    answer = why("why isn't this load vectorized?", scale_artifacts, home=None)
    kinds = {f.kind for f in answer.findings}
    assert kinds == {"vectorization.mask"}
    finding = answer.findings[0]
    assert "n" in finding.explanation and finding.deciding_pass == "convert-triton-gpu-to-llvm"
    by_id = {e.id: e for e in answer.evidence}
    chain = [by_id[i] for i in finding.evidence]
    assert {e.kind for e in chain} >= {"ptx", "remark", "ttgir", "ttir"}
    assert any("ld.global.b32" in e.excerpt for e in chain)
    assert answer.recommendations[0].pattern_id == "masked-tail-split"


def test_recommended_tail_split_recompiles_to_128_bit_accesses(tmp_path):
    # The change `masked-tail-split` recommends, applied to scale.py (corpora/examples/scale_tail_split.py).
    arts = capture_call(EXAMPLES / "scale_tail_split.py", "scale(torch.randn(1000003), 2.0)", cache_dir=tmp_path)
    ptx = arts[0].stages["ptx"]
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
    widths = {a.bits for a in ir.ptx_memory_accesses(ptx) if a.kind == "load"}
    assert 128 in widths


def test_aligned_launch_is_reported_vectorized(tmp_path):
    arts = capture_call(EXAMPLES / "scale.py", "scale(torch.randn(1 << 20), 2.0)", cache_dir=tmp_path)
    answer = why("is this load vectorized?", arts, home=None)
    assert [f.kind for f in answer.findings] == ["vectorization.ok"]
    assert not answer.recommendations


def test_ieee_fp32_dot_is_diagnosed_as_fma_and_tf32_fixes_it(tmp_path):
    call = "matmul(torch.randn(256, 256), torch.randn(256, 256){})"
    arts = capture_call(EXAMPLES / "matmul_fp32.py", call.format(""), cache_dir=tmp_path)
    answer = why("why doesn't this matmul use tensor cores?", arts, home=None)
    assert [f.kind for f in answer.findings] == ["dot.fma"]
    assert "ieee" in answer.findings[0].explanation
    assert answer.recommendations[0].pattern_id == "dot-input-precision-tf32"
    fixed = capture_call(EXAMPLES / "matmul_fp32.py", call.format(', prec="tf32"'), cache_dir=tmp_path)
    assert [f.kind for f in why("does the dot use tensor cores?", fixed, home=None).findings] == ["dot.ok"]
    assert "wgmma" in fixed[0].stages["ptx"]


def test_register_spills_are_found_with_their_cause(tmp_path):
    arts = capture_call(REPO / "corpora" / "diagnosis" / "nvidia" / "center_spills.py", "center(torch.randn(2, 16384))",
                        cache_dir=tmp_path)
    answer = why("why does it spill registers?", arts, home=None)
    assert [f.kind for f in answer.findings] == ["spills.registers"]
    assert answer.recommendations[0].pattern_id == "reduce-register-pressure"
    assert any("values per thread" in e.claim for e in answer.evidence)


def test_per_element_acq_rel_atomics_are_found_in_the_ptx_and_relaxing_them_clears_it(tmp_path):
    # The suite's index_add: Triton writes `atom.global.gpu.acq_rel.add`, scope before ordering.
    from diagnose.rewriters import rewrite

    kernel = REPO / "corpora" / "operators" / "index_add" / "index_add.py"
    call = "index_add(torch.randn(64, 4096), torch.randint(0, 16, (64,)), 16)"
    answer = why("why are the atomics slow?", capture_call(kernel, call, cache_dir=tmp_path), home=None)
    assert [f.kind for f in answer.findings] == ["atomics.ordered"]
    assert "acq_rel ordering and its result unused" in answer.findings[0].title and answer.findings[0].level == "L3"
    assert any("acq_rel ordering, gpu scope" in e.claim for e in answer.evidence)
    # what ptxas made of the ordering: a barrier and an L1 invalidation around each atomic (two 4-wide
    # ATOMG a thread at this launch, its strides divisible by 16)
    sass = next(e for e in answer.evidence if e.kind == "sass")
    barriers, invalidations, atomics = map(int, re.findall(r"(\d+) (?:memory barrier|L1 inval|global atomic)", sass.claim))
    assert barriers == invalidations == atomics > 0 and sass.excerpt.startswith(("MEMBAR", "CCTL"))
    assert answer.recommendations[0].pattern_id == "relaxed-atomics"
    relaxed = tmp_path / "index_add.py"
    relaxed.write_text(rewrite("relaxed-atomics", kernel.read_text(), {})[0].source)
    arts = capture_call(relaxed, call, cache_dir=tmp_path)
    assert "red.global.gpu.relaxed.add" in arts[0].stages["ptx"]  # no result used: a reduction
    assert "sass" not in arts[0].stages  # nothing ordered left: no disassembly
    with pytest.raises(UserFacingError, match="no evidence about atomics"):
        why("why are the atomics slow?", arts, home=None)


def test_questions_outside_the_evidence_are_refused(scale_artifacts):
    with pytest.raises(UserFacingError, match="cannot answer"):
        question_topics("what is the capital of France?")
    with pytest.raises(UserFacingError, match="no evidence about tensor-cores"):
        why("why no tensor cores?", scale_artifacts, home=None)


def test_why_with_a_kb_cites_compiler_source_at_the_release(scale_artifacts, built_home):
    answer = why("why isn't this load vectorized?", scale_artifacts, built_home, release="fixture-1")
    assert "L4" in answer.levels and answer.release == "fixture-1"
    sources = {e.source for e in answer.evidence if e.level == "L4"}
    assert "include/triton/Dialect/TritonGPU/Transforms/Passes.td:4@fixture-1" in sources  # TritonGPUCoalesce
    assert "include/triton/Analysis/AxisInfo.h:12@fixture-1" in sources  # getMaskAlignment
    assert "backends/nvidia/compiler.py:7@fixture-1" in sources  # passes.ttgpuir.add_coalesce
    assert "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:8@fixture-1" in sources  # GEN_PASS_DEF_TRITONGPUCOALESCE
    emitter = next(e for e in answer.evidence if e.claim.startswith("the remark is emitted by"))
    assert emitter.source == "lib/Dialect/TritonGPU/Transforms/Coalesce.cpp:15@fixture-1"
    assert "LoadVectorizer::matchAndRewrite" in emitter.claim
    mask_decl = next(e for e in answer.evidence if e.source.startswith("include/triton/Analysis/AxisInfo.h:12"))
    assert "getMaskAlignment(Value mask)" in mask_decl.excerpt
    # every cited file:line exists in the indexed tree
    for e in answer.evidence:
        if e.level == "L4":
            path, line = e.source.split("@")[0].rsplit(":", 1)
            assert int(line) <= len((FIXTURES / "compiler_tree" / path).read_text().splitlines())


def test_an_atomic_whose_result_is_read_is_only_suspected_contended_and_shows_its_fences(tmp_path):
    # A ticket: the old value is read, so its ordering may publish what other programs wrote; L3 does not
    # offer to relax it, though ptxas still brackets it with a barrier and an L1 invalidation.
    answer = _why_about_atomics(tmp_path, "ticket(torch.randn(1024))", '''\
import torch
import triton
import triton.language as tl


@triton.jit
def ticket_kernel(x_ptr, count_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    ticket = tl.atomic_add(count_ptr, 1)
    tl.store(out_ptr + n + tl.program_id(0), ticket.to(tl.float32))


def ticket(x):
    out = torch.empty(x.numel() + 4, device=x.device)
    count = torch.zeros(1, dtype=torch.int32, device=x.device)
    ticket_kernel[(4,)](x, count, out, x.numel(), BLOCK=256)
    return out
''')
    assert [f.kind for f in answer.findings] == ["atomics.contended"] and answer.findings[0].confidence == 0.6
    assert any(e.kind == "sass" and "memory barrier" in e.claim for e in answer.evidence)


def test_an_atomic_whose_buffer_the_kernel_reads_back_is_not_offered_relaxed(tmp_path):
    answer = _why_about_atomics(tmp_path, "readback(torch.randn(1024))", '''\
import torch
import triton
import triton.language as tl


@triton.jit
def readback_kernel(x_ptr, acc_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(acc_ptr + offs % 64, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    tl.store(out_ptr + offs, tl.load(acc_ptr + offs % 64), mask=offs < n)


def readback(x):
    acc = torch.zeros(64, device=x.device)
    out = torch.empty_like(x)
    readback_kernel[(triton.cdiv(x.numel(), 256),)](x, acc, out, x.numel(), BLOCK=256)
    return out
''')
    assert [f.kind for f in answer.findings] == ["atomics.contended"]
    from diagnose.rewriters import rewrite

    assert rewrite("relaxed-atomics", (tmp_path / "readback.py").read_text(), {}) == []


def _why_about_atomics(tmp_path, call: str, source: str):  # noqa: ANN202 - an Answer
    """`why` about the atomics of `source`, written as the module the call names (`readback(...)`)."""
    kernel = tmp_path / f"{call.split('(')[0]}.py"
    kernel.write_text(source)
    return why("why are the atomics slow?", capture_call(kernel, call, cache_dir=tmp_path), home=None)
