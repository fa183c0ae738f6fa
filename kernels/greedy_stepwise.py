"""The greedy one step at a time, two launches per step over the whole ragged batch.

``pivot_direction_kernel`` (one program per session) picks the pivot and grows the
explicit d-space basis by modified Gram-Schmidt; ``residual_update_kernel`` (one program
per tile of packed rows, whatever session they belong to) applies
``r_i <- r_i - (q^T x_hat_i)^2``. Long sessions get many programs per step, which the
fused one-program-per-session kernel cannot give them.
"""

import torch
import triton
import triton.language as tl

from .pivot import pick_pivot, should_stop


@triton.jit
def pivot_direction_kernel(
    x_ptr, inv_norm_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr, candidate_ptr, tau_ptr,
    capacity_ptr, residuals_ptr, residual_sum_ptr, basis_ptr, adding_ptr, running_ptr, directions_ptr,
    indices_ptr, counts_ptr, eps, d, stride_x, width,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Session ``program_id(0)``: record its next pivot and, if independent, append its MGS direction."""
    s = tl.program_id(0)
    tl.store(adding_ptr + s, tl.zeros([], tl.int8))
    if tl.load(running_ptr + s) != 0:
        start = tl.load(offsets_ptr + s).to(tl.int32)
        n = tl.load(offsets_ptr + s + 1).to(tl.int32) - start
        p_start = tl.load(protected_offsets_ptr + s).to(tl.int32)
        num_protected = tl.load(protected_offsets_ptr + s + 1).to(tl.int32) - p_start
        t = tl.load(counts_ptr + s).to(tl.int32)
        coverage = 1.0 - tl.load(residual_sum_ptr + s) / n
        pivot, forced, best = pick_pivot(residuals_ptr, candidate_ptr, protected_idx_ptr + p_start, start, n, t,
                                         num_protected, BLOCK_N)
        if should_stop(forced, best, t, tl.load(capacity_ptr + s), coverage, tl.load(tau_ptr + s), eps):
            tl.store(running_ptr + s, tl.zeros([], tl.int8))
        else:
            tl.store(indices_ptr + s.to(tl.int64) * width + t, pivot.to(tl.int64))
            tl.store(counts_ptr + s, (t + 1).to(tl.int64))
            tl.store(candidate_ptr + start + pivot, tl.zeros([], tl.int8))
            if tl.load(residuals_ptr + start + pivot) > eps:
                directions = tl.load(directions_ptr + s)
                cols = tl.arange(0, BLOCK_D)
                basis = basis_ptr + s.to(tl.int64) * width * d
                q_ptr = basis + directions * d
                scale = tl.load(inv_norm_ptr + start + pivot)
                pivot_ptr = x_ptr + (start + pivot).to(tl.int64) * stride_x
                for d0 in range(0, d, BLOCK_D):
                    cm = d0 + cols < d
                    v = tl.load(pivot_ptr + d0 + cols, mask=cm, other=0.0).to(tl.float32) * scale
                    tl.store(q_ptr + d0 + cols, v, mask=cm)
                for k in range(0, directions):
                    dot = 0.0
                    for d0 in range(0, d, BLOCK_D):
                        cm = d0 + cols < d
                        qk = tl.load(basis + k * d + d0 + cols, mask=cm, other=0.0)
                        dot += tl.sum(qk * tl.load(q_ptr + d0 + cols, mask=cm, other=0.0), axis=0)
                    for d0 in range(0, d, BLOCK_D):
                        cm = d0 + cols < d
                        qk = tl.load(basis + k * d + d0 + cols, mask=cm, other=0.0)
                        v = tl.load(q_ptr + d0 + cols, mask=cm, other=0.0)
                        tl.store(q_ptr + d0 + cols, v - dot * qk, mask=cm)
                norm_sq = 0.0
                for d0 in range(0, d, BLOCK_D):
                    v = tl.load(q_ptr + d0 + cols, mask=d0 + cols < d, other=0.0)
                    norm_sq += tl.sum(v * v, axis=0)
                inv = 1.0 / tl.sqrt(norm_sq)
                for d0 in range(0, d, BLOCK_D):
                    cm = d0 + cols < d
                    tl.store(q_ptr + d0 + cols, tl.load(q_ptr + d0 + cols, mask=cm, other=0.0) * inv, mask=cm)
                tl.store(directions_ptr + s, directions + 1)
                tl.store(adding_ptr + s, tl.full([], 1, tl.int8))


@triton.jit
def residual_update_kernel(x_ptr, inv_norm_ptr, row_session_ptr, residuals_ptr, residual_sum_ptr, basis_ptr,
                           adding_ptr, directions_ptr, total_rows, d, stride_x, width,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows of one packed tile: ``r_i -= (q_s^T x_hat_i)^2`` with ``q_s`` the newest direction of row i's session."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = rows < total_rows
    session = tl.load(row_session_ptr + rows, mask=m, other=0)
    m = m & (tl.load(adding_ptr + session, mask=m, other=0) != 0)
    newest = tl.load(directions_ptr + session, mask=m, other=1) - 1
    q_rows = basis_ptr + (session.to(tl.int64) * width + newest) * d
    x_rows = x_ptr + rows.to(tl.int64) * stride_x
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for d0 in range(0, d, BLOCK_D):
        mm = m[:, None] & (d0 + cols < d)[None, :]
        xt = tl.load(x_rows[:, None] + d0 + cols[None, :], mask=mm, other=0.0).to(tl.float32)
        qt = tl.load(q_rows[:, None] + d0 + cols[None, :], mask=mm, other=0.0)
        acc += tl.sum(xt * qt, axis=1)
    e = acc * tl.load(inv_norm_ptr + rows, mask=m, other=0.0)
    r = tl.load(residuals_ptr + rows, mask=m, other=0.0)
    r_new = tl.maximum(r - e * e, 0.0)
    tl.store(residuals_ptr + rows, r_new, mask=m)
    tl.atomic_add(residual_sum_ptr + session, r_new - r, mask=m)


def greedy_stepwise(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, row_session: torch.Tensor,
                    protected_idx: torch.Tensor, protected_offsets: torch.Tensor, candidate: torch.Tensor,
                    tau: torch.Tensor, capacity: torch.Tensor, eps: float, width: int, lengths: torch.Tensor,
                    block_n: int = 128, block_d: int = 64):
    """2 launches per step, ``width`` steps, no host synchronisation; same returns as `greedy_fused`."""
    sessions = offsets.numel() - 1
    rows, d = x.shape
    device = x.device
    residuals = torch.ones(rows, dtype=torch.float32, device=device)
    residual_sum = lengths.to(torch.float32)
    basis = torch.empty(sessions * max(width, 1) * d, dtype=torch.float32, device=device)
    adding = torch.zeros(sessions, dtype=torch.int8, device=device)
    running = torch.ones(sessions, dtype=torch.int8, device=device)
    directions = torch.zeros(sessions, dtype=torch.int32, device=device)
    indices = torch.full((sessions, width), -1, dtype=torch.int64, device=device)
    counts = torch.zeros(sessions, dtype=torch.int64, device=device)
    for _ in range(width):
        pivot_direction_kernel[(sessions,)](
            x, inv_norm, offsets, protected_idx, protected_offsets, candidate, tau, capacity, residuals,
            residual_sum, basis, adding, running, directions, indices, counts, eps, d, x.stride(0), width,
            BLOCK_N=block_n, BLOCK_D=block_d,
        )
        residual_update_kernel[(triton.cdiv(rows, block_n),)](
            x, inv_norm, row_session, residuals, residual_sum, basis, adding, directions, rows, d, x.stride(0),
            width, BLOCK_N=block_n, BLOCK_D=block_d,
        )
    coverage = 1.0 - residual_sum / lengths
    return indices, counts, coverage, residuals
