"""Prompt-cache accounting of forwarded requests, call by call (DESIGN.md §4): each call priced by
`gemkernels.compress.prompt_cache.call_cost` (the rule observe mode shares), summed into `Totals` and priced with
`gemkernels.compress.tokens.Prices`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gemkernels.compress.prompt_cache import CallCost, call_cost, common_prefix
from gemkernels.compress.tokens import Prices

__all__ = ["CallCost", "Totals", "call_cost", "common_prefix"]


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
