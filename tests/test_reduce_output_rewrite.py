"""fold-output-reduction: a whole-tensor sum, mean or 2-norm the wrapper runs on what the kernel stored is
reduced by the kernel as it stores, one fp32 partial per program, and the same call reduces the partials."""

from __future__ import annotations

import textwrap

import pytest
from conftest import candidate_rejection

from diagnose.rewriters import rewrite

PATTERN = "fold-output-reduction"

# The shape of TritonBench-T's exp_mean draft: the elementwise kernel, then the mean in PyTorch, the
# whole-tensor mean in one branch and a per-dimension one in the other.
EXP_MEAN = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def exp_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(0)
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.exp(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


    def exp_mean(x, dim=None, dtype=None):
        out = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta['BLOCK_SIZE']),)
        exp_kernel[grid](x, out, n, BLOCK_SIZE=64)
        if dim is None:
            return out.mean(dtype=dtype)
        return out.mean(dim=dim)
    ''')

# scaled_add_norm's: y updated in place by the kernel, then its 2-norm.
SCALED_NORM = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def axpy_kernel(y_ptr, x_ptr, alpha, n, BLOCK: tl.constexpr):
        block_start = tl.program_id(0) * BLOCK
        offsets = block_start + tl.arange(0, BLOCK)
        y = tl.load(y_ptr + offsets, mask=offsets < n) + alpha * tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(y_ptr + offsets, y, mask=offsets < n)


    def axpy_norm(y, x, alpha):
        n = y.numel()
        BLOCK = 128
        axpy_kernel[(triton.cdiv(n, BLOCK),)](y, x, alpha, n, BLOCK=BLOCK)
        total = torch.norm(y)
        return total
    ''')


def test_a_mean_of_the_output_is_reduced_in_the_kernel_and_the_other_branch_kept(tmp_path):
    (variant,) = rewrite(PATTERN, EXP_MEAN, {})
    assert variant.params == {"reduced_in_kernel": ["mean"]}
    text = variant.source
    assert "tl.store(_kb_partials_mean_ptr + tl.program_id(0), tl.sum(_kb_lanes, axis=0) * _kb_scale)" in text
    assert "_kb_scale = _kb_programs / out.numel()" in text and "_kb_programs = triton.cdiv(n, 64)" in text
    assert "return (_kb_partials_mean.mean(dtype=dtype)).to((dtype if dtype is not None else out.dtype))" in text
    assert "return out.mean(dim=dim)" in text  # the per-dimension mean still reads the output, still stored
    reference = "lambda x, dim=None, dtype=None: torch.exp(x).mean(dtype=dtype)"
    # 1000 elements on blocks of 64: a last program mostly masked, whose masked lanes must add nothing
    assert candidate_rejection(tmp_path, EXP_MEAN, text, "exp_mean", "exp_mean(torch.randn(1000))", reference) == ""
    assert candidate_rejection(tmp_path, EXP_MEAN, text, "exp_mean",
                               "exp_mean(torch.randn(40, 50), dtype=torch.float64)", reference) == ""


def test_an_explicit_dtype_none_is_the_outputs_dtype(tmp_path):
    source = EXP_MEAN.replace("return out.mean(dtype=dtype)", "return out.sum(dtype=None)")
    (variant,) = rewrite(PATTERN, source, {})
    assert "return (_kb_partials_sum.sum(dtype=None)).to(out.dtype)" in variant.source
    reference = "lambda x, dim=None, dtype=None: torch.exp(x).sum()"
    assert candidate_rejection(tmp_path, source, variant.source, "exp_mean", "exp_mean(torch.randn(300))", reference,
                               seeds=1) == ""


def test_a_norm_of_a_tensor_updated_in_place_is_the_norm_of_the_programs_partial_norms(tmp_path):
    (variant,) = rewrite(PATTERN, SCALED_NORM, {})
    text = variant.source
    assert "tl.sqrt(tl.sum(_kb_lanes * _kb_lanes, axis=0))" in text
    assert "total = (torch.norm(_kb_partials_norm)).to(y.dtype)" in text
    reference = "lambda y, x, alpha: torch.norm(y.add_(alpha * x))"  # y is updated in place, as the kernel does
    assert candidate_rejection(tmp_path, SCALED_NORM, text, "axpy_norm",
                               "axpy_norm(torch.randn(1001), torch.randn(1001), 0.5)", reference) == ""


def test_a_sum_of_fp16_output_is_summed_in_fp32_partials_and_returned_in_fp16(tmp_path):
    source = EXP_MEAN.replace("return out.mean(dtype=dtype)", "return torch.sum(out)").replace(
        "tl.exp(tl.load(x_ptr + offsets, mask=mask))", "tl.exp(tl.load(x_ptr + offsets, mask=mask).to(tl.float32))")
    (variant,) = rewrite(PATTERN, source, {})
    assert "return (torch.sum(_kb_partials_sum)).to(out.dtype)" in variant.source
    assert "_kb_partials_sum = torch.empty(_kb_programs, dtype=torch.float32, device=out.device)" in variant.source
    reference = "lambda x, dim=None, dtype=None: torch.exp(x).sum()"
    # fp16 output: the partials are fp32 and the result comes back in fp16, the dtype torch.sum(out) gives
    assert candidate_rejection(tmp_path, source, variant.source, "exp_mean",
                               "exp_mean(torch.randn(3000).to(torch.float16))", reference, seeds=1) == ""


@pytest.mark.parametrize("old, new, why", [
    ("return out.mean(dtype=dtype)", "return out.mean(dim=0)", "a per-dimension reduction"),
    ("return out.mean(dtype=dtype)", "return torch.norm(out, p=1)", "a 1-norm"),
    ("    exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n",
     "    exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n    out.mul_(2)\n", "written in place after the launch"),
    ("    exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n",
     "    exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n    exp_kernel[grid](out, out, n, BLOCK_SIZE=64)\n",
     "launched again"),
    ("exp_kernel[grid](x, out, n, BLOCK_SIZE=64)", "exp_kernel[grid](x, out, n // 2, BLOCK_SIZE=64)",
     "stores half the output"),
    ("    out = torch.empty_like(x)\n", "    out = torch.ones(2 * x.numel())\n", "an output larger than x"),
    ("    mask = offsets < n\n", "    mask = offsets < n - 1\n", "a mask that drops a lane"),
    ("    exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n",
     "    if n:\n        exp_kernel[grid](x, out, n, BLOCK_SIZE=64)\n", "a launch in a branch"),
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0) // 2\n", "two programs per block"),
])
def test_what_cannot_be_shown_to_reduce_the_whole_output_is_left_as_written(old, new, why):
    source = EXP_MEAN.replace(old, new)
    assert source != EXP_MEAN, why
    assert rewrite(PATTERN, source, {}) == [], why


@pytest.mark.parametrize("edits, why", [
    ([("    total = torch.norm(y)\n", "    z = y\n    z.mul_(2)\n    total = torch.norm(y)\n")], "a name bound to y, written"),
    ([("def axpy_norm(y, x, alpha):\n    n = y.numel()\n", "def axpy_norm(y0, x, alpha):\n    y = y0.view(-1)\n    n = y.numel()\n"),
      ("    total = torch.norm(y)\n", "    y0.add_(1)\n    total = torch.norm(y)\n")], "the tensor y views, written"),
])
def test_a_write_through_another_name_for_the_output_keeps_the_reduction_in_pytorch(edits, why):
    source = SCALED_NORM
    for old, new in edits:
        assert old in source, why
        source = source.replace(old, new)
    assert rewrite(PATTERN, source, {}) == [], why
