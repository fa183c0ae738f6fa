"""Host-side pieces the greedy launchers share: the buffers a greedy kernel fills."""

import numpy as np
import torch


def greedy_outputs(sessions: int, rows: int, width: int, device: torch.device, gram: torch.Tensor | None,
                   gram_offsets: torch.Tensor | None):
    """(residuals (rows,) fp32, indices (S, width) -1 padded, counts (S,), coverage (S,) fp32, gram, gram_offsets),
    uninitialised but for the indices; without a Gram matrix the kernel gets the residuals as a pointer it never
    reads and zero offsets."""
    residuals = torch.empty(rows, dtype=torch.float32, device=device)
    indices = torch.full((sessions, width), -1, dtype=torch.int64, device=device)
    counts = torch.empty(sessions, dtype=torch.int64, device=device)
    coverage = torch.empty(sessions, dtype=torch.float32, device=device)
    if gram is None:
        gram, gram_offsets = residuals, torch.zeros(sessions, dtype=torch.int64, device=device)
    return residuals, indices, counts, coverage, gram, gram_offsets


def session_basis(count: int, width: int, d: int, device: torch.device) -> torch.Tensor:
    """Uninitialised fp32 scratch for ``count`` explicit d-space bases of ``width`` rows of d (the exact greedy's, one
    a program, each taking whichever session comes)."""
    return torch.empty(count * max(width, 1) * d, dtype=torch.float32, device=device)


def session_blocks(capacities: np.ndarray, sizes: np.ndarray | int) -> tuple[np.ndarray, int]:
    """(S,) int64 offsets of each session's packed block of capacity_s x size_s fp32 values, and their total: scratch
    sized by each session's own capacity (its directions at most), not by the widest session's times all rows."""
    blocks = np.asarray(capacities, dtype=np.int64) * np.asarray(sizes, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(blocks)[:-1]]).astype(np.int64), int(blocks.sum())


#: Alignment of each array in `upload`'s buffer, in bytes (as the JIT's divisibility marks expect).
UPLOAD_ALIGN = 16


def upload(device: torch.device, *arrays: np.ndarray) -> list[torch.Tensor]:
    """The host arrays on ``device`` (dtypes and shapes kept) through one staging buffer and one copy, pinned and
    ``non_blocking`` on CUDA: a copy from pageable memory would wait for the stream, so a call that uploads this
    way neither blocks nor synchronises (and can be captured in a CUDA graph). The tensors are writable views of
    one device buffer, each at a 16-byte boundary."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    starts, size = [], 0
    for a in arrays:
        starts.append(size)
        size += -(-a.nbytes // UPLOAD_ALIGN) * UPLOAD_ALIGN
    host = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=device.type == "cuda")
    staged = host.numpy()
    for a, start in zip(arrays, starts):
        staged[start:start + a.nbytes] = a.reshape(-1).view(np.uint8)
    buffer = host.to(device, non_blocking=True)
    return [buffer[start:start + a.nbytes].view(torch.from_numpy(np.empty(0, a.dtype)).dtype).view(a.shape)
            for a, start in zip(arrays, starts)]
