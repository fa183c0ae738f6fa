"""Per-session Gram matrices ``G_s = X_hat_s X_hat_s^T`` of a ragged batch, in one launch.

A host-side plan lists every (session, row tile, column tile) so the grid has no idle
programs however different the sessions' lengths are (FlashInfer's plan/run split).
``G_s`` is stored row-major at ``gram_offsets[s] = sum_{s' < s} n_{s'}^2``, fp32; the dot
products run on tensor cores for fp16/bf16 input and in full fp32 ("ieee") for fp32.
"""

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def gram_kernel(x_ptr, inv_norm_ptr, offsets_ptr, gram_offsets_ptr, tile_session_ptr, tile_row_ptr, tile_col_ptr,
                gram_ptr, d, stride_x,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Program ``i`` writes one BLOCK_M x BLOCK_M tile of one session's Gram matrix."""
    pid = tl.program_id(0)
    s = tl.load(tile_session_ptr + pid)
    start = tl.load(offsets_ptr + s).to(tl.int32)
    n = tl.load(offsets_ptr + s + 1).to(tl.int32) - start
    rows = tl.load(tile_row_ptr + pid) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.load(tile_col_ptr + pid) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    row_ptr = x_ptr + (start + rows).to(tl.int64)[:, None] * stride_x
    col_ptr = x_ptr + (start + cols).to(tl.int64)[:, None] * stride_x
    acc = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        km = k0 + ks < d
        a = tl.load(row_ptr + k0 + ks[None, :], mask=(rows < n)[:, None] & km[None, :], other=0.0)
        b = tl.load(col_ptr + k0 + ks[None, :], mask=(cols < n)[:, None] & km[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=INPUT_PRECISION)
    scale_r = tl.load(inv_norm_ptr + start + rows, mask=rows < n, other=0.0)
    scale_c = tl.load(inv_norm_ptr + start + cols, mask=cols < n, other=0.0)
    acc = acc * scale_r[:, None] * scale_c[None, :]
    out = gram_ptr + tl.load(gram_offsets_ptr + s) + rows.to(tl.int64)[:, None] * n + cols[None, :]
    tl.store(out, acc, mask=(rows < n)[:, None] & (cols < n)[None, :])


def gram_plan(lengths: np.ndarray, block_m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host plan: (gram_offsets (S,) int64, tile_session, tile_row, tile_col (T,) int32) for a batch."""
    lengths = np.asarray(lengths, dtype=np.int64)
    gram_offsets = np.concatenate([[0], np.cumsum(lengths * lengths)[:-1]]).astype(np.int64)
    tiles = -(-lengths // block_m)
    tile_session = np.repeat(np.arange(len(lengths), dtype=np.int32), tiles * tiles)
    first = np.concatenate([[0], np.cumsum(tiles * tiles)[:-1]])
    local = np.arange(len(tile_session)) - first[tile_session]
    per_row = tiles[tile_session]
    return gram_offsets, tile_session, (local // per_row).astype(np.int32), (local % per_row).astype(np.int32)


def ragged_gram(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, lengths: np.ndarray,
                block_m: int = 64, block_k: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed fp32 Gram matrices of the normalised rows and their offsets (``(sum n_s^2,)``, ``(S,)``)."""
    gram_offsets, tile_session, tile_row, tile_col = gram_plan(lengths, block_m)
    device = x.device
    gram = torch.empty(int((np.asarray(lengths, dtype=np.int64) ** 2).sum()), dtype=torch.float32, device=device)
    gram_offsets_t = torch.as_tensor(gram_offsets, device=device)
    precision = "ieee" if x.dtype in (torch.float32, torch.float64) else "tf32"
    gram_kernel[(len(tile_session),)](
        x, inv_norm, offsets, gram_offsets_t, torch.as_tensor(tile_session, device=device),
        torch.as_tensor(tile_row, device=device), torch.as_tensor(tile_col, device=device), gram,
        x.shape[1], x.stride(0), BLOCK_M=block_m, BLOCK_K=block_k, INPUT_PRECISION=precision,
    )
    return gram, gram_offsets_t
