"""triton backend: the selection kernels of ``gemkernels.kernels`` on CUDA (or Triton's CPU interpreter).

Three paths give the same answers; `choose_path` picks one per batch from byte and occupancy arithmetic
(`path_costs`): ``gram`` (one tensor-core GEMM per session, then the greedy on G: fewer bytes than b passes while
4 n^2 is small against b n d), ``fused`` (the whole greedy in one launch, a pass over X per direction, one program a
session) and ``stepwise`` (two launches per step, parallel over row tiles: too few sessions to fill the GPU).
``gram`` and ``fused`` keep a short session's greedy state in registers (``greedy_resident``) when it fits;
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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from gemkernels.select.arrays import is_cuda
from gemkernels.select.backends import PackedSelection, dependency_threshold
from gemkernels.select.ragged import RaggedBatch

LIBRARY = "torch"
PATHS = ("gram", "fused", "stepwise")

#: Budget for the packed Gram matrices of one launch, in bytes: larger batches run in groups of sessions, and the
#: gram path takes no session whose own G is larger.
GRAM_MAX_BYTES = 2 << 30
#: Largest session `warm_up_shapes` compiles for by default.
WARM_UP_MAX_ROWS = 2048
#: Width of the X tiles the fused, stepwise and exact passes stream (128 rows), by whether X's rows are aligned
#: (`rows_aligned`): the JIT then marks d, the row stride and X's address divisible by 16, the loads vectorise,
#: and 128 x 64 compiles without register spills on sm_90 (80-128 registers); unaligned, 128 x 8 does (128 x 16
#: spilled the fused pass in fp32; tests/compile_kernels.py compiles both).
STREAM_BLOCK_D = {True: 64, False: 8}
#: In-session offsets of the Gram kernel are int32: one session's n x d must stay below this.
GRAM_MAX_SESSION_ELEMENTS = 2 ** 31
#: The fused greedy's offsets inside one session's coordinates are int32: capacity x n must stay below this.
FUSED_MAX_SESSION_COORDS = 2 ** 31


@dataclass(frozen=True)
class TritonOptions:
    """Path (None: `choose_path`), register-resident greedy state when it fits (gram and fused paths), and tile
    sizes (``block_d`` None: `STREAM_BLOCK_D` of X's alignment for the streamed X tiles, the resident greedy's own
    choice); tests shrink the tiles to cross chunk edges."""

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


#: The shape rule's GPU (H100/H200 class; the SM count is read from the device that runs): bytes a second HBM
#: streams, the product rates of the Gram GEMM by X's itemsize (tensor cores for fp16/bf16, IEEE fp32 on CUDA
#: cores), one launch, and the 4-warp programs each SM needs in flight to keep HBM busy (fewer stream slower in
#: proportion). Estimates until measured (bench/gpu_check.sh); DESIGN.md §1.1 has the table they give.
HBM_BYTES_PER_S = 4.0e12
MATMUL_FLOP_PER_S = {2: 600e12, 4: 50e12}
LAUNCH_S = 5e-6
PROGRAMS_PER_SM = 4
DEFAULT_SMS = 132
#: Rows of the Gram kernel's tiles and of the stepwise update's (the defaults).
GRAM_TILE, STREAM_TILE = 64, 128


@dataclass(frozen=True)
class PathCost:
    """What one call of a path moves and launches, and the time that should bound it."""

    bytes: float
    flops: float
    launches: int
    programs: int
    seconds: float


def path_costs(lengths: np.ndarray, d: int, itemsize: int = 4, steps: int = 16,
               sms: int = DEFAULT_SMS) -> dict[str, PathCost]:
    """Each path's cost for sessions of ``lengths`` rows in ``d`` dimensions (X of ``itemsize`` bytes), ``steps``
    steps: HBM bytes at `HBM_BYTES_PER_S` scaled by how full its programs keep the GPU, or the Gram product's
    flops, whichever takes longer, plus its launches. A path the batch cannot take is left out.

    fused: b passes over X, one program a session (of b x n < 2^31). stepwise: the same passes over row tiles of
    128, two launches a step. gram: X read once, G (4 n^2 bytes a session) written and b of its rows read, on
    64-row tiles, three launches a group of `GRAM_MAX_BYTES` (for sessions of up to 64 rows G stays on chip: X
    alone, two launches).
    A greedy whose state does not fit its registers (fused past 256 rows, gram past 1,024) re-reads its
    coordinates: 2 b^2 n bytes a session."""
    n = np.asarray(lengths, dtype=np.float64)
    rows, n_max, fill = n.sum(), int(n.max()), PROGRAMS_PER_SM * sms
    x_bytes = rows * d * itemsize
    coords = 2.0 * steps ** 2 * rows

    def cost(nbytes: float, flops: float, launches: int, programs: float) -> PathCost:
        seconds = max(nbytes / (HBM_BYTES_PER_S * min(1.0, programs / fill)),
                      flops / MATMUL_FLOP_PER_S.get(itemsize, MATMUL_FLOP_PER_S[4])) + launches * LAUNCH_S
        return PathCost(nbytes, flops, launches, int(programs), seconds)

    passes = steps * x_bytes
    costs = {"stepwise": cost(passes, 0.0, 2 * steps + 1, np.ceil(n / STREAM_TILE).sum())}
    if steps * n_max < FUSED_MAX_SESSION_COORDS:
        costs["fused"] = cost(passes + (coords if n_max > 256 else 0.0), 0.0, 2, len(n))
    if 4 * n_max ** 2 <= GRAM_MAX_BYTES and n_max * d < GRAM_MAX_SESSION_ELEMENTS:
        if n_max <= 64:  # G on chip: the resident greedy and greedy_exact
            costs["gram"] = cost(x_bytes, float((2 * n * n * d).sum()), 2, len(n))
        else:
            tiles = np.ceil(n / GRAM_TILE)
            upper = tiles * (tiles + 1) / 2
            gram_bytes = x_bytes + 4 * (n * n).sum() + 4 * steps * rows + (coords if n_max > 1024 else 0.0)
            groups = max(1, int(np.ceil(4 * (n * n).sum() / GRAM_MAX_BYTES)))  # about; three launches each
            costs["gram"] = cost(gram_bytes, float((2 * GRAM_TILE ** 2 * d * upper).sum()), 3 * groups, upper.sum())
    return costs


def choose_path(lengths: np.ndarray, d: int, itemsize: int = 4, steps: int = 16, sms: int = DEFAULT_SMS) -> str:
    """The path of least `path_costs` time (a tie to the earlier of gram, fused, stepwise)."""
    costs = path_costs(lengths, d, itemsize, steps, sms)
    return min((p for p in PATHS if p in costs), key=lambda p: costs[p].seconds)


def multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device; `DEFAULT_SMS` elsewhere (the interpreter decides as an H100 would)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS


def rows_aligned(x: torch.Tensor) -> bool:
    """Whether the JIT specialises a launch over ``x`` as aligned: d, its row stride (elements) and its address
    (bytes) all multiples of 16 (``tt.divisibility``)."""
    return x.shape[1] % 16 == 0 and x.stride(0) % 16 == 0 and x.data_ptr() % 16 == 0


def compiles_ahead() -> bool:
    """Whether kernels compile before they run (on a GPU; Triton's CPU interpreter compiles nothing)."""
    return torch.cuda.is_available()


def warm_up_shapes(dim: int, k: int | None, max_rows: int | None) -> list[tuple[int, int]]:
    """One selection of k steps (None: as many as rows) per power-of-two row count from 16 up to ``max_rows``
    (None: `WARM_UP_MAX_ROWS`): Triton compiles one variant per tile shape on first use (about a second each on
    a GPU) and caches it on disk. Empty when nothing compiles ahead (`compiles_ahead`)."""
    if not compiles_ahead():
        return []
    limit = WARM_UP_MAX_ROWS if max_rows is None else max_rows
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
    from gemkernels.kernels.launch import upload

    if values.is_cuda and values.device.index != torch.cuda.current_device():
        with torch.cuda.device(values.device):  # Triton launches on the current device: make it the rows' one
            return select_packed(batch, values, sq_norms, tau, capacity, eps)
    options = current_options()
    # no fp64 kernels; Triton's CPU interpreter has no bf16 arithmetic
    widen = values.dtype == torch.float64 or (values.dtype == torch.bfloat16 and not values.is_cuda)
    width, n_max = int(capacity.max()), int(batch.lengths.max())
    path = options.path or choose_path(batch.lengths, batch.dim, 4 if widen else values.element_size(), width,
                                       multiprocessors(values.device))
    if path not in PATHS:
        raise ValueError(f"unknown triton path {path!r}; choose one of {PATHS}")
    on_chip = options.resident and path == "gram" and resident_fits(n_max, width, "chip")  # no G in memory
    groups = gram_groups(batch.lengths, GRAM_MAX_BYTES) if path == "gram" and not on_chip else [(0, len(capacity))]
    if len(groups) > 1:
        with using(replace(options, path=path)):  # every group on the path chosen for the whole batch
            return select_in_groups(groups, batch, values, sq_norms, tau, capacity, eps)
    x = (values.float() if widen else values).contiguous()
    device = x.device
    inv_norm = sq_norms.to(torch.float32).rsqrt()
    protected_rows = batch.protected_rows
    every_row = batch.eligible.all()
    # the per-call arrays in one pinned upload (copies: the kernels consume the candidate flags)
    offsets, protected_idx, protected_offsets, protected_t, tau_t, capacity_t, *eligible = upload(
        device, batch.offsets, np.append(protected_rows - batch.offsets[batch.protected_sessions], 0).astype(np.int32),
        batch.protected_offsets, protected_rows, np.asarray(tau, dtype=np.float32), capacity.astype(np.int32),
        *(() if every_row else (batch.eligible.view(np.int8),)))
    candidate = torch.ones(len(batch.eligible), dtype=torch.int8, device=device) if every_row else eligible[0]
    candidate[protected_t] = 0  # eligible, not protected, not yet selected
    eps = dependency_threshold(eps, np.float32)  # the kernels compute in fp32
    common = dict(eps=eps, width=width, block_n=options.block_n,
                  block_d=options.block_d or STREAM_BLOCK_D[rows_aligned(x)])
    if path == "stepwise":
        return PackedSelection(*greedy_stepwise(x, inv_norm, offsets, batch.lengths, protected_idx, protected_offsets,
                                                candidate, tau_t, capacity_t, capacities=capacity,
                                                pivot_block_d=options.pivot_block_d, **common))
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
            out = greedy_fused(*args, lengths=batch.lengths, capacities=capacity, gram=gram, gram_offsets=gram_offsets,
                               block_w=options.block_w, **common)
    # the sessions a Cholesky greedy handed back at a near-dependent pivot, selected again by explicit Gram-Schmidt
    return PackedSelection(*greedy_exact(x, inv_norm, offsets, protected_idx, protected_offsets, candidate_init, tau_t,
                                         capacity_t, out=out, **common))
