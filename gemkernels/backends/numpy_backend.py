"""numpy backend: the CPU fallback, one session at a time, vectorised over rows.

Pivoted partial Cholesky of the Gram matrix, computed lazily (fast-map-dpp's update):
adding pivot j costs one ``X @ x_j`` plus an ``(m, n)`` correction, with
``coords[m] = Q[:, m]^T X_hat^T`` the new direction's projections and ``r -= coords[m]**2``.
Rows are never copied to normalise them: the Gram row is scaled by the inverse norms.
float64 input computes in float64, every other dtype in float32.
"""

from __future__ import annotations

import math

import numpy as np

from ..ragged import RaggedBatch
from . import PackedSelection

LIBRARY = "numpy"


def select_packed(batch: RaggedBatch, values: np.ndarray, sq_norms: np.ndarray, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Every session in turn; see `select_session`."""
    dtype = np.float64 if values.dtype == np.float64 else np.float32
    values = values.astype(dtype, copy=False)
    inv_norms = (1.0 / np.sqrt(sq_norms)).astype(dtype, copy=False)
    sessions = batch.num_sessions
    indices = np.full((sessions, int(capacity.max())), -1, dtype=np.int64)
    counts = np.zeros(sessions, dtype=np.int64)
    coverage = np.zeros(sessions, dtype=dtype)
    residuals = np.empty(values.shape[0], dtype=dtype)
    for s, (a, b) in enumerate(zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist())):
        order, coverage[s], residuals[a:b] = select_session(
            values[a:b], inv_norms[a:b], np.flatnonzero(batch.protected[a:b]), batch.eligible[a:b],
            float(tau[s]), int(capacity[s]), eps)
        counts[s] = len(order)
        indices[s, :len(order)] = order
    return PackedSelection(indices, counts, coverage, residuals)


def select_session(x: np.ndarray, inv_norms: np.ndarray, protected: np.ndarray, eligible: np.ndarray,
                   tau: float, capacity: int, eps: float) -> tuple[list[int], float, np.ndarray]:
    """DESIGN.md §1 for one session of raw rows ``x`` (``inv_norms`` = 1/||x_i||): (order, coverage, residuals)."""
    n = x.shape[0]
    residuals = np.ones(n, dtype=x.dtype)
    coords = np.empty((max(capacity, 1), n), dtype=x.dtype)
    scratch = np.empty(n, dtype=x.dtype)
    directions = 0
    order: list[int] = []

    def add_direction(j: int) -> None:
        """Append pivot j's direction: coords[m] = (G[j] - C[:m, j] C[:m]) / sqrt(r_j); r -= coords[m]**2.

        Residuals may dip below zero by rounding here; they are clamped once at the end."""
        nonlocal directions
        scale = 1.0 / math.sqrt(float(residuals[j]))
        row = coords[directions]
        np.matmul(x, x[j] * (float(inv_norms[j]) * scale), out=row)
        row *= inv_norms
        if directions:
            np.matmul(coords[:directions, j] * scale, coords[:directions], out=scratch)
            row -= scratch
        np.subtract(residuals, np.square(row, out=scratch), out=residuals)
        directions += 1

    for j in protected.tolist():
        order.append(j)
        if residuals[j] > eps:
            add_direction(j)

    candidates = eligible.copy()
    candidates[protected] = False
    scores = np.full(n, -np.inf, dtype=x.dtype)
    while len(order) < capacity and 1.0 - float(residuals.sum()) / n < tau:
        np.copyto(scores, residuals, where=candidates)
        j = int(np.argmax(scores))
        if scores[j] <= eps:
            break
        order.append(j)
        candidates[j] = False
        scores[j] = -np.inf
        add_direction(j)
    np.maximum(residuals, 0, out=residuals)
    return order, 1.0 - float(np.add.reduce(residuals, dtype=np.float64)) / n, residuals
