"""kernel-kb optimize: best kernel of run column_scan (task column_scan).

Round 1 (parent round 0): parallelism.grid-underfilled -> pattern split-work-over-programs (pattern); diagnosed at L1; evidence E4 in round-001.diagnosis.md.
The rewrite makes true: the launch's grid has at least one program per SM (better, several), each with enough independent work
Geomean speedup over its parent: 1.879x. History: kb rounds show /tmp/opt/column_scan
"""
"""A linear recurrence over time, h[t] = a * h[t-1] + x[t], one program per block of columns: at 1024
columns and BLOCK=128 the grid is 8 programs, each walking all T rows in sequence."""

import torch
import triton
import triton.language as tl


@triton.jit
def _scan(X, H, T, D, a, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    h = tl.zeros((BLOCK,), dtype=tl.float32)
    for t in tl.range(0, T, num_stages=3):
        x = tl.load(X + t * D + cols, mask=mask, other=0.0)
        h = a * h + x
        tl.store(H + t * D + cols, h, mask=mask)


def _kb_fill_block(block, programs, floor, target):
    """The block halved while the grid `programs(block)` runs fewer than `target` programs and the block is
    above `floor`: more, smaller programs for a grid too short for the device; a full grid keeps `block`."""
    while block > floor and programs(block) < target:
        block //= 2
    return block


def scan(x, a=0.9, block=128):
    T, D = x.shape
    h = torch.empty_like(x)
    # fill the grid: the block halved (not below 8) until 2 programs per SM; a full grid keeps it
    _kb_sm_count = (torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
                    if torch.cuda.is_available() else 132)
    _kb_written = block
    _kb_block = _kb_fill_block(_kb_written, lambda _kb_b: triton.cdiv(D, _kb_b), 8, 2 * _kb_sm_count)
    _scan[(triton.cdiv(D, _kb_block),)](x, h, T, D, a, BLOCK=_kb_block, num_warps=max(1, 4 * _kb_block // _kb_written))
    return h
