"""Geometry against evidence: the paper's analysis toolkit (§4.1-4.3, appendix C.1 and C.3).

Inputs are unit block embeddings ``x`` (n, d) of one run's history, in order, and for the
checkpoint analyses the embedding ``a`` (d,) of the recorded next action.

- **Spectral statistics** (Eq. 1-2, C.1): from the centred matrix ``X - 1 x̄ᵀ``, the effective rank
  ``exp(-Σ p_j log p_j)`` with ``p_j = σ_j² / Σ σ_k²``, ``r_ρ`` (fewest leading directions holding a
  fraction ρ of the centred energy) and ``r_ρ / n``; squared singular values below `RANK_RTOL` of
  the largest count as zero. Controls: independent circular shifts of each feature column
  (`feature_shift`) and an i.i.d. standard Gaussian matrix of the same shape (`gaussian_like`).
- **Low-energy share** (Eq. 5, C.3): with ``V_low`` the centred directions after the ρ cut-off,
  ``m_low(a) = ||V_lowᵀ a||² / ||Vᵀ a||²``; ``L_i`` is the same share for a centred block and ``A_i``
  the cosine of a centred block and the action inside the low-energy subspace.
- **Controlled replacement** (§4.3, C.3): from the whole available history, remove either the block
  with the highest ``A_i`` or a low-alignment block matched to it in representation, recency and
  serialised length (`Tolerance`), and compare the two kept sets with `retention.Targets`.
- **Greedy uncentred coverage counts** (§4.1): how many blocks `select_batch` needs to reach tau.
- **Paired tests**: one-sided Wilcoxon signed-rank tests across runs with Holm-adjusted p-values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from gemkernels.evaluate.retention import METRICS, RANK_RTOL, Targets
from gemkernels.select.api import select_batch

RHO = 0.90
STATS = ("effective_rank", "r_rho", "r_rho_over_n")  # columns of `spectral_stats`
CONDITIONS = ("real", "feature_shift", "gaussian")
DELTAS = ("action_projection", "top3", "centroid", "coverage")  # Table 2's rows, as `METRICS` names
DELTA_COLUMNS = np.array([METRICS.index(m) for m in DELTAS])


# --------------------------------------------------------------------------- spectra

def centred_energies(x: np.ndarray) -> np.ndarray:
    """Squared singular values of the centred rows of ``x`` (..., n, d), descending, length n (zeros past
    the rank): the eigenvalues of the centred Gram matrix, batched over leading axes."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=-2, keepdims=True)
    return np.maximum(np.linalg.eigvalsh(xc @ np.swapaxes(xc, -1, -2))[..., ::-1], 0.0)


def spectral_stats(energies: np.ndarray, n: np.ndarray | int, rho: float = RHO) -> np.ndarray:
    """`STATS` (..., 3) from descending squared singular values (..., k) of histories of ``n`` rows.

    Energies below `RANK_RTOL` of the largest are zeros; rows without positive energy give nan.
    """
    e = np.asarray(energies, dtype=np.float64)
    e = np.where(e > RANK_RTOL * e[..., :1], e, 0.0)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = e / total
        entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
        r_rho = (np.argmax(np.cumsum(p, axis=-1) >= rho - 1e-12, axis=-1) + 1).astype(np.float64)
    defined = total[..., 0] > 0
    out = np.stack([np.exp(entropy), r_rho, r_rho / np.asarray(n, dtype=np.float64)], axis=-1)
    return np.where(defined[..., None], out, np.nan)


def batched_stats(matrices: Sequence[np.ndarray], rho: float = RHO) -> np.ndarray:
    """`spectral_stats` (m, 3) of many histories; histories of one shape share one batched eigendecomposition."""
    out = np.full((len(matrices), len(STATS)), np.nan)
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, x in enumerate(matrices):
        shapes.setdefault(np.shape(x), []).append(i)
    for shape, rows in shapes.items():
        energies = centred_energies(np.stack([matrices[i] for i in rows]))
        out[rows] = spectral_stats(energies, shape[0], rho)
    return out


