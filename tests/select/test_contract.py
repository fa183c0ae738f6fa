"""Selection (DESIGN.md §1), every backend against the float64 reference: random inputs, ties, eps, edge cases,
properties (hypothesis) and bad input refused with a clear message. Shared helpers: tests/select_helpers.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402
from reference import STOP_CAPACITY, STOP_COVERAGE, STOP_EXHAUSTED, expected_stop, replay  # noqa: E402
from select_helpers import (  # noqa: E402
    BACKEND_NAMES,
    BACKENDS,
    CPU_BACKENDS,
    KINDS,
    TOLS,
    X,
    backend_marks,
    check_selection,
    interpreted,
    make_x,
    random_problem,
    sel_idx,
    shapes_for,
    to_np,
    torch,
)

import gemkernels as gk  # noqa: E402


def random_params():
    out = []
    for b in BACKEND_NAMES:
        dtypes = ["float32", "float16"] + (["float64"] if b in ("numpy", "numba") else [])
        for dt in dtypes:
            for n, d in shapes_for(b):
                out.append(pytest.param(b, dt, n, d, id=f"{b}-{dt}-n{n}-d{d}", marks=backend_marks(b)))
    return out


@pytest.mark.parametrize("backend,dtype,n,d", random_params())
def test_random_inputs_match_reference(backend, dtype, n, d):
    seed = n * 1009 + d * 13 + ["float32", "float16", "float64"].index(dtype)
    rng = np.random.default_rng(seed)
    draws = 2 if interpreted(backend) else 3
    for _ in range(draws):
        x64, protected, eligible, tau, k = random_problem(rng, n, d, max_k=16 if interpreted(backend) else 32)
        x = x64.astype(dtype)
        sel = gk.select(x, protected=protected, eligible=eligible, tau=tau, k=k, backend=backend)
        assert isinstance(sel.indices, np.ndarray)   # numpy in, numpy out, whatever the backend
        check_selection(sel, x, protected, eligible, tau, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_eps_stops_early(backend):
    rng = np.random.default_rng(7)
    x = make_x(rng, 30, 12, "gaussian").astype(np.float32)
    sel = gk.select(x, tau=1.0, k=30, eps=0.3, backend=backend)
    ref = check_selection(sel, x, tau=1.0, k=30, eps=0.3)
    assert ref.exact and ref.stop == STOP_EXHAUSTED and len(ref.indices) == 11   # eps cuts before the rank (12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_go_to_lowest_index(backend):
    # Orthogonal rows keep every residual at exactly 1: each pick is a tie, won by the lowest index.
    x = np.zeros((6, 9), dtype=np.float32)
    x[np.arange(6), [4, 0, 8, 2, 6, 1]] = [1.0, 2.0, 0.5, 3.0, 1.0, 4.0]
    sel = gk.select(x, protected=[3], k=4, tau=1.0, backend=backend)
    assert to_np(sel.indices).tolist() == [3, 0, 1, 2]
    # Equal rows: row 5 duplicates row 2 (scaled), both orthogonal to the rest; 2 comes first, 5 never.
    y = np.eye(5, 8, dtype=np.float32)
    y = np.concatenate([y, 7 * y[2:3]])
    sel = gk.select(y, k=6, tau=1.0, backend=backend)
    assert to_np(sel.indices).tolist() == [0, 1, 2, 3, 4]
    assert sel.stop == expected_stop(5, 6, sel.coverage, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_coverage_exactly_tau_stops(backend):
    # Orthogonal rows make the arithmetic exact: after two picks E = 2/4 = 0.5 exactly, and "while E < tau"
    # must stop there (a '<=' would take a third row).
    x = np.zeros((4, 6), dtype=np.float32)
    x[np.arange(4), [1, 3, 0, 5]] = [2.0, 1.0, 0.5, 4.0]
    sel = gk.select(x, tau=0.5, k=4, backend=backend)
    assert sel_idx(sel) == [0, 1] and sel.stop == STOP_COVERAGE and sel.coverage == 0.5
    np.testing.assert_array_equal(to_np(sel.residuals), [0.0, 0.0, 1.0, 1.0])
    sel = gk.select(x, protected=[3], tau=0.75, k=4, backend=backend)
    assert sel_idx(sel) == [3, 0, 1] and sel.stop == STOP_COVERAGE and sel.coverage == 0.75


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_row(backend):
    x = np.array([[0.0, 3.0, -4.0, 0.0, 1.0, 0.0, 2.0]], dtype=np.float32)
    for protected in (None, [0], [0, 0]):
        sel = gk.select(x, protected=protected, backend=backend)
        assert sel_idx(sel) == [0] and sel.stop == STOP_CAPACITY
        assert sel.num_protected == (0 if protected is None else 1)
        assert abs(sel.coverage - 1.0) <= 1e-5 and abs(float(to_np(sel.residuals)[0])) <= 1e-5
    sel = gk.select(x, eligible=[], backend=backend)
    assert sel_idx(sel) == [] and sel.stop == STOP_EXHAUSTED and sel.coverage == 0.0
    assert to_np(sel.residuals).tolist() == [1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fewer_rows_than_k(backend):
    x = make_x(np.random.default_rng(31), 5, 33, "gaussian").astype(np.float32)
    sel = gk.select(x, k=16, tau=1.0, backend=backend)
    check_selection(sel, x, k=16, tau=1.0)
    assert sorted(sel_idx(sel)) == [0, 1, 2, 3, 4] and sel.stop == STOP_CAPACITY   # K_t never exceeds n
    assert abs(sel.coverage - 1.0) <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_rows_protected(backend):
    x = make_x(np.random.default_rng(32), 12, 20, "clustered").astype(np.float32)
    sel = gk.select(x, protected=np.ones(12, dtype=bool), k=3, tau=0.5, backend=backend)
    assert sel_idx(sel) == list(range(12)) and sel.num_protected == 12 and sel.stop == STOP_CAPACITY
    check_selection(sel, x, np.ones(12, dtype=bool), None, 0.5, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_protected_than_k_keeps_all_and_adds_nothing(backend):
    rng = np.random.default_rng(33)
    x = make_x(rng, 30, 33, "gaussian").astype(np.float32)
    p = rng.choice(30, size=10, replace=False)
    sel = gk.select(x, protected=p, k=4, tau=1.0, backend=backend)
    assert sel_idx(sel) == sorted(p.tolist()) and sel.num_protected == 10 and sel.stop == STOP_CAPACITY
    check_selection(sel, x, p, None, 1.0, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_protected_indices_count_once(backend):
    x = make_x(np.random.default_rng(34), 20, 16, "embedding").astype(np.float32)
    a = gk.select(x, protected=[9, 2, 9, 2, 2, 14], k=5, tau=0.999, backend=backend)
    b = gk.select(x, protected=[2, 9, 14], k=5, tau=0.999, backend=backend)
    assert a.num_protected == 3 and sel_idx(a)[:3] == [2, 9, 14]
    assert sel_idx(a) == sel_idx(b) and len(sel_idx(a)) == 5      # K_t = max(5, 3), not max(5, 6)
    check_selection(a, x, [2, 9, 14], None, 0.999, 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dependent_protected_rows_add_no_direction(backend):
    rng = np.random.default_rng(35)
    x = make_x(rng, 40, 24, "gaussian")
    x[3] = 0.3 * x[0] - 2.0 * x[1] + 0.7 * x[2]     # linear combination of protected rows
    x[4] = -2.5 * x[1]                              # scaled, negated duplicate
    x[5] = x[0]                                     # exact duplicate
    x = x.astype(np.float32)
    dep = gk.select(x, protected=[0, 1, 2, 3, 4, 5], k=10, tau=1.0, backend=backend)
    ind = gk.select(x, protected=[0, 1, 2], k=7, tau=1.0, backend=backend)
    assert sel_idx(dep)[:6] == [0, 1, 2, 3, 4, 5] and dep.num_protected == 6
    assert sel_idx(dep)[6:] == sel_idx(ind)[3:], "dependent protected rows changed the completion"
    assert abs(dep.coverage - ind.coverage) <= 1e-5
    assert np.abs(to_np(dep.residuals)[:6]).max() <= 1e-5
    ref = check_selection(dep, x, [0, 1, 2, 3, 4, 5], None, 1.0, 10)
    assert ref.directions == 3 + 4
    # Only the protected rows: coverage equals that of the three independent ones.
    dep0 = gk.select(x, protected=[0, 1, 2, 3, 4, 5], k=0, backend=backend)
    ind0 = gk.select(x, protected=[0, 1, 2], k=0, backend=backend)
    assert abs(dep0.coverage - ind0.coverage) <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,d,rank", [(50, 7, 7), (60, 40, 4), (64, 48, 1)])
def test_rank_deficient_stops_at_the_rank(backend, n, d, rank):
    rng = np.random.default_rng(36 + rank)
    x = (rng.standard_normal((n, rank)) @ rng.standard_normal((rank, d))).astype(np.float32)
    sel = gk.select(x, k=n, tau=1.0, backend=backend)
    assert len(sel_idx(sel)) == rank, f"picked {len(sel_idx(sel))} rows from a rank-{rank} set"
    assert sel.stop in (STOP_EXHAUSTED, STOP_COVERAGE)
    assert sel.stop == expected_stop(rank, n, sel.coverage, 1.0)
    assert abs(sel.coverage - 1.0) <= 1e-5 and np.abs(to_np(sel.residuals)).max() <= 1e-5
    check_selection(sel, x, None, None, 1.0, n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_of_a_selected_row_is_never_selected(backend):
    rng = np.random.default_rng(37)
    base = make_x(rng, 24, 40, "gaussian")
    pairs = [(0, 24), (5, 25), (11, 26), (23, 27), (7, 28)]
    x = np.concatenate([base, 3 * base[[0, 5]], -base[[11]], 0.5 * base[[23]], base[[7]]]).astype(np.float32)
    sel = gk.select(x, protected=[7], k=len(x), tau=1.0, backend=backend)
    idx = sel_idx(sel)
    for a, b in pairs:
        assert not (a in idx and b in idx), f"rows {a} and {b} are the same direction; both were selected"
    assert len(idx) == 24 and sel.stop == expected_stop(24, len(x), sel.coverage, 1.0)
    assert 28 not in idx                             # a duplicate of a protected row
    check_selection(sel, x, [7], None, 1.0, len(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_eligible_row(backend):
    x = make_x(np.random.default_rng(38), 15, 12, "gaussian").astype(np.float32)
    for eligible in ([], np.zeros(15, dtype=bool), [1, 3]):      # [1, 3]: only protected rows eligible
        sel = gk.select(x, protected=[3, 1], eligible=eligible, k=8, backend=backend)
        assert sel_idx(sel) == [1, 3] and sel.stop == STOP_EXHAUSTED and sel.num_protected == 2
        check_selection(sel, x, [3, 1], eligible, k=8)
    sel = gk.select(x, eligible=[], k=8, backend=backend)
    assert sel_idx(sel) == [] and sel.stop == STOP_EXHAUSTED and sel.coverage == 0.0
    np.testing.assert_allclose(to_np(sel.residuals), 1.0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exhausted_when_eligible_rows_are_in_the_span(backend):
    rng = np.random.default_rng(39)
    x = make_x(rng, 20, 16, "gaussian")
    x[2], x[3], x[4] = x[0] + x[1], -2 * x[0], x[1] - 0.5 * x[0]
    x = x.astype(np.float32)
    sel = gk.select(x, protected=[0, 1], eligible=[2, 3, 4], k=10, backend=backend)
    assert sel_idx(sel) == [0, 1] and sel.stop == STOP_EXHAUSTED
    check_selection(sel, x, [0, 1], [2, 3, 4], k=10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_protected_rows_need_not_be_eligible(backend):
    x = make_x(np.random.default_rng(40), 12, 8, "gaussian").astype(np.float32)
    eligible = np.ones(12, dtype=bool)
    eligible[[0, 6]] = False
    sel = gk.select(x, protected=[6], eligible=eligible, k=5, tau=1.0, backend=backend)
    idx = sel_idx(sel)
    assert idx[0] == 6 and 0 not in idx and len(idx) == 5
    check_selection(sel, x, [6], eligible, 1.0, 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tau_already_reached_by_protected(backend):
    rng = np.random.default_rng(41)
    x = (rng.standard_normal((30, 3)) @ rng.standard_normal((3, 20))).astype(np.float32)   # rank 3
    sel = gk.select(x, protected=[2, 10, 17], k=10, tau=0.9, backend=backend)
    assert sel_idx(sel) == [2, 10, 17] and sel.stop == STOP_COVERAGE and sel.coverage >= 0.9
    check_selection(sel, x, [2, 10, 17], None, 0.9, 10)
    # tau small enough that one protected row reaches it
    y = make_x(rng, 25, 16, "embedding").astype(np.float32)
    sel = gk.select(y, protected=[4], k=10, tau=0.05, backend=backend)
    assert sel_idx(sel) == [4] and sel.stop == STOP_COVERAGE
    check_selection(sel, y, [4], None, 0.05, 10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tau_one_fills_capacity(backend):
    x = make_x(np.random.default_rng(42), 10, 33, "embedding").astype(np.float32)
    sel = gk.select(x, k=16, tau=1.0, backend=backend)
    assert sorted(sel_idx(sel)) == list(range(10)) and sel.stop == STOP_CAPACITY
    check_selection(sel, x, None, None, 1.0, 16)
    sel = gk.select(x, k=6, tau=1.0, backend=backend)
    assert len(sel_idx(sel)) == 6 and sel.stop == STOP_CAPACITY and sel.coverage < 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_zero(backend):
    x = make_x(np.random.default_rng(43), 9, 8, "gaussian").astype(np.float32)
    sel = gk.select(x, k=0, backend=backend)
    assert sel_idx(sel) == [] and sel.stop == STOP_CAPACITY and sel.coverage == 0.0
    np.testing.assert_allclose(to_np(sel.residuals), 1.0, atol=1e-6)
    sel = gk.select(x, protected=[4, 2], k=0, backend=backend)
    assert sel_idx(sel) == [2, 4] and sel.stop == STOP_CAPACITY and sel.num_protected == 2
    check_selection(sel, x, [4, 2], None, k=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_and_mask_forms_agree(backend):
    x = make_x(np.random.default_rng(44), 16, 10, "clustered").astype(np.float32)
    p_mask = np.zeros(16, dtype=bool)
    p_mask[[1, 8]] = True
    e_mask = np.arange(16) % 3 != 0
    forms = [([8, 1], np.flatnonzero(e_mask).tolist()), (p_mask, e_mask), (np.array([1, 8]), np.flatnonzero(e_mask)),
             ((1, 8, 8), tuple(np.flatnonzero(e_mask).tolist()))]
    if torch is not None:
        forms.append((torch.tensor([8, 1]), torch.from_numpy(e_mask)))
    results = [gk.select(x, protected=p, eligible=e, k=6, backend=backend) for p, e in forms]
    for sel in results[1:]:
        assert sel_idx(sel) == sel_idx(results[0]) and sel.coverage == results[0].coverage
    check_selection(results[0], x, [1, 8], e_mask, k=6)


def rescaled_rows(backend, dtype, scales):
    """Unit rows in ``dtype``, and the same with rows 3 and 8 scaled by ``scales``."""
    x = make_x(np.random.default_rng(45), 20, 33 if not interpreted(backend) else 24, "gaussian")
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)
    y = x.astype(np.float64)
    y[3] *= scales[0]
    y[8] *= scales[1]
    y = y.astype(dtype)
    assert np.isfinite(y).all() and (np.abs(y).max(1) > 0).all()
    return x, y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,scales", [("float32", (1e-3, 1e3)), ("float16", (1e-2, 100.0))],
                         ids=["fp32-moderate", "fp16-moderate"])
def test_row_scale_does_not_matter(backend, dtype, scales):
    """Rows are normalised: scaling a row by a positive factor representable in the dtype changes nothing."""
    x, y = rescaled_rows(backend, dtype, scales)
    a = gk.select(x, k=20, tau=1.0, backend=backend)
    b = gk.select(y, k=20, tau=1.0, backend=backend)
    assert np.isfinite(to_np(b.residuals)).all() and np.isfinite(b.coverage), "finite non-zero rows gave NaN"
    assert sel_idx(a) == sel_idx(b)
    assert abs(a.coverage - b.coverage) <= TOLS[dtype].coverage


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_whose_norm_leaves_the_dtype_is_refused_by_name(backend):
    """Finite rows whose squared norm under- or overflows float32 are refused naming the row, never a silent NaN."""
    _, y = rescaled_rows(backend, "float32", (1e-25, 1e20))
    with pytest.raises(ValueError, match=r"row 3 .*too large or too small"):
        gk.select(y, k=20, tau=1.0, backend=backend)


# ----------------------------------------------------------------------------- properties (hypothesis)


@st.composite
def problems(draw, max_n=40, max_d=24):
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    kind = draw(st.sampled_from(("floats",) + KINDS))
    if kind == "floats":
        x = draw(hnp.arrays(np.float32, (n, d), elements=st.floats(-4, 4, width=32, allow_subnormal=False)))
        x[np.abs(x).max(axis=1) < 1e-3, 0] = 1.0      # zero/tiny rows are errors or scale tests, not properties
    else:
        x = make_x(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), n, d, kind).astype(np.float32)
    protected = draw(st.lists(st.integers(0, n - 1), max_size=min(n, 8)))
    eligible = draw(st.none() | hnp.arrays(np.bool_, (n,)))
    tau = draw(st.floats(0.01, 1.0))
    k = draw(st.integers(0, 24))
    return x, protected, eligible, tau, k


#: GK_HYPOTHESIS_EXAMPLES=1000 for a longer hunt; the default keeps the suite fast.
PROPERTY_SETTINGS = settings(max_examples=int(os.environ.get("GK_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@PROPERTY_SETTINGS
@given(problem=problems())
def test_properties(backend, problem):
    x, protected, eligible, tau, k = problem
    n = x.shape[0]
    sel = gk.select(x, protected=protected, eligible=eligible, tau=tau, k=k, backend=backend)
    idx, res = to_np(sel.indices), to_np(sel.residuals).astype(np.float64)
    p = sorted(set(protected))
    assert idx[:len(p)].tolist() == p, "P must be the ascending prefix"
    assert len(idx) <= min(max(k, len(p)), n)
    assert len(set(idx.tolist())) == len(idx), "indices must be unique"
    assert sel.num_protected == len(p)
    assert ((res >= -1e-5) & (res <= 1 + 1e-5)).all(), res
    assert abs(sel.coverage - float(np.mean(1.0 - res))) <= 1e-5
    if eligible is not None:
        assert all(eligible[i] for i in idx[len(p):]), "completion picked an ineligible row"
    tol = TOLS["float32"]
    rp = replay(x.astype(np.float64), idx, p, eligible, tau=tau, k=k, eps=gk.DEFAULT_EPS, tol=tol.margin,
                pivot_slack=tol.pivot_slack)
    assert not rp.violations, rp.violations
    assert abs(sel.coverage - rp.coverage) <= tol.coverage + tol.coverage_slack / rp.min_pivot


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@PROPERTY_SETTINGS
@given(problem=problems(), extra=st.integers(1, 16))
def test_coverage_never_falls_as_k_grows(backend, problem, extra):
    x, protected, eligible, tau, k = problem
    small = gk.select(x, protected=protected, eligible=eligible, tau=tau, k=k, backend=backend)
    large = gk.select(x, protected=protected, eligible=eligible, tau=tau, k=k + extra, backend=backend)
    assert large.coverage >= small.coverage - 1e-5
    assert len(large.indices) >= len(small.indices)


# ----------------------------------------------------------------------------- bad input

R = gk.RaggedBatch.from_list([X])


def with_value(value, row=2, col=3):
    y = X.copy()
    y[row, col] = value
    return y


def zero_row(row=2):
    y = X.copy()
    y[row] = 0
    return y


BAD_INPUTS = [
    ("nan", lambda: gk.select(with_value(np.nan)), ValueError, r"\brow 2\b.*not finite"),
    ("inf", lambda: gk.select(with_value(np.inf, row=4)), ValueError, r"\brow 4\b.*not finite"),
    ("-inf", lambda: gk.select(with_value(-np.inf, row=0)), ValueError, r"\brow 0\b.*not finite"),
    ("zero-row", lambda: gk.select(zero_row(1)), ValueError, r"\brow 1\b.*all zeros"),
    ("batch-nan", lambda: gk.select_batch([X, with_value(np.nan, row=3)]), ValueError,
     r"session 1 row 3\b.*not finite"),
    ("batch-zero", lambda: gk.select_batch([zero_row(4), X]), ValueError, r"session 0 row 4\b.*all zeros"),
    ("1-D", lambda: gk.select(X[0]), ValueError, r"2-D"),
    ("3-D", lambda: gk.select(X[None]), ValueError, r"2-D"),
    ("no-rows", lambda: gk.select(X[:0]), ValueError, r"no rows"),
    ("no-columns", lambda: gk.select(X[:, :0]), ValueError, r"at least one column"),
    ("not-an-array", lambda: gk.select("abc"), TypeError, r"numpy array"),
    ("protected-out-of-range", lambda: gk.select(X, protected=[1, 5]), ValueError,
     r"protected index 5 is out of range"),
    ("protected-negative", lambda: gk.select(X, protected=[-1]), ValueError, r"protected index -1 is out of range"),
    ("eligible-out-of-range", lambda: gk.select(X, eligible=[0, 9]), ValueError, r"eligible index 9"),
    ("protected-float-indices", lambda: gk.select(X, protected=[1.5]), TypeError, r"protected"),
    ("eligible-mask-short", lambda: gk.select(X, eligible=np.ones(4, dtype=bool)), ValueError,
     r"eligible mask has length 4, expected 5"),
    ("protected-mask-long", lambda: gk.select(X, protected=np.ones(6, dtype=bool)), ValueError,
     r"protected mask has length 6, expected 5"),
    ("batch-mask-length", lambda: gk.select_batch([X, X[:3]], eligible=[None, np.ones(5, dtype=bool)]),
     ValueError, r"eligible\[1\] mask has length 5, expected 3"),
    ("batch-protected-count", lambda: gk.select_batch([X, X], protected=[[0]]), ValueError,
     r"protected has 1 entries for 2 sessions"),
    ("batch-different-d", lambda: gk.select_batch([X, X[:, :6]]), ValueError, r"share d.*\[6, 7\]"),
    ("batch-empty", lambda: gk.select_batch([]), TypeError, r"non-empty"),
    ("integer-x", lambda: gk.select(X.astype(np.int32)), TypeError, r"floating-point"),
    ("bool-x", lambda: gk.select(X > 0), TypeError, r"floating-point"),
    ("tau-0", lambda: gk.select(X, tau=0), ValueError, r"tau must lie in \(0, 1\]"),
    ("tau-negative", lambda: gk.select(X, tau=-0.1), ValueError, r"tau must lie in \(0, 1\]"),
    ("tau-above-1", lambda: gk.select(X, tau=1.5), ValueError, r"tau must lie in \(0, 1\]"),
    ("tau-nan", lambda: gk.select(X, tau=float("nan")), ValueError, r"tau must lie in \(0, 1\]"),
    ("tau-bool", lambda: gk.select(X, tau=True), TypeError, r"tau"),
    ("tau-per-session", lambda: gk.select_batch([X, X], tau=[0.5, 1.5]), ValueError, r"tau must lie in"),
    ("tau-wrong-count", lambda: gk.select_batch([X, X], tau=[0.5, 0.6, 0.7]), ValueError,
     r"tau must be a scalar or have one value per session \(2\)"),
    ("k-negative", lambda: gk.select(X, k=-1), ValueError, r"k must be >= 0"),
    ("k-float", lambda: gk.select(X, k=2.5), TypeError, r"k must be an integer"),
    ("k-string", lambda: gk.select(X, k="3"), TypeError, r"\bk\b"),
    ("k-per-session-negative", lambda: gk.select_batch([X, X], k=[3, -2]), ValueError, r"k must be >= 0"),
    ("eps-negative", lambda: gk.select(X, eps=-1e-6), ValueError, r"eps must be finite and >= 0"),
    ("eps-nan", lambda: gk.select(X, eps=float("nan")), ValueError, r"eps"),
    ("offsets-decreasing", lambda: gk.RaggedBatch(X, np.array([0, 3, 2, 5]), np.zeros(5, bool), np.ones(5, bool)),
     ValueError, r"non-decreasing"),
    ("offsets-short", lambda: gk.RaggedBatch(X, np.array([0, 2, 4]), np.zeros(5, bool), np.ones(5, bool)),
     ValueError, r"end at the row count 5"),
    ("offsets-long", lambda: gk.RaggedBatch(X, np.array([0, 2, 6]), np.zeros(5, bool), np.ones(5, bool)),
     ValueError, r"end at the row count 5"),
    ("offsets-start", lambda: gk.RaggedBatch(X, np.array([1, 3, 5]), np.zeros(5, bool), np.ones(5, bool)),
     ValueError, r"start at 0"),
    ("offsets-float", lambda: gk.RaggedBatch(X, np.array([0.0, 5.0]), np.zeros(5, bool), np.ones(5, bool)),
     ValueError, r"offsets must be a 1-D integer array"),
    ("ragged-mask-shape", lambda: gk.RaggedBatch(X, np.array([0, 5]), np.zeros(4, bool), np.ones(5, bool)),
     ValueError, r"protected must be a bool mask of shape \(5,\)"),
    ("select-ragged-list", lambda: gk.select_ragged([X]), TypeError, r"RaggedBatch"),
    ("unknown-backend", lambda: gk.select(X, backend="jax"), ValueError, r"unknown backend 'jax'"),
    ("unknown-backend-batch", lambda: gk.select_ragged(R, backend="TORCH"), ValueError, r"unknown backend 'TORCH'"),
    ("cupy-backend", lambda: gk.select(X, backend="cupy"), ValueError, r"unknown backend 'cupy'.*CuPy arrays run"),
]


@pytest.mark.parametrize("call,error,match", [pytest.param(c, e, m, id=i) for i, c, e, m in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("value,problem", [(float("nan"), "not finite"), (float("inf"), "not finite"),
                                           (0.0, "all zeros")])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_bad_rows_in_torch_tensors(value, problem, dtype):
    if torch is None:
        pytest.skip("torch is not installed")
    x = torch.from_numpy(X.copy()).to(getattr(torch, dtype))
    if value == 0.0:
        x[3] = 0
    else:
        x[3, 1] = value
    with pytest.raises(ValueError, match=rf"\brow 3\b.*{problem}"):
        gk.select(x)
