"""The whole greedy selection of every session in one launch (one program per session).

Pivoted partial Cholesky of each session's Gram matrix: adding pivot j computes
``e = (G[j, :] - C[:, j]^T C) / sqrt(r_j)`` (``C`` the stored projections of earlier
directions, read BLOCK_W directions a load), then ``r -= e**2``. ``G[j, :]`` is either
recomputed as ``X_hat x_hat_j`` (a pass over X per direction, O(n d b)) or read from a
precomputed Gram matrix (``FROM_GRAM``, O(n b^2) after one O(n^2 d) GEMM). Accumulation is
fp32 whatever the input dtype. A session whose pivot is near-dependent (``pivot.NEAR_DEPENDENCE``) stops there
with count -1: ``greedy_exact`` selects it again.
"""

import torch
import triton
import triton.language as tl

from .launch import greedy_outputs
from .pivot import NEAR_DEPENDENCE, gram_row_chunk, pick_pivot, session_scalars, should_stop


@triton.jit(do_not_specialize=["total_rows", "width"])
def greedy_fused_kernel(
    x_ptr, inv_norm_ptr, gram_ptr, gram_offsets_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr,
    candidate_ptr, tau_ptr, capacity_ptr, residuals_ptr, coords_ptr, indices_ptr, counts_ptr, coverage_ptr,
    eps, d, stride_x, total_rows, width,
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
    directions = tl.zeros([], dtype=tl.int64)  # int64: directions x total_rows passes 2^31 on big batches
    coverage = 0.0
    running = 1
    while running != 0:
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
            if r_pivot > eps:
                inv_pivot = 1.0 / tl.sqrt(r_pivot)
                residual_sum = 0.0
                for c0 in range(0, n, BLOCK_N):
                    m = c0 + rows < n
                    g = gram_row_chunk(x_ptr, inv_norm_ptr, gram_ptr, start, n, pivot, c0, d, stride_x,
                                       FROM_GRAM, BLOCK_N, BLOCK_D)
                    for k0 in range(0, directions, BLOCK_W):  # C[:, pivot]^T C[:, chunk], BLOCK_W directions a load
                        ks = k0 + slots
                        live = ks < directions
                        coord_rows = coords_ptr + ks * total_rows + start
                        c_pivot = tl.load(coord_rows + pivot, mask=live, other=0.0)
                        c_chunk = tl.load(coord_rows[:, None] + c0 + rows[None, :], mask=live[:, None] & m[None, :],
                                          other=0.0)
                        g -= tl.sum(c_pivot[:, None] * c_chunk, axis=0)
                    e = g * inv_pivot
                    tl.store(coords_ptr + directions * total_rows + start + c0 + rows, e, mask=m)
                    r = tl.load(residuals_ptr + start + c0 + rows, mask=m, other=0.0)
                    r = tl.maximum(r - e * e, 0.0)
                    tl.store(residuals_ptr + start + c0 + rows, r, mask=m)
                    residual_sum += tl.sum(tl.where(m, r, 0.0), axis=0)
                directions += 1
                coverage = 1.0 - residual_sum / n
    tl.store(counts_ptr + s, t.to(tl.int64))
    tl.store(coverage_ptr + s, coverage)


def greedy_fused(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, protected_idx: torch.Tensor,
                 protected_offsets: torch.Tensor, candidate: torch.Tensor, tau: torch.Tensor,
                 capacity: torch.Tensor, eps: float, width: int, gram: torch.Tensor | None = None,
                 gram_offsets: torch.Tensor | None = None, block_n: int = 128, block_d: int = 16,
                 block_w: int = 16):
    """Launch one program per session; returns (indices (S, width) -1 padded, counts, coverage, residuals).

    ``candidate`` (int8, one per row) is consumed. With ``gram``/``gram_offsets`` the Gram rows
    are read from the packed per-session matrices instead of recomputed from ``x``. Earlier
    directions are subtracted ``block_w`` at a time (one load of their coordinates each).
    """
    sessions = offsets.numel() - 1
    rows, d = x.shape
    device = x.device
    from_gram = gram is not None
    residuals, indices, counts, coverage, gram, gram_offsets = greedy_outputs(sessions, rows, width, device, gram,
                                                                              gram_offsets)
    coords = torch.empty(max(width, 1) * rows, dtype=torch.float32, device=device)
    greedy_fused_kernel[(sessions,)](
        x, inv_norm, gram, gram_offsets, offsets, protected_idx, protected_offsets, candidate, tau, capacity,
        residuals, coords, indices, counts, coverage, eps, d, x.stride(0), rows, width,
        FROM_GRAM=from_gram, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_W=block_w,
    )
    return indices, counts, coverage, residuals
