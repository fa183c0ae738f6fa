"""Device helpers shared by the greedy kernels: choose a session's next pivot, record it.

A session's state lives in global memory: residuals (fp32, per row), a candidate flag per
row (int8: eligible, not protected, not yet selected), the packed ascending protected
indices, and its selection row ``indices[s, :]``.
"""

import triton
import triton.language as tl


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
    """The completion loop's exit test (DESIGN.md §1 step 3); protected steps never stop."""
    stop = (t >= capacity) | (coverage >= tau) | (best <= eps)
    return stop & (forced == 0)
