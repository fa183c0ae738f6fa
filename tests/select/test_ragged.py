"""Many sessions at once (DESIGN.md §1): `select_batch` against single selections and the reference, `RaggedBatch`
and the packed layout of `select_ragged`. Shared helpers: tests/select_helpers.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from reference import STOP_CAPACITY  # noqa: E402
from select_helpers import (  # noqa: E402
    BACKENDS,
    TOLS,
    backend_marks,
    check_selection,
    interpreted,
    make_x,
    random_problem,
    sel_idx,
    to_np,
    torch,
)

import gemkernels as gk  # noqa: E402

# ----------------------------------------------------------------------------- batches


def batch_problem(backend: str, seed: int):
    rng = np.random.default_rng(seed)
    ns = [1, 40, 3, 17, 1] if interpreted(backend) else [1, 200, 3, 64, 1, 17, 255]
    d = 24 if interpreted(backend) else 33
    xs, ps, es, taus, ks = [], [], [], [], []
    for n in ns:
        x, p, e, tau, k = random_problem(rng, n, d, max_k=12 if interpreted(backend) else 32)
        xs.append(x.astype(np.float32))
        ps.append(p)
        es.append(e if e is not None else np.ones(n, dtype=bool))
        taus.append(tau)
        ks.append(k)
    return xs, ps, es, np.array(taus), np.array(ks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_equals_single_and_reference(backend):
    xs, ps, es, taus, ks = batch_problem(backend, seed=11)
    batch = gk.select_batch(xs, protected=ps, eligible=es, tau=taus, k=ks, backend=backend)
    assert len(batch) == len(xs)
    for s, (x, p, e, tau, k) in enumerate(zip(xs, ps, es, taus.tolist(), ks.tolist())):
        single = gk.select(x, protected=p, eligible=e, tau=tau, k=k, backend=backend)
        ref = check_selection(batch[s], x, p, e, tau, k)
        check_selection(single, x, p, e, tau, k)
        got, one = to_np(batch[s].indices), to_np(single.indices)
        c = ref.comparable
        assert got[:c].tolist() == one[:c].tolist(), f"session {s}"
        if ref.exact:
            assert got.tolist() == one.tolist(), f"session {s}"
            assert batch[s].stop == single.stop
        tol = TOLS["float32"]
        assert abs(batch[s].coverage - single.coverage) <= tol.coverage + tol.coverage_slack / ref.min_pivot, s
        assert batch[s].num_protected == single.num_protected == ref.num_protected


@pytest.mark.parametrize("backend", [pytest.param(b, marks=backend_marks(b)) for b in ("numpy", "numba")])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_single_session_path_is_the_batch_path_exactly(dtype, backend):
    """`select` on one numpy session skips the batch layout; its answer must be bit for bit the batch path's."""
    rng = np.random.default_rng(21)
    for _ in range(60):
        n, d = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        x = rng.standard_normal((n, d)).astype(dtype)
        p = rng.choice(n, size=int(rng.integers(0, min(n, 4) + 1)), replace=False)
        tau, k = float(rng.choice([0.5, 0.9, 1.0])), int(rng.integers(0, n + 1))
        one = gk.select(x, protected=p, tau=tau, k=k, backend=backend)
        batch = gk.select_batch([x], protected=[p], tau=tau, k=k, backend=backend)[0]
        assert to_np(one.indices).tolist() == to_np(batch.indices).tolist()
        assert (one.coverage, one.stop, one.num_protected) == (batch.coverage, batch.stop, batch.num_protected)
        assert np.array_equal(one.residuals, batch.residuals) and one.residuals.dtype == batch.residuals.dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_scalar_tau_k_broadcast(backend):
    xs, ps, es, _, _ = batch_problem(backend, seed=12)
    batch = gk.select_batch(xs, protected=ps, eligible=es, tau=0.6, k=5, backend=backend)
    for s, x in enumerate(xs):
        check_selection(batch[s], x, ps[s], es[s], 0.6, 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_very_different_n_in_one_batch(backend):
    rng = np.random.default_rng(5)
    ns = [1, 60, 2, 1, 9] if interpreted(backend) else [1, 600, 2, 1, 77]
    d = 16 if interpreted(backend) else 48
    xs = [make_x(rng, n, d, "embedding").astype(np.float32) for n in ns]
    ps = [[], [0, 5], [1], [0], []]
    ks = np.array([3, 8, 0, 0, 20])
    sels = gk.select_batch(xs, protected=ps, tau=0.99, k=ks, backend=backend)
    for x, p, k, sel in zip(xs, ps, ks.tolist(), sels):
        check_selection(sel, x, p, None, 0.99, k)
    assert to_np(sels[0].indices).tolist() == [0]                 # n = 1: the row itself
    assert to_np(sels[2].indices).tolist() == [1] and sels[2].stop == STOP_CAPACITY   # k = 0 keeps P
    assert to_np(sels[3].indices).tolist() == [0] and sels[3].num_protected == 1


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=backend_marks("torch"))])
def test_ragged_from_list_to_list_round_trips(lib):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((n, 5)).astype(np.float32) for n in (1, 4, 2)]
    if lib == "torch":
        xs = [torch.from_numpy(x) for x in xs]
    ps = [[0], [3, 1, 3], np.array([False, True])]
    es = [None, np.array([True, False, True, True]), [1]]
    batch = gk.RaggedBatch.from_list(xs, ps, es)
    assert batch.offsets.tolist() == [0, 1, 5, 7]
    assert batch.num_sessions == 3 and batch.dim == 5 and batch.lengths.tolist() == [1, 4, 2]
    want_p = [[True], [False, True, False, True], [False, True]]
    want_e = [[True], [True, False, True, True], [False, True]]
    parts = batch.to_list()
    assert len(parts) == 3
    for (x, p, e), x0, wp, we in zip(parts, xs, want_p, want_e):
        assert type(x) is type(x0)
        np.testing.assert_array_equal(to_np(x), to_np(x0))
        assert p.tolist() == wp and e.tolist() == we
    again = gk.RaggedBatch.from_list([x for x, _, _ in parts], [p for _, p, _ in parts], [e for _, _, e in parts])
    np.testing.assert_array_equal(to_np(again.values), to_np(batch.values))
    np.testing.assert_array_equal(again.offsets, batch.offsets)
    np.testing.assert_array_equal(again.protected, batch.protected)
    np.testing.assert_array_equal(again.eligible, batch.eligible)


