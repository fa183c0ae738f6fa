"""Public selection entry points: `select`, `select_batch` and `select_ragged` (DESIGN.md §1)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from gemkernels.select.arrays import NUMPY, TORCH, convert_like, library_of, to_numpy
from gemkernels.select.backends import Backend, WarmUp, auto_backend, get_backend
from gemkernels.select.backends.numpy_backend import compute_dtype
from gemkernels.select.ragged import RaggedBatch, as_float_matrix, index_mask
from gemkernels.select.result import RaggedSelection, Selection, stop_reason

DEFAULT_TAU, DEFAULT_K, DEFAULT_EPS = 0.90, 16, 1e-6


def select(x: Any, protected: Any = None, eligible: Any = None, tau: float = DEFAULT_TAU,
           k: int = DEFAULT_K, eps: float = DEFAULT_EPS, backend: str = "auto") -> Selection:
    """Greedy residual selection for one session: protected rows first, then largest residuals until tau or K_t.

    ``x`` is ``(n, d)`` (numpy, torch or CuPy); ``protected``/``eligible`` are index sequences
    or bool masks (default: none protected, all eligible). Results are in ``x``'s library.
    """
    x = as_float_matrix(x, "x")
    n = int(x.shape[0])
    protected_mask = index_mask(protected, n, "protected", default=False)
    eligible_mask = index_mask(eligible, n, "eligible", default=True)
    if library_of(x) == NUMPY:
        impl = get_backend(auto_backend(x) if backend == "auto" else backend)
        if impl.LIBRARY == NUMPY and hasattr(impl, "select_one"):
            return select_numpy(impl, x, protected_mask, eligible_mask, check_tau(tau), check_k(k), check_eps(eps))
    batch = RaggedBatch(values=x, offsets=np.array([0, n], dtype=np.int64), protected=protected_mask,
                        eligible=eligible_mask)
    return select_ragged(batch, tau=tau, k=k, eps=eps, backend=backend).sessions()[0]


def select_numpy(impl: Backend, x: np.ndarray, protected: np.ndarray, eligible: np.ndarray, tau: float, k: int,
                 eps: float) -> Selection:
    """`select` for one numpy session on a CPU backend (``impl``: numpy or numba) without the batch layout (a
    small call costs about half as much); float16 rows are widened once, for the norms and the selection alike."""
    x = x.astype(compute_dtype(x), copy=False)
    num_protected = int(protected.sum())
    capacity = int(session_capacity(k, num_protected, x.shape[0]))
    order, coverage, residuals = impl.select_one(x, row_sq_norms(x), protected, eligible, tau, capacity, eps)
    return Selection(indices=np.asarray(order, dtype=np.int64), coverage=coverage, residuals=residuals,
                     num_protected=num_protected, stop=stop_reason(len(order), capacity, coverage, tau))


def select_batch(xs: Sequence[Any] | RaggedBatch, protected: Sequence[Any] | None = None,
                 eligible: Sequence[Any] | None = None, tau: Any = DEFAULT_TAU, k: Any = DEFAULT_K,
                 eps: float = DEFAULT_EPS, backend: str = "auto") -> list[Selection]:
    """`select` over many sessions in one batched call; ``tau``/``k`` are scalars or one value per session.

    ``xs`` is a list of ``(n_s, d)`` arrays (with per-session ``protected``/``eligible``) or a `RaggedBatch`.
    """
    if isinstance(xs, RaggedBatch):
        if protected is not None or eligible is not None:
            raise ValueError("a RaggedBatch carries its own protected/eligible masks; do not pass them again")
        batch = xs
    else:
        batch = RaggedBatch.from_list(xs, protected, eligible)
    return select_ragged(batch, tau=tau, k=k, eps=eps, backend=backend).sessions()


def select_ragged(batch: RaggedBatch, tau: Any = DEFAULT_TAU, k: Any = DEFAULT_K, eps: float = DEFAULT_EPS,
                  backend: str = "auto") -> RaggedSelection:
    """Run a packed batch and return packed results in the values' library (no per-session split)."""
    if not isinstance(batch, RaggedBatch):
        raise TypeError(f"batch must be a RaggedBatch, got {type(batch).__name__}")
    sessions = batch.num_sessions
    tau_s = per_session_tau(tau, sessions)
    k_s = per_session_k(k, sessions)
    eps = check_eps(eps)

    impl = get_backend(auto_backend(batch.values) if backend == "auto" else backend)
    checks_rows = getattr(impl, "CHECKS_ROWS", False)
    sq_norms = None if checks_rows else row_sq_norms(batch.values, batch.offsets)
    caller_lib, caller_device = library_of(batch.values), getattr(batch.values, "device", None)
    compute_device = impl.device(batch.values)
    values = convert_like(batch.values, impl.LIBRARY, compute_device)
    if sq_norms is not None:
        sq_norms = convert_like(sq_norms, impl.LIBRARY, compute_device)

    counts_p = batch.protected_counts
    capacity = session_capacity(k_s, counts_p, batch.lengths)
    packed = impl.select_packed(batch, values, sq_norms, tau_s, capacity, eps)
    if checks_rows:
        bad = to_numpy(packed.bad_rows)  # the call's one wait for the device
        if bad.any():
            raise bad_row_error(batch.values, int(np.argmax(bad != 0)), batch.offsets)

    out_device = caller_device if caller_lib == TORCH else None
    return RaggedSelection(
        indices=convert_like(packed.indices, caller_lib, out_device),
        counts=convert_like(packed.counts, caller_lib, out_device),
        coverage=convert_like(packed.coverage, caller_lib, out_device),
        residuals=convert_like(packed.residuals, caller_lib, out_device),
        offsets=batch.offsets, num_protected=counts_p, capacity=capacity, tau=tau_s,
    )


