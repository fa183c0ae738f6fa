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
from gemkernels.select.backends import PackedSelection, WarmUp, dependency_threshold
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

    fused: b passes over X, one program a session (of b x n < 2^31), after the norm kernel's pass (`kernels.norms`,
    one launch). stepwise: the same passes over row tiles of 128, two launches a step. gram: X read once, G (4 n^2
    bytes a session) written and b of its rows read, on 64-row tiles, three launches a group of `GRAM_MAX_BYTES`,
    the norms from G's diagonal (one launch more; for sessions of up to 64 rows G stays on chip and gives the
    norms itself: X alone, two launches).
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

    passes = (steps + 1) * x_bytes  # the norm kernel's pass, then one a step
    costs = {"stepwise": cost(passes, 0.0, 2 * steps + 2, np.ceil(n / STREAM_TILE).sum())}
    if steps * n_max < FUSED_MAX_SESSION_COORDS:
        costs["fused"] = cost(passes + (coords if n_max > 256 else 0.0), 0.0, 3, len(n))
    if 4 * n_max ** 2 <= GRAM_MAX_BYTES and n_max * d < GRAM_MAX_SESSION_ELEMENTS:
        if n_max <= 64:  # G on chip: the resident greedy and greedy_exact
            costs["gram"] = cost(x_bytes, float((2 * n * n * d).sum()), 2, len(n))
        else:
            tiles = np.ceil(n / GRAM_TILE)
            upper = tiles * (tiles + 1) / 2
            gram_bytes = x_bytes + 4 * (n * n).sum() + 4 * steps * rows + (coords if n_max > 1024 else 0.0)
            groups = max(1, int(np.ceil(4 * (n * n).sum() / GRAM_MAX_BYTES)))  # about; three launches each
            costs["gram"] = cost(gram_bytes, float((2 * GRAM_TILE ** 2 * d * upper).sum()), 3 * groups + 1,
                                 upper.sum())
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


def warm_up_shapes(dim: int, k: int | None, max_rows: int | None, max_batch: int, dtype: str) -> list[WarmUp]:
    """Batches that launch every kernel variant a server's batches of up to ``max_batch`` sessions of up to
    ``max_rows`` rows (None: `WARM_UP_MAX_ROWS`) of ``dtype`` will, one batch a variant (Triton compiles one per
    path and tile shape on first use, about a second each on a GPU, and caches it on disk). Empty when nothing
    compiles ahead (`compiles_ahead`).

    The variants of a batch follow from its path, its longest session's row bucket (powers of two from 16) and its
    width bucket (K_t of its widest session, a power of two: from min(k, rows) up to the rows, protected rows past k
    included). For both ends of each pair of buckets (in the first row bucket, sessions shorter than k: both ends of
    each width bucket) the shape rule is asked about 1 to ``max_batch`` sessions, the others as long as the longest,
    of 1 row, or of the row bucket's shortest length."""
    if not compiles_ahead():
        return []
    device = kernel_device()
    itemsize = 4 if widened(getattr(torch, dtype), device) else getattr(torch, dtype).itemsize
    sms = multiprocessors(device)
    limit = WARM_UP_MAX_ROWS if max_rows is None else max_rows
    runs, seen = [], set()
    top = 16
    while top < 2 * limit:
        low = 0 if top == 16 else top // 2
        most = min(top, limit)
        for n_max in width_ends(1, most) if top == 16 else [low + 1, most]:
            for steps in ([n_max] if k is None else width_ends(min(k, n_max), n_max)):
                width = min(steps, n_max)
                for lengths in candidate_batches(n_max, low + 1, max_batch):
                    variant = launch_variant(choose_path(np.array(lengths), dim, itemsize, width, sms), n_max, width)
                    if variant not in seen:
                        seen.add(variant)
                        runs.append(WarmUp(n_max, steps, lengths, dtype))
        top *= 2
    return runs


