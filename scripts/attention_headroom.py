"""Where a plain Triton flash-attention kernel's gap to PyTorch's SDPA goes, on the GPU this runs on: tile
shape (BLOCK_M x BLOCK_N, stages, warps), exp2 with the scale folded into the log2(e) factor (and fused into
the subtraction, as Triton's tutorial writes it), and the key loop split into full blocks without masks and
one masked boundary block, one at a time; against SDPA's default backend and its flash backend.

The kernel is corpora/operators/attention's form (non-causal, fp16, one program per BLOCK_M query rows of
one head, online softmax). Every variant is checked against torch's scaled_dot_product_attention and
timed beside it with triton.testing.do_bench (median, L2 flushed), as scripts/matmul_headroom.py times
matmuls.

    python scripts/attention_headroom.py [--cases 4x16x512x64,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale, stride_bh, stride_s, HEAD: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr, SPLIT: tl.constexpr,
               FMA: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1) * stride_bh
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD)
    q = tl.load(q_ptr + base + rm[:, None] * stride_s + rd[None, :], mask=rm[:, None] < seq, other=0.0)
    qk_scale = scale * 1.4426950408889634 if EXP2 else scale
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)
    # With SPLIT the blocks wholly inside the sequence run without masks; the last, partial one after them.
    full = (seq // BLOCK_N) * BLOCK_N if SPLIT else 0
    for start_n in range(0, full, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + rn[:, None] * stride_s + rd[None, :])
        if FMA:  # the tutorial's form: the max of the raw scores scaled once, the scale fused into the subtraction
            s = tl.dot(q, tl.trans(k))
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            p = tl.exp2(s * qk_scale - m_new[:, None])
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp2(s - m_new[:, None]) if EXP2 else tl.exp(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new) if EXP2 else tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + rn[:, None] * stride_s + rd[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    for start_n in range(full, seq, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(rn[None, :] < seq, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None]) if EXP2 else tl.exp(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new) if EXP2 else tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rm[:, None] * stride_s + rd[None, :], out.to(o_ptr.dtype.element_ty), mask=rm[:, None] < seq)


# (BLOCK_M, BLOCK_N, num_stages, num_warps): the corpus kernel's 64 x 64 first, then the points Triton's
# fused-attention tutorial (06) autotunes over on Hopper (tiles.py's _DOT_TILES_NO_K), and two more.
TILES = ((64, 64, 3, 4), (128, 64, 3, 4), (128, 64, 4, 4), (128, 128, 2, 8), (128, 32, 3, 4), (64, 128, 3, 4),
         (64, 32, 4, 4), (128, 128, 3, 8), (128, 64, 3, 8))


# exp: tl.exp of the scaled scores; exp2: tl.exp2 with log2(e) folded into the scale; fma: exp2 with the scale
# applied inside the subtraction (s * scale - m, one FMA), the form Triton's fused-attention tutorial writes.
MATH = ("exp", "exp2", "fma")


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, tile: tuple[int, ...], math: str,
            split: bool) -> None:
    bm, bn, stages, warps = tile
    batch, heads, seq, head = q.shape
    _attention[(triton.cdiv(seq, bm), batch * heads)](
        q, k, v, o, seq, head ** -0.5, q.stride(1), q.stride(2), HEAD=head, BLOCK_M=bm, BLOCK_N=bn,
        EXP2=math != "exp", FMA=math == "fma", SPLIT=split, num_stages=stages, num_warps=warps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="4x16x512x64,4x16x1024x64,2x16x2048x64,1x16x4096x64,8x8x1024x128",
                        help="BATCHxHEADSxSEQxHEAD, comma-separated (default: corpora/operators/attention's cases)")
    parser.add_argument("--tiles", default=None, help="BLOCK_MxBLOCK_NxSTAGESxWARPS, comma-separated (default: TILES)")
    parser.add_argument("--math", default=",".join(MATH), help=f"a subset of {','.join(MATH)}")
    parser.add_argument("--split", default="off,on", help="off, on or both (the key loop split into full blocks)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("attention_headroom: no CUDA device here; run it on the GPU host", file=sys.stderr)
        return 2
    tiles = [tuple(int(p) for p in t.split("x")) for t in args.tiles.split(",")] if args.tiles else list(TILES)
    maths = [m for m in args.math.split(",") if m in MATH]
    splits = [s == "on" for s in args.split.split(",")]
    rows = []
    for text in args.cases.split(","):
        batch, heads, seq, head = (int(p) for p in text.split("x"))
        q, k, v = (torch.randn(batch, heads, seq, head, device="cuda", dtype=torch.float16) for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        sdpa_ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                          return_mode="median")
        # The bar is SDPA's flash backend; the default may pick another (cuDNN, efficient) on this GPU.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                               return_mode="median")
        row = {"case": text, "sdpa_ms": sdpa_ms, "flash_ms": flash_ms, "variants": []}
        for tile in tiles:
            for math in maths:
                for split in splits:
                    o = torch.empty_like(q)
                    point = {"tile": tile, "math": math, "split": split}
                    try:
                        _launch(q, k, v, o, tile, math, split)
                        torch.cuda.synchronize()
                    except Exception as exc:  # a tile that does not fit the shared memory or registers
                        row["variants"].append({**point, "error": str(exc)[:120]})
                        continue
                    ok = torch.allclose(o.float(), want.float(), atol=2e-2, rtol=2e-2)
                    ms = triton.testing.do_bench(lambda: _launch(q, k, v, o, tile, math, split), return_mode="median")
                    row["variants"].append({**point, "ms": ms, "vs_sdpa": sdpa_ms / ms, "correct": ok})
        timed = [v for v in row["variants"] if "ms" in v and v["correct"]]
        first = row["variants"][0]
        best = max(timed, key=lambda v: v["vs_sdpa"]) if timed else None
        print(f"{text}: SDPA {sdpa_ms * 1e3:.1f} us (flash {flash_ms * 1e3:.1f} us); first variant {first.get('vs_sdpa', 0):.3f}x"
              + (f"; best {best['vs_sdpa']:.3f}x (tile {best['tile']}, math {best['math']}, split {best['split']})"
                 if best else "; no variant correct"), flush=True)
        for v in sorted(timed, key=lambda v: -v["vs_sdpa"])[:6]:
            print(f"    {v['vs_sdpa']:.3f}x tile {v['tile']} math {v['math']} split {v['split']}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
                       "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
