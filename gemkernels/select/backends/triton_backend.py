"""triton backend: the selection kernels of ``gemkernels.kernels`` on CUDA (or Triton's CPU interpreter).

Three paths give the same answers; `choose_path` picks one per batch by shape:
``gram`` (one tensor-core GEMM per session, then the greedy on G: n small against d),
``fused`` (the whole greedy in one launch, a pass over X per direction) and ``stepwise``
(two launches per step, parallel over row tiles: few, very long sessions). ``gram`` and
``fused`` keep a short session's greedy state in registers (``greedy_resident``) when it fits;
``gram`` sessions of up to 64 rows keep their whole Gram matrix there too (one launch, X read once).
After a ``gram`` or ``fused`` greedy, ``greedy_exact`` selects again the sessions it handed back at a
near-dependent pivot (DESIGN.md §1.1). Inputs of any float dtype are read as stored and accumulated in fp32;
float64 is read as fp32, and eps never goes below fp32's floor (`dependency_threshold`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gemkernels.select.arrays import is_cuda
from gemkernels.select.backends import PackedSelection, dependency_threshold
from gemkernels.select.ragged import RaggedBatch

LIBRARY = "torch"
PATHS = ("gram", "fused", "stepwise")

#: Largest session whose Gram matrix the ``gram`` path builds (n^2 fp32 = 4 MiB).
GRAM_MAX_ROWS = 1024
#: Budget for the packed Gram matrices of one launch, in bytes: larger batches run in groups of sessions.
GRAM_MAX_BYTES = 2 << 30
#: Below this many sessions per SM-sized worker, a long session is better split over row tiles.
STEPWISE_MIN_ROWS = 8192
#: Width of the X tiles the fused and stepwise passes stream (128 x 16: no register spills on sm_90).
STREAM_BLOCK_D = 16
#: In-session offsets of the Gram kernel are int32: one session's n x d must stay below this.
GRAM_MAX_SESSION_ELEMENTS = 2 ** 31


@dataclass(frozen=True)
class TritonOptions:
    """Path (None: `choose_path`), register-resident greedy state when it fits (gram and fused paths), and tile
    sizes (``block_d`` None: `STREAM_BLOCK_D` for the streamed X tiles, the resident greedy's own choice);
    tests shrink the tiles to cross chunk edges."""

    path: str | None = None
    resident: bool = True
    block_n: int = 128
    block_d: int | None = None
    block_w: int = 16
    pivot_block_d: int = 128
    block_m: int = 64
    block_k: int = 32
    gram_warps: int = 4
    gram_stages: int = 3


_options: ContextVar[TritonOptions] = ContextVar("gemkernels_triton_options", default=TritonOptions())


def current_options() -> TritonOptions:
    """The options selections in this context run with (`using` sets them)."""
    return _options.get()


@contextmanager
def using(options: TritonOptions) -> Iterator[TritonOptions]:
    """Run the selections of this context (thread or task) with ``options``: tests and benchmarks force a path
    or tiles without touching anyone else's."""
    token = _options.set(options)
    try:
        yield options
    finally:
        _options.reset(token)


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here: no CUDA device and no TRITON_INTERPRET=1; None when they can."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return ("the triton backend needs a CUDA GPU (or TRITON_INTERPRET=1, set before import, to run its kernels "
            "on the CPU in Triton's interpreter)")


def kernel_device() -> torch.device:
    """Where the kernels run: the current CUDA device, or the CPU under TRITON_INTERPRET=1."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device(values: Any) -> torch.device | None:
    """CUDA tensors stay where they are; anything else moves to `kernel_device`."""
    return None if is_cuda(values) else kernel_device()


def choose_path(lengths: np.ndarray, d: int) -> str:
    """Shape rule (provisional until measured on a GPU, see bench/RESULTS.md).

    gram when every session is at most GRAM_MAX_ROWS rows and no longer than d (one GEMM beats
    b passes over X; batches whose Gram matrices pass GRAM_MAX_BYTES run in groups); stepwise
    for a handful of very long sessions (too few programs to fill the GPU); fused otherwise.
    """
    n_max = int(lengths.max())
    if n_max <= min(GRAM_MAX_ROWS, d):
        return "gram"
    if n_max >= STEPWISE_MIN_ROWS and len(lengths) < 32:
        return "stepwise"
    return "fused"


def compiles_ahead() -> bool:
    """Whether kernels compile before they run (on a GPU; Triton's CPU interpreter compiles nothing)."""
    return torch.cuda.is_available()


def warm_up_shapes(dim: int, k: int | None, max_rows: int | None) -> list[tuple[int, int]]:
    """One selection of k steps (None: as many as rows) per power-of-two row count from 16 up to ``max_rows``
    (None: twice `GRAM_MAX_ROWS`): Triton compiles one variant per tile shape on first use (about a second each on
    a GPU) and caches it on disk. Empty when nothing compiles ahead (`compiles_ahead`)."""
    if not compiles_ahead():
        return []
    limit = 2 * GRAM_MAX_ROWS if max_rows is None else max_rows
    shapes, rows = [], 16
    while rows < 2 * limit:
        shapes.append((rows, rows if k is None else k))
        rows *= 2
    return shapes


def gram_groups(lengths: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Contiguous session ranges ``(first, stop)`` whose fp32 Gram matrices take at most ``budget`` bytes each
    (or one session's, if that alone is more)."""
    sizes = (4 * lengths.astype(np.int64) ** 2).tolist()
    if sum(sizes) <= budget:
        return [(0, len(sizes))]
    groups, first, used = [], 0, 0
    for s, size in enumerate(sizes):
        if used and used + size > budget:
            groups.append((first, s))
            first, used = s, 0
        used += size
    return groups + [(first, len(sizes))]


def select_in_groups(groups: list[tuple[int, int]], batch: RaggedBatch, values: torch.Tensor,
                     sq_norms: torch.Tensor, tau: np.ndarray, capacity: np.ndarray, eps: float) -> PackedSelection:
    """`select_packed` on each group of sessions, its packed results joined (indices padded to one width)."""
    parts = []
    for first, stop in groups:
        a, b = int(batch.offsets[first]), int(batch.offsets[stop])
        parts.append(select_packed(batch.sessions(first, stop), values[a:b], sq_norms[a:b], tau[first:stop],
                                   capacity[first:stop], eps))
    width = int(capacity.max())
    indices = torch.cat([torch.nn.functional.pad(p.indices, (0, width - p.indices.shape[1]), value=-1)
                         for p in parts])
    return PackedSelection(indices, *(torch.cat([getattr(p, f) for p in parts])
                                      for f in ("counts", "coverage", "residuals")))


def select_packed(batch: RaggedBatch, values: torch.Tensor, sq_norms: torch.Tensor, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Prepare the packed inputs the kernels share, run the chosen path, return packed results."""
    from gemkernels.kernels.gram import ragged_gram
    from gemkernels.kernels.greedy_exact import greedy_exact
    from gemkernels.kernels.greedy_fused import greedy_fused
    from gemkernels.kernels.greedy_resident import greedy_resident, resident_fits
    from gemkernels.kernels.greedy_stepwise import greedy_stepwise

    options = current_options()
    path = options.path or choose_path(batch.lengths, batch.dim)
    if path not in PATHS:
        raise ValueError(f"unknown triton path {path!r}; choose one of {PATHS}")
    width, n_max = int(capacity.max()), int(batch.lengths.max())
    on_chip = options.resident and path == "gram" and resident_fits(n_max, width, "chip")  # no G in memory
    groups = gram_groups(batch.lengths, GRAM_MAX_BYTES) if path == "gram" and not on_chip else [(0, len(capacity))]
    if len(groups) > 1:
        return select_in_groups(groups, batch, values, sq_norms, tau, capacity, eps)
    x = values
    if x.dtype == torch.float64 or (x.dtype == torch.bfloat16 and not x.is_cuda):
        x = x.float()  # no fp64 kernels; Triton's CPU interpreter has no bf16 arithmetic
    x = x.contiguous()
    device = x.device
    inv_norm = sq_norms.to(torch.float32).rsqrt()
    offsets = torch.tensor(batch.offsets, device=device)  # torch.tensor: copies of the batch's read-only arrays
    protected_rows = batch.protected_rows
    protected_idx = torch.as_tensor(
        np.append(protected_rows - batch.offsets[batch.protected_sessions], 0).astype(np.int32), device=device)
    protected_offsets = torch.tensor(batch.protected_offsets, device=device)
    candidate = (torch.ones(len(batch.eligible), dtype=torch.int8, device=device) if batch.eligible.all() else
                 torch.tensor(batch.eligible.view(np.int8), device=device))  # a copy: the kernels consume it
    candidate[torch.tensor(protected_rows, device=device)] = 0  # eligible, not protected, not yet selected
    tau_t = torch.as_tensor(tau, dtype=torch.float32, device=device)
    capacity_t = torch.as_tensor(capacity.astype(np.int32), device=device)
    eps = dependency_threshold(eps, np.float32)  # the kernels compute in fp32
    common = dict(eps=eps, width=width, block_n=options.block_n, block_d=options.block_d or STREAM_BLOCK_D)
    if path == "stepwise":
        return PackedSelection(*greedy_stepwise(x, inv_norm, offsets, batch.lengths, protected_idx, protected_offsets,
                                                candidate, tau_t, capacity_t, pivot_block_d=options.pivot_block_d,
                                                **common))
    candidate_init = candidate.clone()  # the Cholesky greedies consume theirs; greedy_exact starts again from it
    if on_chip:
        out = greedy_resident(x, inv_norm, offsets, protected_idx, protected_offsets, candidate, tau_t, capacity_t,
                              eps=eps, width=width, lengths=batch.lengths, source="chip")
    else:
        gram = gram_offsets = None
        if path == "gram":
            if n_max * batch.dim >= GRAM_MAX_SESSION_ELEMENTS:
                raise ValueError(f"the gram path takes sessions of fewer than {GRAM_MAX_SESSION_ELEMENTS} elements "
                                 f"(n x d); the longest here has {n_max * batch.dim}")
            gram, gram_offsets = ragged_gram(x, inv_norm, offsets, batch.lengths, block_m=options.block_m,
                                              block_k=options.block_k, num_warps=options.gram_warps,
                                              num_stages=options.gram_stages)
        args = (x, inv_norm, offsets, protected_idx, protected_offsets, candidate, tau_t, capacity_t)
        source = "gram" if gram is not None else "x"
        if options.resident and resident_fits(n_max, width, source):
            out = greedy_resident(*args, eps=eps, width=width, lengths=batch.lengths, source=source, gram=gram,
                                  gram_offsets=gram_offsets, max_block_d=options.block_d)
        else:
            out = greedy_fused(*args, gram=gram, gram_offsets=gram_offsets, block_w=options.block_w, **common)
    # the sessions a Cholesky greedy handed back at a near-dependent pivot, selected again by explicit Gram-Schmidt
    return PackedSelection(*greedy_exact(x, inv_norm, offsets, protected_idx, protected_offsets, candidate_init, tau_t,
                                         capacity_t, out=out, **common))
