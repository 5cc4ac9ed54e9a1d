"""Loop a whole-row tile in chunks (issue 27; pattern chunked-row-loop): a row-per-program kernel whose
tile is its whole row reduces it chunk by chunk, each reduction carried across the chunks, a sum of
exp(x - m) beside its max as an online sum. Each variant is judged on the interpreter against the kernel
as written, on rows wider than a chunk (several chunks, a partly masked last one, chunks wholly past the
row), rows of exactly one chunk and short rows; the spills it removes are read from ptxas for sm90."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
from conftest import candidate_rejection
from test_rows_rewrite import SOFTMAX as ROWS_SOFTMAX
from test_rows_rewrite import SOFTMAX_REFERENCE

from diagnose.rewriters import rewrite
from diagnose.rewriters.base import jit_functions
from diagnose.rewriters.rowloopread import Decline, read_kernel
from diagnose.rewriters.rowsplit import triton_imports

PATTERN = "chunked-row-loop"
ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "operators"

# Our corpus's cross entropy: a log-sum-exp of the whole row (32,768 columns in its widest case).
CROSS_ENTROPY = (CORPUS / "cross_entropy" / "cross_entropy.py").read_text()
CROSS_ENTROPY_REFERENCE = "lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, reduction='none')"

# Our corpus's layer norm: a mean, then a variance around it, then the normalized row stored.
LAYER_NORM = (CORPUS / "layer_norm" / "layer_norm.py").read_text()
LAYER_NORM_REFERENCE = ("lambda x, w, b: torch.nn.functional.layer_norm(x.float(), (x.shape[1],), w.float(), b.float(), "
                        "1e-5).to(x.dtype)")

# rows-per-program's softmax (it also stores its row's log-sum-exp, a scalar store after the tile store,
# reads a weight vector that does not depend on the row, launches on a lambda grid), in base 2 and on
# 16 warps.
SOFTMAX = (ROWS_SOFTMAX.replace("e = tl.exp(x - top)", "e = tl.exp2((x - top) * 1.4426950408889634)")
           .replace("BLOCK=BLOCK)", "BLOCK=BLOCK, num_warps=16)"))


def kernel_with(body: str, launch: str = "kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))",
                other: str = "0.0") -> str:
    """A row kernel module around `body` (its statements after the columns and the row's load, masked
    lanes `other`)."""
    return textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            cols = tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other={other})
        {body}

        def entry(x):
            out = torch.empty_like(x)
            {launch}
            return out
        ''').format(body=textwrap.indent(textwrap.dedent(body), "    "), launch=launch, other=other)


def test_a_log_sum_exp_reads_its_row_once_as_an_online_sum(tmp_path):
    variants = rewrite(PATTERN, CROSS_ENTROPY, {})
    assert [(v.params["chunk"], v.params["num_warps"]) for v in variants] == [(2048, 4), (4096, 8), (8192, 8)]
    assert variants[0].params["online"] == ["cross_entropy_kernel: tl.max + tl.sum"]
    source = variants[1].source
    assert source.count("for _kb_start in range(") == 1  # max and sum in one pass over the row
    assert "_kb_acc1 = _kb_acc1 * tl.exp(_kb_acc0 - _kb_m0) + tl.sum(tl.exp(x - _kb_m0), axis=0)" in source
    assert "lse = m + tl.log(_kb_acc1)" in source
    # rows of 5,000 (a last chunk partly masked and, at 2,048, a chunk wholly past the row), of exactly one
    # chunk, short rows, and rows whose first 4,096 columns are -inf (a running max of -inf)
    calls = ["cross_entropy(torch.randn(3, 5000) * 4, torch.randint(0, 5000, (3,)))",
             "cross_entropy(torch.randn(2, 2048), torch.randint(0, 2048, (2,)))",
             "cross_entropy(torch.randn(4, 7), torch.randint(0, 7, (4,)))",
             "cross_entropy(torch.cat([torch.full((2, 4096), -float('inf')), torch.randn(2, 900)], 1), "
             "torch.randint(4096, 4996, (2,)))"]
    for call in calls:
        for variant in variants:
            assert candidate_rejection(tmp_path, CROSS_ENTROPY, variant.source, "cross_entropy", call,
                                       CROSS_ENTROPY_REFERENCE) == "", (call, variant.params)


def test_a_softmax_shares_one_loop_for_max_and_sum_and_stores_in_a_second(tmp_path):
    assert "tl.exp2(" in SOFTMAX and "num_warps=16" in SOFTMAX  # the replacements took
    variants = rewrite(PATTERN, SOFTMAX, {})
    source = variants[0].source
    assert source.count("for _kb_start in range(") == 2
    # the exp2 form with a scale rescales by the same function of the moved max
    assert "_kb_acc1 = _kb_acc1 * tl.exp2((_kb_acc0 - _kb_m0) * 1.4426950408889634) + tl.sum(e)" in source
    assert "tl.store(lse_ptr + row, top + tl.log(total))" in source  # the scalar store stays, after the loop
    # the launch's own num_warps stays for rows of one chunk
    assert "num_warps=4 if kb_block > 2048 else (16)" in source
    for shape in ("3, 5000", "2, 2048", "5, 20"):
        call = f"softmax(torch.randn({shape}), torch.rand({shape.split(', ')[1]}))"
        for variant in variants:
            assert candidate_rejection(tmp_path, SOFTMAX, variant.source, "softmax", call, SOFTMAX_REFERENCE) == ""


def test_a_variance_around_the_mean_takes_a_loop_of_its_own(tmp_path):
    variants = rewrite(PATTERN, LAYER_NORM, {})
    assert variants and variants[0].params["online"] == []
    assert variants[0].source.count("for _kb_start in range(") == 3  # the mean, the variance, the stores
    for shape in ("3, 5000", "4, 100"):
        call = f"layer_norm(torch.randn({shape}).half(), torch.rand({shape.split(', ')[1]}).half() + 0.5, " \
               f"torch.randn({shape.split(', ')[1]}).half())"
        for variant in variants:
            assert candidate_rejection(tmp_path, LAYER_NORM, variant.source, "layer_norm", call, LAYER_NORM_REFERENCE) == ""


def test_a_sum_against_the_max_of_another_tile_is_not_online(tmp_path):
    source = kernel_with('''\
        z = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
        m = tl.max(z * 2.0, axis=0)
        s = tl.sum(tl.exp(z - m), axis=0)
        tl.store(out_ptr + row * n_cols + cols, x + s, mask=mask)
        ''')
    variants = rewrite(PATTERN, source, {})
    assert variants and variants[0].params["online"] == []
    assert variants[0].source.count("for _kb_start in range(") == 3  # the max, the sum, the stores
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "entry", "entry(torch.randn(3, 4500))",
                                   "lambda x: x + torch.exp(x - (2 * x).max(1, keepdim=True).values).sum(1, keepdim=True)") == ""


@pytest.mark.parametrize(("body", "reason"), [
    ("tl.store(out_ptr + row, tl.argmax(x, axis=0))\n", "elementwise: tl.argmax"),
    ("tl.store(out_ptr + row * n_cols + cols, x, mask=mask)\ntl.store(out_ptr + row, tl.sum(x))\n",
     "a tile store before a reduction"),
    ("s = tl.sum(x)\nif s > 0:\n    s = 0.0\ntl.store(out_ptr + row, s)\n", "control flow"),
    ("acc = tl.zeros([BLOCK], dtype=tl.float32)\ntl.store(out_ptr + row, tl.sum(x + acc))\n", "elementwise: tl.zeros"),
    ("tl.store(out_ptr + row, tl.sum(x, axis=0, keep_dims=True))\n", "options besides its axis"),
    ("s = tl.sum(x)\ntl.device_print('x', x)\ntl.store(out_ptr + row, s)\n", "neither an assignment nor a store"),
    ("tl.store(out_ptr + row * n_cols + cols, x * 2.0, mask=mask)\n", "nothing reduces or scans the row"),
    ("s = tl.sum(x)\ntl.store(out_ptr + row * n_cols + cols, x / s, mask=mask)\ntl.store(out_ptr + row, s)\n"
     "tl.store(out_ptr + row * n_cols + cols, x, mask=mask)\n", "a scalar load or store between two tile stores"),
    # found by a review's probes: loads that a loop would run again after a store into their buffer ...
    ("tl.store(x_ptr + row * n_cols, -1000.0)\ntl.store(out_ptr + row, tl.sum(x, axis=0))\n",
     "a scalar store into the buffer the row is loaded from"),
    ("s = tl.sum(x)\ntl.store(x_ptr + row * n_cols, s)\ntl.store(out_ptr + row * n_cols + cols, x / s, mask=mask)\n",
     "a scalar store into the buffer the row is loaded from"),
    # ... a row written back in place through other columns than it was read from ...
    ("s = tl.sum(x, axis=0)\ntl.store(x_ptr + row * n_cols + (n_cols - 1 - cols), x / s, mask=mask)\n",
     "do not address the row's columns the same way"),
    # ... and triton.language calls that look across the tile
    ("s = tl.sum(x)\ntl.store(out_ptr + row * n_cols + cols, tl.softmax(x) * s, mask=mask)\n", "elementwise: tl.softmax"),
    ("tl.store(out_ptr + row, tl.reduce_or((x < 0).to(tl.int32), 0))\n", "elementwise: tl.reduce_or"),
])
def test_what_it_cannot_loop_soundly_is_declined_with_its_reason(body, reason):
    source = kernel_with(body)
    module = cst.parse_module(source)
    kernels = jit_functions(module)
    with pytest.raises(Decline, match=reason):
        read_kernel(kernels["kernel"], triton_imports(module), kernels)
    assert rewrite(PATTERN, source, {}) == []


def test_a_value_reassigned_after_a_lane_statement_read_it_starts_a_loop_where_it_still_holds(tmp_path):
    # `scale` is read by the lane statement `y` before it is reassigned: the sum's loop must go where
    # `y` was computed, before the reassignment, not where the sum is.
    source = kernel_with('''\
        scale = n_cols * 1.0
        y = x * scale
        scale = 2.0
        s = tl.sum(y, axis=0)
        tl.store(out_ptr + row * n_cols + cols, x * scale + s, mask=mask)
        ''')
    module = cst.parse_module(source)
    kernels = jit_functions(module)
    plan = read_kernel(kernels["kernel"], triton_imports(module), kernels)
    reassigned = max(i for i, st in enumerate(plan.statements) if st.target == "scale")
    assert [g.at for g in plan.groups] == [reassigned] and plan.reductions[0].at > reassigned
    variants = rewrite(PATTERN, source, {})
    assert variants
    # Entries of -1, 0, 1 keep every partial sum of x * 4500 an integer well below 2**24, exact in fp32
    # in any order: random normals made the sum's rounding fail the default tolerance on rows whose sum
    # lands near zero, and this test is about where the loop goes, not about fp32 summation.
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "entry",
                                   "entry(torch.randint(-1, 2, (3, 4500)).float())",
                                   "lambda x: x * 2.0 + (x * x.shape[1]).sum(1, keepdim=True)") == ""


def test_a_launch_that_does_not_name_the_block_is_left_alone():
    source = kernel_with("tl.store(out_ptr + row, tl.sum(x))\n", launch="kernel[(x.shape[0],)](x, out, *meta)")
    assert rewrite(PATTERN, source, {}) == []


def test_the_chunked_cross_entropy_compiles_for_sm90_without_the_spills(tmp_path):
    from harness.capture import capture_call

    call = "cross_entropy(torch.randn(4, 32768), torch.randint(0, 32768, (4,)))"
    (tmp_path / "before.py").write_text(CROSS_ENTROPY)
    (tmp_path / "after.py").write_text(rewrite(PATTERN, CROSS_ENTROPY, {})[0].source)
    before = capture_call(tmp_path / "before.py", call, target="cuda:90")[0].ptxas
    after = capture_call(tmp_path / "after.py", call, target="cuda:90")[0].ptxas
    assert before.spill_stores > 0  # 32,768 fp32 on 4 warps: 256 a thread
    assert after.spill_stores == 0 and after.spill_loads == 0 and after.registers < before.registers
    # a row of one chunk compiles the kernel as written: the same loads, the same registers
    narrow = "cross_entropy(torch.randn(4, 1000), torch.randint(0, 1000, (4,)))"
    written, rewritten = (capture_call(tmp_path / f, narrow, target="cuda:90")[0] for f in ("before.py", "after.py"))
    assert rewritten.ptxas.registers == written.ptxas.registers
    assert rewritten.stages["ptx"].count("ld.global") == written.stages["ptx"].count("ld.global")


def test_the_loop_reaches_it_for_spills_after_the_findings_two_recommended_patterns(tmp_path):
    from diagnose.engine import diagnose
    from diagnose.loop_options import OptimizeOptions
    from diagnose.planning import hypotheses
    from diagnose.request import KernelInput, request_from
    from kb.patterns import catalog_for

    path = tmp_path / "cross_entropy.py"
    path.write_text(CROSS_ENTROPY)
    call = "cross_entropy(torch.randn(4, 32768), torch.randint(0, 32768, (4,)))"
    answer = diagnose(request_from(KernelInput(kernel=str(path), call=call)), None, level_max="L3",
                      strategy="always-deep")
    spills = [r.pattern_id for r in answer.recommendations if r.for_finding == "spills.registers"]
    assert len(spills) == 2 and PATTERN not in spills  # the diagnosis names the two lowest-risk patterns
    planned = [h.pattern for h in hypotheses(answer, OptimizeOptions(), catalog_for()) if h.finding == "spills.registers"]
    assert planned[:2] == spills and PATTERN in planned[2:]


@pytest.mark.parametrize(("body", "other", "reference"), [
    # a reduction inside an augmented assignment to a tile, and one read after it (a review's probes)
    ("x -= tl.max(x, axis=0)\ns = tl.sum(tl.exp(x), axis=0)\ntl.store(out_ptr + row * n_cols + cols, tl.exp(x) / s, mask=mask)\n",
     '-float("inf")', "lambda x: torch.softmax(x, 1)"),
    ("x += 1.0\nx = tl.where(mask, x, 0.0)\ns = tl.sum(x, axis=0)\ny = x - tl.max(x, axis=0)\n"
     "tl.store(out_ptr + row * n_cols + cols, y + s, mask=mask)\n",
     "0.0", "lambda x: x + 1 - (x + 1).max(1, keepdim=True).values + (x + 1).sum(1, keepdim=True)"),
    # `m += tl.max(x)` is not the max of x: its sum of exp(x - m) is no online sum
    ("m = 0.5\nm += tl.max(x, axis=0)\ns = tl.sum(tl.exp(x - m), axis=0)\ntl.store(out_ptr + row * n_cols + cols, x * 0.0 + s, mask=mask)\n",
     '-float("inf")', "lambda x: (x * 0 + torch.exp(x - x.max(1, keepdim=True).values - 0.5).sum(1, keepdim=True))"),
    # the row's axis written -1, a dtype for the sum
    ("s = tl.sum(x, axis=-1, dtype=tl.float32)\ntl.store(out_ptr + row * n_cols + cols, x / s, mask=mask)\n",
     "0.0", "lambda x: x / x.sum(1, keepdim=True)"),
])
def test_tiles_reassigned_in_place_and_reductions_written_other_ways_stay_exact(tmp_path, body, other, reference):
    source = kernel_with(body, other=other)
    variants = rewrite(PATTERN, source, {})
    assert variants
    for variant in variants:
        for call in ("entry(torch.rand(3, 5000) + 0.5)", "entry(torch.rand(4, 100) + 0.5)"):
            assert candidate_rejection(tmp_path, source, variant.source, "entry", call, reference) == "", (body, call)


def test_columns_offset_by_the_row_a_positional_default_and_a_launch_with_star_star_still_launch(tmp_path):
    source = textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, eps=1e-5):
            row = tl.program_id(0)
            offs = row * n_cols + tl.arange(0, BLOCK)
            mask = offs < row * n_cols + n_cols
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            ms = tl.sum(x * x, axis=0) / n_cols
            tl.store(out_ptr + offs, x * tl.rsqrt(ms + eps), mask=mask)


        def entry(x):
            out = torch.empty_like(x)
            meta = {"num_stages": 2}
            kernel[(x.shape[0],)](x, out, x.shape[1], triton.next_power_of_2(x.shape[1]), 1e-6, **meta)
            return out
        ''')
    variants = rewrite(PATTERN, source, {})
    assert [v.params["chunk"] for v in variants] == [2048, 4096, 8192]
    assert "offs = row * n_cols + (_kb_start + tl.arange(0, _KB_CHUNK))" in variants[0].source
    assert "eps=1e-5, _KB_CHUNK: tl.constexpr = 1)" in variants[0].source  # after the defaulted parameter
    assert "num_warps" not in variants[1].source  # `**meta` may name it
    reference = "lambda x: x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6)"
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "entry", "entry(torch.randn(3, 5000))", reference) == ""


CUMSUM = (CORPUS / "cumsum" / "cumsum.py").read_text()


def test_a_scan_carries_its_prefix_from_chunk_to_chunk(tmp_path):
    variants = rewrite(PATTERN, CUMSUM, {})
    source = variants[0].source
    assert "_kb_scan0 = tl.cumsum(x, axis=0) + _kb_carry0" in source
    assert "_kb_carry0 = tl.sum(tl.where(tl.arange(0, _KB_CHUNK) == _KB_CHUNK - 1, _kb_scan0, 0), axis=0)" in source
    for call in ("cumsum(torch.rand(3, 5000))", "cumsum(torch.rand(2, 2048))", "cumsum(torch.rand(4, 7))"):
        for variant in variants:
            assert candidate_rejection(tmp_path, CUMSUM, variant.source, "cumsum", call,
                                       "lambda x: torch.cumsum(x, 1)") == "", (call, variant.params)


def test_a_product_scan_a_scan_feeding_a_reduction_and_its_stores_each_carry_their_own(tmp_path):
    source = kernel_with('''\
        p = tl.cumprod(tl.where(mask, 1.0 + x * 0.001, 1.0), axis=0)
        y = tl.cumsum(x, 0) * 0.5
        s = tl.sum(y, axis=0)
        tl.store(out_ptr + row * n_cols + cols, p + y / s, mask=mask)
        ''')
    variants = rewrite(PATTERN, source, {})
    assert variants and "* _kb_carry0" in variants[0].source and "+ _kb_carry1" in variants[0].source
    reference = ("lambda x: torch.cumprod(1.0 + x * 0.001, 1) + "
                 "(torch.cumsum(x, 1) * 0.5) / (torch.cumsum(x, 1) * 0.5).sum(1, keepdim=True)")
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "entry", "entry(torch.rand(3, 5000))",
                                   reference) == ""


@pytest.mark.parametrize(("body", "reason"), [
    ("tl.store(out_ptr + row, tl.sum(tl.cumsum(x, 0)))\n", "a scan outside a tile's plain assignment"),
    ("y = tl.cumsum(x, 0, reverse=True)\ntl.store(out_ptr + row * n_cols + cols, y, mask=mask)\n", "`reverse`"),
    ("y = tl.cumsum(tl.cumsum(x, 0), 0)\ntl.store(out_ptr + row * n_cols + cols, y, mask=mask)\n", "a scan of a scan"),
])
def test_scans_it_cannot_carry_are_declined(body, reason):
    module = cst.parse_module(kernel_with(body))
    kernels = jit_functions(module)
    with pytest.raises(Decline, match=reason):
        read_kernel(kernels["kernel"], triton_imports(module), kernels)


def test_columns_addressed_through_different_strides_are_the_same_columns(tmp_path):
    # which column a lane addresses is what matters for a row written back in place, not the strides
    source = kernel_with("s = tl.sum(x, axis=0)\ntl.store(out_ptr + row * n_cols + cols * stride_o, x / s, mask=mask)\n",
                         launch="kernel[(x.shape[0],)](x, out, x.shape[1], out.stride(1), "
                                "BLOCK=triton.next_power_of_2(x.shape[1]))").replace(
        "def kernel(x_ptr, out_ptr, n_cols, BLOCK", "def kernel(x_ptr, out_ptr, n_cols, stride_o, BLOCK")
    variants = rewrite(PATTERN, source, {})
    assert variants
    for variant in variants:
        assert candidate_rejection(tmp_path, source, variant.source, "entry", "entry(torch.rand(3, 5000))",
                                   "lambda x: x / x.sum(1, keepdim=True)") == ""


def test_a_scan_imported_by_name_is_not_taken_for_elementwise():
    source = kernel_with("t = tl.sum(x, 0)\ny = cumsum(x, 0) / t\ntl.store(out_ptr + row * n_cols + cols, y, mask=mask)\n")
    source = source.replace("import triton.language as tl\n", "import triton.language as tl\nfrom triton.language import cumsum\n")
    module = cst.parse_module(source)
    kernels = jit_functions(module)
    with pytest.raises(Decline, match="elementwise: cumsum"):
        read_kernel(kernels["kernel"], triton_imports(module), kernels)
