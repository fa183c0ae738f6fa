"""Selection (DESIGN.md §1): every backend against the float64 reference in tests/reference.py.

Backends are parametrised over the expected list as well as `available_backends()`, so a
backend whose module is missing or broken fails here instead of disappearing; triton is
skipped (with a reason) only when triton itself is not installed. Without a GPU the
Triton kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
which is slow, so triton gets small shapes (`shapes_for`).

Floating-point ties are legitimately ambiguous: index lists are compared with the
reference only up to its `comparable` prefix, and every answer is also replayed through
the reference (`replay`), which checks each decision was a legal greedy decision within
the dtype's margin and recomputes coverage and residuals for the indices actually chosen.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import KernelSpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import (
    STOP_CAPACITY,
    STOP_COVERAGE,
    STOP_EXHAUSTED,
    expected_stop,
    reference_select,
    replay,
)

import gemkernels as gk
from gemkernels.select.backends import Backend, auto_backend, get_backend

try:
    import torch
except ImportError:
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = not HAS_CUDA and os.environ.get("TRITON_INTERPRET") == "1"

EXPECTED_BACKENDS = ("numpy", "numba", "torch", "triton")


def backend_marks(name: str) -> list:
    if name == "numba" and importlib.util.find_spec("numba") is None:
        return [pytest.mark.skip(reason="the numba backend needs numba, which is not installed")]
    if name in ("torch", "triton") and torch is None:
        return [pytest.mark.skip(reason=f"the {name} backend needs torch, which is not installed")]
    if name == "triton" and not HAS_TRITON:
        return [pytest.mark.skip(reason="triton is not installed")]
    if name == "triton" and not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1":
        return [pytest.mark.skip(reason="no CUDA device and TRITON_INTERPRET was set to something other than 1")]
    return []


BACKEND_NAMES = list(EXPECTED_BACKENDS) + [b for b in gk.available_backends() if b not in EXPECTED_BACKENDS]
BACKENDS = [pytest.param(b, id=b, marks=backend_marks(b)) for b in BACKEND_NAMES]
CPU_BACKENDS = [pytest.param(b, id=b, marks=backend_marks(b)) for b in ("numpy", "numba", "torch")]


def interpreted(backend: str) -> bool:
    return backend == "triton" and INTERPRETED


# ----------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tol:
    coverage: float      # |coverage - reference coverage|
    residual: float      # max |residual - reference residual|
    margin: float        # decisions closer than this to flipping are ties (reference prefix, replay)
    u: float             # unit roundoff of the arithmetic (fp16/bf16 inputs are computed in at least fp32)

    # Conditioning (see reference.py): after a pivot of residual r_min, errors of order u/r_min are
    # rounding, not bugs. Measured on the numpy/torch/triton backends: coverage errors up to ~8 u/r_min,
    # residual errors up to ~25 u/r_min (Gram/Cholesky updates), hence these factors.
    @property
    def pivot_slack(self) -> float:        # residuals and decision margins
        return 32 * self.u

    @property
    def coverage_slack(self) -> float:
        return 8 * self.u


U32, U64 = 2.0 ** -24, 2.0 ** -53
TOLS = {
    "float64": Tol(coverage=1e-8, residual=1e-8, margin=1e-4, u=U64),
    "float32": Tol(coverage=1e-5, residual=1e-5, margin=1e-4, u=U32),
    "float16": Tol(coverage=2e-3, residual=2e-3, margin=2e-3, u=U32),
    "bfloat16": Tol(coverage=2e-2, residual=2e-2, margin=2e-2, u=U32),
}


def reference_for(x, protected=None, eligible=None, tau=gk.DEFAULT_TAU, k=gk.DEFAULT_K, eps=gk.DEFAULT_EPS):
    """The reference on the values the library sees, with the margins of x's dtype."""
    tol = TOLS[dtype_name(x)]
    return reference_select(values64(x), mask_np(protected), mask_np(eligible), tau=tau, k=k, eps=eps,
                            margin=tol.margin, pivot_slack=tol.pivot_slack)


def dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def to_np(a) -> np.ndarray:
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        if a.dtype == torch.bfloat16:
            a = a.float()
        return a.numpy()
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def sel_idx(sel) -> list[int]:
    return to_np(sel.indices).tolist()


def values64(x) -> np.ndarray:
    """The values exactly as the library receives them (fp16/bf16 already rounded), in float64."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)


def mask_np(spec):
    """A protected/eligible spec (list, tuple, numpy or torch; indices or mask) in numpy form for the reference."""
    if spec is None:
        return None
    return to_np(spec) if not isinstance(spec, (list, tuple)) else np.asarray(spec, dtype=np.int64).reshape(-1)


def check_selection(sel, x, protected=None, eligible=None, tau=gk.DEFAULT_TAU, k=gk.DEFAULT_K,
                    eps=gk.DEFAULT_EPS, tol: Tol | None = None):
    """Assert ``sel`` answers §1 for these inputs; return the reference."""
    x64 = values64(x)
    n = x64.shape[0]
    tol = tol or TOLS[dtype_name(x)]
    protected, eligible = mask_np(protected), mask_np(eligible)
    idx = to_np(sel.indices)
    res = to_np(sel.residuals).astype(np.float64)
    assert idx.dtype == np.int64 and idx.ndim == 1, (idx.dtype, idx.shape)
    assert res.shape == (n,)
    assert isinstance(sel.coverage, float)

    ref = reference_select(x64, protected, eligible, tau=tau, k=k, eps=eps, margin=tol.margin,
                           pivot_slack=tol.pivot_slack)
    c = ref.comparable
    assert idx[:c].tolist() == ref.indices[:c].tolist(), (
        f"indices {idx.tolist()} differ from the reference {ref.indices.tolist()} within the unambiguous "
        f"prefix of {c}; steps: {ref.steps}")
    assert sel.num_protected == ref.num_protected
    assert sel.stop == expected_stop(len(idx), ref.capacity, sel.coverage, tau), (sel.stop, len(idx), sel.coverage)
    if ref.exact:
        assert idx.tolist() == ref.indices.tolist()
        assert sel.stop == ref.stop
        assert abs(sel.coverage - ref.coverage) <= tol.coverage + tol.coverage_slack / ref.min_pivot, (
            sel.coverage, ref.coverage, ref.min_pivot)
        np.testing.assert_allclose(res, ref.residuals, rtol=0, atol=tol.residual + tol.pivot_slack / ref.min_pivot)

    rp = replay(x64, idx, protected, eligible, tau=tau, k=k, eps=eps, tol=tol.margin, pivot_slack=tol.pivot_slack)
    assert not rp.violations, rp.violations
    assert abs(sel.coverage - rp.coverage) <= tol.coverage + tol.coverage_slack / rp.min_pivot, (
        sel.coverage, rp.coverage, rp.min_pivot)
    np.testing.assert_allclose(res, rp.residuals, rtol=0, atol=tol.residual + tol.pivot_slack / rp.min_pivot)
    return ref


# ----------------------------------------------------------------------------- random inputs

SHAPES = [(1, 7), (1, 384), (17, 33), (17, 7), (255, 100), (255, 7), (1000, 384), (1000, 33)]
INTERPRETER_SHAPES = [(1, 7), (17, 33), (64, 48), (40, 7), (64, 33), (33, 17)]
KINDS = ("gaussian", "lowrank", "clustered", "embedding")


def shapes_for(backend: str) -> list[tuple[int, int]]:
    return INTERPRETER_SHAPES if interpreted(backend) else SHAPES


def make_x(rng: np.random.Generator, n: int, d: int, kind: str) -> np.ndarray:
    """float64 rows with some structure; row norms vary in [0.5, 4] (normalisation is the library's job)."""
    if kind == "gaussian":
        x = rng.standard_normal((n, d))
    elif kind == "lowrank":
        r = int(rng.integers(1, min(n, d) + 1))
        x = rng.standard_normal((n, r)) @ rng.standard_normal((r, d)) + 1e-2 * rng.standard_normal((n, d))
    elif kind == "clustered":
        c = int(rng.integers(1, 6))
        x = rng.standard_normal((c, d))[rng.integers(0, c, size=n)] + 0.3 * rng.standard_normal((n, d))
    else:  # "embedding": a shared mean direction plus noise, like sentence embeddings
        x = 1.0 + 0.7 * rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.5, 4.0, size=(n, 1))


