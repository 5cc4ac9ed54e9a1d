"""Deterministic rewriters: source transformations a catalog pattern justifies, on the syntax tree.

One module per family of rewrite; each registers its rewriter for the pattern ids it serves
(`base.register`), and importing this package imports them all.

Each rewriter takes a kernel module's source and returns variants (a parameter description and the
new source); an empty list means the pattern does not apply to this source. They
work on libcst's concrete syntax tree, so comments and formatting outside the changed nodes
survive and the result reads like the input.

| pattern id                  | module | rewrite |
|-----------------------------|--------|---------|
| block-size-num-warps, autotune-configs (other kernels), warp-local-reduction, reduce-register-pressure, num-stages | launch | launch configuration: a small search, one knob per variant |
| autotune-configs (tl.dot kernels), wgmma-friendly-tiles | tiles | six whole tile shapes (BLOCK_M/N/K, stages, warps), the best measured on the H200 (configs.DOT_TILES), or four measured for an M x N tile without a K block (attention); the grid's divisors moved with them. A kernel whose one block sizes M, N and K (`BLOCK_SIZE` for all three), or whose blocks the launch binds to one wrapper local, is untied first (untie.py; the roles read by dot_roles.py from the program axes, the K loop and the dot's operands) |
| block-size-num-warps, autotune-configs (a kernel already under @triton.autotune) | configs | its own config list, whatever its form, widened: more (or fewer) warps, stages +-1, doubled blocks the grid follows, Hopper dot tiles (none whose operand buffers exceed sm90 shared memory); the configs it had stay |
| autotune-configs (tl.dot kernels) | tiles | also those six under `@triton.autotune` keyed on the kernel's sizes, the grid a function of the picked config (pure kernels only; blocks written at the launch, or as wrapper locals that only size launches) |
| tl-range-pipelining         | pipelining | `for ... in range(...)` over loads without a dot -> `tl.range(..., num_stages=3)` |
| masked-tail-split           | tail | a 1-D masked block -> `if START + BLOCK <= N:` unmasked, `else:` as written |
| peel-loop-boundary          | peel | a loop over blocks with boundary masks -> its full iterations unmasked, then the last (partial) iteration as written |
| causal-loop-bounds          | causal | a causal key loop -> ended at the rows' diagonal (`tl.minimum(seq, S + BLOCK_M)`), optionally split so the blocks below it run without the causal select; a sliding window's (`rows - keys < W`) -> started at the block of the window's first key (`tl.maximum(S - W + 1, 0) // BLOCK_N * BLOCK_N`), split so the blocks inside every row's window run unmasked |
| accumulate-then-reduce      | accumulate | `acc += tl.sum(E[, axis])` in a loop -> `lanes += E` in it and one `acc += tl.sum(lanes[, axis])` after it; the 1-D step block also widened to 1024 / 4096 at the launch |
| vectorize-scalar-loop       | vectorize | a loop that loads one element per iteration and sums it -> chunks of 16, 64 or 256 lanes loaded at once (masked past the end) and summed with `tl.sum` |
| chunked-linear-scan         | scan | a step-at-a-time recurrence `h = a * h + b` -> chunks of 16 or 64 steps loaded as tiles and combined by `tl.associative_scan`, the state carried between chunks |
| trim-wrapper-overhead       | host | the wrapper without `torch.cuda.synchronize()`, printing and logging; outputs a kernel writes made with `torch.empty*` instead of `zeros*` (no atomics in the module) |
| fit-tile-to-extent          | fit | a program axis `start + tl.arange(0, BLOCK)` whose mask bounds it by a smaller extent M -> `BLOCK = min(BLOCK, next_power_of_2(M))` at launch, and (second variant) the lanes freed given to the block the loop steps by |
| fold-wrapper-work           | fold | `T = X * S` / `X / S` / `X.clone()` in the wrapper, T reaching one read-only kernel argument through layout steps -> the kernel scales the tiles it loads (`T = X.to(result dtype)`), the clone dropped |
| fold-output-reduction       | reduce_output | `T.sum()` / `T.mean()` / `torch.norm(T)` (whole tensor) after the one launch that stores T at `pid * BLOCK + arange` under `< T.numel()` -> each program stores its partial (its sum, its sum x programs / numel, its sqrt of squares) to an fp32 buffer and the same call reduces the partials, cast to the dtype it gave |
| fuse-matmul-epilogue        | matmul_epilogue | `C = torch.matmul/mm/tensordot(A, B)` or `A @ B` in the wrapper, C read only by one launch of a straight-line elementwise kernel (load C at `pid * BLOCK + arange` under `< C.numel()`, a tail of elementwise math, one store at the same offsets) -> one Triton GEMM whose epilogue is that tail, taken at run time for 2-D floating operands up to 256^3, 512^3 or 1024^3 (one variant each; the call as written above), the product rounded to its dtype first and fp32 accumulated in IEEE unless torch allows TF32 |
| grouped-program-order       | grouped_order | a dot kernel reading `tl.program_id(0)` and `(1)` -> both replaced by the program's coordinates in a grouped launch order (the matmul tutorial's map from the launch position, a bijection of the grid: G = 8, 4, 16 tiles along axis 1 before a step along axis 0) |
| divisibility-hints          | hints | the strides and mask bounds among a kernel's runtime ints -> `P = P // d * d` under a constexpr flag each launch sets to the multiple of 8 or 4 its value really is (Triton specializes only 16); and `pid * BLOCK + tl.arange(0, BLOCK)` wrapped in tl.multiple_of / tl.max_contiguous |
| persistent-kernel           | persistent, persistent_dot | a 1-D grid `(G,)` -> a loop over the G tiles on at most 1, 2 or 4 programs per SM; a dot kernel on a 2-D grid of output tiles -> one program per SM walking the tiles (counted from its row and column masks) in launch order, the tile loop flattened into the K loop, operand tiles through TMA descriptors made once per program (dispatched on TMA's rules), with and without warp_specialize |
| split-work-over-programs    | split, fill | a reduction loop on a grid too small for the SMs -> a second grid axis taking every n-th step, partials `tl.atomic_add`ed into a zeroed output, split sized at launch; a masked program axis `pid * BLOCK + tl.arange(0, BLOCK)` whose grid follows BLOCK -> BLOCK halved at launch (not below a floor of 32 / 16 / 8) while the grid runs fewer than 2 programs per SM, num_warps scaled with it |
| rows-per-program            | rows | one row per program (`row = tl.program_id(0)`, a 1-D lane tile) -> a [ROWS, BLOCK] tile of consecutive rows: reductions over axis 1 with keep_dims, accesses masked by the row count, grid axis 0 divided by ROWS; the lanes fitted to the row at launch where they can be (ROWS = 1, 2, 4 x the written block over the fitted one), else 2, 4, 8 rows |
| chunked-row-loop            | rowloop | a whole-row tile that reduces (`cols = tl.arange(0, BLOCK)`, BLOCK the row's power of two) -> each reduction a loop over chunks of 2048-8192 columns carrying it (the first chunk peeled, reductions known at the same point sharing a loop, a sum of exp(x - m) beside the max m of the same x an online sum, a cumsum / cumprod joined to the prefix the earlier chunks carried), the tile stores in a last loop; rows of one chunk compile the kernel as written |
| contiguous-innermost-axis   | coalesce | lanes stepping by a stride while the program index is the unit-stride one (`tl.load(X + rows * stride + col)`, `col = tl.program_id(0)`) -> the rows-per-program tile with 8, 16 or 32 consecutive program indices across it, so the coalescer runs threads along them |
| split-row-tile              | rowsplit | an elementwise kernel whose tile is the whole row (`tl.arange(0, BLOCK)`, BLOCK used nowhere else) -> chunks of 1024-4096 columns on a second grid axis, num_warps for the chunk; bit-identical |
| split-kv-online-softmax     | splitkv | an online-softmax key loop (running max, sums rescaled to it) on a grid too small for the SMs -> a second grid axis of partial programs writing (m, sums) to an fp32 workspace, and a merge launch rescaling them to the largest m (log-sum-exp) before the kernel's own code after the loop; split sized at launch |
| tensor-descriptors-tma      | tma | dot-loop tile loads -> `tl.make_tensor_descriptor(...).load`, dispatched where TMA's rules hold |
| dot-input-precision-tf32    | keywords | `input_precision="ieee"` -> "tf32" where the task's fp32 tolerance admits it, else "tf32x3" |
| fp32-accumulation           | precision | `tl.sum(x)` / `tl.cumsum(x)` / `x.sum()` at the lines the IR shows adding in bf16/fp16 -> the operand widened with `.to(tl.float32)` (declines without those lines: the source cannot tell a bf16 operand from an integer one) |
| int32-offsets               | offsets | each `E.to(tl.int64)` in a launched kernel -> `(E.to(tl.int64) if _KB_INT64 else E.to(tl.int32))`, the constexpr flag set per launch by `_kb_int64(<its arguments>)`: 0 (int32) only where every tensor's strides reach fewer than 2**30 elements and every int is below 2**30, else the casts as written |
| relaxed-atomics             | atomics | `sem="relaxed"` on accumulating atomics that name no ordering, where every atomic in the module discards its result and nothing synchronizes through memory (no compare-and-swap, exchange or volatile load) |
| eviction-hints              | eviction | in a kernel without `tl.dot` that streams one operand (its address over every program axis, loaded at one site) past one every program re-reads (its address over none) -> `eviction_policy="evict_first"` on the first, `"evict_last"` on the second; both, or either alone |
| exp2-fast-math              | exp2 | `tl.exp(d)` -> `tl.exp2(d)` with log2(e) folded into the scalar factor of the scores `d` is built from (an online softmax's `dot * scale`), where everything between commutes with a scale; and `tl.exp(x)` -> `tl.exp2(x * log2(e))` at each call |
"""

from __future__ import annotations

from typing import Any

from diagnose.rewriters import (  # noqa: F401 - register
    accumulate,
    atomics,
    causal,
    coalesce,
    eviction,
    exp2,
    fill,
    fit,
    fold,
    grouped_order,
    hints,
    host,
    keywords,
    launch,
    matmul_epilogue,
    offsets,
    peel,
    persistent,
    pipelining,
    precision,
    reduce_output,
    rowloop,
    rows,
    rowsplit,
    scan,
    split,
    splitkv,
    tail,
    tiles,
    tma,
    vectorize,
)
from diagnose.rewriters.base import REWRITERS, Rewriter, Variant, unified_diff
from diagnose.rewriters.tiles import dot_tile_autotune, dot_tile_configs

__all__ = ["REWRITERS", "Rewriter", "Variant", "dot_tile_autotune", "dot_tile_configs", "rewrite", "unified_diff"]


def rewrite(pattern_id: str, source: str, context: dict[str, Any]) -> list[Variant]:
    """Variants of `source` under the pattern's rewrite; [] when it has no rewriter or does not apply."""
    rewriter = REWRITERS.get(pattern_id)
    if rewriter is None:
        return []
    return [v for v in rewriter(source, context) if v.source != source]
