"""The whole greedy of a short session with its state in registers (one program per session).

Same pivoted partial Cholesky as ``greedy_fused``, but the residuals, candidate flags and the
projections ``C`` (``BLOCK_W x BLOCK_N``, one row per direction) never leave the program. The
pivot's Gram row comes from ``SOURCE``: ``"gram"`` reads one row of a precomputed G, ``"x"``
makes one pass over the session's X, ``"chip"`` takes it from the session's whole G, computed
by the program itself with ``tl.dot`` (tensor cores for fp16/bf16; X read once, nothing else
from memory; the rows' inverse norms come from its diagonal, and are stored, with the rows' bad flags, for
``greedy_exact`` and the host: a session with a bad row takes no step). Sessions must have at most ``BLOCK_N`` rows
and at most ``BLOCK_W`` steps
(`resident_fits`). A session whose pivot is near-dependent (``pivot.NEAR_DEPENDENCE``) stops there with
count -1: ``greedy_exact`` selects it again.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from .gram import input_precision, unit_gram_tile
from .launch import greedy_outputs
from .pivot import (
    NEAR_DEPENDENCE,
    adds_direction,
    coverage_of,
    gram_row_chunk,
    inverse_sqrt,
    session_scalars,
    should_stop,
)


@triton.jit(do_not_specialize=["width"])
def greedy_resident_kernel(
    x_ptr, inv_norm_ptr, gram_ptr, gram_offsets_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr,
    candidate_ptr, tau_ptr, capacity_ptr, residuals_ptr, indices_ptr, counts_ptr, coverage_ptr, bad_rows_ptr,
    eps, d, stride_x, width,
    SOURCE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """One program runs session ``program_id(0)`` from protected seeding to its stop."""
    s = tl.program_id(0)
    start, n, p_start, num_protected, tau, capacity = session_scalars(s, offsets_ptr, protected_offsets_ptr,
                                                                      tau_ptr, capacity_ptr)
    gram_ptr += tl.load(gram_offsets_ptr + s)
    rows = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, BLOCK_W)
    m = rows < n

    running = 1
    if SOURCE == "chip":  # the session's whole G, and its rows' norms from its diagonal
        gram, inv_norm, bad = unit_gram_tile(x_ptr, start, rows, n, d, stride_x, BLOCK_N, BLOCK_D, EVEN_D,
                                             INPUT_PRECISION)
        tl.store(inv_norm_ptr + start + rows, inv_norm, mask=m)
        tl.store(bad_rows_ptr + start + rows, bad.to(tl.int8), mask=m)
        running = 1 - tl.max(bad.to(tl.int32), axis=0)
    residuals = tl.where(m, 1.0, 0.0)
    candidate = tl.load(candidate_ptr + start + rows, mask=m, other=0) != 0
    projections = tl.zeros([BLOCK_W, BLOCK_N], dtype=tl.float32)  # C: row k = direction k's coordinates
    t = 0
    directions = 0
    coverage = 0.0
    while running != 0:
        score = tl.where(candidate, residuals, -1.0)
        best = tl.max(score, axis=0)
        forced = t < num_protected
        forced_i = tl.load(protected_idx_ptr + p_start + t, mask=forced, other=0)
        pivot = tl.where(forced, forced_i, tl.argmax(score, axis=0, tie_break_left=True))
        at_pivot = rows == pivot
        r_pivot = tl.sum(tl.where(at_pivot, residuals, 0.0), axis=0)
        if should_stop(forced, best, t, capacity, coverage, tau, eps):
            running = 0
        elif r_pivot < NEAR_DEPENDENCE:  # near-dependent: greedy_exact selects this session again
            running = 0
            t = -1
        else:
            tl.store(indices_ptr + s.to(tl.int64) * width + t, pivot.to(tl.int64))
            candidate = candidate & (rows != pivot)
            t += 1
            if adds_direction(r_pivot, eps):
                if SOURCE == "chip":
                    g = tl.sum(tl.where(at_pivot[:, None], gram, 0.0), axis=0)
                else:
                    g = gram_row_chunk(x_ptr, inv_norm_ptr, gram_ptr, start, n, pivot, 0, d, stride_x,
                                       SOURCE == "gram", BLOCK_N, BLOCK_D)
                c_pivot = tl.sum(tl.where(at_pivot[None, :], projections, 0.0), axis=1)  # C[:, pivot]
                e = (g - tl.sum(c_pivot[:, None] * projections, axis=0)) * inverse_sqrt(r_pivot)
                e = tl.where(m, e, 0.0)
                projections = tl.where(slots[:, None] == directions, e[None, :], projections)
                residuals = tl.maximum(residuals - e * e, 0.0)
                directions += 1
                coverage = coverage_of(tl.sum(residuals, axis=0), n)
    tl.store(residuals_ptr + start + rows, residuals, mask=m)
    tl.store(counts_ptr + s, t.to(tl.int64))
    tl.store(coverage_ptr + s, coverage)


#: Sources of the pivot's Gram row (see the module docstring).
SOURCES = ("gram", "x", "chip")
#: Per source: the largest session, and the largest projections tile (rows x steps, fp32) kept in registers;
#: beyond them ptxas spills (tests/compile_kernels.py).
MAX_ROWS = {"gram": 1024, "x": 256, "chip": 64}
MAX_ELEMENTS = {"gram": 16384, "x": 4096, "chip": 4096}


def resident_blocks(n_max: int, width: int, source: str) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_W, BLOCK_D, num_warps) for sessions of up to n_max rows and width steps.

    One warp per 32 rows, and enough warps (4 to 16) that a thread holds at most 32 projections of C
    (16 when the step also streams an X tile) and 64 entries of an on-chip G; an X tile holds 16
    elements a thread (BLOCK_D: its width; for "chip" the K step of the Gram product, 16: at 32 the fp32 product
    of 64 rows spills once the JIT specialises an aligned d). That keeps ptxas under its register limit without
    spills (tests/compile_kernels.py reports both)."""
    block_n = triton.next_power_of_2(max(n_max, 16))
    block_w = triton.next_power_of_2(max(width, 1))
    per_thread = 16 if source == "x" else 32
    gram_warps = block_n * block_n // (32 * 64) if source == "chip" else 0
    num_warps = max(4, min(16, max(block_n // 32, block_n * block_w // (32 * per_thread), gram_warps)))
    block_d = 16 if source == "chip" else max(8, min(64, 512 * num_warps // block_n))
    return block_n, block_w, block_d, num_warps


def resident_fits(n_max: int, width: int, source: str) -> bool:
    """Whether sessions of up to ``n_max`` rows taking up to ``width`` steps fit `greedy_resident` from
    ``source``."""
    block_n, block_w, _, _ = resident_blocks(n_max, width, source)
    return n_max <= MAX_ROWS[source] and block_n * block_w <= MAX_ELEMENTS[source]


def greedy_resident(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, protected_idx: torch.Tensor,
                    protected_offsets: torch.Tensor, candidate: torch.Tensor, tau: torch.Tensor,
                    capacity: torch.Tensor, eps: float, width: int, lengths: np.ndarray, source: str,
                    gram: torch.Tensor | None = None, gram_offsets: torch.Tensor | None = None,
                    max_block_d: int | None = None, bad_rows: torch.Tensor | None = None):
    """Launch one program per session; returns (indices (S, width) -1 padded, counts, coverage, residuals).

    ``lengths`` are the sessions' row counts (host), which must `resident_fits` ``source``; ``gram`` and
    ``gram_offsets`` (as in `greedy_fused`) for source "gram"; ``max_block_d`` caps the X tile's width
    (tests cross its edges). For source "chip" the kernel writes ``inv_norm`` and ``bad_rows`` (int8, one per
    row; required); the other sources read ``inv_norm``.
    """
    if source not in SOURCES or (gram is not None, bad_rows is not None) != (source == "gram", source == "chip"):
        raise ValueError(f"source must be one of {SOURCES}, with a Gram matrix exactly for 'gram' and bad-row flags "
                         f"exactly for 'chip'; got {source!r}")
    n_max = int(np.max(lengths))
    if not resident_fits(n_max, width, source):
        raise ValueError(f"sessions of {n_max} rows taking {width} steps do not fit the resident greedy "
                         f"from {source!r}")
    sessions = offsets.numel() - 1
    rows, d = x.shape
    device = x.device
    block_n, block_w, block_d, num_warps = resident_blocks(n_max, width, source)
    if source != "chip":  # chip's BLOCK_D is the K step of tl.dot, which must stay >= 16
        block_d = min(block_d, max_block_d or block_d)
    residuals, indices, counts, coverage, gram, gram_offsets = greedy_outputs(sessions, rows, width, device, gram,
                                                                              gram_offsets)
    greedy_resident_kernel[(sessions,)](
        x, inv_norm, gram, gram_offsets, offsets, protected_idx, protected_offsets, candidate, tau, capacity,
        residuals, indices, counts, coverage, candidate if bad_rows is None else bad_rows, eps, d, x.stride(0), width,
        SOURCE=source, BLOCK_N=block_n, BLOCK_W=block_w, BLOCK_D=block_d, EVEN_D=source == "chip" and d % block_d == 0,
        INPUT_PRECISION=input_precision(x.dtype), num_warps=num_warps,
    )
    return indices, counts, coverage, residuals
