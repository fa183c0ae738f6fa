"""Observe mode (``gem serve --observe``): every request goes out byte for byte, and each session records what
compression would have forwarded and what that would have cost under the provider's prompt cache.

Per call and timeline (what was sent, what compression would have sent) the cached tokens are those of the
leading messages identical to the previous call's in the same timeline (the provider caches prefixes), the rest
uncached, priced with the preset's ``cached_price`` / ``uncached_price``. Tokens are bytes / 4 of each message as
the client wrote it (an estimate: the same for both timelines). Sessions are kept per tenant, at most
``max_sessions``, the least recently used dropped first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gemkernels.compress.tokens import Prices


@dataclass
class Timeline:
    """One way of sending a session: the last call's messages (digests) and the totals so far."""

    last: tuple[bytes, ...] = ()
    tokens: int = 0
    cached: int = 0
    price: float = 0.0

    def send(self, digests: tuple[bytes, ...], tokens: Sequence[int], prices: Prices) -> None:
        shared = 0
        for before, now in zip(self.last, digests):
            if before != now:
                break
            shared += 1
        cached = sum(tokens[:shared])
        total = sum(tokens)
        self.last, self.tokens, self.cached = digests, self.tokens + total, self.cached + cached
        self.price += prices.of(cached, total - cached)


@dataclass
class SessionLedger:
    """A session's calls, as sent and as compression would have sent them."""

    calls: int = 0
    compressed_calls: int = 0
    sent: Timeline = field(default_factory=Timeline)
    compressed: Timeline = field(default_factory=Timeline)

    def summary(self) -> dict[str, float | int]:
        return {"calls": self.calls, "compressed_calls": self.compressed_calls,
                "tokens_sent": self.sent.tokens, "tokens_if_compressed": self.compressed.tokens,
                "cached_tokens_sent": self.sent.cached, "cached_tokens_if_compressed": self.compressed.cached,
                "price_sent": round(self.sent.price, 1), "price_if_compressed": round(self.compressed.price, 1),
                "saved": round(1 - self.compressed.price / self.sent.price, 4) if self.sent.price else 0.0}


class Observer:
    """The ledgers of the observed sessions (module doc); thread-safe."""

    def __init__(self, prices: Prices, max_sessions: int = 10_000):
        self.prices, self.max_sessions = prices, max_sessions
        self.ledgers: OrderedDict[tuple[str, str], SessionLedger] = OrderedDict()
        self.lock = threading.Lock()

    def record(self, tenant: str, session: str, elements: Sequence[bytes], kept: Sequence[bool]) -> None:
        """One call: the history's elements as the client wrote them, and which compression would have kept."""
        digests = tuple(hashlib.blake2b(element, digest_size=8).digest() for element in elements)
        tokens = [-(-len(element) // 4) for element in elements]
        with self.lock:
            ledger = self.ledgers.pop((tenant, session), None) or SessionLedger()
            self.ledgers[(tenant, session)] = ledger
            while len(self.ledgers) > self.max_sessions:
                self.ledgers.popitem(last=False)
            ledger.calls += 1
            ledger.compressed_calls += not all(kept)
            ledger.sent.send(digests, tokens, self.prices)
            ledger.compressed.send(tuple(d for d, keep in zip(digests, kept) if keep),
                                   [t for t, keep in zip(tokens, kept) if keep], self.prices)

    def report(self, tenant: str | None = None) -> dict[str, Any]:
        """The sessions of ``tenant`` (None: every tenant), named by a short hash, with their totals."""
        with self.lock:
            chosen = [(key, ledger.summary()) for key, ledger in self.ledgers.items()
                      if tenant is None or key[0] == tenant]
        sessions = [{"session": hashlib.sha256(f"{t}\x1f{s}".encode()).hexdigest()[:12], **summary}
                    for (t, s), summary in chosen]
        totals: dict[str, float] = {}
        for summary in sessions:
            for name in ("calls", "compressed_calls", "tokens_sent", "tokens_if_compressed", "price_sent",
                         "price_if_compressed"):
                totals[name] = totals.get(name, 0) + summary[name]
        if totals.get("price_sent"):
            totals["saved"] = round(1 - totals["price_if_compressed"] / totals["price_sent"], 4)
        return {"prices": {"cached": self.prices.cached, "uncached": self.prices.uncached}, "sessions": sessions,
                "totals": totals}


def report_table(report: dict[str, Any]) -> str:
    """An observe-mode report as a markdown table, one row per session and a total."""
    rows = ["| session | calls | compressed | tokens sent | if compressed | price sent | if compressed | saved |",
            "|---|---|---|---|---|---|---|---|"]
    for line in [*report["sessions"], {"session": "all", **report["totals"]}] if report["totals"] else []:
        rows.append(f"| {line['session']} | {line['calls']} | {line['compressed_calls']} | {line['tokens_sent']:,} | "
                    f"{line['tokens_if_compressed']:,} | {line['price_sent']:,.1f} | "
                    f"{line['price_if_compressed']:,.1f} | {line.get('saved', 0.0):.1%} |")
    return "\n".join(rows)