def feature_shift(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each column of ``x`` (n, d) circularly shifted along the rows by its own uniform random offset:
    every column keeps its multiset of values, the alignment across columns is broken."""
    n, d = np.shape(x)
    rows = (np.arange(n)[:, None] - rng.integers(0, n, size=d)[None, :]) % n
    return np.take_along_axis(np.asarray(x), rows, axis=0)


def gaussian_like(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An i.i.d. standard normal matrix of ``x``'s shape."""
    return rng.standard_normal(np.shape(x))


def spectral_comparison(matrices: Sequence[np.ndarray], seed: int, rho: float = RHO) -> np.ndarray:
    """`STATS` of each history and its two controls: (runs, `CONDITIONS`, `STATS`).

    Controls are drawn from one generator seeded with ``seed``, run by run in order (deterministic).
    """
    rng = np.random.default_rng(seed)
    controls = [(feature_shift(x, rng), gaussian_like(x, rng)) for x in matrices]
    return np.stack([batched_stats(matrices, rho), batched_stats([c[0] for c in controls], rho),
                     batched_stats([c[1] for c in controls], rho)], axis=1)


# --------------------------------------------------------------------------- paired tests

def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); nan stays nan."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    defined = np.flatnonzero(~np.isnan(p))
    order = defined[np.argsort(p[defined], kind="stable")]
    scaled = p[order] * (len(order) - np.arange(len(order)))
    out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out


def signed_rank(differences: np.ndarray, alternative: str) -> tuple[float, float]:
    """Wilcoxon signed-rank (statistic, p) of paired differences; nan without a non-zero difference."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[~np.isnan(d)]
    if not np.any(d != 0):
        return float("nan"), float("nan")
    result = stats.wilcoxon(d, alternative=alternative)
    return float(result.statistic), float(result.pvalue)


def paired_tests(labels: Sequence[str], differences: Sequence[np.ndarray], alternative: str) -> list[dict]:
    """One signed-rank test per label on its per-run differences, Holm-adjusted across the labels."""
    raw = [signed_rank(d, alternative) for d in differences]
    adjusted = holm([p for _, p in raw])
    return [{"comparison": label, "runs": int(np.sum(~np.isnan(d))), "alternative": alternative,
             "statistic": s, "p": p, "p_holm": float(q)}
            for label, d, (s, p), q in zip(labels, differences, raw, adjusted)]


# --------------------------------------------------------------------------- low-energy subspace

def band_shares(weights: np.ndarray, bands: int) -> np.ndarray:
    """Shares (..., bands) of non-negative ``weights`` (..., r) over ordered directions in ``bands``
    contiguous rank bands of (nearly) equal size; a band with no direction (r < bands) is nan."""
    w = np.asarray(weights, dtype=np.float64)
    r = w.shape[-1]
    band_of = np.arange(r) * bands // max(r, 1)
    sums = np.stack([w[..., band_of == b].sum(axis=-1) for b in range(bands)], axis=-1)
    sizes = np.bincount(band_of, minlength=bands)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sizes > 0, sums / w.sum(axis=-1, keepdims=True), np.nan)


@dataclass(frozen=True)
class Subspace:
    """A history's centred directions: ``directions`` (r, d) orthonormal rows by decreasing energy,
    their ``energies`` (r,), the history ``mean`` (d,) and ``cut`` = r_ρ (directions ``cut:`` are V_low)."""

    directions: np.ndarray
    energies: np.ndarray
    mean: np.ndarray
    cut: int

    @classmethod
    def of(cls, x: np.ndarray, rho: float = RHO) -> Subspace:
        """The centred SVD of ``x`` (n, d) through the centred Gram matrix, keeping directions with energy
        above `RANK_RTOL` of the largest."""
        x = np.asarray(x, dtype=np.float64)
        mean = x.mean(axis=0)
        centred = x - mean
        lam, u = np.linalg.eigh(centred @ centred.T)
        lam, u = lam[::-1], u[:, ::-1]
        keep = lam > RANK_RTOL * lam[0] if lam.size and lam[0] > 0 else np.zeros(lam.size, dtype=bool)
        directions = (u[:, keep].T @ centred) / np.sqrt(lam[keep])[:, None]
        cut = int(spectral_stats(lam[keep], x.shape[0], rho)[1]) if keep.any() else 0
        return cls(directions, lam[keep], mean, cut)

    def coefficients(self, vectors: np.ndarray) -> np.ndarray:
        """Coordinates (k, r) of ``vectors`` (k, d) on the directions."""
        return np.asarray(vectors, dtype=np.float64) @ self.directions.T

    def low_share(self, vectors: np.ndarray) -> np.ndarray:
        """``||V_lowᵀ v||² / ||Vᵀ v||²`` per row of ``vectors`` (k, d): m_low (Eq. 5) for an action,
        L_i (C.3) for a centred block; nan where ``||Vᵀ v||`` is zero."""
        c2 = self.coefficients(vectors) ** 2
        total = c2.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, c2[:, self.cut:].sum(axis=1) / total, np.nan)

    def low_alignment(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        """A_i (C.4): cosine of each centred row of ``x`` with ``a`` inside the low-energy subspace; nan
        where either projection is zero."""
        low = self.coefficients(np.asarray(x) - self.mean)[:, self.cut:]
        action = self.coefficients(np.asarray(a)[None])[0, self.cut:]
        norms = np.linalg.norm(low, axis=1) * np.linalg.norm(action)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(norms > 1e-12, low @ action / norms, np.nan)


# --------------------------------------------------------------------------- controlled replacement

@dataclass(frozen=True)
class Tolerance:
    """What a matched removal j must satisfy against the targeted block i: cosine of the two block
    embeddings >= ``similarity``, ``|i - j| <= recency`` blocks, serialised lengths within a factor of
    ``length_ratio``, and low alignment: ``A_j`` at most the history's median A."""

    similarity: float = 0.5
    recency: int = 6
    length_ratio: float = 2.0


