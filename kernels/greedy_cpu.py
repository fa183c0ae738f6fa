"""numba kernels: the whole greedy of a session on one CPU core, without the GIL so threads spread sessions.

The CPU analogue of ``greedy_resident``: the pivoted partial Cholesky of ``numpy_backend`` (``U[m] = (X x_j -
U[:m, j] U[:m]) / (||x_j|| sqrt(r_j))``, ``r -= U[m]^2 / ||x||^2``), compiled, so a step is one pass over X for
the Gram row (four rows per pass of x_j) and one pass over n rows that updates the residuals and finds the next
pivot. Nothing of numpy's per-call cost is left between the passes. A near-dependent pivot takes its residual
and direction from its row, against an explicit basis built only then, as in ``numpy_backend``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Only the Gram row's dot products may be reassociated (to vectorise over d): each row then still takes the same
# instructions. Everything else keeps IEEE order, no FMA contraction (a vector body and its scalar tail could
# round differently): identical rows get identical residuals, and a tie between them goes to the lower index.
DOT_FASTMATH = {"reassoc", "nsz"}


@numba.njit(cache=True, nogil=True, fastmath=DOT_FASTMATH)
def row_dots(x: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """``out = X @ v``, accumulated in X's dtype (as BLAS does), four rows per pass of v; the last group repeats
    row n - 1 rather than taking a one-row loop, so every row is summed by the same instructions."""
    n, d = x.shape
    for i in range(0, n, 4):
        x0, x1, x2, x3 = x[i], x[min(i + 1, n - 1)], x[min(i + 2, n - 1)], x[min(i + 3, n - 1)]
        a0, a1, a2, a3 = x0[0] * v[0], x1[0] * v[0], x2[0] * v[0], x3[0] * v[0]
        for c in range(1, d):
            vc = v[c]
            a0 += x0[c] * vc
            a1 += x1[c] * vc
            a2 += x2[c] * vc
            a3 += x3[c] * vc
        out[i] = a0
        if i + 3 < n:
            out[i + 1], out[i + 2], out[i + 3] = a1, a2, a3
        elif i + 2 < n:
            out[i + 1], out[i + 2] = a1, a2
        elif i + 1 < n:
            out[i + 1] = a1


@numba.njit(cache=True, nogil=True)
def orthogonal(x: np.ndarray, inv_norms: np.ndarray, basis: np.ndarray, m: int, j: int) -> np.ndarray:
    """x_j / ||x_j|| minus its projection on ``basis[:m]``, projected out twice ("twice is enough")."""
    w = x[j] * inv_norms[j]
    for _ in range(2):
        for t in range(m):
            q = basis[t]
            dot = 0.0
            for c in range(w.shape[0]):
                dot += q[c] * w[c]
            for c in range(w.shape[0]):
                w[c] -= dot * q[c]
    return w


@numba.njit(cache=True, nogil=True)
def unit(w: np.ndarray, out: np.ndarray) -> float:
    """``out = w / ||w||``; returns ||w||^2 (w non-zero)."""
    norm_sq = 0.0
    for c in range(w.shape[0]):
        norm_sq += w[c] * w[c]
    scale = 1.0 / math.sqrt(norm_sq)
    for c in range(w.shape[0]):
        out[c] = w[c] * scale
    return norm_sq


@numba.njit(cache=True, nogil=True)
def component(x: np.ndarray, inv_norms: np.ndarray, basis: np.ndarray, built: int, pivots: np.ndarray, m: int,
              j: int) -> tuple[np.ndarray, float]:
    """Row j's orthogonal component against directions 0 .. m - 1 and its squared norm (row j's exact residual),
    after building ``basis[built:m]`` (the explicit d-space basis, built only when a near-dependent row needs it)
    from their pivots' rows."""
    for t in range(built, m):
        unit(orthogonal(x, inv_norms, basis, t, pivots[t]), basis[t])
    w = orthogonal(x, inv_norms, basis, m, j)
    norm_sq = 0.0
    for c in range(w.shape[0]):
        norm_sq += w[c] * w[c]
    return w, norm_sq


@numba.njit(cache=True, nogil=True)
def add_direction(x: np.ndarray, inv_norms: np.ndarray, scaled: np.ndarray, m: int, j: int, r_j: float,
                  q: np.ndarray, residuals: np.ndarray, candidate: np.ndarray) -> tuple[float, int, float]:
    """Direction ``m`` from pivot ``j`` (residual ``r_j``): from its Gram row, or ``X q`` for a near-dependent pivot
    whose unit direction ``q`` was built from its row (empty otherwise); updates ``scaled[m]`` and the residuals;
    returns the energy captured and the candidate with the largest new residual (lowest index on ties; -1 when
    none)."""
    new = scaled[m]
    if q.size:
        row_dots(x, q, new)
        scale = inv_norms.dtype.type(1)
    else:
        row_dots(x, x[j], new)
        for t in range(m):
            coefficient = scaled[t, j]
            previous = scaled[t]
            for i in range(new.shape[0]):
                new[i] -= coefficient * previous[i]
        scale = inv_norms.dtype.type(inv_norms[j] / math.sqrt(r_j))  # then the row update runs in the rows' dtype
    captured = 0.0
    best, best_r = -1, -np.inf
    for i in range(new.shape[0]):
        u = new[i] * scale
        new[i] = u
        decrease = u * u * inv_norms[i] * inv_norms[i]
        captured += decrease
        r = residuals[i] - decrease
        residuals[i] = r
        if candidate[i] and r > best_r:
            best, best_r = i, r
    return captured, best, best_r


