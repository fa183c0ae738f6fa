"""The whole greedy selection of every session in one launch (one program per session).

Pivoted partial Cholesky of each session's Gram matrix: adding pivot j computes
``e = (G[j, :] - C[:, j]^T C) / sqrt(r_j)`` (``C`` the stored projections of earlier
directions, read BLOCK_W directions a load), then ``r -= e**2``. ``G[j, :]`` is either
recomputed as ``X_hat x_hat_j`` (a pass over X per direction, O(n d b)) or read from a
precomputed Gram matrix (``FROM_GRAM``, O(n b^2) after one O(n^2 d) GEMM). Accumulation is
fp32 whatever the input dtype. A session whose pivot is near-dependent (``pivot.NEAR_DEPENDENCE``) stops there
with count -1: ``greedy_exact`` selects it again.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from .launch import greedy_outputs, session_blocks, upload
from .pivot import (
    NEAR_DEPENDENCE,
    adds_direction,
    coverage_of,
    gram_row_chunk,
    inverse_sqrt,
    pick_pivot,
    session_scalars,
    should_stop,
)


@triton.jit(do_not_specialize=["width"])
def greedy_fused_kernel(
    x_ptr, inv_norm_ptr, gram_ptr, gram_offsets_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr,
    candidate_ptr, tau_ptr, capacity_ptr, residuals_ptr, coords_ptr, coord_offsets_ptr, indices_ptr, counts_ptr,
    coverage_ptr, eps, d, stride_x, width,
    FROM_GRAM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """One program runs session ``program_id(0)`` from protected seeding to its stop."""
    s = tl.program_id(0)
    start, n, p_start, num_protected, tau, capacity = session_scalars(s, offsets_ptr, protected_offsets_ptr,
                                                                      tau_ptr, capacity_ptr)
    gram_ptr += tl.load(gram_offsets_ptr + s)
    rows = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, BLOCK_W)

    for c0 in range(0, n, BLOCK_N):
        tl.store(residuals_ptr + start + c0 + rows, tl.full([BLOCK_N], 1.0, tl.float32), mask=c0 + rows < n)

    t = 0
    coords_ptr += tl.load(coord_offsets_ptr + s)  # the session's C: capacity x n, one row of n a direction
    directions = 0  # offsets inside C are int32 (greedy_fused checks capacity x n < 2^31)
    coverage = 0.0
    running = 1
    while running != 0:
        # Every value a step reads from global memory that another thread of this program wrote (the residuals
        # and flags pick_pivot scans, the scalar r_pivot, the coordinates C in another layout) was written before
        # this point: by the initialisation above or by an earlier step. One barrier here orders them all, whatever
        # the tiles (rows of a tile narrower than the program's threads are stored by some lanes, read by all).
        tl.debug_barrier()
        pivot, forced, best = pick_pivot(residuals_ptr, candidate_ptr, protected_idx_ptr + p_start, start, n, t,
                                         num_protected, BLOCK_N)
        r_pivot = tl.load(residuals_ptr + start + pivot)
        if should_stop(forced, best, t, capacity, coverage, tau, eps):
            running = 0
        elif r_pivot < NEAR_DEPENDENCE:  # near-dependent: greedy_exact selects this session again
            running = 0
            t = -1
        else:
            tl.store(indices_ptr + s.to(tl.int64) * width + t, pivot.to(tl.int64))
            tl.store(candidate_ptr + start + pivot, tl.zeros([], tl.int8))
            t += 1
            if adds_direction(r_pivot, eps):
                inv_pivot = inverse_sqrt(r_pivot)
                residual_sum = 0.0
                for c0 in range(0, n, BLOCK_N):
                    m = c0 + rows < n
                    g = gram_row_chunk(x_ptr, inv_norm_ptr, gram_ptr, start, n, pivot, c0, d, stride_x,
                                       FROM_GRAM, BLOCK_N, BLOCK_D)
                    for k0 in range(0, directions, BLOCK_W):  # C[:, pivot]^T C[:, chunk], BLOCK_W directions a load
                        ks = k0 + slots
                        live = ks < directions
                        coord_rows = coords_ptr + ks * n
                        c_pivot = tl.load(coord_rows + pivot, mask=live, other=0.0)
                        c_chunk = tl.load(coord_rows[:, None] + c0 + rows[None, :], mask=live[:, None] & m[None, :],
                                          other=0.0)
                        g -= tl.sum(c_pivot[:, None] * c_chunk, axis=0)
                    e = g * inv_pivot
                    tl.store(coords_ptr + directions * n + c0 + rows, e, mask=m)
                    r = tl.load(residuals_ptr + start + c0 + rows, mask=m, other=0.0)
                    r = tl.maximum(r - e * e, 0.0)
                    tl.store(residuals_ptr + start + c0 + rows, r, mask=m)
                    residual_sum += tl.sum(tl.where(m, r, 0.0), axis=0)
                directions += 1
                coverage = coverage_of(residual_sum, n)
    tl.store(counts_ptr + s, t.to(tl.int64))
    tl.store(coverage_ptr + s, coverage)


def greedy_fused(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, protected_idx: torch.Tensor,
                 protected_offsets: torch.Tensor, candidate: torch.Tensor, tau: torch.Tensor,
                 capacity: torch.Tensor, eps: float, width: int, lengths: np.ndarray, capacities: np.ndarray,
                 gram: torch.Tensor | None = None, gram_offsets: torch.Tensor | None = None, block_n: int = 128,
                 block_d: int = 16, block_w: int = 16):
    """Launch one program per session; returns (indices (S, width) -1 padded, counts, coverage, residuals).

    ``candidate`` (int8, one per row) is consumed. With ``gram``/``gram_offsets`` the Gram rows
    are read from the packed per-session matrices instead of recomputed from ``x``. Earlier
    directions are subtracted ``block_w`` at a time (one load of their coordinates each), from C, capacity x n
    fp32 a session (``lengths`` and ``capacities``: the rows and capacities, on the host).
    """
    if np.any(np.asarray(capacities, dtype=np.int64) * np.asarray(lengths, dtype=np.int64) >= 2 ** 31):
        raise ValueError("the fused greedy takes sessions of capacity x rows < 2^31 (its offsets inside a session's "
                         "coordinates are int32); run them on path='stepwise'")
    sessions = offsets.numel() - 1
    rows, d = x.shape
    device = x.device
    from_gram = gram is not None
    residuals, indices, counts, coverage, gram, gram_offsets = greedy_outputs(sessions, rows, width, device, gram,
                                                                              gram_offsets)
    coord_offsets, coord_values = session_blocks(capacities, lengths)
    coord_offsets, = upload(device, coord_offsets)
    coords = torch.empty(max(coord_values, 1), dtype=torch.float32, device=device)
    greedy_fused_kernel[(sessions,)](
        x, inv_norm, gram, gram_offsets, offsets, protected_idx, protected_offsets, candidate, tau, capacity,
        residuals, coords, coord_offsets, indices, counts, coverage, eps, d, x.stride(0), width,
        FROM_GRAM=from_gram, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_W=block_w,
    )
    return indices, counts, coverage, residuals