def random_problem(rng: np.random.Generator, n: int, d: int, max_k: int = 32):
    """(x64, protected, eligible, tau, k) with protected/eligible in a random accepted form."""
    x = make_x(rng, n, d, KINDS[int(rng.integers(len(KINDS)))])
    n_p = int(rng.choice([0, 1, int(rng.integers(0, min(n, 6) + 1))]))
    p = rng.choice(n, size=n_p, replace=False)
    form = int(rng.integers(3))
    if form == 0:
        protected = p.tolist() + p[: n_p // 2].tolist()          # list with duplicates
    elif form == 1:
        protected = np.zeros(n, dtype=bool)
        protected[p] = True                                        # bool mask
    else:
        protected = p.astype(np.int64)                             # index array
    if rng.random() < 0.4:
        eligible = None
    else:
        eligible = rng.random(n) < rng.uniform(0.3, 1.0)
        if rng.random() < 0.5:
            eligible = np.flatnonzero(eligible)
    tau = float(rng.choice([0.9, rng.uniform(0.2, 1.0), 1.0]))
    k = int(rng.choice([16, int(rng.integers(0, max_k + 1))]))
    return x, protected, eligible, tau, k


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


@pytest.mark.parametrize("backend", [pytest.param(b, marks=backend_marks(b)) for b in ("numpy", "numba")])
def test_a_duplicate_never_beats_the_earlier_copy(backend):
    """Identical blocks (same tool call, same output) tie exactly; §1 gives the tie to the lower index. BLAS and
    vector loops may sum a row's copy in another order, so the backends must keep copies equal on purpose."""
    rng = np.random.default_rng(13)
    checked = 0
    for _ in range(300):
        n, d = int(rng.choice([5, 7, 8, 9, 17, 33, 255])), int(rng.choice([7, 33, 100]))
        x = rng.standard_normal((n, d)).astype(rng.choice([np.float32, np.float64]))
        a = int(rng.integers(0, n - 1))
        b = int(rng.choice([n - 1, int(rng.integers(a + 1, n))]))
        x[b] = x[a]
        idx = gk.select(x, tau=1.0, k=min(n, d), backend=backend).indices.tolist()
        if a in idx or b in idx:  # once one copy is in, the other's residual is 0
            checked += 1
            assert a in idx and (b not in idx or idx.index(a) < idx.index(b)), (n, d, a, b, idx)
    assert checked > 200


def brute_force_copies(x: np.ndarray) -> dict[int, int]:
    return {i: next(e for e in range(i) if np.array_equal(x[e], x[i])) for i in range(len(x))
            if any(np.array_equal(x[e], x[i]) for e in range(i))}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), copies=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 39)), max_size=12),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_earlier_copies_finds_exactly_the_repeated_rows(n, copies, dtype, seed):
    from gemkernels.select.backends.numpy_backend import earlier_copies

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 5)).astype(dtype)
    half = n // 2  # rows (1, then one 1 among the other four): equal norms and first values, different content
    x[:half] = 0
    x[:half, 0] = 1
    x[np.arange(half), rng.integers(1, 5, size=half)] = 1
    x[half:, 1:][rng.random((n - half, 4)) < 0.3] = 0.0  # zeros to flip; column 0 keeps every row non-zero
    for src, dst in copies:
        x[dst % n] = x[src % n]
        x[dst % n][(x[dst % n] == 0) & (rng.random(5) < 0.5)] = -0.0  # a copy with -0.0 is still a copy
    found = earlier_copies(x)
    got = {} if found is None else dict(zip(found[0].tolist(), found[1].tolist()))
    assert got == brute_force_copies(x)


