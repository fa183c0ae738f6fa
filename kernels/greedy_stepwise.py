"""The greedy one step at a time, two launches per step over the whole ragged batch.

``pivot_direction_kernel`` (one program per session) picks the pivot and grows the
explicit d-space basis by block Gram-Schmidt (twice); ``residual_update_kernel`` (one program
per row tile of a session, from a host plan) applies ``r_i <- r_i - (q^T x_hat_i)^2`` and stores its tile's
residual sum, which the next pivot launch adds up in a fixed order (no atomics: the same bits on every run).
Long sessions get many programs per step, which the one-program-per-session kernels cannot
give them. The squared norm of the pivot's orthogonal component is its exact residual: it replaces a
near-dependent pivot's downdated one (``pivot.choose_exact``).
"""

import numpy as np
import torch
import triton
import triton.language as tl

from .launch import session_blocks, upload
from .pivot import adds_direction, choose_exact, downdate_rows, normalise, session_scalars


@triton.jit(do_not_specialize=["width"])
def pivot_direction_kernel(
    x_ptr, inv_norm_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr, candidate_ptr, tau_ptr,
    capacity_ptr, residuals_ptr, exact_ptr, residual_sum_ptr, tile_offsets_ptr, tile_sums_ptr, basis_ptr,
    basis_offsets_ptr, adding_ptr, running_ptr, directions_ptr, indices_ptr, counts_ptr, eps, d, stride_x, width,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Session ``program_id(0)``: record its next pivot and, if independent, append its direction to the basis;
    ``exact_ptr`` holds each residual when last computed from its row. After a step that added a direction the
    session's residual sum is that of its row tiles' sums (`residual_update_kernel`), in tile order."""
    s = tl.program_id(0)
    updated = tl.load(adding_ptr + s) != 0
    tl.store(adding_ptr + s, tl.zeros([], tl.int8))
    if tl.load(running_ptr + s) != 0:
        start, n, p_start, num_protected, tau, capacity = session_scalars(s, offsets_ptr, protected_offsets_ptr,
                                                                          tau_ptr, capacity_ptr)
        residual_sum = tl.load(residual_sum_ptr + s)
        if updated:
            residual_sum = tile_sum(tile_sums_ptr, tl.load(tile_offsets_ptr + s), tl.load(tile_offsets_ptr + s + 1),
                                    BLOCK_N)
        t = tl.load(counts_ptr + s).to(tl.int32)
        directions = tl.load(directions_ptr + s)
        basis = basis_ptr + tl.load(basis_offsets_ptr + s)
        pivot, stopped, r_exact, residual_sum = choose_exact(
            x_ptr, inv_norm_ptr, residuals_ptr, exact_ptr, candidate_ptr, protected_idx_ptr + p_start, basis, start, n,
            t, num_protected, capacity, tau, eps, residual_sum, directions, d, stride_x, BLOCK_N, BLOCK_D)
        tl.store(residual_sum_ptr + s, residual_sum)
        if stopped:
            tl.store(running_ptr + s, tl.zeros([], tl.int8))
        else:
            tl.store(indices_ptr + s.to(tl.int64) * width + t, pivot.to(tl.int64))
            tl.store(counts_ptr + s, (t + 1).to(tl.int64))
            tl.store(candidate_ptr + start + pivot, tl.zeros([], tl.int8))
            if adds_direction(r_exact, eps):
                normalise(basis + directions * d, r_exact, d, BLOCK_D)
                tl.store(directions_ptr + s, directions + 1)
                tl.store(adding_ptr + s, tl.full([], 1, tl.int8))


@triton.jit
def tile_sum(tile_sums_ptr, first, stop, BLOCK_N: tl.constexpr):
    """The sum of ``tile_sums[first:stop]``, in the same order on every run (the residual update's tiles run in
    any order; an atomic sum of their parts would round differently from one run to the next)."""
    tiles = tl.arange(0, BLOCK_N)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(first, stop, BLOCK_N):
        total += tl.load(tile_sums_ptr + c0 + tiles, mask=c0 + tiles < stop, other=0.0)
    return tl.sum(total, axis=0)


@triton.jit
def residual_update_kernel(x_ptr, inv_norm_ptr, offsets_ptr, tile_session_ptr, tile_start_ptr, tile_offsets_ptr,
                           residuals_ptr, tile_sums_ptr, basis_ptr, basis_offsets_ptr, adding_ptr, directions_ptr, d,
                           stride_x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One tile of one session's rows: ``r_i -= (q^T x_hat_i)^2`` with ``q`` the session's newest direction, and
    the sum of the tile's new residuals stored in the session's slot for that tile (its place in the session,
    whichever program runs it)."""
    pid = tl.program_id(0)
    s = tl.load(tile_session_ptr + pid)
    if tl.load(adding_ptr + s) != 0:
        start = tl.load(offsets_ptr + s)
        n = (tl.load(offsets_ptr + s + 1) - start).to(tl.int32)
        first = tl.load(tile_start_ptr + pid)
        local = first + tl.arange(0, BLOCK_N)
        q_ptr = basis_ptr + tl.load(basis_offsets_ptr + s) + (tl.load(directions_ptr + s) - 1) * d
        tl.store(tile_sums_ptr + tl.load(tile_offsets_ptr + s) + first // BLOCK_N,
                 downdate_rows(x_ptr, inv_norm_ptr, residuals_ptr, start, local, local < n, q_ptr, d, stride_x,
                               BLOCK_N, BLOCK_D))


def row_tiles(lengths: np.ndarray, block_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host plan: every session's row tiles, as (tile_session, first row of the tile in its session) int32, in
    any order, and (S + 1,) int64 offsets of each session's tiles in tile order (``tile_offsets[s] + first //
    block_n`` is a tile's slot)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    tiles = -(-lengths // block_n)
    tile_offsets = np.concatenate([[0], np.cumsum(tiles)])
    tile_session = np.repeat(np.arange(len(lengths), dtype=np.int32), tiles)
    tile_start = (np.arange(len(tile_session)) - tile_offsets[tile_session]) * block_n
    return tile_session, tile_start.astype(np.int32), tile_offsets


def greedy_stepwise(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, lengths: np.ndarray,
                    protected_idx: torch.Tensor, protected_offsets: torch.Tensor, candidate: torch.Tensor,
                    tau: torch.Tensor, capacity: torch.Tensor, eps: float, width: int, capacities: np.ndarray,
                    block_n: int = 128, block_d: int = 16, pivot_block_d: int = 128):
    """2 launches per step, ``width`` steps, then one pivot launch that only sums the last step's tiles (every
    session stops there); no host synchronisation; same returns as `greedy_fused`, bit for bit the same from run to
    run.

    ``block_d`` is the X tile's width in the residual update, ``pivot_block_d`` the chunk of the pivot
    kernel's one-dimensional loops over d (MGS against the basis); each session's basis holds its capacity
    (``capacities``, on the host) rows of d."""
    sessions = offsets.numel() - 1
    rows, d = x.shape
    device = x.device
    basis_offsets, basis_values = session_blocks(capacities, d)
    tile_session, tile_start, tile_offsets, basis_offsets, residual_sum = upload(
        device, *row_tiles(lengths, block_n), basis_offsets, np.asarray(lengths, dtype=np.float32))
    lengths_t = residual_sum.clone()
    residuals = torch.ones(rows, dtype=torch.float32, device=device)
    exact = torch.ones(rows, dtype=torch.float32, device=device)
    tile_sums = torch.empty(len(tile_session), dtype=torch.float32, device=device)
    basis = torch.empty(max(basis_values, 1), dtype=torch.float32, device=device)
    adding = torch.zeros(sessions, dtype=torch.int8, device=device)
    running = torch.ones(sessions, dtype=torch.int8, device=device)
    directions = torch.zeros(sessions, dtype=torch.int32, device=device)
    indices = torch.full((sessions, width), -1, dtype=torch.int64, device=device)
    counts = torch.zeros(sessions, dtype=torch.int64, device=device)
    for step in range(width + 1):
        pivot_direction_kernel[(sessions,)](
            x, inv_norm, offsets, protected_idx, protected_offsets, candidate, tau, capacity, residuals, exact,
            residual_sum, tile_offsets, tile_sums, basis, basis_offsets, adding, running, directions, indices, counts,
            eps, d, x.stride(0), width, BLOCK_N=block_n, BLOCK_D=pivot_block_d,
        )
        if step < width:
            residual_update_kernel[(len(tile_session),)](
                x, inv_norm, offsets, tile_session, tile_start, tile_offsets, residuals, tile_sums, basis,
                basis_offsets, adding, directions, d, x.stride(0), BLOCK_N=block_n, BLOCK_D=block_d,
            )
    coverage = 1.0 - residual_sum / lengths_t
    return indices, counts, coverage, residuals
