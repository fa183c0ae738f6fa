"""numba backend: the numpy backend's selection compiled (``kernels.greedy_cpu``), sessions spread over the CPU
cores by a thread pool (the kernels release the GIL). Same formulation and dtypes as numpy (float64 input in
float64, the rest in float32). The first call in a fresh environment compiles (about 5 s on two cores); later
processes load numba's on-disk cache (about 0.5 s).

Threads, not numba's ``parallel=True``: its threading layers must not be entered by two callers at once
(workqueue) or add milliseconds of wake-up per call on some machines (OpenMP), and a pool of our own leaves the
process's numba configuration alone.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gemkernels.kernels import greedy_cpu
from gemkernels.select.backends import PackedSelection, WarmUp, computes_in_place, dependency_threshold, near_dependence
from gemkernels.select.backends.numpy_backend import compute_dtype, empty_packed, inverse_norms
from gemkernels.select.ragged import RaggedBatch

LIBRARY = "numpy"
device = computes_in_place

#: Threads a batch is spread over: the cores this process may run on.
THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_thread = threading.local()  # .in_pool: this thread is one of the pool's workers


def _mark_worker() -> None:
    _thread.in_pool = True


def _worker_pool() -> ThreadPoolExecutor | None:
    """The process's worker threads (started on first use); None on a worker itself, which must not wait on its
    own pool."""
    global _pool
    if getattr(_thread, "in_pool", False):
        return None
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="gemkernels-numba",
                                       initializer=_mark_worker)
        return _pool


def _forget_pool() -> None:
    """In a forked child the parent's worker threads do not exist, and the lock may have been held: start anew."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def session_ranges(offsets: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """At most ``parts`` contiguous, non-empty session ranges ``(first, stop)`` with about equal rows each."""
    sessions = len(offsets) - 1
    parts = min(parts, sessions)
    if parts <= 1:
        return [(0, sessions)]
    cuts = np.searchsorted(offsets, np.arange(1, parts) * (offsets[-1] / parts), side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, sessions - 1), [sessions]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def select_packed(batch: RaggedBatch, values: np.ndarray, sq_norms: np.ndarray, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Every session of the batch, ranges of sessions on the pool's threads (on the caller's for a lone range, or
    when the caller is itself a worker)."""
    values = np.ascontiguousarray(values, dtype=compute_dtype(values))
    sessions = batch.num_sessions
    out = empty_packed(sessions, int(capacity.max()), values.shape[0], values.dtype)
    args = (values, inverse_norms(sq_norms, values.dtype), batch.offsets, batch.protected_rows, batch.protected_offsets,
            batch.eligible & ~batch.protected, tau, capacity.astype(np.int64, copy=False),
            dependency_threshold(eps, values.dtype), near_dependence(values.dtype), *out[:4])  # no bad_rows
    ranges = session_ranges(batch.offsets, THREADS)
    workers = _worker_pool() if len(ranges) > 1 else None
    if workers is None:
        greedy_cpu.select_sessions(0, sessions, *args)
    else:
        for done in [workers.submit(greedy_cpu.select_sessions, first, stop, *args) for first, stop in ranges]:
            done.result()
    return out


def select_one(x: np.ndarray, sq_norms: np.ndarray, protected: np.ndarray, eligible: np.ndarray, tau: float,
               capacity: int, eps: float) -> tuple[np.ndarray, float, np.ndarray]:
    """One session from raw rows (in their `compute_dtype`), their squared norms and its masks, on the calling
    thread: (order, coverage, residuals)."""
    x = np.ascontiguousarray(x)
    order = np.empty(max(capacity, 1), dtype=np.int64)
    residuals = np.empty(x.shape[0], dtype=x.dtype)
    count, coverage = greedy_cpu.select_session(x, inverse_norms(sq_norms, x.dtype), np.flatnonzero(protected),
                                                eligible & ~protected, tau, capacity,
                                                dependency_threshold(eps, x.dtype), near_dependence(x.dtype), order,
                                                residuals)
    return order[:count], coverage, residuals


def warm_up_shapes(dim: int, k: int | None, max_rows: int | None, max_batch: int, dtype: str) -> list[WarmUp]:
    """One small session alone and in a batch of two: they compile (or load from numba's on-disk cache) the
    one-session and the batch kernel for rows of ``dtype`` (float16 is widened: float32's), whatever their width
    and count."""
    return [WarmUp(8, 2, (8,), dtype), WarmUp(8, 2, (8, 4), dtype)]
