"""An independent float64 reference of DESIGN.md §1, written for clarity, not speed.

Nothing here imports gemkernels: the reference is the contract written out literally,

1. rows are L2-normalised (in float64);
2. B starts as P ascending; each protected row whose residual against the basis is above
   eps adds one modified-Gram-Schmidt direction (with one reorthogonalisation pass) to Q;
3. K_t = max(k, |P|) (never more than n); while |B| < K_t and E(B) < tau, pick the eligible
   row not in B with the largest residual r_i = 1 - ||Q^T x_i||^2 (ties: lowest index),
   computed directly from Q every step; stop if that residual is <= eps, else add it;
4. E(B) = mean over all n rows of ||Q^T x_i||^2.

Floating-point ties are legitimately ambiguous, so every decision records how far it was
from flipping (its *margin*), and `Reference.comparable` is the length of the index prefix
that any correct implementation must reproduce.

Accuracy also depends on conditioning: a direction added from a row whose residual r is
small is known only to about u/r in a working precision u (u/r^(1/2) for MGS, u/r for the
Gram/Cholesky update), and every later residual inherits that error. ``pivot_slack`` widens
every margin after such a pivot by ``pivot_slack / min_pivot`` (``min_pivot``: the smallest
residual from which a direction was added so far), so ill-conditioned inputs do not turn
rounding into false failures; `Reference.min_pivot` and `Replay.min_pivot` report it. `replay` goes the
other way: it takes an implementation's answer and checks, in float64, that each of its decisions was a legal
greedy decision within a tolerance, whatever the ties did.

Tests import this module (``from reference import ...``); the benchmarks may import it as
their baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEFAULT_TAU, DEFAULT_K, DEFAULT_EPS = 0.90, 16, 1e-6
#: Decisions closer than this to flipping are treated as ties (either outcome is correct).
DEFAULT_MARGIN = 1e-4

STOP_CAPACITY, STOP_COVERAGE, STOP_EXHAUSTED = "capacity", "coverage", "exhausted"


# --------------------------------------------------------------------------- inputs


def normalise_rows(x) -> np.ndarray:
    """Rows of ``x`` as float64 unit vectors (x must already be finite and non-zero)."""
    x = np.array(x, dtype=np.float64)
    norms = np.sqrt(np.sum(x * x, axis=1))
    return x / norms[:, None]


def as_mask(spec, n: int, default: bool) -> np.ndarray:
    """None, an index sequence (a set: duplicates count once) or a bool mask -> bool mask of length n."""
    if spec is None:
        return np.full(n, default, dtype=bool)
    arr = np.asarray(spec)
    if arr.dtype == np.bool_:
        assert arr.shape == (n,)
        return arr.copy()
    mask = np.zeros(n, dtype=bool)
    for i in arr.reshape(-1).tolist():
        mask[int(i)] = True
    return mask


# --------------------------------------------------------------------------- the basis


def projection_energies(basis: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """||Q^T x_i||^2 = sum over basis vectors q of (q . x_i)^2, for every row of x."""
    energy = np.zeros(x.shape[0], dtype=np.float64)
    for q in basis:
        energy += (x @ q) ** 2
    return energy


def all_residuals(basis: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """r_i = 1 - ||Q^T x_i||^2 for every unit row, straight from Q (not incrementally)."""
    return 1.0 - projection_energies(basis, x)


def residual(basis: list[np.ndarray], v: np.ndarray) -> float:
    """r = 1 - ||Q^T v||^2 for one unit row v."""
    return float(all_residuals(basis, v[None, :])[0])


def coverage_of(basis: list[np.ndarray], x: np.ndarray) -> float:
    """E(B) = (1/n) sum_i ||Q^T x_i||^2 over all n rows."""
    return float(np.mean(projection_energies(basis, x)))


def mgs_direction(basis: list[np.ndarray], v: np.ndarray) -> np.ndarray:
    """Modified Gram-Schmidt: v minus its projection on each basis vector in turn, done twice, normalised."""
    w = v.copy()
    for _ in range(2):  # one MGS pass plus one reorthogonalisation pass
        for q in basis:
            w = w - float(q @ w) * q
    return w / np.sqrt(float(w @ w))


# --------------------------------------------------------------------------- reference


@dataclass
class Step:
    """One completion decision, with its distance from flipping."""

    position: int            # |B| when the decision was taken (= position of the picked index)
    coverage: float          # E(B) at the loop check
    tau_gap: float           # |E(B) - tau|
    best: int | None         # the picked row (None: no eligible candidate left)
    best_residual: float
    second_gap: float        # best residual - second-best residual (inf with one candidate)
    eps_gap: float           # |best residual - eps|


@dataclass
class Reference:
    indices: np.ndarray                      # int64, selection order
    coverage: float
    residuals: np.ndarray                    # float64, length n, straight from the final Q
    num_protected: int
    capacity: int                            # K_t = min(max(k, |P|), n)
    stop: str                                # "capacity" | "coverage" | "exhausted"
    directions: int                          # rank of the final basis
    min_pivot: float                         # smallest residual from which a direction was added (1 if none)
    protected_gaps: list[float] = field(default_factory=list)   # |r_p - eps| per protected row
    steps: list[Step] = field(default_factory=list)
    tau_gaps: list[float] = field(default_factory=list)          # |E(B) - tau| at every loop check
    comparable: int = 0                      # indices[:comparable] are unambiguous
    exact: bool = True                       # the whole list (its length too) and stop are unambiguous


def reference_select(x, protected=None, eligible=None, tau: float = DEFAULT_TAU, k: int = DEFAULT_K,
                     eps: float = DEFAULT_EPS, margin: float = DEFAULT_MARGIN,
                     eps_margin: float | None = None, pivot_slack: float = 0.0) -> Reference:
    """DESIGN.md §1 in float64, literally. ``margin`` bounds the tau and best-vs-second ties,
    ``eps_margin`` (default: ``margin``) the residual-vs-eps ties; both grow by
    ``pivot_slack / min_pivot`` after ill-conditioned pivots (module docstring)."""
    eps_margin = margin if eps_margin is None else eps_margin
    min_pivot = 1.0
    xn = normalise_rows(x)
    n = xn.shape[0]
    p_mask = as_mask(protected, n, default=False)
    e_mask = as_mask(eligible, n, default=True)

    basis: list[np.ndarray] = []
    selected: list[int] = []
    ambiguous_at: list[int] = []     # positions where a decision was within its margin
    protected_gaps = []

    for p in np.flatnonzero(p_mask).tolist():   # ascending
        selected.append(p)
        r = residual(basis, xn[p])
        protected_gaps.append(abs(r - eps))
        if abs(r - eps) < eps_margin + pivot_slack / min_pivot:
            ambiguous_at.append(int(p_mask.sum()))  # the P prefix is fixed; what follows is not
        if r > eps:
            basis.append(mgs_direction(basis, xn[p]))
            min_pivot = min(min_pivot, r)

    capacity = min(max(int(k), len(selected)), n)
    steps: list[Step] = []
    tau_gaps: list[float] = []
    stop = None
    while True:
        position = len(selected)
        if position >= capacity:
            stop = STOP_CAPACITY
            break
        slack = pivot_slack / min_pivot
        energy = coverage_of(basis, xn)
        tau_gap = abs(energy - tau)
        tau_gaps.append(tau_gap)
        if tau_gap < margin + slack:
            ambiguous_at.append(position)
        if not energy < tau:
            stop = STOP_COVERAGE
            break
        in_b = set(selected)
        candidates = [i for i in range(n) if e_mask[i] and i not in in_b]
        if not candidates:
            steps.append(Step(position, energy, tau_gap, None, -np.inf, np.inf, np.inf))
            stop = STOP_EXHAUSTED
            break
        r_all = all_residuals(basis, xn)
        res = {i: float(r_all[i]) for i in candidates}
        best = candidates[0]
        for i in candidates:            # strict '>' keeps the lowest index on exact ties
            if res[i] > res[best]:
                best = i
        others = [res[i] for i in candidates if i != best]
        second_gap = res[best] - max(others) if others else np.inf
        eps_gap = abs(res[best] - eps)
        steps.append(Step(position, energy, tau_gap, best, res[best], second_gap, eps_gap))
        # With an empty basis every residual is exactly 1 by definition (not by rounding): the
        # first pick is the lowest eligible index, a tie the contract resolves, not a float tie.
        if (second_gap < margin + slack and basis) or eps_gap < eps_margin + slack:
            ambiguous_at.append(position)
        if res[best] <= eps:
            stop = STOP_EXHAUSTED
            break
        selected.append(best)
        basis.append(mgs_direction(basis, xn[best]))
        min_pivot = min(min_pivot, res[best])

    comparable = min(ambiguous_at) if ambiguous_at else len(selected)
    return Reference(
        indices=np.array(selected, dtype=np.int64),
        coverage=coverage_of(basis, xn),
        residuals=all_residuals(basis, xn),
        num_protected=int(p_mask.sum()),
        capacity=capacity,
        stop=stop,
        directions=len(basis),
        min_pivot=min_pivot,
        protected_gaps=protected_gaps,
        steps=steps,
        tau_gaps=tau_gaps,
        comparable=min(comparable, len(selected)),
        exact=not ambiguous_at,
    )


# --------------------------------------------------------------------------- replay


@dataclass
class Replay:
    coverage: float          # E of the replayed selection, float64
    residuals: np.ndarray    # final residuals of the replayed selection, float64
    directions: int
    min_pivot: float         # smallest residual from which a direction was added (1 if none)
    violations: list[str]    # empty when every decision was legal within tol


def replay(x, indices, protected=None, eligible=None, tau: float = DEFAULT_TAU, k: int = DEFAULT_K,
           eps: float = DEFAULT_EPS, tol: float = DEFAULT_MARGIN, eps_tol: float | None = None,
           pivot_slack: float = 0.0) -> Replay:
    """Check that ``indices`` (an implementation's answer) is a legal greedy run of §1 in float64.

    Each completion pick must be eligible, new, and within ``tol`` of the best residual and
    above ``eps - eps_tol``; the loop must have been allowed to continue (|B| < K_t, E < tau + tol);
    and it must have been allowed to stop (|B| = K_t, E >= tau - tol, or no eligible row with
    residual above eps + eps_tol). Both tolerances grow by ``pivot_slack / min_pivot``.
    """
    eps_tol = tol if eps_tol is None else eps_tol
    xn = normalise_rows(x)
    n = xn.shape[0]
    p_mask = as_mask(protected, n, default=False)
    e_mask = as_mask(eligible, n, default=True)
    indices = [int(i) for i in np.asarray(indices).reshape(-1).tolist()]
    protected_sorted = np.flatnonzero(p_mask).tolist()
    capacity = min(max(int(k), len(protected_sorted)), n)
    violations = []

    if indices[:len(protected_sorted)] != protected_sorted:
        violations.append(f"prefix {indices[:len(protected_sorted)]} is not P ascending {protected_sorted}")
    if len(set(indices)) != len(indices):
        violations.append(f"repeated indices in {indices}")
    if len(indices) > capacity:
        violations.append(f"{len(indices)} indices exceed K_t = {capacity}")
    if any(i < 0 or i >= n for i in indices):
        return Replay(np.nan, np.full(n, np.nan), 0, np.nan, violations + [f"index out of range in {indices}"])

    basis: list[np.ndarray] = []
    min_pivot = 1.0
    for p in indices[:len(protected_sorted)]:
        r = residual(basis, xn[p])
        if r > eps:
            basis.append(mgs_direction(basis, xn[p]))
            min_pivot = min(min_pivot, r)

    chosen = set(indices[:len(protected_sorted)])
    for position in range(len(protected_sorted), len(indices)):
        i = indices[position]
        slack = pivot_slack / min_pivot
        energy = coverage_of(basis, xn)
        if energy >= tau + tol + slack:
            violations.append(f"position {position}: continued although E={energy:.6f} >= tau={tau}")
        if not e_mask[i]:
            violations.append(f"position {position}: row {i} is not eligible")
        if i in chosen:
            violations.append(f"position {position}: row {i} picked twice")
        candidates = [j for j in range(n) if e_mask[j] and j not in chosen]
        r_all = all_residuals(basis, xn)
        best = max((float(r_all[j]) for j in candidates), default=-np.inf)
        r = float(r_all[i])
        if r < best - tol - slack:
            violations.append(f"position {position}: row {i} has residual {r:.6f}, best is {best:.6f}")
        if not basis and candidates and i != min(candidates):
            violations.append(f"position {position}: with an empty basis every residual is exactly 1, "
                              f"so the lowest eligible row {min(candidates)} wins the tie, not {i}")
        if r <= eps - eps_tol - slack:
            violations.append(f"position {position}: row {i} has residual {r:.3g} <= eps")
        chosen.add(i)
        if r > eps:
            basis.append(mgs_direction(basis, xn[i]))
            min_pivot = min(min_pivot, r)

    slack = pivot_slack / min_pivot
    energy = coverage_of(basis, xn)
    if len(indices) < capacity and energy < tau - tol - slack:
        candidates = [j for j in range(n) if e_mask[j] and j not in chosen]
        r_all = all_residuals(basis, xn)
        best = max((float(r_all[j]) for j in candidates), default=-np.inf)
        if best > eps + eps_tol + slack:
            violations.append(f"stopped at {len(indices)} < K_t={capacity} with E={energy:.6f} < tau={tau} "
                              f"and a candidate of residual {best:.6f} left")
    return Replay(energy, all_residuals(basis, xn), len(basis), min_pivot, violations)


def expected_stop(count: int, capacity: int, coverage: float, tau: float) -> str:
    """The `stop` label a result with these numbers must carry (capacity wins, then coverage)."""
    if count >= capacity:
        return STOP_CAPACITY
    if coverage >= tau:
        return STOP_COVERAGE
    return STOP_EXHAUSTED
