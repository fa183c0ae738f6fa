"""numba backend: the numpy backend's selection compiled (``kernels.greedy_cpu``), sessions in parallel on the
CPU cores. Same formulation and dtypes as numpy (float64 input in float64, the rest in float32); the first call
in a fresh environment compiles for a few seconds, later processes load the cached machine code.
"""

from __future__ import annotations

import threading

import numpy as np

from ..kernels import greedy_cpu
from ..ragged import RaggedBatch
from . import PackedSelection
from .numpy_backend import compute_dtype, inverse_norms

LIBRARY = "numpy"

# numba's default (workqueue) threading layer must not be entered by two threads at once.
PARALLEL_LOCK = threading.Lock()


def select_packed(batch: RaggedBatch, values: np.ndarray, sq_norms: np.ndarray, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Every session of the batch in one parallel kernel call."""
    values = np.ascontiguousarray(values, dtype=compute_dtype(values))
    sessions = batch.num_sessions
    indices = np.full((sessions, int(capacity.max())), -1, dtype=np.int64)
    counts = np.zeros(sessions, dtype=np.int64)
    coverage = np.zeros(sessions, dtype=np.float64)
    residuals = np.empty(values.shape[0], dtype=values.dtype)
    protected_offsets = np.zeros(sessions + 1, dtype=np.int64)
    np.cumsum(batch.protected_counts, out=protected_offsets[1:])
    with PARALLEL_LOCK:
        greedy_cpu.select_sessions(values, inverse_norms(sq_norms, values.dtype), batch.offsets,
                                   batch.protected_rows, protected_offsets, batch.eligible & ~batch.protected,
                                   tau, capacity.astype(np.int64), float(eps), indices, counts, coverage, residuals)
    return PackedSelection(indices, counts, coverage, residuals)


def select_one(x: np.ndarray, sq_norms: np.ndarray, protected: np.ndarray, eligible: np.ndarray, tau: float,
               capacity: int, eps: float) -> tuple[np.ndarray, float, np.ndarray]:
    """One session from raw rows, their squared norms and its masks, on the calling thread: (order, coverage,
    residuals)."""
    x = np.ascontiguousarray(x, dtype=compute_dtype(x))
    order = np.empty(max(capacity, 1), dtype=np.int64)
    residuals = np.empty(x.shape[0], dtype=x.dtype)
    count, coverage = greedy_cpu.select_session(x, inverse_norms(sq_norms, x.dtype), np.flatnonzero(protected),
                                                eligible & ~protected, tau, capacity, eps, order, residuals)
    return order[:count], coverage, residuals



def warm_up(dim: int) -> None:
    """Compile (or load from numba's on-disk cache) the one-session and the parallel kernel for float32 rows of
    ``dim`` dimensions, so a server's first requests do not pay for it."""
    from ..api import select, select_batch

    x = np.random.default_rng(0).standard_normal((8, dim)).astype(np.float32)
    select(x, protected=[0], k=2, backend="numba")
    select_batch([x, x[:3]], protected=[[0], []], k=2, backend="numba")
