"""Device helpers shared by the greedy kernels: read a session's scalars, choose its next pivot,
test the stop, read the pivot's Gram row, and the explicit Gram-Schmidt pieces of the stepwise and exact greedies.

``pick_pivot`` reads a session's state from global memory (the fused, stepwise and exact greedies keep
it there; the resident greedy holds it in registers): residuals (fp32, per row), a candidate
flag per row (int8: eligible, not protected, not yet selected), the packed ascending protected
indices; every greedy writes its selection row ``indices[s, :]``.

A pivot whose residual is below `NEAR_DEPENDENCE` is near-dependent (DESIGN.md §1.1): the Cholesky greedies
(resident, fused) hand its session to ``greedy_exact``; the greedies with an explicit d-space basis (stepwise,
exact) take every residual that decides from the pivot's own row (`choose_exact`).
"""

import numpy as np
import triton
import triton.language as tl

#: gemkernels.select.backends.near_dependence(float32): 32 sqrt(machine epsilon) of fp32, the fraction of its last
#: exact value below which a downdated residual is recomputed from its row.
NEAR_DEPENDENCE = tl.constexpr(float(32 * np.sqrt(np.finfo(np.float32).eps)))
#: Basis rows a Gram-Schmidt pass of `orthogonal_component` projects out at once.
BASIS_TILE = tl.constexpr(16)
#: fp32's smallest normal number: a residual below it adds no direction whatever eps is (a GPU flushes such a
#: denormal to zero, and 1/sqrt of it would be inf, then NaN).
SMALLEST_NORMAL = tl.constexpr(float(np.finfo(np.float32).tiny))
#: fp32's largest finite number: a squared norm above it (inf) or not comparable (NaN) marks a bad row.
LARGEST = tl.constexpr(float(np.finfo(np.float32).max))
#: Below it a row's 1 / ||x|| squared overflows fp32 (the scaled products s_i s_j would be inf): a bad row.
SMALLEST = tl.constexpr(float(1.0 / np.finfo(np.float32).max))


@triton.jit
def session_scalars(s, offsets_ptr, protected_offsets_ptr, tau_ptr, capacity_ptr):
    """Session ``s``'s (first row, rows, first protected entry, protected count, tau, capacity); the first row and
    the first protected entry stay int64 (a batch may pass 2^31 rows), the counts are int32."""
    start = tl.load(offsets_ptr + s)
    n = (tl.load(offsets_ptr + s + 1) - start).to(tl.int32)
    p_start = tl.load(protected_offsets_ptr + s)
    num_protected = (tl.load(protected_offsets_ptr + s + 1) - p_start).to(tl.int32)
    return start, n, p_start, num_protected, tl.load(tau_ptr + s), tl.load(capacity_ptr + s)


@triton.jit
def adds_direction(r_pivot, eps):
    """Whether a pivot of residual ``r_pivot`` is independent (DESIGN.md §1): ``r_pivot > eps``, and never below
    `SMALLEST_NORMAL`, so that the divisor of `inverse_sqrt` is a positive normal number even with eps = 0."""
    return r_pivot > tl.maximum(eps, SMALLEST_NORMAL)


@triton.jit
def inverse_sqrt(r):
    """``1 / sqrt(r)`` correctly rounded twice (``sqrt.rn``, ``div.rn``; ``tl.sqrt`` and ``/`` compile to
    approximations), for ``r`` a positive normal fp32 number: one per step, the pivot's scale."""
    return tl.div_rn(1.0, tl.sqrt_rn(r))


@triton.jit
def inverse_norms(sq_norms, m):
    """(``1 / sqrt(sq_norms)``, 0 where ``m`` is false or a row is bad; the bad rows where ``m``): a row is bad when its
    fp32 squared norm is below `SMALLEST` or not finite (all zeros, not finite, or too large or too small for fp32), as
    `gemkernels.select.api.row_sq_norms` decides."""
    good = (sq_norms >= SMALLEST) & (sq_norms <= LARGEST)  # NaN fails both
    return tl.where(m & good, inverse_sqrt(tl.where(good, sq_norms, 1.0)), 0.0), m & (good == 0)