def width_ends(least: int, most: int) -> list[int]:
    """Both ends of each power-of-two bucket, (2^(i-1), 2^i], of the widths from ``least`` to ``most``."""
    ends, top = set(), 1
    while top // 2 < most:
        first, last = max(least, top // 2 + 1), min(top, most)
        if first <= last:
            ends.update((first, last))
        top *= 2
    return sorted(ends)


def candidate_batches(n_max: int, shortest: int, max_batch: int) -> Iterator[tuple[int, ...]]:
    """Session lengths of 1 to ``max_batch`` sessions led by one of ``n_max`` rows: all of ``n_max``, or the rest of
    1 row or of ``shortest``."""
    for sessions in range(1, max_batch + 1):
        for rest in sorted({n_max, 1, shortest}):
            yield (n_max,) + (rest,) * (sessions - 1)
            if sessions == 1:
                break


def launch_variant(path: str, n_max: int, width: int, resident: bool = True) -> tuple:
    """What a batch on ``path`` whose longest session has ``n_max`` rows and whose widest takes ``width`` steps
    launches: (its greedy's source of Gram rows, "chip", "gram" or "x", or "stepwise"; whether the greedy keeps its
    state in registers; then, for that register-resident greedy, its `resident_blocks`). Batches of one variant launch
    the same compiled kernels (for one X dtype and alignment)."""
    from gemkernels.kernels.greedy_resident import resident_blocks, resident_fits

    if path == "stepwise":
        return "stepwise", False
    source = "chip" if path == "gram" and resident and resident_fits(n_max, width, "chip") else (
        "gram" if path == "gram" else "x")
    if resident and resident_fits(n_max, width, source):
        return (source, True) + resident_blocks(n_max, width, source)
    return source, False


def widened(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether rows of ``dtype`` are read as fp32: float64 (no fp64 kernels), and bf16 in Triton's CPU interpreter
    (no bf16 arithmetic there)."""
    return dtype == torch.float64 or (dtype == torch.bfloat16 and device.type != "cuda")


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
                     sq_norms: torch.Tensor | None, tau: np.ndarray, capacity: np.ndarray,
                     eps: float) -> PackedSelection:
    """`select_packed` on each group of sessions, its packed results joined (indices padded to one width)."""
    parts = []
    for first, stop in groups:
        a, b = int(batch.offsets[first]), int(batch.offsets[stop])
        norms = None if sq_norms is None else sq_norms[a:b]
        parts.append(select_packed(batch.sessions(first, stop), values[a:b], norms, tau[first:stop],
                                   capacity[first:stop], eps))
    width = int(capacity.max())
    indices = torch.cat([torch.nn.functional.pad(p.indices, (0, width - p.indices.shape[1]), value=-1)
                         for p in parts])
    return PackedSelection(indices, *(torch.cat([getattr(p, f) for p in parts])
                                      for f in ("counts", "coverage", "residuals")),
                           bad_rows=None if sq_norms is not None else torch.cat([p.bad_rows for p in parts]))


#: The backend computes the rows' norms itself (`select_packed` with ``sq_norms`` None) and reports the rows it
#: cannot normalise in `PackedSelection.bad_rows` (`gemkernels.select.backends.Backend`).
CHECKS_ROWS = True


def select_packed(batch: RaggedBatch, values: torch.Tensor, sq_norms: torch.Tensor | None, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """Prepare the packed inputs the kernels share, run the chosen path, return packed results.

    With ``sq_norms`` None the kernels take the rows' norms themselves, from the Gram matrices' diagonals on the
    gram path (the one on chip, or G in memory) and from one pass over X on the others, and the result's
    ``bad_rows`` flags the rows that are zero, too small or not finite in fp32 (int8, on the device: nothing here
    waits for it); a session with such a row takes its protected steps only (on chip: no step at all). Its results
    are not an answer: the API raises for it."""
    from gemkernels.kernels.gram import ragged_gram
    from gemkernels.kernels.greedy_exact import greedy_exact
    from gemkernels.kernels.greedy_fused import greedy_fused
    from gemkernels.kernels.greedy_resident import greedy_resident
    from gemkernels.kernels.greedy_stepwise import greedy_stepwise, row_tiles
    from gemkernels.kernels.launch import upload
    from gemkernels.kernels.norms import row_norms

    if values.is_cuda and values.device.index != torch.cuda.current_device():
        with torch.cuda.device(values.device):  # Triton launches on the current device: make it the rows' one
            return select_packed(batch, values, sq_norms, tau, capacity, eps)
    options = current_options()
    widen = widened(values.dtype, values.device)
    width, n_max = int(capacity.max()), int(batch.lengths.max())
    path = options.path or choose_path(batch.lengths, batch.dim, 4 if widen else values.element_size(), width,
                                       multiprocessors(values.device))
    if path not in PATHS:
        raise ValueError(f"unknown triton path {path!r}; choose one of {PATHS}")
    source, in_registers = launch_variant(path, n_max, width, options.resident)[:2]
    groups = gram_groups(batch.lengths, GRAM_MAX_BYTES) if source == "gram" else [(0, len(capacity))]
    if len(groups) > 1:
        with using(replace(options, path=path)):  # every group on the path chosen for the whole batch
            return select_in_groups(groups, batch, values, sq_norms, tau, capacity, eps)
    if source == "gram" and n_max * batch.dim >= GRAM_MAX_SESSION_ELEMENTS:
        raise ValueError(f"the gram path takes sessions of fewer than {GRAM_MAX_SESSION_ELEMENTS} elements "
                         f"(n x d); the longest here has {n_max * batch.dim}")
    x = (values.float() if widen else values).contiguous()
    device = x.device
    protected_rows = batch.protected_rows
    every_row = batch.eligible.all()
    norms_here = sq_norms is None and source != "chip"  # the chip greedy takes them from its own G
    # the per-call arrays in one pinned upload (copies: the kernels consume the candidate flags)
    offsets, protected_idx, protected_offsets, protected_t, tau_t, capacity_t, *rest = upload(
        device, batch.offsets, np.append(protected_rows - batch.offsets[batch.protected_sessions], 0).astype(np.int32),
        batch.protected_offsets, protected_rows, np.asarray(tau, dtype=np.float32), capacity.astype(np.int32),
        *(row_tiles(batch.lengths, STREAM_TILE)[:2] if norms_here else ()),
        *(() if every_row else (batch.eligible.view(np.int8),)))
    candidate = torch.ones(len(batch.eligible), dtype=torch.int8, device=device) if every_row else rest[-1]
    candidate[protected_t] = 0  # eligible, not protected, not yet selected
    eps = dependency_threshold(eps, np.float32)  # the kernels compute in fp32
    common = dict(eps=eps, width=width, block_n=options.block_n,
                  block_d=options.block_d or STREAM_BLOCK_D[rows_aligned(x)])
    gram = gram_offsets = None
    if source == "gram":
        gram, gram_offsets = ragged_gram(x, offsets, batch.lengths, block_m=options.block_m, block_k=options.block_k,
                                         num_warps=options.gram_warps, num_stages=options.gram_stages)
    if sq_norms is not None:
        inv_norm, bad_rows = sq_norms.to(torch.float32).rsqrt(), None
    elif norms_here:
        inv_norm, bad_rows, bad_sessions = row_norms(x, offsets, *rest[:2], gram=gram, gram_offsets=gram_offsets,
                                                     block_n=STREAM_TILE, block_d=common["block_d"])
        capacity_t.masked_fill_(bad_sessions != 0, 0)  # no completion steps over rows that cannot be normalised
    else:  # written by the chip greedy
        inv_norm = torch.empty(len(x), dtype=torch.float32, device=device)
        bad_rows = torch.empty(len(x), dtype=torch.int8, device=device)
    if source == "stepwise":
        return PackedSelection(*greedy_stepwise(x, inv_norm, offsets, batch.lengths, protected_idx, protected_offsets,
                                                candidate, tau_t, capacity_t, capacities=capacity,
                                                pivot_block_d=options.pivot_block_d, **common), bad_rows=bad_rows)
    candidate_init = candidate.clone()  # the Cholesky greedies consume theirs; greedy_exact starts again from it
    args = (x, inv_norm, offsets, protected_idx, protected_offsets, candidate, tau_t, capacity_t)
    if source == "chip":  # G on chip, none in memory
        out = greedy_resident(*args, eps=eps, width=width, lengths=batch.lengths, source="chip",
                              bad_rows=bad_rows if sq_norms is None else torch.empty_like(candidate))
    elif in_registers:
        out = greedy_resident(*args, eps=eps, width=width, lengths=batch.lengths, source=source, gram=gram,
                              gram_offsets=gram_offsets, max_block_d=options.block_d)
    else:
        out = greedy_fused(*args, lengths=batch.lengths, capacities=capacity, gram=gram, gram_offsets=gram_offsets,
                           block_w=options.block_w, **common)
    # the sessions a Cholesky greedy handed back at a near-dependent pivot, selected again by explicit Gram-Schmidt
    return PackedSelection(*greedy_exact(x, inv_norm, offsets, protected_idx, protected_offsets, candidate_init, tau_t,
                                         capacity_t, out=out, **common), bad_rows=bad_rows)
