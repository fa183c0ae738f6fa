"""The forwarding guard (DESIGN.md §2.6): how much of a request one rewrite may remove."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def guarded_removals(sizes: Sequence[int], removable: Sequence[int], total: int, delta: float) -> list[int]:
    """Blocks to drop: ``removable`` tried largest first (ties: earliest), each accepted only while the
    request keeps at least ``(1 - delta) * total`` of its serialised characters."""
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")
    candidates = np.asarray(removable, dtype=np.int64)
    all_sizes = np.asarray(sizes)
    if all_sizes.dtype.kind != "i" or not isinstance(total, int) or abs(total) >= 2**53:  # as defined, one at a time
        # (fractional sizes, sizes past int64: numpy made them uint64 or objects, totals a float floor cannot hold)
        return one_at_a_time(sizes, candidates.tolist(), total, delta)
    by_size = all_sizes.astype(np.int64)[candidates]
    if len(by_size) and (by_size.min() < 0 or int(by_size.max()) * len(by_size) >= 2**62):  # runs sum without overflow
        return one_at_a_time(sizes, candidates.tolist(), total, delta)
    order = np.lexsort((candidates, -by_size))  # largest first, ties earliest
    candidates, descending = candidates[order], by_size[order]
    ascending_negated = -descending
    reach = np.concatenate(([0], np.cumsum(descending)))  # reach[i]: the sizes of the candidates before i
    budget = total - math.ceil((1.0 - delta) * total)  # a block fits while kept - size >= that floor (integers)
    runs = []
    at = 0
    while True:  # the next candidate that fits (the sizes descend: those that fit are a suffix of the rest), then
        # the run after it that fits in turn (the candidates up to the last whose running sum is within the budget)
        at = max(at, int(np.searchsorted(ascending_negated, -budget, side="left")))
        if at >= len(descending):
            return np.sort(np.concatenate([candidates[:0], *runs])).tolist()
        end = int(np.searchsorted(reach, reach[at] + budget, side="right")) - 1
        runs.append(candidates[at:end])
        budget -= int(reach[end] - reach[at])
        at = end


def one_at_a_time(sizes: Sequence[float], removable: Sequence[int], total: float, delta: float) -> list[int]:
    """`guarded_removals` trying every candidate in turn (sizes that are not integers)."""
    kept, floor, dropped = total, (1.0 - delta) * total, []
    for block in sorted(removable, key=lambda b: (-sizes[b], b)):
        if kept - sizes[block] >= floor:
            kept -= sizes[block]
            dropped.append(block)
    return sorted(dropped)