@triton.jit
def coverage_of(residual_sum, n):
    """``1 - residual_sum / n`` with an IEEE division: a session's coverage from the sum of its residuals."""
    return 1.0 - tl.div_rn(residual_sum, n.to(tl.float32))


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
    """Rows c0..c0+BLOCK_N of G[pivot, :] for one session (zeros past n), normalised: the dot products (a row of the
    session's G, not normalised, or one pass over X) scaled by s_i s_pivot, one factor whichever the source."""
    rows = c0 + tl.arange(0, BLOCK_N)
    m = rows < n
    if FROM_GRAM:
        acc = tl.load(gram_ptr + pivot.to(tl.int64) * n + rows, mask=m, other=0.0)
    else:
        acc = row_dots(x_ptr, start, rows, m, x_ptr + (start + pivot).to(tl.int64) * stride_x, d, stride_x, BLOCK_N,
                       BLOCK_D)
    return acc * (tl.load(inv_norm_ptr + start + rows, mask=m, other=0.0) * tl.load(inv_norm_ptr + start + pivot))


@triton.jit
def row_dots(x_ptr, start, rows, m, v_ptr, d, stride_x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``X[start + rows] @ v`` in fp32 for the rows where ``m`` (zeros elsewhere), X in BLOCK_N x BLOCK_D tiles;
    ``v`` (d values) is a row of X or of a basis."""
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_ptr = x_ptr + (start + rows).to(tl.int64)[:, None] * stride_x
    for d0 in range(0, d, BLOCK_D):
        cm = d0 + cols < d
        xt = tl.load(row_ptr + d0 + cols[None, :], mask=m[:, None] & cm[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + d0 + cols, mask=cm, other=0.0).to(tl.float32)
        acc += tl.sum(xt * v[None, :], axis=1)
    return acc


@triton.jit
def squared_norms(x_ptr, start, rows, m, d, stride_x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``||X[start + rows]||^2`` in fp32 for the rows where ``m`` (zeros elsewhere), X in BLOCK_N x BLOCK_D tiles."""
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_ptr = x_ptr + (start + rows).to(tl.int64)[:, None] * stride_x
    for d0 in range(0, d, BLOCK_D):
        xt = tl.load(row_ptr + d0 + cols[None, :], mask=m[:, None] & (d0 + cols < d)[None, :], other=0.0)
        xt = xt.to(tl.float32)
        acc += tl.sum(xt * xt, axis=1)
    return acc


@triton.jit
def orthogonal_component(x_ptr, inv_norm_ptr, start, row, stride_x, basis_ptr, m, d, BLOCK_D: tl.constexpr):
    """Writes row ``row`` of the session, normalised, minus its projection on basis rows 0 .. m - 1 (block
    Gram-Schmidt, `BASIS_TILE` directions a pass, twice: "twice is enough") to basis row ``m``; returns its squared
    norm, the row's exact residual.

    The barriers order each pass's stores before the next pass's loads, which other threads may make."""
    cols = tl.arange(0, BLOCK_D)
    w_ptr = basis_ptr + m * d
    scale = tl.load(inv_norm_ptr + start + row)
    row_ptr = x_ptr + (start + row).to(tl.int64) * stride_x
    for d0 in range(0, d, BLOCK_D):
        cm = d0 + cols < d
        tl.store(w_ptr + d0 + cols, tl.load(row_ptr + d0 + cols, mask=cm, other=0.0).to(tl.float32) * scale, mask=cm)
    tl.debug_barrier()
    for _ in tl.static_range(2):
        for k0 in range(0, m, BASIS_TILE):
            ks = k0 + tl.arange(0, BASIS_TILE)
            live = ks < m
            c = tl.zeros([BASIS_TILE], dtype=tl.float32)  # Q[ks] w
            for d0 in range(0, d, BLOCK_D):
                cm = d0 + cols < d
                q = tl.load(basis_ptr + ks[:, None] * d + d0 + cols[None, :], mask=live[:, None] & cm[None, :],
                            other=0.0)
                c += tl.sum(q * tl.load(w_ptr + d0 + cols, mask=cm, other=0.0)[None, :], axis=1)
            for d0 in range(0, d, BLOCK_D):
                cm = d0 + cols < d
                q = tl.load(basis_ptr + ks[:, None] * d + d0 + cols[None, :], mask=live[:, None] & cm[None, :],
                            other=0.0)
                w = tl.load(w_ptr + d0 + cols, mask=cm, other=0.0) - tl.sum(q * c[:, None], axis=0)
                tl.store(w_ptr + d0 + cols, w, mask=cm)
            tl.debug_barrier()
    norm_sq = 0.0
    for d0 in range(0, d, BLOCK_D):
        w = tl.load(w_ptr + d0 + cols, mask=d0 + cols < d, other=0.0)
        norm_sq += tl.sum(w * w, axis=0)
    return norm_sq


@triton.jit
def normalise(w_ptr, norm_sq, d, BLOCK_D: tl.constexpr):
    """Scales the d values at ``w_ptr`` (squared norm ``norm_sq``, which `adds_direction`) to a unit vector."""
    cols = tl.arange(0, BLOCK_D)
    inv = inverse_sqrt(norm_sq)
    for d0 in range(0, d, BLOCK_D):
        cm = d0 + cols < d
        tl.store(w_ptr + d0 + cols, tl.load(w_ptr + d0 + cols, mask=cm, other=0.0) * inv, mask=cm)
    tl.debug_barrier()


@triton.jit
def choose_exact(x_ptr, inv_norm_ptr, residuals_ptr, exact_ptr, candidate_ptr, protected_idx_ptr, basis_ptr, start,
                 n, t, num_protected, capacity, tau, eps, residual_sum, directions, d, stride_x,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Step ``t``'s pivot, its orthogonal component against basis rows 0 .. directions - 1 left in basis row
    ``directions``. A near-dependent pivot's downdated residual is replaced by that component's squared norm (its
    exact residual; ``exact_ptr`` keeps each row's last one), and a completion pick whose downdated residual had
    lost most of it is chosen again if another candidate now leads or it is dependent. Returns (pivot, stopped,
    the pivot's exact residual, the session's residual sum after the replacements)."""
    choosing = t * 0 + 1
    pivot = t * 0
    stopped = t < 0
    r_exact = residual_sum * 0.0
    while choosing != 0:
        pivot, forced, best = pick_pivot(residuals_ptr, candidate_ptr, protected_idx_ptr, start, n, t, num_protected,
                                         BLOCK_N)
        stopped = should_stop(forced, best, t, capacity, coverage_of(residual_sum, n), tau, eps)
        choosing = t * 0
        if stopped == 0:
            r_exact = orthogonal_component(x_ptr, inv_norm_ptr, start, pivot, stride_x, basis_ptr, directions, d,
                                           BLOCK_D)
            r = tl.load(residuals_ptr + start + pivot)
            if r < NEAR_DEPENDENCE:
                stale = r < NEAR_DEPENDENCE * tl.load(exact_ptr + start + pivot)
                tl.store(residuals_ptr + start + pivot, r_exact)
                tl.store(exact_ptr + start + pivot, r_exact)
                residual_sum += r_exact - r
                tl.debug_barrier()  # the stores above before pick_pivot's loads
                if forced == 0:
                    moved = pick_pivot(residuals_ptr, candidate_ptr, protected_idx_ptr, start, n, t, num_protected,
                                       BLOCK_N)[0] != pivot
                    choosing = ((adds_direction(r_exact, eps) == 0) | (stale & moved)).to(tl.int32)
    return pivot, stopped, r_exact, residual_sum


@triton.jit
def downdate_rows(x_ptr, inv_norm_ptr, residuals_ptr, start, local, m, q_ptr, d, stride_x, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """``r_i <- max(r_i - (q . x_i / ||x_i||)^2, 0)`` for the session rows ``local`` where ``m`` (``q``: a unit basis
    row); returns the sum of their new residuals (a session's residual sum is the sum of these, not a running sum
    of changes, so it does not drift)."""
    e = row_dots(x_ptr, start, local, m, q_ptr, d, stride_x, BLOCK_N, BLOCK_D) * tl.load(
        inv_norm_ptr + start + local, mask=m, other=0.0)
    r = tl.load(residuals_ptr + start + local, mask=m, other=0.0)
    r_new = tl.maximum(r - e * e, 0.0)
    tl.store(residuals_ptr + start + local, r_new, mask=m)
    return tl.sum(tl.where(m, r_new, 0.0), axis=0)
