"""Where a plain Triton matmul's gap to cuBLAS goes, on the GPU this runs on: tile shape, program order
(GROUP_M swizzle over a 2-D grid, remapped inside the kernel), and K-loop masks, one at a time; and, with
`--forms plain,persistent`, how far a persistent kernel of tensor-descriptor (TMA) tile loads gets, with and
without Hopper warp specialization (`tl.range(..., warp_specialize=True)`), one program per SM walking the
tiles in GROUP_M order: the structural step the plain form's best tiles leave (wave quantization, address
math, the producer/consumer overlap cuBLAS has).

The kernel is the textbook form first drafts and corpora/operators/matmul write: a 2-D grid of M x N tiles,
a masked K loop, fp32 accumulation. Every variant is timed with triton.testing.do_bench (median, L2 flushed,
as the roofline ceilings are) beside torch.matmul on the same inputs, and checked against it.

    python scripts/matmul_headroom.py [--sizes 512,1024,2048,4096,3072x1024x4096] [--dtype float16] [--json out.json]
        [--forms plain,persistent] [--tiles 128x256x64x3x8,...]
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


@triton.jit
def _persistent(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    in_group = GROUP_M * tiles_n
    # flatten merges the tile loop and the K loop into one software pipeline: the next tile's first loads
    # are issued during this tile's last steps.
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        first = (tile // in_group) * GROUP_M
        rows = tl.minimum(tiles_m - first, GROUP_M)
        off_m = (first + (tile % in_group) % rows) * BLOCK_M
        off_n = ((tile % in_group) // rows) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in tl.range(steps, num_stages=STAGES):
            acc = tl.dot(a_desc.load([off_m, step * BLOCK_K]), b_desc.load([step * BLOCK_K, off_n]), acc)
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


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


def _launch_persistent(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tile: tuple[int, ...], group: int,
                       warp_specialize: bool) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps = tile
    m, k = a.shape
    n = b.shape[1]
    programs = min(torch.cuda.get_device_properties(a.device).multi_processor_count, triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _persistent[(programs,)](
        TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
        TensorDescriptor.from_tensor(c, [bm, bn]), m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=max(group, 1),
        PROGRAMS=programs, STAGES=stages, WARP_SPECIALIZE=warp_specialize, num_warps=warps)


def _describe(point: dict) -> str:
    extra = (f"mask_k {point['mask_k']}" if point["form"] == "plain" else f"warp_specialize {point['warp_specialize']}")
    return f"{point['form']} tile {point['tile']} group {point['group']} {extra}"


def _size(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.split("x")]
    return (parts[0],) * 3 if len(parts) == 1 else (parts[0], parts[1], parts[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,512,1024,1280,2048,2176,3072,4096,3072x1024x4096")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--groups", default="0,8")
    parser.add_argument("--json", default=None)
    parser.add_argument("--forms", default="plain", help="plain (the textbook kernel), persistent (TMA loads, one "
                        "program per SM; each tile with and without warp specialization), or both, comma-separated")
    parser.add_argument("--tiles", default=None, help="MxNxKxSTAGESxWARPS,... instead of the built-in list")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("matmul_headroom: no CUDA device here; run it on the GPU host", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    groups = [int(g) for g in args.groups.split(",")]
    forms = args.forms.split(",")
    tiles = TILES if args.tiles is None else tuple(tuple(int(x) for x in t.split("x")) for t in args.tiles.split(","))
    rows = []
    for text in args.sizes.split(","):
        m, n, k = _size(text)
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        want = a @ b
        torch_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
        row = {"m": m, "n": n, "k": k, "torch_ms": torch_ms, "variants": []}
        points = []  # (description, launch)
        for tile in tiles:
            for group in groups:
                if "plain" in forms:
                    for mask_k in ((True, False) if k % tile[2] == 0 else (True,)):
                        points.append(({"form": "plain", "tile": tile, "group": group, "mask_k": mask_k},
                                       lambda c, t=tile, g=group, mk=mask_k: _launch(a, b, c, t, g, mk)))
                if "persistent" in forms:
                    for ws in (False, True):
                        points.append(({"form": "persistent", "tile": tile, "group": group, "warp_specialize": ws},
                                       lambda c, t=tile, g=group, w=ws: _launch_persistent(a, b, c, t, g, w)))
        for point, launch in points:
            c = torch.empty(m, n, device="cuda", dtype=dtype)
            started = time.perf_counter()
            try:
                launch(c)
                torch.cuda.synchronize()
            except Exception as exc:  # out of shared memory, too many registers: a point that does not compile
                row["variants"].append({**point, "error": str(exc)[:120]})
                continue
            compile_s = time.perf_counter() - started
            ok = torch.allclose(c.float(), want.float(), atol=5e-2, rtol=2e-2)
            ms = triton.testing.do_bench(lambda: launch(c), return_mode="median")
            row["variants"].append({**point, "ms": ms, "vs_torch": torch_ms / ms, "correct": ok,
                                    "compile_s": round(compile_s, 2)})
        best = max((v for v in row["variants"] if "ms" in v and v["correct"]), key=lambda v: v["vs_torch"])
        first = row["variants"][0]
        print(f"{m}x{n}x{k}: torch {torch_ms * 1e3:.1f} us; first point {first.get('vs_torch', 0):.3f}x; "
              f"best {best['vs_torch']:.3f}x ({_describe(best)})", flush=True)
        for form in forms:
            for v in sorted((v for v in row["variants"] if "ms" in v and v["form"] == form), key=lambda v: -v["vs_torch"])[:6]:
                print(f"    {v['vs_torch']:.3f}x {_describe(v)}{'' if v['correct'] else ' WRONG'}", flush=True)
        for v in row["variants"]:
            if "error" in v:
                print(f"    error: {_describe(v)}: {v['error']}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
                       "dtype": args.dtype, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
