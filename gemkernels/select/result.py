"""Selection results: one session's `Selection`, and a whole batch packed as `RaggedSelection`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gemkernels.select.arrays import to_numpy

#: Why a session's completion stopped: it filled K_t = max(k, |P|), it reached tau, or no
#: eligible candidate with residual above eps was left.
STOP_CAPACITY, STOP_COVERAGE, STOP_EXHAUSTED = "capacity", "coverage", "exhausted"


@dataclass(frozen=True)
class Selection:
    """One session's answer.

    indices: int64 row indices, protected rows ascending then completion order.
    coverage: E(B), the mean over all n rows of the energy captured by the selected span.
    residuals: final ``r_i = 1 - ||Q^T x_i||^2`` for every row (length n).
    """

    indices: Any
    coverage: float
    residuals: Any
    num_protected: int
    stop: str


@dataclass(frozen=True)
class RaggedSelection:
    """A batch's answers, packed: row ``s`` of ``indices`` holds ``counts[s]`` indices, then -1."""

    indices: Any
    counts: Any
    coverage: Any
    residuals: Any
    offsets: np.ndarray
    num_protected: np.ndarray
    capacity: np.ndarray
    tau: np.ndarray

    def sessions(self) -> list[Selection]:
        """Split into one `Selection` per session (indices and residuals stay in the batch's library)."""
        counts = to_numpy(self.counts).tolist()
        coverage = to_numpy(self.coverage).astype(float).tolist()
        return [Selection(indices=self.indices[s, :count], coverage=cov,
                          residuals=self.residuals[int(self.offsets[s]):int(self.offsets[s + 1])],
                          num_protected=int(self.num_protected[s]),
                          stop=stop_reason(count, int(self.capacity[s]), cov, float(self.tau[s])))
                for s, (count, cov) in enumerate(zip(counts, coverage))]


def stop_reason(count: int, capacity: int, coverage: float, tau: float) -> str:
    """Why a completion stopped: it filled K_t, it reached tau, or no candidate was left."""
    if count >= capacity:
        return STOP_CAPACITY
    if coverage >= tau:
        return STOP_COVERAGE
    return STOP_EXHAUSTED