@dataclass(frozen=True)
class Replacement:
    """One checkpoint's pair: targeted block, matched block, their A, and the matching quantities."""

    targeted: int
    matched: int
    alignment: tuple[float, float]
    similarity: float
    gap: int
    length_ratio: float


def match_removal(x: np.ndarray, alignment: np.ndarray, lengths: np.ndarray,
                  tolerance: Tolerance = Tolerance()) -> Replacement | None:
    """The targeted block (highest positive A_i) and its matched removal, or None when no block is
    positively aligned or no candidate meets ``tolerance``.

    Among the candidates the match minimises the sum of the three matching distances, each scaled to
    [0, 1] by its tolerance (ties: the lower index).
    """
    a = np.asarray(alignment, dtype=np.float64)
    if not np.any(a > 0):
        return None
    i = int(np.nanargmax(a))
    x = np.asarray(x, dtype=np.float64)
    similarity = x @ x[i] / (np.linalg.norm(x, axis=1) * np.linalg.norm(x[i]))
    gap = np.abs(np.arange(len(a)) - i)
    ratio = np.maximum(lengths, lengths[i]) / np.maximum(np.minimum(lengths, lengths[i]), 1)
    ok = ((a <= np.nanmedian(a)) & (similarity >= tolerance.similarity) & (gap <= tolerance.recency)
          & (ratio <= tolerance.length_ratio) & (gap > 0))
    if not ok.any():
        return None
    cost = ((1 - similarity) / max(1 - tolerance.similarity, 1e-12) + gap / max(tolerance.recency, 1)
            + np.log(ratio) / max(np.log(tolerance.length_ratio), 1e-12))
    j = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    return Replacement(i, j, (float(a[i]), float(a[j])), float(similarity[j]), int(gap[j]), float(ratio[j]))


def replacement_deltas(x: np.ndarray, a: np.ndarray, pair: Replacement) -> np.ndarray:
    """`DELTAS` (targeted minus matched) of the whole history without ``pair.targeted`` against the whole
    history without ``pair.matched``: both keep n - 1 blocks."""
    targets = Targets.build(x, a, x[-1], None)
    everything = np.arange(len(x))
    targeted = targets.measure(everything[everything != pair.targeted])
    matched = targets.measure(everything[everything != pair.matched])
    return (targeted - matched)[DELTA_COLUMNS]


# --------------------------------------------------------------------------- checkpoints

@dataclass(frozen=True)
class CheckpointResult:
    """One checkpoint: m_low(a), the action's and the history's energy per rank band, the replacement."""

    t: int
    m_low: float
    action_bands: np.ndarray
    history_bands: np.ndarray
    replacement: Replacement | None
    deltas: np.ndarray | None


def analyse_checkpoint(x: np.ndarray, a: np.ndarray, lengths: np.ndarray, bands: int,
                       tolerance: Tolerance = Tolerance(), rho: float = RHO) -> CheckpointResult:
    """Everything §4.3 measures at a history ``x`` (t, d) before the next action ``a`` (d,), with the
    blocks' serialised ``lengths`` (t,)."""
    space = Subspace.of(x, rho)
    pair = match_removal(x, space.low_alignment(x, a), np.asarray(lengths, dtype=np.float64), tolerance)
    return CheckpointResult(
        t=len(x), m_low=float(space.low_share(np.asarray(a)[None])[0]),
        action_bands=band_shares(space.coefficients(np.asarray(a)[None])[0] ** 2, bands),
        history_bands=band_shares(space.energies, bands), replacement=pair,
        deltas=None if pair is None else replacement_deltas(x, a, pair))


# --------------------------------------------------------------------------- coverage counts

def greedy_counts(matrices: Sequence[np.ndarray], tau: float = 0.90, backend: str = "auto") -> np.ndarray:
    """Blocks greedy uncentred coverage selects to reach E(S) >= ``tau`` in each history (no capacity limit,
    nothing protected), in one `select_batch` call."""
    selections = select_batch(list(matrices), tau=tau, k=[len(x) for x in matrices], backend=backend)
    return np.array([len(s.indices) for s in selections], dtype=np.int64)