def test_earlier_copies_compares_past_the_hashed_columns():
    """Rows equal in every hashed column but one later value are not copies; a true copy still is."""
    from gemkernels.select.backends.numpy_backend import HASH_COLUMNS, earlier_copies

    x = np.ones((6, HASH_COLUMNS + 6), dtype=np.float32)
    x[np.arange(6), HASH_COLUMNS + np.arange(6)] = 2.0  # each row differs from the others after the hash
    assert earlier_copies(x) is None
    x[4] = x[1]
    rows, copies = earlier_copies(x)
    assert rows.tolist() == [4] and copies.tolist() == [1]


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


#: Session lengths of a batch: "short" fit every register-resident greedy (G on chip included), "medium" only the
#: one reading G from memory. Interpreted (slow) and on CUDA (the default tiles).
TRITON_LENGTHS = {"short": ([1, 40, 3, 17, 64], [1, 60, 3, 17, 64]),
                  "medium": ([1, 40, 3, 260], [1, 700, 3, 257, 64, 1000])}


@pytest.mark.parametrize("path,resident,lengths,greedy", [
    ("gram", True, "short", ("greedy_resident", "chip")), ("gram", True, "medium", ("greedy_resident", "gram")),
    ("gram", False, "short", ("greedy_fused", None)), ("fused", True, "short", ("greedy_resident", "x")),
    ("fused", True, "medium", ("greedy_fused", None)), ("stepwise", False, "medium", None)])
def test_triton_paths_match_reference(path, resident, lengths, greedy, monkeypatch, triton_options):
    """Every Triton path, forced, with tiles small enough that the shapes cross tile edges, and every greedy
    kernel behind them (``greedy``: the kernel and the resident greedy's source of Gram rows)."""
    for mark in backend_marks("triton"):
        pytest.skip(mark.kwargs["reason"])
    from gemkernels.kernels import greedy_fused, greedy_resident

    from gemkernels.select.backends import triton_backend

    assert path in triton_backend.PATHS
    triton_options(triton_backend.TritonOptions(
        path=path, resident=resident, block_n=16, block_d=16, block_w=4, pivot_block_d=16, block_m=16, block_k=16))
    launched = []  # which greedy kernel ran: the options must reach it
    for module, name in ((greedy_fused, "greedy_fused"), (greedy_resident, "greedy_resident")):
        monkeypatch.setattr(module, f"{name}_kernel", KernelSpy(getattr(module, f"{name}_kernel"), name, launched))
    rng = np.random.default_rng(17)
    ns, d = (TRITON_LENGTHS[lengths][0], 24) if INTERPRETED else (TRITON_LENGTHS[lengths][1], 100)
    for dtype in ("float32", "float16"):
        problems = [random_problem(rng, n, d, max_k=16) for n in ns]
        xs = [p[0].astype(dtype) for p in problems]
        ps = [p[1] for p in problems]
        es = [p[2] for p in problems]
        taus, ks = np.array([p[3] for p in problems]), np.array([p[4] for p in problems])
        sels = gk.select_batch(xs, protected=ps, eligible=es, tau=taus, k=ks, backend="triton")
        for x, p, e, tau, k, sel in zip(xs, ps, es, taus.tolist(), ks.tolist(), sels):
            check_selection(sel, x, p, e, tau, k)
        # the same batch through the torch backend agrees on the unambiguous prefixes
        base = gk.select_batch(xs, protected=ps, eligible=es, tau=taus, k=ks, backend="torch")
        for s, (x, a, b) in enumerate(zip(xs, sels, base)):
            ref = reference_for(x, ps[s], es[s], float(taus[s]), int(ks[s]))
            c = ref.comparable
            assert sel_idx(a)[:c] == sel_idx(b)[:c], f"{path} session {s}"
    assert {(name, constexprs.get("SOURCE")) for name, constexprs in launched} == ({greedy} if greedy else set())


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