#: The most sessions `warm_up` expects in one batch: `gemkernels.serve.batching.SelectionBatcher`'s default.
WARM_UP_MAX_BATCH = 64


def warm_up(backend: str, dim: int, k: int | None = None, max_rows: int | None = None,
            max_batch: int = WARM_UP_MAX_BATCH, dtypes: Sequence[str] = ("float32",),
            seed: int = 0) -> list[WarmUp]:
    """Compile, before the first request, the kernels that selections of k steps (None: as many as rows) over
    batches of up to ``max_batch`` sessions of up to ``max_rows`` rows of ``dim``-dimensional rows of each of
    ``dtypes`` will launch on ``backend`` (a server's embeddings are float32; "float16", "bfloat16" and "float64"
    for callers that pass those): each batch of the backend's `warm_up_shapes` is selected once (a lone session
    also through `select`), the first session with one protected row.

    Returns the batches run (empty for a backend that compiles nothing ahead)."""
    impl = get_backend(auto_backend(np.empty((1, dim), np.float32)) if backend == "auto" else backend)
    rng = np.random.default_rng(seed)
    runs = []
    for dtype in dtypes:
        for run in impl.warm_up_shapes(dim, k, max_rows, max_batch, dtype):
            x = random_rows(rng, run.rows, dim, dtype, impl)
            sessions = [x[:n] for n in run.lengths]
            select_batch(sessions, protected=[[0]] + [[]] * (len(sessions) - 1), k=run.steps, tau=1.0,
                         backend=backend)
            if len(sessions) == 1:
                select(x, protected=[0], k=run.steps, tau=1.0, backend=backend)
            runs.append(run)
    return runs


def random_rows(rng: np.random.Generator, rows: int, dim: int, dtype: str, impl: Backend) -> Any:
    """Gaussian ``(rows, dim)`` rows of ``dtype`` in ``impl``'s library, where it computes."""
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    if impl.LIBRARY == NUMPY:
        try:
            return x.astype(np.dtype(dtype))
        except TypeError:
            raise ValueError(f"numpy rows have no dtype {dtype!r}") from None
    import torch

    return convert_like(x, impl.LIBRARY, impl.device(x)).to(getattr(torch, dtype))


def session_capacity(k: Any, num_protected: Any, n: Any) -> Any:
    """K_t = max(k, |P|), never more than the session's rows (scalars or one per session)."""
    return np.minimum(np.maximum(k, num_protected), n)


def check_tau(tau: Any) -> float:
    """tau as a float in (0, 1]."""
    return float(per_session_tau(tau, 1)[0]) if not isinstance(tau, float) or not 0 < tau <= 1 else tau


def check_k(k: Any) -> int:
    """k as an int >= 0."""
    return int(per_session_k(k, 1)[0]) if type(k) is not int or k < 0 else k


