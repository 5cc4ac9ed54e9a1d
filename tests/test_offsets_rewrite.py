"""int32-offsets: int64 casts kept for launches that reach 2**30 elements, dropped for the others
(diagnose/rewriters/offsets.py)."""

from __future__ import annotations

import torch
from conftest import candidate_rejection

from diagnose.rewriters import rewrite

PATTERN = "int32-offsets"

ROWS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # rows past 2**31 elements (Liger's idiom)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols)
    tl.store(out_ptr + row * stride + cols.to(tl.int64), x * 2.0, mask=cols < n_cols)


def scale_rows(x):
    out = torch.empty_like(x)
    scale_rows_kernel[(x.shape[0],)](x, out, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
'''


def _helper(source: str):  # noqa: ANN202 - the module's _kb_int64, run as the launch runs it
    import ast

    tree = ast.parse(source)
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_kb_int64")
    namespace: dict = {}
    exec(compile(ast.Module([helper], []), "variant.py", "exec"), namespace)  # noqa: S102 - our own fixture's rewrite
    return namespace["_kb_int64"]


LOCAL_BLOCK = ROWS.replace("BLOCK=triton.next_power_of_2(x.shape[1]))", "BLOCK=block)").replace(
    "    out = torch.empty_like(x)\n", "    out = torch.empty_like(x)\n    block = triton.next_power_of_2(x.shape[1])\n")


def test_casts_become_a_choice_each_launch_makes_from_its_arguments_reach(tmp_path):
    source = LOCAL_BLOCK
    (variant,) = rewrite(PATTERN, source, {})
    assert variant.params["sites"] == 2
    assert "row = (tl.program_id(0).to(tl.int64) if _KB_INT64 else tl.program_id(0).to(tl.int32))" in variant.source
    assert "_KB_INT64: tl.constexpr = 1" in variant.source  # a launch that does not say keeps the casts
    assert rewrite(PATTERN, variant.source, {}) == []  # its launch decides already
    assert "_KB_INT64=_kb_int64(x, out, x.stride(0), x.shape[1], block))" in variant.source
    assert candidate_rejection(tmp_path, source, variant.source, "scale_rows", "scale_rows(torch.randn(37, 300))",
                               "lambda x: x * 2.0") == ""
    wide = _helper(variant.source)
    small = torch.empty(4, 5)
    assert wide(small, 3, 16) == 0
    assert wide(torch.empty(2**31, device="meta")) == 1  # numel past the margin
    assert wide(torch.empty(2, 8, device="meta").as_strided((2, 8), (2**30, 1))) == 1  # a view reaching further
    assert wide(small, 2**30) == 1 and wide(small, -(2**31)) == 1
    assert wide(torch.empty(0, device="meta").as_strided((0, 8), (2**40, 1))) == 0  # nothing addressed


def test_the_rewritten_kernel_compiles_int32_offsets_where_the_launch_allows(tmp_path):
    from harness.capture import capture_call

    source = LOCAL_BLOCK
    (variant,) = rewrite(PATTERN, source, {})
    (tmp_path / "before.py").write_text(source)
    (tmp_path / "after.py").write_text(variant.source)
    call = "scale_rows(torch.randn(64, 256))"
    before, after = (capture_call(tmp_path / f, call, cache_dir=tmp_path / "cache")[0] for f in ("before.py", "after.py"))
    assert "tensor<256xi64>" in before.stages["ttir"] and "tensor<256xi64>" not in after.stages["ttir"]
    assert after.constants["_KB_INT64"] == 0


def test_kernels_it_cannot_flag_keep_their_casts():
    assert rewrite(PATTERN, LOCAL_BLOCK.replace("tl.int64", "tl.int32"), {}) == []  # nothing to guard
    # an argument that calls more than layout reads is not evaluated a second time: the launch is left alone
    assert rewrite(PATTERN, ROWS, {}) == []
    starred = ROWS.replace("scale_rows_kernel[(x.shape[0],)](x, out, x.stride(0), x.shape[1], "
                           "BLOCK=triton.next_power_of_2(x.shape[1]))",
                           "args = (x, out, x.stride(0), x.shape[1])\n    scale_rows_kernel[(x.shape[0],)](*args, BLOCK=64)")
    assert rewrite(PATTERN, starred, {}) == []


def test_a_value_widened_for_its_range_keeps_its_cast():
    # the count is summed in int64 for its range, which no tensor's reach bounds; the row base is an address
    source = LOCAL_BLOCK.replace(
        "    tl.store(out_ptr + row * stride + cols.to(tl.int64), x * 2.0, mask=cols < n_cols)\n",
        "    big = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols).to(tl.int32).to(tl.int64)\n"
        "    tl.store(out_ptr + row, tl.sum(big * big, axis=0))\n")
    (variant,) = rewrite(PATTERN, source, {})
    assert variant.params["sites"] == 1
    assert "row = (tl.program_id(0).to(tl.int64) if _KB_INT64 else tl.program_id(0).to(tl.int32))" in variant.source
    assert ".to(tl.int32).to(tl.int64)\n" in variant.source


def test_a_mask_made_from_a_widened_offset_does_not_make_the_stored_value_wide():
    source = LOCAL_BLOCK.replace("x * 2.0, mask=cols < n_cols)", "tl.where(row * stride + cols < 10**6, x * 2.0, 0.0))")
    (variant,) = rewrite(PATTERN, source, {})
    assert variant.params["sites"] == 2


def test_l1_reports_only_the_casts_that_reach_an_address(tmp_path):
    from diagnose.features import kernel_features
    from diagnose.records import EvidenceLog
    from diagnose.triage import triage

    path = tmp_path / "rows.py"
    path.write_text(LOCAL_BLOCK)
    found = {f.kind: f for f in triage(kernel_features(path), EvidenceLog(), "cuda:90")}
    assert found["index.int64"].kernel_lines == [8, 11]
    counting = LOCAL_BLOCK.replace("tl.program_id(0).to(tl.int64)", "tl.program_id(0)").replace(
        "cols.to(tl.int64)", "cols").replace("x * 2.0, mask", "(x.to(tl.int32).to(tl.int64) * 3).to(tl.float32), mask")
    path.write_text(counting)
    assert "index.int64" not in {f.kind for f in triage(kernel_features(path), EvidenceLog(), "cuda:90")}