# ----------------------------------------------------------------------------- torch inputs and outputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_array_library_in_is_array_library_out(backend):
    if torch is None:
        pytest.skip("torch is not installed")
    rng = np.random.default_rng(21)
    x = make_x(rng, 30, 12, "clustered").astype(np.float32)
    sel_np = gk.select(x, protected=[4], k=6, backend=backend)
    assert isinstance(sel_np.indices, np.ndarray) and sel_np.indices.dtype == np.int64
    assert isinstance(sel_np.residuals, np.ndarray) and sel_np.residuals.shape == (30,)
    assert isinstance(sel_np.coverage, float)

    xt = torch.from_numpy(x)
    sel_t = gk.select(xt, protected=torch.tensor([4]), k=6, backend=backend)
    assert isinstance(sel_t.indices, torch.Tensor) and sel_t.indices.dtype == torch.int64
    assert isinstance(sel_t.residuals, torch.Tensor) and sel_t.residuals.shape == (30,)
    assert sel_t.indices.device == xt.device and sel_t.residuals.device == xt.device
    assert isinstance(sel_t.coverage, float)
    check_selection(sel_t, xt, [4], None, k=6)
    assert sel_t.indices.tolist() == sel_np.indices.tolist()
    assert abs(sel_t.coverage - sel_np.coverage) <= 1e-6


def test_auto_backend_follows_the_input():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    assert auto_backend(x) == "numpy"
    if torch is not None:
        assert auto_backend(torch.from_numpy(x)) == "torch"
        sel = gk.select(torch.from_numpy(x), k=2)
        assert isinstance(sel.indices, torch.Tensor)
    assert isinstance(gk.select(x, k=2).indices, np.ndarray)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bf16_torch_input(backend):
    rng = np.random.default_rng(22)
    x = torch.from_numpy(make_x(rng, 50, 40, "clustered")).to(torch.bfloat16)
    for p, tau, k in (([3, 9], 0.9, 10), ([], 1.0, 20)):
        sel = gk.select(x, protected=p, tau=tau, k=k, backend=backend)
        assert isinstance(sel.indices, torch.Tensor) and sel.indices.dtype == torch.int64
        check_selection(sel, x, p, None, tau, k)   # reference on the bf16-rounded values, bf16 tolerances


def test_bf16_in_the_triton_interpreter_is_refused_or_right():
    """The interpreter lacks bf16 arithmetic; bf16 on triton is a GPU test (test_cuda_bf16_on_triton)."""
    if not (HAS_TRITON and INTERPRETED) or torch is None:
        pytest.skip("only meaningful under the Triton interpreter")
    x = torch.from_numpy(make_x(np.random.default_rng(23), 12, 16, "gaussian")).to(torch.bfloat16)
    try:
        sel = gk.select(x, k=4, backend="triton")
    except (TypeError, ValueError, RuntimeError, gk.BackendUnavailableError) as err:
        assert "bf16" in str(err).lower() or "bfloat16" in str(err).lower(), err
    else:
        check_selection(sel, x, None, None, k=4)


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

rng0 = np.random.default_rng(0)
X = rng0.standard_normal((5, 7)).astype(np.float32)
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


