"""torch backend: the reference path on any device, every session advancing together.

The batch is padded to ``(S, n_max, d)`` and masked. The basis Q is explicit in d-space:
each new direction is the pivot's component orthogonal to Q (Gram-Schmidt with one
reorthogonalisation pass), then ``r -= (X q)**2``. The squared norm of that component is the pivot's exact
residual, which replaces a near-dependent pivot's downdated one (DESIGN.md §1.1). fp16/bf16 inputs compute in
float32.
"""

from __future__ import annotations

import numpy as np
import torch

from gemkernels.select.backends import (
    PackedSelection,
    compiles_nothing,
    computes_in_place,
    dependency_threshold,
    near_dependence,
)
from gemkernels.select.ragged import RaggedBatch

LIBRARY = "torch"

device = computes_in_place
warm_up_shapes = compiles_nothing


def select_packed(batch: RaggedBatch, values: torch.Tensor, sq_norms: torch.Tensor, tau: np.ndarray,
                  capacity: np.ndarray, eps: float) -> PackedSelection:
    """All sessions in lock-step: one batched matmul per step over the padded batch."""
    device = values.device
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    sessions, width = batch.num_sessions, int(capacity.max())
    lengths = torch.as_tensor(batch.lengths, device=device)
    n_max = int(batch.lengths.max())

    session_of_row = torch.repeat_interleave(torch.arange(sessions, device=device), lengths)
    local_row = torch.arange(values.shape[0], device=device) - torch.tensor(batch.offsets[:-1], device=device)[
        session_of_row]  # torch.tensor: a copy of the batch's read-only arrays
    x = values.to(dtype) * sq_norms.to(dtype).rsqrt().unsqueeze(1)
    padded = torch.zeros(sessions, n_max, x.shape[1], dtype=dtype, device=device)
    padded[session_of_row, local_row] = x

    def pad_mask(mask: np.ndarray) -> torch.Tensor:
        out = torch.zeros(sessions, n_max, dtype=torch.bool, device=device)
        out[session_of_row, local_row] = torch.tensor(mask, device=device)
        return out

    protected = pad_mask(batch.protected)
    candidates = pad_mask(batch.eligible) & ~protected
    residuals = (torch.arange(n_max, device=device) < lengths.unsqueeze(1)).to(dtype)  # 0 on padding
    exact = residuals.clone()  # each residual when last computed from its row
    basis = torch.zeros(sessions, width, x.shape[1], dtype=dtype, device=device)
    num_directions = torch.zeros(sessions, dtype=torch.long, device=device)
    everyone = torch.arange(sessions, device=device)
    eps = dependency_threshold(eps, np.float64 if dtype == torch.float64 else np.float32)
    near = near_dependence(np.float64 if dtype == torch.float64 else np.float32)

    def settle(pivot: torch.Tensor, deciding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each session's pivot row minus its projection on Q (twice); where the pivot decides (``deciding``) and
        is near-dependent, its residual is replaced by that component's squared norm. Returns the component, and
        where the downdated residual had lost most of its last exact value (None when no pivot was near-dependent)."""
        v = padded[everyone, pivot]
        for _ in range(2):
            v = v - torch.bmm(torch.bmm(basis, v.unsqueeze(2)).transpose(1, 2), basis).squeeze(1)
        current = residuals[everyone, pivot]
        recompute = deciding & (current < near)
        if not bool(recompute.any()):
            return v, None
        stale = recompute & (current < near * exact[everyone, pivot])
        value = torch.where(recompute, (v * v).sum(dim=1), current)
        residuals[everyone, pivot] = value
        exact[everyone, pivot] = torch.where(recompute, value, exact[everyone, pivot])
        return v, stale

    def add_direction(v: torch.Tensor, adding: torch.Tensor) -> None:
        """Append the pivots' orthogonal components ``v`` to Q for sessions in ``adding`` and update residuals."""
        q = v / torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        q = torch.where(adding.unsqueeze(1), q, torch.zeros_like(q))
        basis[everyone, num_directions.clamp(max=width - 1)] += q
        num_directions.add_(adding.long())
        proj = torch.bmm(padded, q.unsqueeze(2)).squeeze(2)
        residuals.sub_(proj * proj).clamp_(min=0)

    indices = torch.full((sessions, width), -1, dtype=torch.long, device=device)
    num_protected = protected.sum(dim=1)
    positions = torch.arange(n_max, device=device).expand(sessions, n_max)
    protected_order = torch.where(protected, positions, n_max).sort(dim=1).values
    for t in range(int(num_protected.max())):
        has = t < num_protected
        pivot = torch.where(has, protected_order[:, t], 0)
        indices[has, t] = pivot[has]
        v, _ = settle(pivot, has)
        add_direction(v, has & (residuals[everyone, pivot] > eps))

    counts = num_protected.clone()
    tau_t = torch.as_tensor(tau, dtype=dtype, device=device)
    capacity_t = torch.as_tensor(capacity, device=device)
    while True:  # up to K_t picks a session, and another choice after each pick made for a lost residual
        coverage = 1 - residuals.sum(dim=1) / lengths
        scores = torch.where(candidates, residuals, -torch.inf)
        pivot = scores.argmax(dim=1)
        active = (counts < capacity_t) & (coverage < tau_t) & (scores[everyone, pivot] > eps)
        if not bool(active.any()):
            break
        v, stale = settle(pivot, active)
        if stale is not None:  # a pick made on a lost value is made again if another leads or it is dependent
            again = torch.where(candidates, residuals, -torch.inf).argmax(dim=1) != pivot
            active &= ~(stale & again) & (residuals[everyone, pivot] > eps)
        indices[everyone[active], counts[active]] = pivot[active]
        counts.add_(active.long())
        candidates[everyone[active], pivot[active]] = False
        add_direction(v, active)

    coverage = 1 - residuals.sum(dim=1) / lengths
    return PackedSelection(indices, counts, coverage, residuals[session_of_row, local_row])
