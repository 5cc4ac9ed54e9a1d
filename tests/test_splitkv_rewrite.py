"""The split of an online-softmax key loop over programs, merged by log-sum-exp (issue 27, families 1 and 4):
where the loop's state is a running maximum and sums rescaled to it, the split-and-merge computes the
kernel's result under the real judge (interpreter), at every split count; where the loop carries
anything else, it declines."""

from __future__ import annotations

import textwrap

import pytest
from conftest import REPO, candidate_rejection

from diagnose.rewriters import rewrite

PATTERN = "split-kv-online-softmax"
HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"

# Decoding attention with grouped query heads: one program per (batch, query head), a key loop in BS
# blocks, the running max as a [1] tensor updated through a tuple assignment (fla's style), tl.exp.
DECODE = HEADER + textwrap.dedent('''\
    @triton.jit
    def decode_kernel(q, k, v, o, T, scale, HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                      BS: tl.constexpr, BD: tl.constexpr):
        pid = tl.program_id(0)
        b, hq = pid // HQ, pid % HQ
        h = hq // (HQ // H)
        d = tl.arange(0, BD)
        q_row = tl.load(q + pid * D + d, mask=d < D, other=0.0).to(tl.float32) * scale
        acc = tl.zeros([BD], dtype=tl.float32)
        m = tl.full([1], float("-inf"), dtype=tl.float32)
        den = tl.zeros([1], dtype=tl.float32)
        for start in range(0, T, BS):
            keys = start + tl.arange(0, BS)
            inside = keys < T
            base = (b * T + keys[:, None]) * H * D + h * D + d[None, :]
            kt = tl.load(k + base, mask=inside[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
            vt = tl.load(v + base, mask=inside[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
            s = tl.sum(q_row[None, :] * kt, 1)
            s = tl.where(inside, s, float("-inf"))
            m, m_old = tl.maximum(m, tl.max(s)), m
            r = tl.exp(m_old - m)
            p = tl.exp(s - m)
            den = den * r + tl.sum(p, 0)
            acc = acc * r + tl.sum(p[:, None] * vt, 0)
        out = acc / den
        tl.store(o + pid * D + d, out.to(o.dtype.element_ty), mask=d < D)


    def decode(q, k, v):
        B, HQ, D = q.shape
        T, H = k.shape[1], k.shape[2]
        o = torch.empty_like(q)
        grid = (B * HQ,)
        decode_kernel[grid](q, k, v, o, T, D ** -0.5, HQ=HQ, H=H, D=D, BS=16, BD=triton.next_power_of_2(D))
        return o
    ''')

DECODE_REFERENCE = ("lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q.double()[:, :, None], "
                    "k.double().transpose(1, 2).repeat_interleave(q.shape[1] // k.shape[2], 1), "
                    "v.double().transpose(1, 2).repeat_interleave(q.shape[1] // k.shape[2], 1))[:, :, 0].to(q.dtype)")

# Flash attention's forward (Triton tutorial style): a 2-D tile of queries, exp2 with the scale folded,
# the maximum starting at zeros - inf, the denominator at one, `acc * alpha[:, None]` then
# `tl.dot(p, v, acc)`; after the loop it stores the output and the log-sum-exp.
FLASH = HEADER + textwrap.dedent('''\
    @triton.jit
    def flash_kernel(Q, K, V, O, L, N_CTX, qk_scale, H: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, D: tl.constexpr):
        pid = tl.program_id(0)
        n_m = tl.cdiv(N_CTX, BLOCK_M)
        bh, start_m = pid // n_m, pid % n_m
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, D)
        head = bh * N_CTX * D
        q = tl.load(Q + head + rows[:, None] * D + cols[None, :], mask=rows[:, None] < N_CTX, other=0.0)
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        for start_n in tl.range(0, N_CTX, BLOCK_N):
            keys = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + head + keys[None, :] * D + cols[:, None], mask=keys[None, :] < N_CTX, other=0.0)
            qk = tl.dot(q, k)
            qk = tl.where(keys[None, :] < N_CTX, qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
            p = tl.math.exp2(qk)
            l_ij = tl.sum(p, 1)
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + l_ij
            acc = acc * alpha[:, None]
            v = tl.load(V + head + keys[:, None] * D + cols[None, :], mask=keys[:, None] < N_CTX, other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
        tl.store(L + bh * N_CTX + rows, m_i + tl.math.log2(l_i), mask=rows < N_CTX)
        acc = acc / l_i[:, None]
        tl.store(O + head + rows[:, None] * D + cols[None, :], acc.to(O.dtype.element_ty), mask=rows[:, None] < N_CTX)


    def flash(q, k, v):
        B, H, N, D = q.shape
        o = torch.empty_like(q)
        lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
        grid = lambda META: (triton.cdiv(N, META["BLOCK_M"]) * B * H,)
        flash_kernel[grid](q, k, v, o, lse, N, D ** -0.5 * 1.4426950408889634, H=H, BLOCK_M=16, BLOCK_N=16, D=D)
        return o
    ''')


