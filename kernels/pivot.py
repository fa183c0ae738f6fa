"""Device helpers shared by the greedy kernels: read a session's scalars, choose its next pivot,
test the stop, read the pivot's Gram row.

``pick_pivot`` reads a session's state from global memory (the fused and stepwise greedies keep
it there; the resident greedy holds it in registers): residuals (fp32, per row), a candidate
flag per row (int8: eligible, not protected, not yet selected), the packed ascending protected
indices; every greedy writes its selection row ``indices[s, :]``.
"""

import triton
import triton.language as tl


@triton.jit
def session_scalars(s, offsets_ptr, protected_offsets_ptr, tau_ptr, capacity_ptr):
    """Session ``s``'s (first row, rows, first protected entry, protected count, tau, capacity)."""
    start = tl.load(offsets_ptr + s).to(tl.int32)
    n = tl.load(offsets_ptr + s + 1).to(tl.int32) - start
    p_start = tl.load(protected_offsets_ptr + s).to(tl.int32)
    num_protected = tl.load(protected_offsets_ptr + s + 1).to(tl.int32) - p_start
    return start, n, p_start, num_protected, tl.load(tau_ptr + s), tl.load(capacity_ptr + s)


@triton.jit
def pick_pivot(residuals_ptr, candidate_ptr, protected_idx_ptr, start, n, t, num_protected,
               BLOCK_N: tl.constexpr):
    """Step ``t``'s pivot: the t-th protected row while any remain, else the candidate with the
    largest residual (ties to the lowest index). Returns (pivot, forced, best candidate residual);
    the best residual is -1 when no candidate is left."""
    rows = tl.arange(0, BLOCK_N)
    best = -1.0
    best_i = 0
    for c0 in range(0, n, BLOCK_N):
        m = c0 + rows < n
        r = tl.load(residuals_ptr + start + c0 + rows, mask=m, other=-1.0)
        cand = tl.load(candidate_ptr + start + c0 + rows, mask=m, other=0)
        score = tl.where(cand != 0, r, -1.0)
        chunk_best = tl.max(score, axis=0)
        chunk_arg = tl.argmax(score, axis=0, tie_break_left=True)
        better = chunk_best > best
        best_i = tl.where(better, c0 + chunk_arg, best_i)
        best = tl.where(better, chunk_best, best)
    forced = t < num_protected
    forced_i = tl.load(protected_idx_ptr + t, mask=forced, other=0)
    pivot = tl.where(forced, forced_i, best_i)
    return pivot, forced, best


@triton.jit
def should_stop(forced, best, t, capacity, coverage, tau, eps):
    """The completion loop's exit test (DESIGN.md §1); protected steps never stop."""
    stop = (t >= capacity) | (coverage >= tau) | (best <= eps)
    return stop & (forced == 0)


@triton.jit
def gram_row_chunk(x_ptr, inv_norm_ptr, gram_ptr, start, n, pivot, c0, d, stride_x,
                   FROM_GRAM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows c0..c0+BLOCK_N of G[pivot, :] for one session (zeros past n)."""
    rows = c0 + tl.arange(0, BLOCK_N)
    m = rows < n
    if FROM_GRAM:
        g = tl.load(gram_ptr + pivot.to(tl.int64) * n + rows, mask=m, other=0.0)
    else:
        cols = tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        row_ptr = x_ptr + (start + rows).to(tl.int64)[:, None] * stride_x
        pivot_ptr = x_ptr + (start + pivot).to(tl.int64) * stride_x
        for d0 in range(0, d, BLOCK_D):
            cm = d0 + cols < d
            xt = tl.load(row_ptr + d0 + cols[None, :], mask=m[:, None] & cm[None, :], other=0.0).to(tl.float32)
            xj = tl.load(pivot_ptr + d0 + cols, mask=cm, other=0.0).to(tl.float32)
            acc += tl.sum(xt * xj[None, :], axis=1)
        scale = tl.load(inv_norm_ptr + start + rows, mask=m, other=0.0) * tl.load(inv_norm_ptr + start + pivot)
        g = acc * scale
    return g
