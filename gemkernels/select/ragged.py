"""The packed ragged layout every backend consumes: one launch serves every session.

Session ``s`` owns rows ``offsets[s]:offsets[s+1]`` of ``values`` (the ``indptr`` /
``cu_seqlens`` convention of FlashInfer and flash-attn); its protected and eligible
masks are the same slices of ``protected`` and ``eligible``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from gemkernels.select.arrays import NUMPY, TORCH, is_floating, library_of, to_numpy


@dataclass(frozen=True)
class RaggedBatch:
    """Sessions packed row-wise.

    values: ``(sum n_s, d)`` float array (numpy, torch or CuPy).
    offsets: ``(S+1,)`` int64 numpy array, ``offsets[0] == 0``, non-decreasing, ends at the row count.
    protected, eligible: ``(sum n_s,)`` bool numpy arrays.
    offsets and the masks are kept as read-only arrays (copies of writable ones), so what a batch derives
    from them once (its protected rows) cannot go stale.
    """

    values: Any
    offsets: np.ndarray
    protected: np.ndarray
    eligible: np.ndarray

    def __post_init__(self) -> None:
        check_values(self.values, "values")
        offsets = np.asarray(self.offsets)
        if offsets.ndim != 1 or offsets.size < 1 or offsets.dtype.kind not in "iu":
            raise ValueError(f"offsets must be a 1-D integer array of length S+1, got shape {offsets.shape} "
                             f"dtype {offsets.dtype}")
        if offsets[0] != 0:
            raise ValueError(f"offsets must start at 0, got {int(offsets[0])}")
        lengths = np.diff(offsets)
        if (lengths < 0).any():
            s = int(np.argmax(lengths < 0))
            raise ValueError(f"offsets must be non-decreasing: offsets[{s + 1}]={int(offsets[s + 1])} < "
                             f"offsets[{s}]={int(offsets[s])}")
        if (lengths == 0).any():
            raise ValueError(f"session {int(np.argmax(lengths == 0))} has no rows")
        rows = self.values.shape[0]
        if offsets[-1] != rows:
            raise ValueError(f"offsets must end at the row count {rows}, got {int(offsets[-1])}")
        for name in ("protected", "eligible"):
            mask = np.asarray(getattr(self, name))
            if mask.dtype != np.bool_ or mask.shape != (rows,):
                raise ValueError(f"{name} must be a bool mask of shape ({rows},), got {mask.dtype} {mask.shape}")
            object.__setattr__(self, name, read_only(mask))
        object.__setattr__(self, "offsets", read_only(offsets.astype(np.int64, copy=False)))

    @property
    def num_sessions(self) -> int:
        return len(self.offsets) - 1

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])

    @property
    def lengths(self) -> np.ndarray:
        """Rows per session, ``(S,)`` int64."""
        return np.diff(self.offsets)

    @cached_property
    def protected_rows(self) -> np.ndarray:
        """Packed indices of the protected rows, ascending, int64 (computed once per batch, read-only)."""
        rows = np.flatnonzero(self.protected) if self.protected.any() else np.empty(0, dtype=np.int64)
        return read_only(rows, owned=True)

    @cached_property
    def protected_sessions(self) -> np.ndarray:
        """The session of each of `protected_rows` (read-only)."""
        return read_only(np.searchsorted(self.offsets, self.protected_rows, side="right") - 1, owned=True)

    @cached_property
    def protected_counts(self) -> np.ndarray:
        """Protected rows per session, ``(S,)`` int64 (read-only)."""
        return read_only(np.bincount(self.protected_sessions, minlength=self.num_sessions).astype(np.int64), owned=True)

    @cached_property
    def protected_offsets(self) -> np.ndarray:
        """Where each session's entries start in `protected_rows`, ``(S+1,)`` int64 (read-only)."""
        offsets = np.zeros(self.num_sessions + 1, dtype=np.int64)
        np.cumsum(self.protected_counts, out=offsets[1:])
        return read_only(offsets, owned=True)

    @classmethod
    def from_list(cls, xs: Sequence[Any], protected: Sequence[Any] | None = None,
                  eligible: Sequence[Any] | None = None) -> RaggedBatch:
        """Pack per-session ``(n_s, d)`` arrays; ``protected``/``eligible`` hold one index list or mask per session."""
        if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence) or len(xs) == 0:
            raise TypeError("xs must be a non-empty list of (n_s, d) arrays")
        xs = [as_float_matrix(x, f"xs[{s}]") for s, x in enumerate(xs)]
        dims = {int(x.shape[1]) for x in xs}
        if len(dims) > 1:
            raise ValueError(f"all sessions must share d, got d in {sorted(dims)}")
        libs = {library_of(x) for x in xs}
        if len(libs) > 1:
            raise TypeError(f"all sessions must use one array library, got {sorted(libs)}")
        lengths = [int(x.shape[0]) for x in xs]
        offsets = np.zeros(len(xs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        per_session = [None] * len(xs)
        for name, spec in (("protected", protected), ("eligible", eligible)):
            if spec is not None and len(spec) != len(xs):
                raise ValueError(f"{name} has {len(spec)} entries for {len(xs)} sessions")
        return cls(  # arrays built here are made read-only in place: the batch need not copy them
            values=concatenate(xs),
            offsets=read_only(offsets, owned=True),
            protected=read_only(np.concatenate([index_mask(p, n, f"protected[{s}]", default=False) for s, (p, n) in
                                enumerate(zip(per_session if protected is None else protected, lengths))]), owned=True),
            eligible=read_only(np.concatenate([index_mask(e, n, f"eligible[{s}]", default=True) for s, (e, n) in
                               enumerate(zip(per_session if eligible is None else eligible, lengths))]), owned=True),
        )

    def sessions(self, first: int, stop: int) -> RaggedBatch:
        """Sessions ``first .. stop-1`` as a batch of their own (``values`` a view)."""
        a, b = int(self.offsets[first]), int(self.offsets[stop])
        return RaggedBatch(self.values[a:b], self.offsets[first:stop + 1] - a, self.protected[a:b],
                           self.eligible[a:b])

    def to_list(self) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """Per-session ``(x, protected_mask, eligible_mask)``; ``x`` are views of ``values``."""
        return [(self.values[a:b], self.protected[a:b], self.eligible[a:b])
                for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist())]


def read_only(a: np.ndarray, owned: bool = False) -> np.ndarray:
    """``a`` read-only: itself if it already is or is ``owned`` (made read-only in place), else a read-only copy
    (the caller keeps its writable original)."""
    if a.flags.writeable:
        a = a if owned else a.copy()
        a.flags.writeable = False
    return a


def check_values(x: Any, name: str) -> None:
    """Raise TypeError/ValueError unless ``x`` is a 2-D floating array with at least one column."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a numpy array, torch tensor or CuPy array, got {type(x).__name__}")
    if len(x.shape) != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {tuple(x.shape)}")
    if not is_floating(x):
        raise TypeError(f"{name} must be a floating-point array (float16/bfloat16/float32/float64), got {x.dtype}")
    if x.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column, got shape {tuple(x.shape)}")


def as_float_matrix(x: Any, name: str) -> Any:
    """Accept arrays of any supported library (lists become numpy) and check they are 2-D floats."""
    if not hasattr(x, "shape"):
        if isinstance(x, (list, tuple)):
            x = np.asarray(x)
            if x.dtype == object:
                raise TypeError(f"{name} is a ragged or non-numeric list")
        else:
            raise TypeError(f"{name} must be a numpy array, torch tensor or CuPy array, got {type(x).__name__}")
    check_values(x, name)
    if x.shape[0] < 1:
        raise ValueError(f"{name} has no rows")
    return x


def concatenate(xs: list[Any]) -> Any:
    """Row-wise concatenation in the arrays' own library."""
    lib = library_of(xs[0])
    if lib == TORCH:
        import torch

        return torch.cat([x.detach() for x in xs], dim=0)
    if lib == NUMPY:
        return np.concatenate(xs, axis=0)
    import cupy

    return cupy.concatenate(xs, axis=0)


def index_mask(spec: Any, n: int, name: str, default: bool) -> np.ndarray:
    """Turn ``None``, an index sequence or a bool mask into a bool mask of length ``n``.

    Indices are a set (duplicates count once); negative or out-of-range indices are errors.
    """
    if spec is None:
        return np.full(n, default, dtype=bool)
    if hasattr(spec, "shape") and library_of(spec) != NUMPY:
        spec = to_numpy(spec)
    if isinstance(spec, (str, bytes, float)) or not hasattr(spec, "__len__"):
        raise TypeError(f"{name} must be an index sequence or a bool mask, got {type(spec).__name__}")
    arr = np.asarray(spec)
    if arr.dtype == np.bool_ or (arr.dtype == object and all(isinstance(v, (bool, np.bool_)) for v in spec)):
        if arr.ndim != 1 or arr.shape[0] != n:
            raise ValueError(f"{name} mask has length {arr.shape[0] if arr.ndim else 0}, expected {n}")
        return arr.astype(bool)
    if arr.size == 0:
        return np.zeros(n, dtype=bool)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer indices or bools, got dtype {arr.dtype} shape {arr.shape}")
    bad = arr[(arr < 0) | (arr >= n)]
    if bad.size:
        raise ValueError(f"{name} index {int(bad[0])} is out of range for {n} rows")
    mask = np.zeros(n, dtype=bool)
    mask[arr] = True
    return mask