def per_session_tau(tau: Any, sessions: int) -> np.ndarray:
    """tau as a float64 ``(S,)`` array, each in (0, 1]."""
    values = per_session(tau, sessions, "tau")
    if isinstance(tau, bool) or values.dtype == np.bool_ or values.dtype.kind not in "iuf":
        raise TypeError(f"tau must be a number or one number per session, got {tau!r}")
    values = values.astype(np.float64)
    bad = ~((values > 0) & (values <= 1))
    if bad.any():
        raise ValueError(f"tau must lie in (0, 1], got {values[bad][0]}")
    return values


def per_session_k(k: Any, sessions: int) -> np.ndarray:
    """k as an int64 ``(S,)`` array, each >= 0."""
    values = per_session(k, sessions, "k")
    if isinstance(k, bool) or values.dtype.kind not in "iu":
        raise TypeError(f"k must be an integer or one integer per session, got {k!r}")
    if (values < 0).any():
        raise ValueError(f"k must be >= 0, got {int(values[values < 0][0])}")
    return values.astype(np.int64)


def per_session(value: Any, sessions: int, name: str) -> np.ndarray:
    """Broadcast a scalar, or check a per-session sequence has length S."""
    if hasattr(value, "shape") and library_of(value) != NUMPY:
        value = to_numpy(value)
    arr = np.asarray(value)
    if arr.dtype == object:
        raise TypeError(f"{name} must be numeric, got {value!r}")
    if arr.ndim == 0:
        return np.full(sessions, arr[()], dtype=arr.dtype)
    if arr.shape != (sessions,):
        raise ValueError(f"{name} must be a scalar or have one value per session ({sessions}), got shape {arr.shape}")
    return arr


def check_eps(eps: Any) -> float:
    """eps as a finite float >= 0."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {eps!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


def row_sq_norms(x: Any, offsets: np.ndarray | None = None) -> Any:
    """Squared row norms of ``x`` in its library, accumulated in float32 (float64 for float64 input); raises
    ValueError naming the first row (and session, given a batch's ``offsets``) that is all zeros, not finite, or too
    small to normalise (a squared norm below 1 / the dtype's largest value)."""
    lib = library_of(x)
    if lib == TORCH:
        import torch

        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        sq = torch.linalg.vector_norm(x, dim=1, dtype=acc) ** 2
    elif lib == NUMPY and hasattr(np, "vecdot"):
        x = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
        with np.errstate(over="ignore", under="ignore"):
            sq = np.vecdot(x, x)
    else:
        xp = array_module(lib)
        acc = xp.float64 if x.dtype == xp.float64 else xp.float32
        sq = xp.einsum("ij,ij->i", x, x, dtype=acc)
    host = to_numpy(sq)
    tiny = 1.0 / np.finfo(host.dtype).max  # below it 1 / ||x|| squared overflows: the scaled Gram entries would
    if host.min() >= tiny and math.isfinite(host.max()):  # NaN fails the first test (min propagates it)
        return sq
    raise bad_row_error(x, int(np.argmax(~(np.isfinite(host) & (host >= tiny)))), offsets)


def bad_row_error(x: Any, row: int, offsets: np.ndarray | None = None) -> ValueError:
    """The ValueError for packed row ``row`` of ``x``, whose squared norm is 0 or not finite in float32: it names
    the row (and its session, given a batch's ``offsets``) and says what is wrong with it."""
    if offsets is None or len(offsets) == 2:
        where = f"row {row}"
    else:
        session = int(np.searchsorted(offsets, row, side="right") - 1)
        where = f"session {session} row {row - int(offsets[session])}"
    lib = library_of(x)
    finite = bool(to_numpy(array_module(lib).isfinite(x[row])).all())
    nonzero = bool(to_numpy((x[row] != 0).any()))
    problem = ("not finite" if not finite else "all zeros" if not nonzero
               else "too large or too small to normalise in float32 (rescale the embeddings)")
    return ValueError(f"{where} of the embeddings is {problem}; every row must be finite and non-zero")


def array_module(lib: str) -> Any:
    """The numpy-like module of an array library."""
    if lib == TORCH:
        import torch

        return torch
    if lib == NUMPY:
        return np
    import cupy

    return cupy