@pytest.mark.parametrize("backend", BACKENDS)
def test_select_ragged_packed_matches_select_batch(backend):
    xs, ps, es, taus, ks = batch_problem(backend, seed=13)
    batch = gk.RaggedBatch.from_list(xs, ps, es)
    packed = gk.select_ragged(batch, tau=taus, k=ks, backend=backend)
    sels = gk.select_batch(batch, tau=taus, k=ks, backend=backend)
    indices, counts = to_np(packed.indices), to_np(packed.counts)
    coverage, residuals = to_np(packed.coverage), to_np(packed.residuals)
    S = len(xs)
    lengths = np.array([x.shape[0] for x in xs])
    n_p = np.array([int(batch.protected[a:b].sum()) for a, b in zip(batch.offsets[:-1], batch.offsets[1:])])
    assert indices.ndim == 2 and indices.shape[0] == S and indices.shape[1] >= counts.max()
    assert counts.shape == (S,) and coverage.shape == (S,) and residuals.shape == (lengths.sum(),)
    np.testing.assert_array_equal(packed.num_protected, n_p)
    np.testing.assert_array_equal(packed.capacity, np.minimum(np.maximum(ks, n_p), lengths))
    np.testing.assert_array_equal(packed.offsets, batch.offsets)
    for s, sel in enumerate(sels):
        c = int(counts[s])
        assert (indices[s, c:] == -1).all(), f"session {s}: padding is not -1"
        check_selection(sel, xs[s], ps[s], es[s], float(taus[s]), int(ks[s]))
        assert len(sel.indices) == c, f"session {s}"
        assert indices[s, :c].tolist() == sel_idx(sel), f"session {s}"   # the same call underneath
        assert abs(float(coverage[s]) - sel.coverage) <= 1e-6
        a, b = batch.offsets[s], batch.offsets[s + 1]
        np.testing.assert_allclose(residuals[a:b], to_np(sel.residuals), atol=1e-5, rtol=0)


@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=8))
def test_ragged_batch_protected_rows_sessions_and_counts(masks):
    batch = gk.RaggedBatch.from_list([np.ones((len(m), 2), np.float32) for m in masks],
                                     protected=[np.flatnonzero(m) for m in masks])
    rows = [(s, a + i) for s, (m, a) in enumerate(zip(masks, batch.offsets[:-1].tolist())) for i in np.flatnonzero(m)]
    assert batch.protected_rows.tolist() == [r for _, r in rows] and batch.protected_rows.dtype == np.int64
    assert batch.protected_sessions.tolist() == [s for s, _ in rows]
    assert batch.protected_counts.tolist() == [int(sum(m)) for m in masks]
    starts = batch.protected_offsets.tolist()
    assert starts[0] == 0 and [batch.protected_rows[a:b].tolist() for a, b in zip(starts, starts[1:])] == [
        [r for s2, r in rows if s2 == s] for s in range(len(masks))]


def test_ragged_batch_arrays_are_read_only_so_derived_rows_cannot_go_stale():
    protected, eligible = np.zeros(6, bool), np.ones(6, bool)
    batch = gk.RaggedBatch(np.eye(6, 4, dtype=np.float32) + 1, np.array([0, 3, 6]), protected, eligible)
    assert batch.protected_counts.tolist() == [0, 0]
    protected[4] = True  # the caller's own array stays writable; the batch holds a copy
    assert batch.protected_counts.tolist() == [0, 0] and not batch.protected.any()
    for array in (batch.protected, batch.eligible, batch.offsets, batch.protected_rows, batch.protected_counts,
                  batch.protected_offsets):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    again = gk.RaggedBatch(batch.values, batch.offsets, batch.protected, batch.eligible)
    assert again.protected is batch.protected  # read-only arrays are shared, not copied again


@pytest.mark.parametrize("backend", BACKENDS)
def test_selection_leaves_the_batch_untouched(backend):
    """The kernels consume a candidate mask: it must be the backend's own, never the caller's eligible mask."""
    xs, ps, es, taus, ks = batch_problem(backend, seed=19)
    es[1][::3] = False  # some ineligible rows, so the triton backend copies the mask
    batch = gk.RaggedBatch.from_list(xs, ps, es)
    before = [a.copy() for a in (batch.offsets, batch.protected, batch.eligible)] + [x.copy() for x in xs]
    gk.select_ragged(batch, tau=taus, k=ks, backend=backend)
    after = [batch.offsets, batch.protected, batch.eligible] + xs
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_ragged_batch_carries_its_own_masks():
    batch = gk.RaggedBatch.from_list([np.ones((2, 3), np.float32) + np.eye(2, 3, dtype=np.float32)])
    with pytest.raises(ValueError, match="carries its own protected/eligible"):
        gk.select_batch(batch, protected=[[0]])
