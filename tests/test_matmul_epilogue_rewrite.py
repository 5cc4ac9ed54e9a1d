"""fuse-matmul-epilogue: a PyTorch matmul the wrapper runs before its launch, read only by an elementwise
kernel, becomes one Triton GEMM whose epilogue is that kernel's tail, below a size limit per variant; above it,
and for operands it does not cover, the call as written runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from diagnose.rewriters import rewrite
from harness.run import RunOptions, run_task
from harness.task import TaskSpec

PATTERN = "fuse-matmul-epilogue"

# The shape of TritonBench-T's tensordot_rsqrt draft.
TENSORDOT = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def rsqrt_kernel(input_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(0)
        block_start = pid * BLOCK_SIZE
        offsets = block_start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(input_ptr + offsets, mask=mask)
        # a comment above a statement of the tail (libcst keeps it with the statement)
        y = 1.0 / tl.sqrt(x)
        tl.store(output_ptr + offsets, y, mask=mask)


    def tensordot_rsqrt(a, b, dims):
        contracted = torch.tensordot(a, b, dims=dims)
        out = torch.empty_like(contracted)
        n_elements = contracted.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']),)
        rsqrt_kernel[grid](contracted, out, n_elements, BLOCK_SIZE=256)
        return out
    ''')

# A linear layer's activation: `@` on a transposed weight, a cast on the load, a scalar the tail reads.
LINEAR = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def act_kernel(h_ptr, y_ptr, alpha, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        h = tl.load(h_ptr + offs, mask=offs < n).to(tl.float32)
        s = tl.sigmoid(h) * alpha
        tl.store(y_ptr + offs, tl.where(h > 0, s, -s), mask=offs < n)


    def linear_act(x, w, alpha=0.5):
        h = x @ w.t()
        y = torch.empty(h.shape, device=h.device, dtype=h.dtype)
        n = h.numel()
        act_kernel[(triton.cdiv(n, 128),)](h, y, alpha, n, BLOCK=128)
        return y
    ''')


def _rejection(tmp_path: Path, original: str, candidate: str, entry: str, calls: list[str], reference: str,
               allow_torch: list[str]) -> str:
    """The candidate's rejection on a case per call ("" when it passes); the original must pass. The task
    allows the wrapper's own matmul, as the TritonBench importer allows a draft's torch calls."""
    (tmp_path / "original.py").write_text(original)
    (tmp_path / "candidate.py").write_text(candidate)
    (tmp_path / "task.py").write_text(textwrap.dedent(f"""\
        import torch
        from original import {entry} as entry
        allow_torch = {allow_torch!r}
        reference = {reference}
        def inputs(i):
            return [{", ".join(calls)}][i]
        cases = [dict(i=i) for i in range({len(calls)})]
        """))
    report = run_task(TaskSpec(path=str(tmp_path / "task.py")), RunOptions(backend="interpreter", time=False, seeds=1),
                      candidate=str(tmp_path / "candidate.py"), candidate_entry=entry)
    assert report.run("baseline").correct, report.to_dict()
    candidate = report.run("candidate")
    assert any(k.endswith("_matmul") for k in candidate.kernels), candidate.kernels  # the fused kernel ran
    return "" if candidate.correct else json.dumps(report.to_dict()["runs"][-1])


def test_the_tail_of_a_tensordot_runs_in_the_gemm_up_to_each_variants_limit(tmp_path):
    variants = rewrite(PATTERN, TENSORDOT, {})
    assert [v.params for v in variants] == [{"fused_up_to": "256^3"}, {"fused_up_to": "512^3"},
                                           {"fused_up_to": "1024^3"}]
    text = variants[0].source
    assert "_kb_fused = _kb_matmul_fusable(_kb_a, _kb_b, 16777216, dims=dims)" in text
    assert "        contracted = torch.tensordot(_kb_a, _kb_b, dims=dims)" in text  # the call as written, else
    assert "    y = 1.0 / tl.sqrt(x)\n    tl.store(output_ptr + _kb_rm[:, None] * _kb_N + _kb_rn[None, :], y," in text
    assert "IEEE=_kb_a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32" in text
    reference = "lambda a, b, dims: torch.rsqrt(torch.tensordot(a, b, dims=dims))"
    calls = [  # fused: fp32 2-D products with ragged edges (M, N not multiples of the tiles, K below one block)
        "(torch.rand(40, 24), torch.rand(24, 72), 1)", "(torch.rand(17, 70), torch.rand(70, 5), 1)",
        # not fused: two contracted dimensions; a product past the limit
        "(torch.rand(4, 6, 8), torch.rand(6, 8, 3), 2)", "(torch.rand(300, 300), torch.rand(300, 300), 1)"]
    assert _rejection(tmp_path, TENSORDOT, text, "tensordot_rsqrt", calls, reference, ["tensordot", "mm"]) == ""


def test_an_at_product_of_a_transposed_view_and_a_tail_with_a_cast_and_a_scalar(tmp_path):
    (variant, *_) = rewrite(PATTERN, LINEAR, {})
    text = variant.source
    assert "_kb_a, _kb_b = x, w.t()" in text and "        h = _kb_a @ _kb_b" in text
    # The transposed view is read through its strides; alpha reaches the fused kernel as the launch passed it.
    assert "_kb_b.stride(0),\n            _kb_b.stride(1), alpha=alpha, _KB_BM=_kb_bm" in text
    assert "    h = _kb_c.to(tl.float32)\n    s = tl.sigmoid(h) * alpha" in text
    reference = ("lambda x, w, alpha=0.5: torch.where(x @ w.t() > 0, torch.sigmoid(x @ w.t()) * alpha, "
                 "-torch.sigmoid(x @ w.t()) * alpha)")
    calls = ["(torch.randn(33, 20), torch.randn(50, 20), 0.25)",
             "(torch.randn(2, 33, 20), torch.randn(50, 20))"]  # 3-D: the call as written
    assert _rejection(tmp_path, LINEAR, text, "linear_act", calls, reference, ["matmul", "mm", "t"]) == ""


def test_the_fused_kernel_compiles_for_sm90_with_an_ieee_fp32_dot(tmp_path):
    from harness.capture import capture_call

    (variant, *_) = rewrite(PATTERN, TENSORDOT, {})
    module = tmp_path / "fused.py"
    module.write_text(variant.source)
    arts = capture_call(module, "tensordot_rsqrt(torch.rand(64, 64), torch.rand(64, 64), 1)",
                        cache_dir=tmp_path / "cache")
    (fused,) = [a for a in arts if a.kernel == "rsqrt_kernel_matmul"]
    dots = [line for line in fused.stages["ttgir"].splitlines() if "tt.dot " in line]
    # IEEE fp32 (the default precision, which the IR leaves unsaid): FMA on a blocked layout, not TF32 MMA.
    assert dots and all("tf32" not in line and "parent = #blocked" in line for line in dots)
    assert "tf32" not in fused.stages["ttir"]


@pytest.mark.parametrize("change", [
    # The product is returned beside the tail: its elements are read.
    ("    return out\n", "    return out, contracted\n"),
    # The wrapper reads an element of the product.
    ("    return out\n", "    return out * contracted.max()\n"),
    # The tail reads the offsets: not elementwise on the product.
    ("y = 1.0 / tl.sqrt(x)", "y = 1.0 / tl.sqrt(x) + offsets"),
    # The store's mask is not the load's.
    ("tl.store(output_ptr + offsets, y, mask=mask)", "tl.store(output_ptr + offsets, y, mask=offsets < n_elements - 1)"),
    # A tensordot without dims contracts two dimensions.
    ("torch.tensordot(a, b, dims=dims)", "torch.tensordot(a, b)"),
    # The kernel reads a second tensor.
    ("y = 1.0 / tl.sqrt(x)", "y = 1.0 / tl.sqrt(x) + tl.load(input_ptr + offsets + 1, mask=mask)"),
    # The bound of the mask is not the product's numel.
    ("n_elements = contracted.numel()", "n_elements = a.numel()"),
    # A loop in the kernel.
    ("    y = 1.0 / tl.sqrt(x)\n", "    for i in range(2):\n        x = x * 1.0\n    y = 1.0 / tl.sqrt(x)\n"),
    # A parameter changed before the load: the pointer shifted, the bound halved.
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    input_ptr += 1\n"),
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    n_elements = n_elements // 2\n"),
    # An operand written between the product and the launch: the fused kernel reads it at the launch.
    ("    out = torch.empty_like(contracted)\n", "    out = torch.empty_like(contracted)\n    a.mul_(2.0)\n"),
    # The tail stored into memory that is not fresh: an operand, or zeros a short grid leaves partly as they are.
    ("    out = torch.empty_like(contracted)\n", "    out = a\n"),
    ("    out = torch.empty_like(contracted)\n", "    out = torch.zeros_like(contracted)\n"),
    # The output bound through **kwargs: its argument is not known.
    ("rsqrt_kernel[grid](contracted, out, n_elements, BLOCK_SIZE=256)",
     "rsqrt_kernel[grid](contracted, n_elements=n_elements, BLOCK_SIZE=256, **dict(output_ptr=out))"),
    # No bare `import triton`: the fused kernel's decorator and the dispatch are spelled with it.
    ("import triton\nimport triton.language", "from triton import cdiv, jit\nimport triton.language"),
    # A name the rewrite introduces, already used.
    ("    grid = lambda", "    _kb_fused = 1\n    grid = lambda"),
])
def test_it_declines_where_the_fused_call_could_differ(change):
    old, new = change
    assert old in TENSORDOT
    assert rewrite(PATTERN, TENSORDOT.replace(old, new), {}) == []


def test_a_scalar_the_launch_leaves_to_its_default_and_a_cast_to_a_parameter_reach_the_gemm():
    source = LINEAR.replace("def act_kernel(h_ptr, y_ptr, alpha, n, BLOCK: tl.constexpr):",
                            "def act_kernel(h_ptr, y_ptr, n, BLOCK: tl.constexpr, DT: tl.constexpr, alpha=0.5):") \
        .replace(".to(tl.float32)", ".to(DT)").replace("(h, y, alpha, n, BLOCK=128)", "(h, y, n, BLOCK=128, DT=tl.float32)")
    (variant, *_) = rewrite(PATTERN, source, {})
    assert "_kb_b.stride(1), DT=tl.float32, alpha=0.5, _KB_BM=_kb_bm" in variant.source
    assert "DT: tl.constexpr, alpha, _KB_BM: tl.constexpr" in variant.source


def test_the_gemm_takes_a_name_free_in_the_module():
    source = TENSORDOT + "\n\ndef rsqrt_kernel_matmul():\n    pass\n"
    (variant, *_) = rewrite(PATTERN, source, {})
    assert "def rsqrt_kernel_matmul_(_kb_a_ptr" in variant.source and "rsqrt_kernel_matmul_[(" in variant.source
