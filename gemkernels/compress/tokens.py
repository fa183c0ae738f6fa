"""Input-token and prompt-cache accounting for forwarded requests (small pure pieces).

A request is a list of messages; each message is serialised as ``json.dumps(message,
ensure_ascii=False)`` (as `GEM`'s own token counts are) and tokenised with o200k
(``bpe-openai``, offline). The prompt-cache model: a call's cached tokens are the longest
common token prefix with the previous request of the same policy, computed over
per-message token lists (whole identical messages, then the common token prefix of the
first differing message); everything after it is uncached. The price-weighted total bills
cached and uncached tokens at a provider's `Prices` (default 0.1 and 1.0 of a plain input token).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

Tokens = tuple[int, ...]
Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Prices:
    """A provider's input prices relative to a plain input token: ``cached`` (read from the prompt cache) and
    ``uncached`` (sent fresh; 1.25 where writing the cache costs extra, as Anthropic's 5-minute cache does)."""

    cached: float = 0.1
    uncached: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.cached <= self.uncached or self.uncached <= 0:
            raise ValueError(f"prices must satisfy 0 <= cached <= uncached and uncached > 0, got cached "
                             f"{self.cached}, uncached {self.uncached}")

    def of(self, cached: int, uncached: int) -> float:
        """Price-weighted input tokens."""
        return cached * self.cached + uncached * self.uncached


@cache
def o200k_encode() -> Encode:
    """The o200k_base ``encode_ordinary`` of ``bpe-openai`` (offline, built once); ImportError naming the extra."""
    try:
        import bpe_openai
    except ImportError as err:
        raise ImportError("token accounting needs pip install 'gemkernels[tokens]' (bpe-openai)") from err
    return bpe_openai.get_encoding("o200k_base").encode_ordinary


def serialise(message: Any) -> str:
    """The text a message is counted as: its JSON, unescaped."""
    return json.dumps(message, ensure_ascii=False)


class TokenCache:
    """Token ids of texts and messages; each distinct text is tokenised once.

    Messages are also remembered by identity (a reference is kept, so an id is never reused
    while cached): a message object seen before is neither serialised nor tokenised again, so a
    message must not be mutated once counted. One cache per run keeps memory bounded by the run.
    """

    def __init__(self, encode: Encode | None = None):
        self.encode = encode or o200k_encode()
        self._texts: dict[str, Tokens] = {}
        self._messages: dict[int, tuple[Any, Tokens]] = {}

    def text(self, text: str) -> Tokens:
        """Token ids of ``text``."""
        tokens = self._texts.get(text)
        if tokens is None:
            tokens = self._texts[text] = tuple(self.encode(text))
        return tokens

    def message(self, message: Any) -> Tokens:
        """Token ids of one message's serialisation."""
        seen = self._messages.get(id(message))
        if seen is not None and seen[0] is message:
            return seen[1]
        tokens = self.text(serialise(message))
        self._messages[id(message)] = (message, tokens)
        return tokens

    def request(self, messages: Iterable[Any]) -> list[Tokens]:
        """Per-message token ids of a request."""
        return [self.message(m) for m in messages]


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
