"""Offline retention metrics for a kept subset S of a history's blocks (paper Eq. 3-4, appendix C.2).

Embeddings are unit rows ``x`` (n, d); ``kept`` is an index sequence. E(S) and C(S) measure global
geometry; projections measure how much of a target direction (next action, final block, goal) the
span of S holds, and ratios divide by what the whole history holds. An encoder-free companion,
`referenced_blocks`, finds the earlier blocks the next action names (paths, identifiers, literals,
numbers) so that their retention can be measured without any embedding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gemkernels.compress.references import (  # noqa: F401  (re-exported: the metric's references)
    References,
    action_references,
    argument_strings,
    block_words,
    referenced_blocks,
    references,
)

# E(S), C(S), P_a(S), R_a(S), T3, R_final(S), R_goal(S), referenced blocks kept, |S| / n
METRICS = ("coverage", "centroid", "action_projection", "action", "top3", "final", "goal", "referenced",
           "retained")
RANK_RTOL = 1e-10  # Gram eigenvalues below this fraction of the largest (singular values below 1e-5) add no direction


def span_weights(gram: np.ndarray, rtol: float = RANK_RTOL) -> np.ndarray:
    """W (m, r) such that ``Q = X_S^T W`` is an orthonormal basis of the span of m rows, from their Gram
    matrix ``X_S X_S^T``; dependent rows add no column."""
    lam, u = np.linalg.eigh(np.asarray(gram, dtype=np.float64))
    keep = lam > rtol * lam[-1] if lam.size and lam[-1] > 0 else np.zeros(lam.size, dtype=bool)
    return u[:, keep] / np.sqrt(lam[keep])


def projected(cross: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``||Q^T v||^2`` for each column v, given ``cross = X_S v`` (m, c) and `span_weights`: P_v(S) of Eq. 4."""
    return np.sum((weights.T @ cross) ** 2, axis=0)


def captured_energy(gram: np.ndarray, kept: np.ndarray, weights: np.ndarray) -> float:
    """E(S) = mean over all n rows of ``||Q_S^T x_i||^2`` (paper Eq. 3), from the full Gram matrix (n, n)."""
    return float(np.mean(projected(gram[kept], weights)))


def centroid_similarity(gram: np.ndarray, kept: np.ndarray) -> float:
    """C(S): cosine between the kept rows' mean and all rows' mean (paper Eq. 3); nan if either mean is zero."""
    norms = np.sqrt(gram[np.ix_(kept, kept)].sum() * gram.sum())
    return float(gram[kept].sum() / norms) if norms > 0 else float("nan")


def ratio(part: float, whole: float, eps: float = 1e-9) -> float:
    """``part / whole``, or nan when the denominator is not defined (``whole <= eps``)."""
    return part / whole if whole > eps else float("nan")


def nearest(x: np.ndarray, target: np.ndarray, k: int = 3) -> np.ndarray:
    """The ``k`` rows most similar to ``target`` (dot product; ties: lower index first): N_k(a)."""
    scores = np.asarray(x, dtype=np.float64) @ np.asarray(target, dtype=np.float64)
    return np.argsort(-scores, kind="stable")[:k]


def retained_fraction(items: Iterable[int], kept: Sequence[int]) -> float:
    """The fraction of ``items`` that are in ``kept``; nan when there are no items (T3 with N_3(a))."""
    items = set(int(i) for i in items)
    return len(items & set(int(i) for i in kept)) / len(items) if items else float("nan")


@dataclass(frozen=True)
class Targets:
    """One checkpoint's measuring targets, with what every selector shares computed once: the Gram matrix
    of the n history rows, each target's dot products with them and its projection on the whole history."""

    gram: np.ndarray  # (n, n)
    cross: np.ndarray  # (n, 3): X a, X final, X goal (zeros without a goal)
    full: np.ndarray  # (3,): P_v([n])
    has_goal: bool
    near: frozenset[int]  # N_3(a)
    referenced: frozenset[int]

    @classmethod
    def build(cls, x: np.ndarray, action: np.ndarray, final: np.ndarray, goal: np.ndarray | None,
              referenced: Iterable[int] = ()) -> Targets:
        """Targets for unit history rows ``x`` (n, d) and unit target vectors (``goal`` may be None)."""
        x = np.asarray(x, dtype=np.float64)
        gram = x @ x.T
        vectors = np.stack([action, final, goal if goal is not None else np.zeros_like(action)])
        cross = x @ np.asarray(vectors, dtype=np.float64).T
        return cls(gram, cross, projected(cross, span_weights(gram)), goal is not None,
                   frozenset(nearest(x, action, 3).tolist()), frozenset(int(i) for i in referenced))

    def measure(self, kept: Sequence[int]) -> np.ndarray:
        """All `METRICS` for the kept subset, in order; undefined ratios are nan."""
        kept = np.asarray(kept, dtype=np.int64)
        weights = span_weights(self.gram[np.ix_(kept, kept)])
        action, final, goal = projected(self.cross[kept], weights)
        return np.array([
            captured_energy(self.gram, kept, weights),
            centroid_similarity(self.gram, kept),
            action,
            ratio(action, self.full[0]),
            retained_fraction(self.near, kept),
            ratio(final, self.full[1]),
            ratio(goal, self.full[2]) if self.has_goal else float("nan"),
            retained_fraction(self.referenced, kept),
            len(kept) / self.gram.shape[0],
        ])
