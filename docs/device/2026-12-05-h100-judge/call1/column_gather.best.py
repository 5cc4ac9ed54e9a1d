"""kernel-kb optimize: best kernel of run column_gather (task column_gather).

Round 2 (parent round 1): pipelining.none -> pattern tl-range-pipelining (pattern); diagnosed at L1; evidence E1, E5 in round-002.diagnosis.md.
The rewrite makes true: the loop is an innermost scf.for with tt.num_stages > 1 (tl.range(..., num_stages=N)) whose loads can become async copies of at least 4 bytes
Geomean speedup over its parent: 1.212x. History: kb rounds show /tmp/opt/column_gather
"""
"""Sum of one column per program: lane i reads row i of the column, `stride` elements after lane i-1."""

import torch
import triton
import triton.language as tl


@triton.jit
def _col_sum(X, OUT, rows, stride, BLOCK: tl.constexpr, _kb_n_rows = 1, _KB_ROWS: tl.constexpr = 1):
    # rows per program: this program's rows, each computed as a program computed its one row
    _kb_row = tl.program_id(0) * _KB_ROWS + tl.arange(0, _KB_ROWS)[:, None]
    _kb_row_ok = _kb_row < _kb_n_rows
    col = _kb_row
    acc = tl.zeros([_KB_ROWS, BLOCK], dtype=tl.float32)
    for start in tl.range(0, rows, BLOCK, num_stages=3):
        r = start + tl.arange(0, BLOCK)[None, :]
        acc += tl.load(X + r * stride + col, mask=(r < rows) & _kb_row_ok, other=0.0)
    tl.store(OUT + col, tl.sum(acc, axis=1, keep_dims=True), mask=_kb_row_ok)


def col_sum(x):
    rows, cols = x.shape
    out = torch.empty(cols, dtype=torch.float32, device=x.device)
    kb_rows = cols
    kb_rows_per_program = max(1, min(32, 8192 // 256))
    _col_sum[(triton.cdiv(kb_rows, kb_rows_per_program),)](x, out, rows, x.stride(0), BLOCK=256, _kb_n_rows=kb_rows, _KB_ROWS=kb_rows_per_program)
    return out
