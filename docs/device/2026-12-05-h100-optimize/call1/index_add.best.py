"""kernel-kb optimize: best kernel of run index_add (task index_add).

Round 2 (parent round 1): parallelism.masked-lanes -> pattern rows-per-program (pattern); diagnosed at L1; evidence E3 in round-002.diagnosis.md.
The rewrite makes true: the masks of the tile are true for most lanes at this launch, each program holding ROWS rows of the row's own width
Geomean speedup over its parent: 1.062x. History: kb rounds show /tmp/opt/index_add
"""
import torch
import triton
import triton.language as tl


@triton.jit
def index_add_kernel(src_ptr, idx_ptr, out_ptr, dim, stride_src, stride_out, BLOCK: tl.constexpr, _kb_n_rows = 1, _KB_ROWS: tl.constexpr = 1):
    # rows per program: this program's rows, each computed as a program computed its one row
    _kb_row = tl.program_id(0) * _KB_ROWS + tl.arange(0, _KB_ROWS)[:, None]
    _kb_row_ok = _kb_row < _kb_n_rows
    row = _kb_row
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = cols < dim
    dst = tl.load(idx_ptr + row, mask=_kb_row_ok)
    vec = tl.load(src_ptr + row * stride_src + cols, mask=mask & _kb_row_ok)
    tl.atomic_add(out_ptr + dst * stride_out + cols, vec, mask=mask & _kb_row_ok, sem="relaxed")


def index_add(src, idx, bins):
    k, dim = src.shape
    out = torch.zeros((bins, dim), dtype=src.dtype, device=src.device)
    kb_rows = k
    kb_row_block = min(1024, triton.next_power_of_2(max(1, dim)))  # the lanes fitted to the row, the lanes freed given to more rows
    kb_rows_per_program = max(1, min(1 * 1024, max(1024, 8192)) // kb_row_block)
    index_add_kernel[(triton.cdiv(kb_rows, kb_rows_per_program), triton.cdiv(dim, 1024))](src, idx, out, dim, src.stride(0), out.stride(0), BLOCK=kb_row_block, _kb_n_rows=kb_rows, _KB_ROWS=kb_rows_per_program)
    return out