def _check(tmp_path, source: str, original: str, name: str, call: str, reference: str) -> None:
    assert candidate_rejection(tmp_path, original, source, name, call, reference) == ""


def test_a_decoding_kernel_is_split_and_merged_and_stays_correct(tmp_path):
    variants = rewrite(PATTERN, DECODE, {})
    assert [(v.params["per_sm"], v.params["max_split"]) for v in variants] == [(2, 16), (4, 32), (8, 64)]
    assert variants[0].params["state"] == ["m", "acc", "den"]
    source = variants[0].source
    assert "for start in range(0 + tl.program_id(1) * BS, T, BS * tl.num_programs(1)):" in source
    assert "_kb_w = tl.where(_kb_mj == float('-inf'), 0.0, tl.exp(_kb_mj - _kb_max))" in source
    assert "kb_record = 1 + triton.next_power_of_2(D) + 1" in source  # m, acc, den: shapes the launch passes
    assert "device=o.device" in source
    # the original kernel stays, launched where the grid fills the device
    assert "    else:\n        decode_kernel[(n_blocks,)](q, k, v, o, T" in source
    call = "decode(torch.randn(1, 4, 40), torch.randn(1, {T}, 2, 40), torch.randn(1, {T}, 2, 40))"
    # 4 programs split 16 ways: 300 keys in 19 blocks (some splits take two, some one); 40 keys in 3 blocks
    # (13 splits see no key and merge with weight 0)
    for T in (300, 40):
        _check(tmp_path, source, DECODE, "decode", call.format(T=T), DECODE_REFERENCE)
    # 132 query heads x 2 fill 264 programs: n_split is 1 and the original kernel runs
    _check(tmp_path, variants[0].source, DECODE, "decode",
           "decode(torch.randn(2, 132, 16), torch.randn(2, 20, 4, 16), torch.randn(2, 20, 4, 16))", DECODE_REFERENCE)


def test_flash_attention_with_exp2_views_and_dot_accumulation_is_merged_under_its_views(tmp_path):
    (variant, *_) = rewrite(PATTERN, FLASH, {})
    assert variant.params["state"] == ["m_i", "acc", "l_i"]
    source = variant.source
    assert "_kb_acc += tl.where((_kb_mj == float('-inf'))[:, None], 0.0, tl.reshape(" in source \
        and ".shape) * _kb_w[:, None])" in source  # acc * alpha[:, None]
    assert "tl.math.exp2(_kb_mj - _kb_max)" in source
    assert "kb_record = 16 + (16 * D) + 16" in source
    # the merge runs the code after the loop: the log-sum-exp store reads the merged m_i and l_i
    merge = source[source.index("def flash_kernel_merge"):source.index("def flash(")]
    assert "tl.store(L + bh * N_CTX + rows, m_i + tl.math.log2(l_i)" in merge
    reference = "lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)"
    _check(tmp_path, source, FLASH, "flash", "flash(torch.randn(1, 2, 72, 16), torch.randn(1, 2, 72, 16), "
           "torch.randn(1, 2, 72, 16))", reference)


