"""numpy backend: the CPU fallback, one session at a time, vectorised over rows.

Pivoted partial Cholesky of the Gram matrix, computed lazily (fast-map-dpp's update):
adding pivot j costs one ``X @ x_j`` plus an ``(m, n)`` correction, with
``coords[m] = Q[:, m]^T X^T`` the new direction's projections and ``r -= coords[m]**2``.
float64 input computes in float64, every other dtype in float32.
"""

from __future__ import annotations

import numpy as np

from ..ragged import RaggedBatch
from . import PackedSelection

LIBRARY = "numpy"


def select_packed(batch: RaggedBatch, tau: np.ndarray, capacity: np.ndarray, eps: float) -> PackedSelection:
    """Every session in turn; see `select_session`."""
    values = batch.values
    dtype = np.float64 if values.dtype == np.float64 else np.float32
    sessions = batch.num_sessions
    width = int(capacity.max())
    indices = np.full((sessions, width), -1, dtype=np.int64)
    counts = np.zeros(sessions, dtype=np.int64)
    coverage = np.zeros(sessions, dtype=dtype)
    residuals = np.empty(values.shape[0], dtype=dtype)
    for s, (a, b) in enumerate(zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist())):
        order, coverage[s], residuals[a:b] = select_session(
            np.asarray(values[a:b], dtype=dtype), np.flatnonzero(batch.protected[a:b]),
            batch.eligible[a:b], float(tau[s]), int(capacity[s]), eps)
        counts[s] = len(order)
        indices[s, :len(order)] = order
    return PackedSelection(indices, counts, coverage, residuals)


def select_session(x: np.ndarray, protected: np.ndarray, eligible: np.ndarray, tau: float, capacity: int,
                   eps: float) -> tuple[list[int], float, np.ndarray]:
    """DESIGN.md §1 for one session: returns (selection order, coverage, residuals)."""
    n = x.shape[0]
    x = x / np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    residuals = np.ones(n, dtype=x.dtype)
    coords = np.empty((max(capacity, 1), n), dtype=x.dtype)
    directions = 0
    order: list[int] = []

    def add_direction(j: int) -> None:
        nonlocal directions
        gram_row = x @ x[j]
        if directions:
            gram_row -= coords[:directions, j] @ coords[:directions]
        coords[directions] = gram_row / np.sqrt(residuals[j])
        np.subtract(residuals, coords[directions] ** 2, out=residuals)
        np.maximum(residuals, 0, out=residuals)
        directions += 1

    for j in protected.tolist():
        order.append(j)
        if residuals[j] > eps:
            add_direction(j)

    candidates = eligible.copy()
    candidates[protected] = False
    while len(order) < capacity and 1.0 - residuals.mean(dtype=np.float64) < tau:
        scores = np.where(candidates, residuals, -np.inf)
        j = int(np.argmax(scores))
        if scores[j] <= eps:
            break
        order.append(j)
        candidates[j] = False
        add_direction(j)
    return order, float(1.0 - residuals.mean(dtype=np.float64)), residuals
