"""The forwarding guard (DESIGN.md §2.6): how much of a request one rewrite may remove."""

from __future__ import annotations

from collections.abc import Sequence


def guarded_removals(sizes: Sequence[int], removable: Sequence[int], total: int, delta: float) -> list[int]:
    """Blocks to drop: ``removable`` tried largest first (ties: earliest), each accepted only while the
    request keeps at least ``(1 - delta) * total`` of its serialised characters."""
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")
    floor = (1.0 - delta) * total
    kept = total
    dropped = []
    for block in sorted(removable, key=lambda b: (-sizes[b], b)):
        if kept - sizes[block] >= floor:
            kept -= sizes[block]
            dropped.append(block)
    return sorted(dropped)
