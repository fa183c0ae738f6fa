"""The order in which a ranked rewrite keeps blocks (`GEMConfig.ranking` ``router`` or ``retrieval``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gemkernels.compress.evidence import rank
from gemkernels.compress.router.features import LIVE_WINDOW


def router_order(scores: np.ndarray, tokens: Sequence[int], seeds: Sequence[int], eligible: np.ndarray | None,
                 size_power: float) -> list[int]:
    """The protected ``seeds`` ascending, then the other ``eligible`` blocks (None: all) by score divided by
    tokens ** ``size_power`` (the score per token when 1, the score alone when 0), highest first; ties: newer
    first."""
    n = len(tokens)
    protected = sorted(set(int(b) for b in seeds))
    candidates = np.setdiff1d(np.arange(n), protected)
    if eligible is not None:
        candidates = candidates[np.asarray(eligible, dtype=bool)[candidates]]
    density = np.asarray(scores, dtype=np.float64)[candidates] / np.maximum(
        np.asarray(tokens, dtype=np.float64)[candidates], 1.0) ** size_power
    return protected + [int(candidates[i]) for i in rank(density, candidates)]


def retrieval_scores(embeddings: np.ndarray, window: int = LIVE_WINDOW) -> np.ndarray:
    """Evidence retrieval (the PaMER idea): each block's largest cosine to the last ``window`` blocks, the
    current state (latest actions and observations)."""
    x = np.asarray(embeddings, dtype=np.float64)
    return (x @ x[-window:].T).max(axis=1)
