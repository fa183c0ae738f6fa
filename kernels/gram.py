"""Per-session Gram matrices ``G_s = X_s X_s^T`` of a ragged batch, in one launch, and the unit Gram tile of a short
session computed on chip.

A host-side plan lists every (session, row tile, column tile) on or above the diagonal, so the
grid has no idle programs however different the sessions' lengths are (FlashInfer's plan/run
split); a program stores its tile and, off the diagonal, its transpose: about half the
tensor-core work of the full product, and G_s exactly symmetric.
``G_s`` is stored row-major at ``gram_offsets[s] = sum_{s' < s} n_{s'}^2``, fp32, not normalised: its diagonal
holds the rows' squared norms (`kernels.norms` takes them from there, so the rows are read once), and a reader
scales ``G[i, j]`` by ``s_i s_j`` (``pivot.gram_row_chunk``). The dot products run on tensor cores for fp16/bf16
input and in full fp32 ("ieee", CUDA cores) for fp32.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from .launch import upload
from .pivot import inverse_norms


@triton.jit
def tile_dots(x_ptr, start, rows, cols, n, d, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """``X[rows] X[cols]^T`` (BLOCK_M x BLOCK_M, fp32) of the session whose rows start at ``start``.

    Rows past the session wrap around (``% n``, as in Triton's matmul tutorial) instead of being masked, so
    the loads are unmasked when ``EVEN_K`` (BLOCK_K divides d); the caller drops them."""
    ks = tl.arange(0, BLOCK_K)
    x_ptr += start * stride_x  # the session's rows (start: int64); offsets inside it fit int32 (n d < 2^31)
    a_ptr = x_ptr + (rows % n)[:, None] * stride_x + ks[None, :]  # BLOCK_M x BLOCK_K
    b_ptr = x_ptr + (cols % n)[None, :] * stride_x + ks[:, None]  # BLOCK_K x BLOCK_M: X^T's tile
    acc = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr)
            b = tl.load(b_ptr)
        else:
            a = tl.load(a_ptr, mask=(k0 + ks < d)[None, :], other=0.0)
            b = tl.load(b_ptr, mask=(k0 + ks < d)[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    return acc


@triton.jit
def unit_gram_tile(x_ptr, start, rows, n, d, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The whole normalised G of a session of at most BLOCK_M rows (``rows``: 0 .. BLOCK_M - 1), its norms from its
    own diagonal: (G, zero past n and in the rows and columns of bad rows; 1 / ||x_i|| by row, 0 for a bad row and
    past n; whether each row is bad: zero or not finite, in fp32).

    Each entry is scaled by one symmetric factor s_i s_j, as `pivot.gram_row_chunk` scales: (acc s_i) s_j and
    (acc s_j) s_i can differ by an ulp, which would make G asymmetric. The diagonal is read along both axes (one
    entry of a row, or of a column, added to zeros: the same value), so s_i is the same bits as a row and as a
    column. The dots are averaged with their transpose ((a + b) / 2 is the same bits either way round): a matrix
    unit need not sum x_i . x_j and x_j . x_i in one order (the interpreter's BLAS on some CPUs does not)."""
    acc = tile_dots(x_ptr, start, rows, rows, n, d, stride_x, BLOCK_M, BLOCK_K, EVEN_K, INPUT_PRECISION)
    acc = (acc + tl.trans(acc)) * 0.5
    diagonal = tl.where(rows[:, None] == rows[None, :], acc, 0.0)
    scale_r, bad = inverse_norms(tl.sum(diagonal, axis=1), rows < n)
    scale_c, _ = inverse_norms(tl.sum(diagonal, axis=0), rows < n)
    return acc * (scale_r[:, None] * scale_c[None, :]), scale_r, bad


@triton.jit
def entry_offsets(rows, cols, n):
    """Offsets of ``G[rows[i], cols[j]]`` and of its mirror ``G[cols[j], rows[i]]`` in a row-major n x n matrix,
    both [len(rows), len(cols)], int64: n^2 passes 2^31 from n = 46,341."""
    rows64 = rows.to(tl.int64)[:, None]
    cols64 = cols.to(tl.int64)[None, :]
    return rows64 * n + cols64, cols64 * n + rows64


@triton.jit
def gram_kernel(x_ptr, offsets_ptr, gram_offsets_ptr, tile_session_ptr, tile_row_ptr, tile_col_ptr, gram_ptr, d,
                stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                INPUT_PRECISION: tl.constexpr):
    """Program ``i`` writes one BLOCK_M x BLOCK_M tile of one session's Gram matrix and its mirror image."""
    pid = tl.program_id(0)
    s = tl.load(tile_session_ptr + pid)
    start = tl.load(offsets_ptr + s)  # int64: a batch may pass 2^31 rows
    n = (tl.load(offsets_ptr + s + 1) - start).to(tl.int32)
    rows = tl.load(tile_row_ptr + pid) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.load(tile_col_ptr + pid) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tile_dots(x_ptr, start, rows, cols, n, d, stride_x, BLOCK_M, BLOCK_K, EVEN_K, INPUT_PRECISION)
    # G[i, j] for j >= i from this tile, and the same value at G[j, i] for j > i: the tiles above the diagonal
    # are stored twice, a diagonal tile's lower half is its upper half mirrored (exactly symmetric)
    gram_ptr += tl.load(gram_offsets_ptr + s)
    inside = (rows < n)[:, None] & (cols < n)[None, :]
    entry, mirror = entry_offsets(rows, cols, n)
    tl.store(gram_ptr + entry, acc, mask=inside & (cols[None, :] >= rows[:, None]))
    tl.store(gram_ptr + mirror, acc, mask=inside & (cols[None, :] > rows[:, None]))


def input_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for X of this dtype: full fp32 ("ieee") for fp32/fp64, tensor cores otherwise."""
    return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"


#: Tile candidates (BLOCK_M, BLOCK_K, warps, stages) for tuning on a GPU (`bench.select_floor --only gram`); each
#: compiles for sm_90 without register spills (tests/compile_kernels.py; 64 x 64 on 8 warps spills in fp32 from 2
#: stages once d is specialised as aligned, ptxas holding it to 80 registers; on 4 warps it takes 128). The first is
#: `ragged_gram`'s default.
TILE_CANDIDATES = ((64, 32, 4, 3), (64, 32, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (128, 32, 8, 4))


def gram_plan(lengths: np.ndarray, block_m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host plan: (gram_offsets (S,) int64, tile_session, tile_row, tile_col (T,) int32) for a batch, with
    tile_row <= tile_col: the tiles on and above each session's diagonal."""
    lengths = np.asarray(lengths, dtype=np.int64)
    gram_offsets = np.concatenate([[0], np.cumsum(lengths * lengths)[:-1]]).astype(np.int64)
    tiles = -(-lengths // block_m)
    pair_row, pair_col = np.triu_indices(int(tiles.max(initial=0)))  # row-major, row <= col
    per_session = tiles * (tiles + 1) // 2
    tile_session = np.repeat(np.arange(len(lengths), dtype=np.int32), per_session)
    # the first t(t+1)/2 pairs of triu_indices(T) are not triu_indices(t): pick each session's own pairs
    keep = pair_col[None, :] < tiles[:, None]  # (S, pairs): col < t, hence row < t
    tile_row = np.broadcast_to(pair_row, keep.shape)[keep]
    tile_col = np.broadcast_to(pair_col, keep.shape)[keep]
    return gram_offsets, tile_session, tile_row.astype(np.int32), tile_col.astype(np.int32)


def ragged_gram(x: torch.Tensor, offsets: torch.Tensor, lengths: np.ndarray, block_m: int = 64, block_k: int = 32,
                num_warps: int = 4, num_stages: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed fp32 Gram matrices of the rows (not normalised) and their offsets (``(sum n_s^2,)``, ``(S,)``)."""
    gram_offsets, tile_session, tile_row, tile_col = gram_plan(lengths, block_m)
    device = x.device
    gram = torch.empty(int((np.asarray(lengths, dtype=np.int64) ** 2).sum()), dtype=torch.float32, device=device)
    gram_offsets_t, tile_session_t, tile_row_t, tile_col_t = upload(device, gram_offsets, tile_session, tile_row,
                                                                     tile_col)
    gram_kernel[(len(tile_session),)](
        x, offsets, gram_offsets_t, tile_session_t, tile_row_t, tile_col_t, gram,
        x.shape[1], x.stride(0), BLOCK_M=block_m, BLOCK_K=block_k, EVEN_K=x.shape[1] % block_k == 0,
        INPUT_PRECISION=input_precision(x.dtype), num_warps=num_warps, num_stages=num_stages,
    )
    return gram, gram_offsets_t