@numba.njit(cache=True, nogil=True)
def best_candidate(residuals: np.ndarray, candidate: np.ndarray) -> tuple[int, float]:
    """The candidate with the largest residual (lowest index on ties), and that residual; (-1, -inf) when none."""
    best, best_r = -1, -np.inf
    for i in range(residuals.shape[0]):
        if candidate[i] and residuals[i] > best_r:
            best, best_r = i, residuals[i]
    return best, best_r


@numba.njit(cache=True, nogil=True)
def select_session(x: np.ndarray, inv_norms: np.ndarray, protected: np.ndarray, candidate: np.ndarray, tau: float,
                   capacity: int, eps: float, near: float, order: np.ndarray,
                   residuals: np.ndarray) -> tuple[int, float]:
    """DESIGN.md §1 for one session of raw rows: ``protected`` holds its local indices ascending, ``candidate``
    (eligible and not protected) is consumed; ``eps`` is the dependency threshold and ``near`` the near-dependence
    fraction of the rows' dtype (`numpy_backend`: a near-dependent pivot's residual and direction come from its
    row). Writes ``order[:count]`` and ``residuals``; returns (count, coverage)."""
    n = x.shape[0]
    scaled = np.empty((max(capacity, 1), n), dtype=x.dtype)
    basis = np.empty((max(capacity, 1), x.shape[1]), dtype=x.dtype)
    pivots = np.empty(max(capacity, 1), dtype=np.int64)  # the row of each direction
    exact = np.ones(n, dtype=x.dtype)  # each residual when last computed from its row
    none = np.empty(0, dtype=x.dtype)
    residuals[:] = 1
    energy = 0.0
    directions = 0
    built = 0  # basis[:built] holds directions 0 .. built - 1
    count = 0
    best, best_r = -1, -np.inf  # -1: not searched yet (or no candidate left)
    for j in protected:
        order[count] = j
        count += 1
        q = none
        if residuals[j] < near:
            w, r = component(x, inv_norms, basis, built, pivots, directions, j)
            built = directions
            energy += residuals[j] - r
            residuals[j] = r
            exact[j] = r
            if r > eps:
                unit(w, basis[directions])
                q = basis[directions]
                built = directions + 1
        if residuals[j] > eps:
            pivots[directions] = j
            captured, best, best_r = add_direction(x, inv_norms, scaled, directions, j, residuals[j], q, residuals,
                                                   candidate)
            energy += captured
            directions += 1
    if directions == 0:
        best, best_r = best_candidate(residuals, candidate)
    while count < capacity and energy / n < tau and best >= 0 and best_r > eps:
        j = best
        q = none
        if residuals[j] < near:
            stale = residuals[j] < near * exact[j]
            w, r = component(x, inv_norms, basis, built, pivots, directions, j)
            built = directions
            energy += residuals[j] - r
            residuals[j] = r
            exact[j] = r
            if r <= eps or stale:
                best, best_r = best_candidate(residuals, candidate)
                if r <= eps or best != j:  # j was chosen for a value it had lost: choose again with the exact one
                    continue
            unit(w, basis[directions])
            q = basis[directions]
            built = directions + 1
        order[count] = j
        count += 1
        candidate[j] = False
        pivots[directions] = j
        captured, best, best_r = add_direction(x, inv_norms, scaled, directions, j, residuals[j], q, residuals,
                                               candidate)
        energy += captured
        directions += 1
    remaining = 0.0
    for i in range(n):
        residuals[i] = max(residuals[i], 0)
        remaining += residuals[i]
    return count, 1.0 - remaining / n


@numba.njit(cache=True, nogil=True)
def select_sessions(first: int, stop: int, values: np.ndarray, inv_norms: np.ndarray, offsets: np.ndarray,
                    protected_rows: np.ndarray, protected_offsets: np.ndarray, candidate: np.ndarray, tau: np.ndarray,
                    capacity: np.ndarray, eps: float, near: float, indices: np.ndarray, counts: np.ndarray,
                    coverage: np.ndarray, residuals: np.ndarray) -> None:
    """`select_session` for sessions ``first .. stop - 1`` of a packed batch, in turn, without the GIL (callers
    run disjoint ranges on threads)."""
    for s in range(first, stop):
        a, b = offsets[s], offsets[s + 1]
        protected = protected_rows[protected_offsets[s]:protected_offsets[s + 1]] - a
        counts[s], coverage[s] = select_session(values[a:b], inv_norms[a:b], protected, candidate[a:b], tau[s],
                                                capacity[s], eps, near, indices[s], residuals[a:b])
