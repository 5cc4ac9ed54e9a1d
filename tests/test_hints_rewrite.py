"""Launch-true divisibility hints (issue 27, family 5): a kernel whose row stride and size are multiples of 8
but not of 16 (Triton specializes only 16) is planned at one element per access; the rewrite tells the
compiler the multiple each launch really has, so the access vectorizes, and says nothing where a launch's
value is not such a multiple."""

from __future__ import annotations

import re
import textwrap

from conftest import candidate_rejection

from diagnose.rewriters import rewrite
from diagnose.rewriters.hints import aligned_parameters

HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"

ROW_DOT = HEADER + textwrap.dedent('''\
    @triton.jit
    def row_dot_kernel(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            cols = k + offs
            a = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :],
                        mask=(rows[:, None] < M) & (cols[None, :] < K), other=0.0)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)
            acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
        tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=rows < M)


    def row_dot(a, x):
        m, k = a.shape
        y = torch.empty(m, dtype=a.dtype, device=a.device)
        row_dot_kernel[(triton.cdiv(m, 16),)](a, x, y, m, k, a.stride(0), BLOCK_M=16, BLOCK_K=64)
        return y
''')
REFERENCE = "lambda a, x: (a.float() @ x.float()).to(a.dtype)"


def _hinted(source: str) -> str:
    [variant] = [v for v in rewrite("divisibility-hints", source, {}) if "hinted" in v.params]
    return variant.source


def test_strides_and_mask_bounds_are_the_hinted_integers():
    import libcst as cst

    kernel = next(n for n in cst.parse_module(ROW_DOT).body if isinstance(n, cst.FunctionDef))
    # stride_am is multiplied into the load's address, M and K bound its masks; the pointers are neither.
    assert aligned_parameters(kernel) == ["M", "K", "stride_am"]


def test_a_multiple_of_8_vectorizes_the_row_load(tmp_path):
    from harness.capture import capture_call

    call = "row_dot(torch.randn(24, 40, dtype=torch.float16), torch.randn(40, dtype=torch.float16))"
    (tmp_path / "plain.py").write_text(ROW_DOT)
    (tmp_path / "hinted.py").write_text(_hinted(ROW_DOT))
    plain = capture_call(tmp_path / "plain.py", call, target="cuda:90")[0]
    hinted = capture_call(tmp_path / "hinted.py", call, target="cuda:90")[0]
    assert hinted.constants.get("_kb_K_multiple") == 8 and hinted.constants.get("_kb_stride_am_multiple") == 8
    # 40 is no multiple of 16: as written, every fp16 element is its own 2-byte load; hinted, 16-byte ones.
    assert re.search(r"ld\.global(\.\w+)*\.b16 ", plain.stages["ptx"])
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32 ", hinted.stages["ptx"])


def test_the_hints_hold_under_the_judge_where_they_apply_and_where_they_do_not(tmp_path):
    hinted = _hinted(ROW_DOT)
    for m, k in ((24, 40), (5, 33), (17, 100)):  # multiples of 8, of nothing, of 4
        call = f"row_dot(torch.randn({m}, {k}, dtype=torch.float16), torch.randn({k}, dtype=torch.float16))"
        assert candidate_rejection(tmp_path, ROW_DOT, hinted, "row_dot", call, REFERENCE) == ""


def test_the_flag_says_only_what_specialization_does_not(tmp_path):
    import runpy

    (tmp_path / "hinted.py").write_text(_hinted(ROW_DOT))
    multiple = runpy.run_path(str(tmp_path / "hinted.py"))["_kb_multiple"]
    assert [multiple(v) for v in (5000, 4100, 40, 4096, 1, 33, 0, -24)] == [8, 4, 8, 1, 1, 1, 1, 8]
    assert multiple(40.0) == 1  # not an int: Triton passes it as a float, no hint


def test_an_argument_that_computes_is_not_evaluated_twice():
    source = ROW_DOT.replace("a.stride(0), BLOCK_M", "a.contiguous().stride(0), BLOCK_M")
    hinted = _hinted(source)
    assert "_kb_stride_am_multiple=" not in hinted and "_kb_K_multiple=_kb_multiple(k)" in hinted


def test_a_kernel_defined_twice_is_left_alone():
    # LLM answers often repeat the kernel and its wrapper; flags added to both would bind twice.
    twice = ROW_DOT + "\n\n" + ROW_DOT[len(HEADER):]
    assert [v for v in rewrite("divisibility-hints", twice, {}) if "hinted" in v.params] == []


def test_a_second_kernel_hinted_in_a_later_round_shares_the_helper():
    once = _hinted(ROW_DOT)
    second = once + "\n\n" + ROW_DOT[len(HEADER):].replace("row_dot", "col_dot")
    twice = _hinted(second)
    assert twice.count("def _kb_multiple(") == 1 and "_kb_K_multiple=_kb_multiple(k)" in twice.split("def col_dot(")[1]
    assert _hinted_or_none(twice) is None  # nothing left to hint


def _hinted_or_none(source: str) -> str | None:
    found = [v.source for v in rewrite("divisibility-hints", source, {}) if "hinted" in v.params]
    return found[0] if found else None


def test_a_signature_closed_on_its_own_line_stays_so():
    # Liger's style: the parameters on one line, `):` on the next; the flags join the parameters' line.
    split = ROW_DOT.replace("BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):",
                            "BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr\n):")
    hinted = _hinted(split)
    assert "BLOCK_K: tl.constexpr, _kb_M_multiple: tl.constexpr = 1" in hinted
    assert "_kb_stride_am_multiple: tl.constexpr = 1\n):" in hinted