def test_named_backend_that_cannot_run_says_why(monkeypatch):
    if HAS_CUDA or not HAS_TRITON or torch is None:
        pytest.skip("needs a machine without CUDA and with triton installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "triton" not in gk.available_backends()
    with pytest.raises(gk.BackendUnavailableError, match=r"CUDA GPU.*TRITON_INTERPRET"):
        gk.select(X, backend="triton")


@pytest.mark.parametrize("name", EXPECTED_BACKENDS)
def test_expected_backends_are_available(name):
    """A backend whose dependencies are installed must be listed and importable (not silently missing)."""
    for mark in backend_marks(name):
        pytest.skip(mark.kwargs["reason"])
    assert name in gk.available_backends()
    module = get_backend(name)
    assert isinstance(module, Backend) and module.LIBRARY in ("numpy", "torch")


# ----------------------------------------------------------------------------- GPU only


def cuda_x(rng, n, d, dtype="float32"):
    return torch.from_numpy(make_x(rng, n, d, "clustered")).to("cuda", getattr(torch, dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_auto_uses_triton(dtype):
    x = cuda_x(np.random.default_rng(50), 1000, 384, dtype)
    assert auto_backend(x) == "triton"
    sel = gk.select(x, protected=[3, 900], k=32)
    assert sel.indices.is_cuda and sel.residuals.is_cuda and sel.indices.dtype == torch.int64
    explicit = gk.select(x, protected=[3, 900], k=32, backend="triton")
    assert sel.indices.tolist() == explicit.indices.tolist() and abs(sel.coverage - explicit.coverage) <= 1e-6
    check_selection(sel, x, [3, 900], None, k=32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_bf16_on_triton():
    x = cuda_x(np.random.default_rng(51), 500, 256, "bfloat16")
    sel = gk.select(x, protected=[0], tau=0.95, k=24, backend="triton")
    assert sel.indices.is_cuda
    check_selection(sel, x, [0], None, 0.95, 24)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_batch_against_reference(backend):
    rng = np.random.default_rng(52)
    ns = [1, 1000, 17, 255, 1, 3000]
    xs = [cuda_x(rng, n, 384) for n in ns]
    ps = [[0], [5, 999], [], [1, 2, 3], [], list(range(0, 3000, 500))]
    ks = np.array([4, 32, 0, 16, 16, 64])
    sels = gk.select_batch(xs, protected=ps, tau=0.97, k=ks, backend=backend)
    for x, p, k, sel in zip(xs, ps, ks.tolist(), sels):
        assert sel.indices.is_cuda
        check_selection(sel, x, p, None, 0.97, k)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_numpy_input_on_triton_gives_numpy():
    x = make_x(np.random.default_rng(53), 300, 100, "embedding").astype(np.float32)
    sel = gk.select(x, k=12, backend="triton")
    assert isinstance(sel.indices, np.ndarray) and isinstance(sel.residuals, np.ndarray)
    check_selection(sel, x, None, None, k=12)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("path,resident", [("gram", True), ("gram", False), ("fused", True), ("fused", False),
                                           ("stepwise", False)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_every_triton_path_and_dtype_at_default_tiles(path, resident, dtype, monkeypatch, triton_options):
    """Three batches: the longest session 1000 rows (gram keeps its greedy in registers, fused cannot), 200 rows
    (both can) and 64 rows (gram computes G on chip), each with the register-resident greedy allowed and not."""
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path=path, resident=resident))
    rng = np.random.default_rng(54)
    for ns in ([1, 256, 17, 1000, 129], [1, 200, 17, 64, 129], [1, 64, 17, 33, 40]):
        xs = [cuda_x(rng, n, 1000, dtype) for n in ns]
        ps = [[0], [3, ns[1] - 1], [], [10, 20, ns[3] - 1], [ns[4] - 1]]
        sels = gk.select_batch(xs, protected=ps, tau=0.9, k=16, backend="triton")
        for x, p, sel in zip(xs, ps, sels):
            assert sel.indices.is_cuda
            check_selection(sel, x, p, None, 0.9, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or importlib.util.find_spec("cupy") is None, reason="needs CUDA and CuPy")
def test_cupy_in_cupy_out():
    import cupy

    x = make_x(np.random.default_rng(55), 300, 96, "embedding").astype(np.float32)
    sel = gk.select(cupy.asarray(x), protected=[1, 2], k=10)
    assert isinstance(sel.indices, cupy.ndarray) and isinstance(sel.residuals, cupy.ndarray)
    check_selection(sel, x, [1, 2], None, k=10)
