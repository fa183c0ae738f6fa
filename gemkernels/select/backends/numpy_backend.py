"""numpy backend: the CPU fallback, one session at a time, vectorised over rows.

Pivoted partial Cholesky of the Gram matrix, computed lazily (fast-map-dpp's update) on the raw
rows: with ``U[m] = C[m] * ||x||`` (a direction's projections scaled back by each row's norm),
adding pivot j costs one ``X @ x_j`` and one ``U[:m, j] @ U[:m]``:
``U[m] = (X @ x_j - U[:m, j] @ U[:m]) / (||x_j|| sqrt(r_j))`` and ``r -= U[m]**2 / ||x||**2``.
Rows are never copied or normalised. The greedy keeps the candidates' residuals in a score
vector (-inf elsewhere) and the captured energy as a running sum, so a step is the two
products and a handful of length-n vector operations. float64 input computes in
float64, every other dtype in float32.

A pivot whose residual has fallen below `near_dependence` (1.1% in float32) is near-dependent: ``1 - ||c||^2`` has lost
most of its digits there. Its residual is computed again from its row against an explicit d-space basis
(`ExplicitBasis`, built only then), and its direction is that orthogonal component, its projections one
``X @ q`` (DESIGN.md §1.1).
"""

from __future__ import annotations

import math

import numpy as np

from gemkernels.select.backends import (
    PackedSelection,
    compiles_nothing,
    computes_in_place,
    dependency_threshold,
    near_dependence,
)
from gemkernels.select.ragged import RaggedBatch

LIBRARY = "numpy"

device = computes_in_place
warm_up_shapes = compiles_nothing


def select_packed(batch: RaggedBatch, values: np.ndarray, sq_norms: np.ndarray, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Every session in turn; see `select_one`. Coverage is float64 whatever the input, as `select_one` returns it."""
    values = values.astype(compute_dtype(values), copy=False)  # widened once for every session
    out = empty_packed(batch.num_sessions, int(capacity.max()), values.shape[0], values.dtype)
    for s, (a, b) in enumerate(zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist())):
        order, out.coverage[s], out.residuals[a:b] = select_one(values[a:b], sq_norms[a:b], batch.protected[a:b],
                                                                batch.eligible[a:b], float(tau[s]),
                                                                int(capacity[s]), eps)
        out.counts[s] = len(order)
        out.indices[s, :len(order)] = order
    return out


def empty_packed(sessions: int, width: int, rows: int, dtype: np.dtype) -> PackedSelection:
    """numpy outputs for a CPU backend to fill: indices -1, counts and float64 coverage 0, residuals unset."""
    return PackedSelection(np.full((sessions, width), -1, dtype=np.int64), np.zeros(sessions, dtype=np.int64),
                           np.zeros(sessions, dtype=np.float64), np.empty(rows, dtype=dtype))


def compute_dtype(values: np.ndarray) -> type:
    """float64 for float64 input, float32 for every other dtype."""
    return np.float64 if values.dtype == np.float64 else np.float32


def select_one(x: np.ndarray, sq_norms: np.ndarray, protected: np.ndarray, eligible: np.ndarray, tau: float,
               capacity: int, eps: float) -> tuple[list[int], float, np.ndarray]:
    """One session from raw rows (in their `compute_dtype`), their squared norms and its masks: (order, coverage,
    residuals)."""
    return select_session(x, inverse_norms(sq_norms, x.dtype), np.flatnonzero(protected), eligible, tau, capacity,
                          eps)


def inverse_norms(sq_norms: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """1 / ||x_i|| in the compute dtype."""
    return (1.0 / np.sqrt(sq_norms)).astype(dtype, copy=False)


def select_session(x: np.ndarray, inv_norms: np.ndarray, protected: np.ndarray, eligible: np.ndarray,
                   tau: float, capacity: int, eps: float) -> tuple[list[int], float, np.ndarray]:
    """DESIGN.md §1 for one session of raw rows ``x`` (``inv_norms`` = 1/||x_i||): (order, coverage, residuals)."""
    n = x.shape[0]
    eps = dependency_threshold(eps, x.dtype)
    near = near_dependence(x.dtype)
    inv_sq = np.square(inv_norms)
    scaled = np.empty((max(capacity, 1), n), dtype=x.dtype)  # U: the directions' projections times ||x_i||
    decrease = np.empty(n, dtype=x.dtype)  # the last direction's U[m]^2 / ||x||^2
    residuals = np.ones(n, dtype=x.dtype)
    scores = np.ones(n, dtype=x.dtype)  # the candidates' residuals, -inf elsewhere
    scores[~eligible] = -np.inf
    scores[protected] = -np.inf
    exact = np.ones(n, dtype=x.dtype)  # each residual when last computed from its row
    basis = ExplicitBasis(x, inv_norms, capacity)
    energy = 0.0  # captured energy summed over rows: n - sum(r)
    order: list[int] = []
    pivots: list[int] = []  # the row of each direction
    copies = earlier_copies(x)

    def settle(j: int) -> tuple[np.ndarray, bool]:
        """Near-dependent row j's residual computed from the row; returns (its orthogonal component, whether the
        downdated value had lost most of what it was)."""
        nonlocal energy
        stale = bool(residuals[j] < near * exact[j])
        w = basis.component(j, pivots)
        r = float(w @ w)
        energy += float(residuals[j]) - r
        residuals[j] = exact[j] = r
        if scores[j] != -np.inf:
            scores[j] = r
        return w, stale

    def add_direction(j: int, w: np.ndarray | None) -> None:
        """U[m] = (X x_j - U[:m, j] U[:m]) / (||x_j|| sqrt(r_j)), or X q with q = w / ||w|| for a near-dependent
        pivot (w its orthogonal component); r -= U[m]^2 / ||x||^2.

        Residuals may dip below zero by rounding here; they are clamped once at the end."""
        nonlocal energy
        m = len(pivots)
        new = scaled[m]
        if w is None:
            np.matmul(x, x[j], out=new)
            if m:
                np.subtract(new, np.dot(scaled[:m, j], scaled[:m], out=decrease), out=new)
            np.multiply(new, float(inv_norms[j]) / math.sqrt(float(residuals[j])), out=new)
        else:
            np.matmul(x, basis.append(w), out=new)
        if copies is not None:  # BLAS may sum a row's copy in another order: give it the earlier row's value
            new[copies[0]] = new[copies[1]]
        np.multiply(new, inv_sq, out=decrease)
        energy += float(np.dot(decrease, new))
        np.multiply(decrease, new, out=decrease)
        np.subtract(residuals, decrease, out=residuals)
        np.subtract(scores, decrease, out=scores)
        pivots.append(j)

    for j in protected.tolist():
        order.append(j)
        w = settle(j)[0] if residuals[j] < near else None
        if residuals[j] > eps:
            add_direction(j, w)

    while len(order) < capacity and energy / n < tau:
        j = int(scores.argmax())
        if scores[j] <= eps:
            break
        w = None
        if residuals[j] < near:
            w, stale = settle(j)
            if scores[j] <= eps or (stale and int(scores.argmax()) != j):  # j was chosen for a lost value
                continue
        order.append(j)
        add_direction(j, w)
        scores[j] = -np.inf
    np.maximum(residuals, 0, out=residuals)
    return order, 1.0 - float(np.add.reduce(residuals, dtype=np.float64)) / n, residuals


class ExplicitBasis:
    """The directions as unit vectors in d-space, built only when a near-dependent row needs them: each from its
    pivot's row, by classical Gram-Schmidt twice against the directions before it."""

    def __init__(self, x: np.ndarray, inv_norms: np.ndarray, capacity: int):
        self.x, self.inv_norms = x, inv_norms
        self.rows = np.empty((max(capacity, 1), x.shape[1]), dtype=x.dtype)
        self.built = 0  # rows[:built] hold directions 0 .. built - 1

    def component(self, j: int, pivots: list[int]) -> np.ndarray:
        """Row j, normalised, minus its projection on the directions taken from ``pivots`` (their rows)."""
        for t in range(self.built, len(pivots)):
            w = self.orthogonal(pivots[t], t)
            self.rows[t] = w / math.sqrt(float(w @ w))
        self.built = len(pivots)
        return self.orthogonal(j, self.built)

    def orthogonal(self, j: int, m: int) -> np.ndarray:
        """x_j / ||x_j|| minus its projection on rows[:m], projected out twice ("twice is enough")."""
        w = self.x[j] * self.inv_norms[j]
        q = self.rows[:m]
        for _ in range(2):
            w -= (q @ w) @ q
        return w

    def append(self, w: np.ndarray) -> np.ndarray:
        """The next direction, w normalised (w: `component`'s result, for the directions built so far)."""
        q = self.rows[self.built]
        np.multiply(w, 1.0 / math.sqrt(float(w @ w)), out=q)
        self.built += 1
        return q


