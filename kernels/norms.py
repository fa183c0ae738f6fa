"""The rows' inverse norms on the device, and flags for the rows that cannot be normalised, which the host reads once a
call (the selection then raises; `gemkernels.select.api`).

The squared norms come from one pass over X, or, after ``gram.ragged_gram``, from the diagonals of the Gram matrices
(no pass over X of their own). A session with a bad row is flagged too: the greedy launched after this gets no
steps for it beyond its protected ones (the triton backend sets its capacity to 0), so NaN or inf in its rows cannot
keep a kernel looping.
"""

import torch
import triton
import triton.language as tl

from .pivot import inverse_norms, squared_norms


@triton.jit
def row_norms_kernel(x_ptr, gram_ptr, gram_offsets_ptr, offsets_ptr, tile_session_ptr, tile_start_ptr, inv_norm_ptr,
                     bad_rows_ptr, bad_sessions_ptr, d, stride_x, FROM_GRAM: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """One row tile of one session (a host plan's): ``1 / ||x_i||`` (0 for a bad row), each row's bad flag, and the
    session's, stored only where it is set (every program that stores it stores 1: no atomics)."""
    pid = tl.program_id(0)
    s = tl.load(tile_session_ptr + pid)
    start = tl.load(offsets_ptr + s)
    n = (tl.load(offsets_ptr + s + 1) - start).to(tl.int32)
    local = tl.load(tile_start_ptr + pid) + tl.arange(0, BLOCK_N)
    m = local < n
    if FROM_GRAM:  # G[i, i] of the session's row-major n x n matrix
        sq = tl.load(gram_ptr + tl.load(gram_offsets_ptr + s) + local.to(tl.int64) * (n + 1), mask=m, other=1.0)
    else:
        sq = squared_norms(x_ptr, start, local, m, d, stride_x, BLOCK_N, BLOCK_D)
    inv, bad = inverse_norms(sq, m)
    tl.store(inv_norm_ptr + start + local, inv, mask=m)
    tl.store(bad_rows_ptr + start + local, bad.to(tl.int8), mask=m)
    if tl.max(bad.to(tl.int32), axis=0) != 0:
        tl.store(bad_sessions_ptr + s, tl.full([], 1, tl.int8))


def row_norms(x: torch.Tensor, offsets: torch.Tensor, tile_session: torch.Tensor, tile_start: torch.Tensor,
              gram: torch.Tensor | None = None, gram_offsets: torch.Tensor | None = None, block_n: int = 128,
              block_d: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1 / ||x_i|| (rows,) fp32, bad rows (rows,) int8, bad sessions (S,) int8) for the row tiles of ``block_n``
    rows in ``tile_session``/``tile_start`` (``greedy_stepwise.row_tiles``), the squared norms from X in
    ``block_n`` x ``block_d`` tiles, or from the diagonals of ``gram`` (``gram_offsets``: as `gram.ragged_gram`
    returns them)."""
    rows, d = x.shape
    device = x.device
    inv_norm = torch.empty(rows, dtype=torch.float32, device=device)
    bad_rows = torch.empty(rows, dtype=torch.int8, device=device)
    bad_sessions = torch.zeros(offsets.numel() - 1, dtype=torch.int8, device=device)
    from_gram = gram is not None
    row_norms_kernel[(tile_session.numel(),)](
        x, gram if from_gram else inv_norm, gram_offsets if from_gram else offsets, offsets, tile_session, tile_start,
        inv_norm, bad_rows, bad_sessions, d, x.stride(0), FROM_GRAM=from_gram, BLOCK_N=block_n, BLOCK_D=block_d,
    )
    return inv_norm, bad_rows, bad_sessions

