"""relaxed-atomics: only atomics whose ordering orders nothing are relaxed (diagnose/rewriters/atomics.py),
and L1 reports the same set as `atomics.ordered`."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from conftest import candidate_rejection

from diagnose.features import kernel_features
from diagnose.records import EvidenceLog
from diagnose.rewriters import rewrite
from diagnose.rewriters.atomics import ordered_atomics
from diagnose.triage import triage

PATTERN = "relaxed-atomics"

SCATTER = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _add_row(out_ptr, dst, cols, vec, mask):
    tl.atomic_add(out_ptr + dst * 64 + cols, vec,
                  mask=mask,
                  )


@triton.jit
def scatter_kernel(src_ptr, idx_ptr, out_ptr, max_ptr, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dst = tl.load(idx_ptr + row)
    vec = tl.load(src_ptr + row * dim + cols, mask=mask)
    _add_row(out_ptr, dst, cols, vec, mask)
    tl.atomic_max(max_ptr + dst, tl.max(tl.where(mask, vec, -float("inf")), axis=0))
    tl.atomic_add(out_ptr + dst * 64 + cols, vec * 0.0, mask, sem="relaxed")


def scatter(src, idx, bins):
    k, dim = src.shape
    out = torch.zeros((bins, 64), dtype=src.dtype, device=src.device)
    top = torch.full((bins,), -float("inf"), dtype=src.dtype, device=src.device)
    scatter_kernel[(k,)](src, idx, out, top, dim, BLOCK=64)
    return out, top
'''


REFERENCE = ("lambda src, idx, bins: (torch.zeros(bins, 64).index_add_(0, idx, src), "
             "torch.full((bins,), -float('inf')).scatter_reduce(0, idx, src.max(1).values, 'amax'))")
CALL = "scatter(torch.randn(40, 64), torch.randint(0, 5, (40,)), 5)"


def test_accumulating_atomics_are_relaxed_in_kernels_and_their_helpers_and_the_values_hold(tmp_path):
    sites = ordered_atomics(SCATTER)
    assert [(s.line, s.op) for s in sites] == [(8, "tl.atomic_add"), (21, "tl.atomic_max")]  # the third names its own
    (variant,) = rewrite(PATTERN, SCATTER, {})
    assert variant.params == {"sem": "relaxed", "sites": 2}
    assert variant.source.count('sem="relaxed"') == 3
    assert 'tl.atomic_max(max_ptr + dst, tl.max(tl.where(mask, vec, -float("inf")), axis=0), sem="relaxed")' in variant.source
    cst.parse_module(variant.source)  # the multi-line call with its trailing comma stays valid
    assert candidate_rejection(tmp_path, SCATTER, variant.source, "scatter", CALL, REFERENCE) == ""


@pytest.mark.parametrize("line, reason", [
    ("    old = tl.atomic_add(out_ptr + dst * 64 + cols, vec, mask=mask)\n"
     "    tl.store(src_ptr + row * dim + cols, old, mask=mask)\n", "a result read"),
    ("    ticket = tl.atomic_add(max_ptr + 100, 1)\n"
     "    if ticket == 0:\n        tl.store(max_ptr + 101, 1.0)\n", "a ticket"),
    ("    while tl.atomic_cas(max_ptr + 100, 0, 1) == 1:\n        pass\n"
     "    tl.atomic_xchg(max_ptr + 100, 0)\n", "a lock"),
    ("    tl.atomic_xchg(max_ptr + 101, 1)\n", "a flag set"),
    ("    flag = tl.load(max_ptr + 101, volatile=True)\n", "a spin's load"),
    ("    tl.atomic_add(max_ptr + 102, 1.0, sem=\"release\")\n", "an ordering asked for"),
    ("    tl.atomic_add(max_ptr + 102, 1.0, None, \"acq_rel\")\n", "an ordering asked for by position"),
    ("    back = tl.load(out_ptr + dst * 64 + cols, mask=mask)\n", "its own update read back"),
    ("    ptrs = max_ptr + dst\n    seen = tl.load(ptrs)\n", "read back through a name"),
])
def test_a_module_that_may_synchronize_through_memory_keeps_every_ordering(line, reason):
    source = SCATTER.replace("    _add_row(out_ptr, dst, cols, vec, mask)\n",
                             "    _add_row(out_ptr, dst, cols, vec, mask)\n" + line)
    cst.parse_module(source)
    assert ordered_atomics(source) == [], reason
    assert rewrite(PATTERN, source, {}) == [], reason


def test_nothing_to_relax_gives_no_variant():
    relaxed = rewrite(PATTERN, SCATTER, {})[0].source
    assert ordered_atomics(relaxed) == [] and rewrite(PATTERN, relaxed, {}) == []
    assert rewrite(PATTERN, "import triton\n\n\n@triton.jit\ndef k(x):\n    pass\n", {}) == []


def _l1(tmp_path, source):
    path = tmp_path / "kernel.py"
    path.write_text(textwrap.dedent(source))
    return {f.kind: f for f in triage(kernel_features(path), EvidenceLog(), "cuda:90")}


def test_l1_reports_the_atomics_the_rewrite_relaxes_and_only_suspects_the_others(tmp_path):
    found = _l1(tmp_path, SCATTER)
    ordered = found["atomics.ordered"]
    assert ordered.confidence == 0.8 and ordered.kernel_lines == [8, 21] and "atomics.contended" not in found
    ticket = SCATTER.replace("    _add_row(out_ptr, dst, cols, vec, mask)\n",
                             "    _add_row(out_ptr, dst, cols, vec, mask)\n    t = tl.atomic_add(max_ptr + 9, 1)\n")
    found = _l1(tmp_path, ticket)
    assert "atomics.ordered" not in found and found["atomics.contended"].confidence == 0.4
    # not a CUDA concern: the SASS fences are sm90's
    path = tmp_path / "kernel.py"
    path.write_text(SCATTER)
    assert "atomics.ordered" not in {f.kind for f in triage(kernel_features(path), EvidenceLog(), "npu")}


def test_a_read_back_through_jit_helpers_parameters_is_seen():
    # a helper loads through its parameter, another passes the updated buffer on to it: still a read-back
    helpers = SCATTER.replace("@triton.jit\ndef scatter_kernel", "@triton.jit\ndef _peek(q, at):\n    return tl.load(q + at)"
                              "\n\n\n@triton.jit\ndef _peek_row(r, at):\n    return _peek(r, at)\n\n\n"
                              "@triton.jit\ndef scatter_kernel")
    read_back = helpers.replace("    _add_row(out_ptr, dst, cols, vec, mask)\n",
                                "    _add_row(out_ptr, dst, cols, vec, mask)\n    seen = _peek_row(out_ptr, dst * 64)\n")
    elsewhere = read_back.replace("_peek_row(out_ptr, dst * 64)", "_peek_row(src_ptr, dst * 64)")
    assert "def _peek_row(r, at):" in read_back and read_back != elsewhere
    assert ordered_atomics(read_back) == [] and rewrite(PATTERN, read_back, {}) == []
    assert [a.op for a in ordered_atomics(elsewhere)] == [a.op for a in ordered_atomics(SCATTER)] != []  # relaxed