def earlier_copies(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, copies): every row that repeats an earlier row exactly (-0.0 and 0.0 alike), and the earliest row it
    repeats; None when no row does. Whole rows are compared only where the first values tie and then an integer
    hash of the first `HASH_COLUMNS` values does: usually one sort of the first column.

    Identical rows must keep identical residuals so that a tie between them goes to the lower index (§1)."""
    if all_distinct(x[:, 0]):
        return None
    keys = row_hash(x[:, :HASH_COLUMNS])
    if all_distinct(keys):
        return None
    by_key = np.argsort(keys, kind="stable")
    tied = keys[by_key[1:]] == keys[by_key[:-1]]
    candidates = np.unique(np.concatenate([by_key[1:][tied], by_key[:-1][tied]]))  # ascending
    rows = np.ascontiguousarray(x[candidates] + 0.0)  # + 0.0 turns -0.0 into 0.0
    _, first, group = np.unique(rows.view(np.dtype((np.void, rows.strides[0]))).ravel(), return_index=True,
                                return_inverse=True)
    copies = candidates[first[group.ravel()]]
    repeats = copies != candidates
    return (candidates[repeats], copies[repeats]) if repeats.any() else None


#: Columns `earlier_copies` hashes last: enough to tell apart quantised rows (+-1, int8) whose norms all tie.
HASH_COLUMNS = 64
HASH_MULTIPLIERS = np.random.default_rng(0).integers(1, 2**63, size=HASH_COLUMNS, dtype=np.uint64) | np.uint64(1)


def row_hash(head: np.ndarray) -> np.ndarray:
    """A uint64 hash of each row's values (exact integer arithmetic: equal rows, equal hashes; -0.0 as 0.0)."""
    head = np.ascontiguousarray(head + 0.0)
    bits = head.view(np.uint32 if head.dtype == np.float32 else np.uint64).astype(np.uint64)
    return (bits * HASH_MULTIPLIERS[:head.shape[1]]).sum(axis=1, dtype=np.uint64)


def all_distinct(values: np.ndarray) -> bool:
    """No two of ``values`` are equal."""
    ordered = np.sort(values)
    return bool((ordered[1:] != ordered[:-1]).all())