def test_a_two_axis_flash_grid_takes_the_split_on_a_third_axis(tmp_path):
    source = FLASH.replace("""    pid = tl.program_id(0)
    n_m = tl.cdiv(N_CTX, BLOCK_M)
    bh, start_m = pid // n_m, pid % n_m
""", """    start_m = tl.program_id(0)
    bh = tl.program_id(1)
""").replace('grid = lambda META: (triton.cdiv(N, META["BLOCK_M"]) * B * H,)', "grid = (triton.cdiv(N, 16), B * H)")
    assert source.count("tl.program_id(1)") == 1
    (variant, *_) = rewrite(PATTERN, source, {})
    new = variant.source
    assert "for start_n in tl.range(0 + tl.program_id(2) * BLOCK_N, N_CTX, BLOCK_N * tl.num_programs(2)):" in new
    assert "(tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2)" in new
    assert "flash_kernel_partial[(kb_axis0, kb_axis1, n_split)]" in new and "flash_kernel_merge[(kb_axis0, kb_axis1,)]" in new
    assert "n_blocks = kb_axis0 * kb_axis1" in new
    reference = "lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)"
    _check(tmp_path, new, source, "flash", "flash(torch.randn(2, 1, 40, 16), torch.randn(2, 1, 40, 16), "
           "torch.randn(2, 1, 40, 16))", reference)


