"""Prompt-cache accounting of forwarded requests, call by call (DESIGN.md §4).

A call's cached tokens are the longest common token prefix with the previous request of the same policy,
computed over per-message token lists (whole identical messages, then the common token prefix of the first
differing message); everything after it is uncached. Totals are priced with `gemkernels.compress.tokens.Prices`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gemkernels.compress.tokens import Prices


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


@dataclass(frozen=True)
class Totals:
    """Summed costs of many calls (a run, a policy over runs)."""

    calls: int = 0
    input: int = 0
    cached: int = 0
    embedding: int = 0
    prefix_breaks: int = 0

    @classmethod
    def of(cls, costs: Iterable[CallCost]) -> Totals:
        costs = list(costs)
        return cls(len(costs), sum(c.input for c in costs), sum(c.cached for c in costs),
                   sum(c.embedding for c in costs), sum(c.prefix_broken for c in costs))

    def __add__(self, other: Totals) -> Totals:
        return Totals(self.calls + other.calls, self.input + other.input, self.cached + other.cached,
                      self.embedding + other.embedding, self.prefix_breaks + other.prefix_breaks)

    @property
    def uncached(self) -> int:
        return self.input - self.cached

    def price(self, prices: Prices = Prices()) -> float:
        """Price-weighted input tokens (embedding tokens are reported apart, not priced)."""
        return prices.of(self.cached, self.uncached)
