"""Host-side pieces the greedy launchers share: the buffers a greedy kernel fills."""

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
    """Uninitialised fp32 scratch for ``count`` explicit d-space bases of ``width`` rows of d (the stepwise greedy's,
    one a session; the exact greedy's, one a program)."""
    return torch.empty(count * max(width, 1) * d, dtype=torch.float32, device=device)
