"""Where a plain Triton matmul's gap to cuBLAS goes, on the GPU this runs on: tile shape, program order
(GROUP_M swizzle over a 2-D grid, remapped inside the kernel), and K-loop masks, one at a time.

The kernel is the textbook form first drafts and corpora/operators/matmul write: a 2-D grid of M x N tiles,
a masked K loop, fp32 accumulation. Every variant is timed with triton.testing.do_bench (median, L2 flushed,
as the roofline ceilings are) beside torch.matmul on the same inputs, and checked against it.

    python scripts/matmul_headroom.py [--sizes 512,1024,2048,4096,3072x1024x4096] [--dtype float16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
            MASK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if GROUP_M > 0:
        # The launch order of a 2-D grid (axis 0 fastest), regrouped so programs in flight share A and B tiles.
        grid_m = tl.num_programs(0)
        grid_n = tl.num_programs(1)
        pid = pid_m + pid_n * grid_m
        width = GROUP_M * grid_n
        first = (pid // width) * GROUP_M
        rows = tl.minimum(grid_m - first, GROUP_M)
        pid_m = first + (pid % width) % rows
        pid_n = (pid % width) // rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if MASK_K:
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        else:
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak, mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn, mask=rn[None, :] < N, other=0.0)
        acc += tl.dot(a, b)
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c, mask=(rm[:, None] < M) & (rn[None, :] < N))


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): the drafts' 64x64x32, Triton's matmul tutorial's six
# CUDA configs, and larger-K Hopper tiles.
TILES = ((64, 64, 32, 3, 4), (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
         (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (128, 128, 64, 3, 8), (128, 128, 64, 4, 4), (128, 256, 64, 4, 8),
         (256, 128, 64, 3, 8))


def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tile: tuple[int, ...], group: int, mask_k: bool) -> None:
    bm, bn, bk, stages, warps = tile
    m, k = a.shape
    n = b.shape[1]
    _matmul[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, MASK_K=mask_k, num_stages=stages, num_warps=warps)


def _size(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.split("x")]
    return (parts[0],) * 3 if len(parts) == 1 else (parts[0], parts[1], parts[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,512,1024,1280,2048,2176,3072,4096,3072x1024x4096")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--groups", default="0,8")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("matmul_headroom: no CUDA device here; run it on the GPU host", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    groups = [int(g) for g in args.groups.split(",")]
    rows = []
    for text in args.sizes.split(","):
        m, n, k = _size(text)
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        want = a @ b
        torch_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
        row = {"m": m, "n": n, "k": k, "torch_ms": torch_ms, "variants": []}
        for tile in TILES:
            for group in groups:
                for mask_k in ((True, False) if k % tile[2] == 0 else (True,)):
                    c = torch.empty(m, n, device="cuda", dtype=dtype)
                    started = time.perf_counter()
                    try:
                        _launch(a, b, c, tile, group, mask_k)
                        torch.cuda.synchronize()
                    except Exception as exc:  # out of shared memory, too many registers: a point that does not compile
                        row["variants"].append({"tile": tile, "group": group, "mask_k": mask_k, "error": str(exc)[:120]})
                        continue
                    compile_s = time.perf_counter() - started
                    ok = torch.allclose(c.float(), want.float(), atol=5e-2, rtol=2e-2)
                    ms = triton.testing.do_bench(lambda: _launch(a, b, c, tile, group, mask_k), return_mode="median")
                    row["variants"].append({"tile": tile, "group": group, "mask_k": mask_k, "ms": ms,
                                            "vs_torch": torch_ms / ms, "correct": ok, "compile_s": round(compile_s, 2)})
        best = max((v for v in row["variants"] if "ms" in v and v["correct"]), key=lambda v: v["vs_torch"])
        first = row["variants"][0]
        print(f"{m}x{n}x{k}: torch {torch_ms * 1e3:.1f} us; draft tile {first['vs_torch']:.3f}x; best {best['vs_torch']:.3f}x "
              f"(tile {best['tile']}, group {best['group']}, mask_k {best['mask_k']})", flush=True)
        for v in sorted((v for v in row["variants"] if "ms" in v), key=lambda v: -v["vs_torch"])[:6]:
            print(f"    {v['vs_torch']:.3f}x tile {v['tile']} group {v['group']} mask_k {v['mask_k']}"
                  f"{'' if v['correct'] else ' WRONG'}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
                       "dtype": args.dtype, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
