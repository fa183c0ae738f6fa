"""The prompt-cache cost of one request after the previous one of the same timeline (DESIGN.md §4): the one rule
`gem online` (`gemkernels.evaluate.costs`) and observe mode (`gemkernels.serve.observe`) both price calls with.

A call's cached tokens are the longest common token prefix with the previous request, computed over per-message
token lists (whole identical messages, then the common token prefix of the first differing message); everything
after it is uncached, and a first call is wholly uncached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def common_prefix(previous: Sequence[Sequence[int]], current: Sequence[Sequence[int]]) -> int:
    """Tokens shared at the start: whole identical messages, then the common prefix of the first differing pair."""
    shared = 0
    for before, now in zip(previous, current):
        if before is now or before == now:
            shared += len(now)
            continue
        for a, b in zip(before, now):
            if a != b:
                break
            shared += 1
        break
    return shared


@dataclass(frozen=True)
class CallCost:
    """One model call of one policy: input tokens, the cached part of them, embedding tokens it caused.

    ``prefix_broken``: the previous request of the policy is not wholly cached (a rewrite).
    """

    input: int
    cached: int
    embedding: int = 0
    prefix_broken: bool = False

    @property
    def uncached(self) -> int:
        return self.input - self.cached


def call_cost(previous: Sequence[Sequence[int]] | None, current: Sequence[Sequence[int]],
              embedding: int = 0) -> CallCost:
    """The cost of sending ``current`` right after ``previous`` (None: a first call, nothing cached)."""
    total = sum(len(m) for m in current)
    if previous is None:
        return CallCost(total, 0, embedding)
    cached = common_prefix(previous, current)
    return CallCost(total, cached, embedding, prefix_broken=cached < sum(len(m) for m in previous))