def _variant(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


@pytest.mark.parametrize("old, new, why", [
    ("den = den * r + tl.sum(p, 0)", "den = den + tl.sum(p, 0)", "a sum not rescaled to the new maximum"),
    ("acc = acc * r + tl.sum(p[:, None] * vt, 0)", "acc = acc * r + tl.sum(p[:, None] * vt, 0) + m",
     "a term that is not exp(s - m) scaled"),
    ("r = tl.exp(m_old - m)", "r = tl.exp2(m_old - m)", "a rescale of another base than the terms"),
    ("out = acc / den", "out = acc / den + tl.sum(s, 0)", "the last step's scores read after the loop"),
    ("        den = den * r + tl.sum(p, 0)\n",
     "        den = den * r + tl.sum(p, 0)\n        tl.store(o + start, tl.sum(p, 0))\n", "a store inside the loop"),
    ("acc = tl.zeros([BD], dtype=tl.float32)", "acc = tl.load(o + d)", "an accumulator whose shape is not known"),
    ("m = tl.full([1], float(\"-inf\"), dtype=tl.float32)", "m = tl.full([1], 0.0, dtype=tl.float32)\n    den += 1.0",
     "a sum set twice before the loop"),
    ("grid = (B * HQ,)", "grid = (B * HQ, 1, 1)", "a three-axis grid"),
    ("BS=16, BD=triton.next_power_of_2(D))", "BS=16)", "a block size the launch does not pass"),
    ("        acc = acc * r + tl.sum(p[:, None] * vt, 0)\n",
     "        acc = acc * r + tl.sum(p[:, None] * vt, 0)\n        den = den + 1\n", "a sum reassigned off the pattern"),
    ("p = tl.exp(s - m)", "p = tl.exp(s - m_old)", "terms scaled by the old maximum, not the new"),
    ("acc = acc * r + tl.sum(p[:, None] * vt, 0)", "acc = acc * r * r + tl.sum(p[:, None] * vt, 0)", "a sum rescaled twice"),
])
def test_a_loop_that_carries_anything_else_is_not_split(old, new, why):
    source = _variant(DECODE, old, new)
    if "BD" in old and "BS=16)" in new:
        source = source.replace("BD: tl.constexpr):", "BD: tl.constexpr = 64):")
    assert rewrite(PATTERN, source, {}) == [], why


def test_in_a_module_of_several_kernels_the_one_the_call_launches_is_split():
    other = textwrap.dedent('''


        @triton.jit
        def scale_kernel(x, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)


        def scale(x):
            scale_kernel[(triton.cdiv(x.numel(), 256),)](x, x.numel(), BLOCK=256)
        ''')
    source = DECODE + other
    assert rewrite(PATTERN, source, {}) == []  # two launched kernels: which one the call runs is not known
    variants = rewrite(PATTERN, source, {"launched": {"decode_kernel": {"num_warps": 4, "num_stages": 3}}})
    assert len(variants) == 3 and "scale_kernel[(triton.cdiv(x.numel(), 256),)]" in variants[0].source
    assert rewrite(PATTERN, source, {"launched": {"scale_kernel": {}}}) == []


def test_a_linear_sum_and_the_operator_corpus_have_nothing_to_merge():
    linear = (REPO / "corpora" / "operators" / "col_sum" / "col_sum.py").read_text()
    assert rewrite(PATTERN, linear, {}) == []


DECODE_TASK = '''\
import torch

from decode import decode as entry  # noqa: F401


def inputs(b, hq, h, t, d):
    return (torch.randn(b, hq, d), torch.randn(b, t, h, d), torch.randn(b, t, h, d))


def reference(q, k, v):
    return REFERENCE(q, k, v)


cases = [dict(b=1, hq=4, h=2, t=4096, d=64)]
'''.replace("REFERENCE", f"({DECODE_REFERENCE})")


def test_the_loop_answers_an_underfilled_decoding_grid_with_the_split(tmp_path):
    """From the diagnosis (4 programs for 132 SMs) to an accepted split-and-merge round, through the real
    judge on the interpreter (the timing set by the merge kernel's presence)."""
    from marker_judge import MarkerJudge, only_round

    # 4 MB of keys and values (enough for the launch triage to count the idle SMs), in 128-key steps so
    # that the interpreter walks few of them
    (tmp_path / "decode.py").write_text(DECODE.replace("BS=16", "BS=128"))
    (tmp_path / "task.py").write_text(DECODE_TASK)
    judge = MarkerJudge(tmp_path / "decode.py", "decode_kernel_merge[", fast_us=20.0)
    first = only_round(judge, tmp_path / "task.py", tmp_path / "run")
    assert first.hypothesis.finding == "parallelism.grid-underfilled"
    assert first.hypothesis.pattern == PATTERN and first.outcome == "accepted", first.reason
    assert first.hypothesis.unblock.startswith("the launch runs at least `per_sm` programs per SM")


FLAGGED_CAUSAL = HEADER + '''\\
@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, N_CTX, stride_h, stride_m,
             IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + off_h * stride_h + offs_m[:, None] * stride_m + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + off_h * stride_h + offs_n[:, None] * stride_m + offs_d[None, :], mask=offs_n[:, None] < N_CTX, other=0.0)
        v = tl.load(V + off_h * stride_h + offs_n[:, None] * stride_m + offs_d[None, :], mask=offs_n[:, None] < N_CTX, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        valid = offs_n[None, :] < N_CTX
        if IS_CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + off_h * stride_h + offs_m[:, None] * stride_m + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=offs_m[:, None] < N_CTX)


def attention(q, k, v, causal=False):
    H, N, D = q.shape
    o = torch.empty_like(q)
    BLOCK_M, BLOCK_N = 16, 16
    attn_fwd[(triton.cdiv(N, BLOCK_M), H)](q, k, v, o, D ** -0.5, N, q.stride(0), q.stride(1),
                                           IS_CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D)
    return o
'''


def test_a_split_that_sees_only_keys_its_rows_mask_adds_nothing_and_no_nan(tmp_path):
    # a second audit: under IS_CAUSAL a split may get only blocks past a row's diagonal; from -inf its
    # rescale was exp(-inf + inf) = NaN and the merge's 0 weight kept it (NaN x 0). The judge's default
    # (IS_CAUSAL=False) never showed it.
    (variant, *_) = rewrite(PATTERN, FLAGGED_CAUSAL, {})
    assert "m_i = tl.where(m_i == float('-inf'), -1.0e30, m_i).to(m_i.dtype)" in variant.source
    reference = ("lambda q, k, v, causal: torch.softmax((q @ k.transpose(1, 2) * q.shape[2] ** -0.5).masked_fill("
                 "torch.ones(q.shape[1], q.shape[1]).triu(1).bool(), float('-inf')), -1) @ v")
    call = "attention(torch.randn(2, 64, 16), torch.randn(2, 64, 16), torch.randn(2, 64, 16), True)"
    assert candidate_rejection(tmp_path, FLAGGED_CAUSAL, variant.source, "attention", call, reference, seeds=1) == ""


def test_the_wrappers_own_names_are_left_to_it(tmp_path):
    # the wrapper's `n_blocks` and `n_split`, set before the launch and read after it, stay the wrapper's
    own = DECODE.replace("    o = torch.empty_like(q)\n", "    o = torch.empty_like(q)\n    n_blocks, n_split = B, 1\n").replace(
        "    return o\n", "    return o[n_split - 1:n_blocks]\n")
    assert own != DECODE
    source = rewrite(PATTERN, own, {})[0].source
    assert "n_blocks_ = " in source and "n_split_ = max(1," in source
    _check(tmp_path, source, own, "decode", "decode(torch.randn(2, 4, 40), torch.randn(2, 300, 2, 40), "
           "torch.randn(2, 300, 2, 40))", DECODE_REFERENCE)
