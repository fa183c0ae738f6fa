"""Per-backend behaviour: the array library in is the library out, the auto backend, bf16 inputs, backends
available or refused by name, and the numpy/numba backends' handling of duplicate rows (`earlier_copies`).
Shared helpers: tests/select_helpers.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from select_helpers import (  # noqa: E402
    BACKENDS,
    CPU_BACKENDS,
    EXPECTED_BACKENDS,
    HAS_CUDA,
    HAS_TRITON,
    INTERPRETED,
    X,
    backend_marks,
    check_selection,
    make_x,
    torch,
)

import gemkernels as gk  # noqa: E402
from gemkernels.select.backends import Backend, auto_backend, get_backend  # noqa: E402


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
    if torch is None:
        pytest.skip("torch is not installed")
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
