"""Observe mode (``gem serve --observe``): every request goes out byte for byte, and each session records what
compression would have forwarded and what that would have cost under the provider's prompt cache.

Each call is priced twice, on two timelines (the history as sent; as compression would have forwarded it, its
removed blocks left out and a moved cache breakpoint added), exactly as `gem online` prices a policy's call: each
message counted as its JSON (`gemkernels.compress.tokens.serialise`) tokenised by `token_encoder` (o200k, or
bytes / 4 without ``bpe-openai``; the report names it), the cached tokens the common token prefix with the same
timeline's previous call (`gemkernels.compress.prompt_cache.call_cost`), at the preset's ``cached_price`` /
``uncached_price``.

Memory: a session keeps its totals and its last call's token ids (4 bytes a token, one array per distinct message,
shared by both timelines, plus about `ENTRY_BYTES` a message); a call tokenises only the messages its session's
last call did not have. At most ``max_sessions`` sessions are kept per process (the least recently used dropped
first) and at most ``max_bytes`` of token ids in all: past it the least recently used sessions' token ids go
(their totals stay; their next call is priced as a first call, nothing cached).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gemkernels.compress.prompt_cache import call_cost
from gemkernels.compress.tokens import Encode, Prices, serialise, token_encoder

#: What remembering one message costs besides its token ids, estimated: its digest, a dict slot, list slots.
ENTRY_BYTES = 160


@dataclass
class Timeline:
    """One way of sending a session: its last call's per-message token ids (None: none kept) and its totals."""

    last: list[array] | None = None
    tokens: int = 0
    cached: int = 0
    prefix_breaks: int = 0

    def send(self, current: list[array]) -> None:
        cost = call_cost(self.last, current)
        self.last = current
        self.tokens += cost.input
        self.cached += cost.cached
        self.prefix_breaks += cost.prefix_broken

    def totals(self) -> Timeline:
        """A copy of the totals alone (no last call)."""
        return Timeline(None, self.tokens, self.cached, self.prefix_breaks)

    def __add__(self, other: Timeline) -> Timeline:
        """The totals of both (no last call)."""
        return Timeline(None, self.tokens + other.tokens, self.cached + other.cached,
                        self.prefix_breaks + other.prefix_breaks)

    def price(self, prices: Prices) -> float:
        return prices.of(self.cached, self.tokens - self.cached)


@dataclass
class SessionLedger:
    """A session's calls, as sent and as compression would have sent them, and its last call's token ids by
    message digest (``known``, ``nbytes`` of them)."""

    calls: int = 0
    compressed_calls: int = 0
    sent: Timeline = field(default_factory=Timeline)
    compressed: Timeline = field(default_factory=Timeline)
    known: dict[bytes, array] = field(default_factory=dict)
    nbytes: int = 0

    def forget_tokens(self) -> None:
        """Drop the last call's token ids (the next call is priced as a first one)."""
        self.known, self.nbytes = {}, 0
        self.sent.last = self.compressed.last = None


def figures(calls: int, compressed_calls: int, sent: Timeline, compressed: Timeline,
            prices: Prices) -> dict[str, float | int]:
    """The report's figures of one session or of all."""
    price_sent, price_compressed = sent.price(prices), compressed.price(prices)
    return {"calls": calls, "compressed_calls": compressed_calls,
            "tokens_sent": sent.tokens, "tokens_if_compressed": compressed.tokens,
            "cached_tokens_sent": sent.cached, "cached_tokens_if_compressed": compressed.cached,
            "prefix_breaks_sent": sent.prefix_breaks, "prefix_breaks_if_compressed": compressed.prefix_breaks,
            "price_sent": price_sent, "price_if_compressed": price_compressed,
            "saved": round(1 - price_compressed / price_sent, 4) if price_sent else 0.0}


class MessageTokens:
    """Token ids of one call's messages: each message object counted once, a text the session's last call had
    (``known``, by digest) taken from it, any other tokenised; ``fresh`` (and ``nbytes``): what this call had."""

    def __init__(self, encode: Encode, known: dict[bytes, array]):
        self.encode, self.known = encode, known
        self.fresh: dict[bytes, array] = {}
        self.by_id: dict[int, array] = {}  # the caller holds the messages for the call: ids are not reused
        self.nbytes = 0

    def request(self, messages: Sequence[Any]) -> list[array]:
        return [self.message(message) for message in messages]

    def message(self, message: Any) -> array:
        ids = self.by_id.get(id(message))
        if ids is not None:
            return ids
        text = serialise(message)
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        ids = self.fresh.get(digest)
        if ids is None:
            ids = self.known.get(digest)
            if ids is None:
                ids = array("I", self.encode(text))
            self.fresh[digest] = ids
            self.nbytes += ids.itemsize * len(ids) + ENTRY_BYTES
        self.by_id[id(message)] = ids
        return ids


class Observer:
    """The ledgers of the observed sessions (module doc); thread-safe. ``encoder``: (name, tokenizer), default
    `token_encoder`."""

    def __init__(self, prices: Prices, max_sessions: int = 10_000, max_bytes: int = 1 << 30,
                 encoder: tuple[str, Encode] | None = None):
        self.prices, self.max_sessions, self.max_bytes = prices, max_sessions, max_bytes
        self.tokenizer, self.encode = encoder or token_encoder()
        self.ledgers: OrderedDict[tuple[str, str], SessionLedger] = OrderedDict()
        self.lock = threading.Lock()
        self.nbytes = 0  # the token ids the ledgers hold, estimated

    def record(self, tenant: str, session: str, sent: Sequence[Any], forwarded: Sequence[Any]) -> None:
        """One call: the history as the client sent it (parsed) and as compression would have forwarded it."""
        key = (tenant, session)
        with self.lock:
            ledger = self.ledgers.get(key)
            known = {} if ledger is None else ledger.known  # replaced, never changed: read outside the lock
        counted = MessageTokens(self.encode, known)
        sent_ids, forwarded_ids = counted.request(sent), counted.request(forwarded)
        with self.lock:
            ledger = self.ledgers.pop(key, None) or SessionLedger()
            self.ledgers[key] = ledger
            ledger.calls += 1
            ledger.compressed_calls += len(forwarded) < len(sent)
            ledger.sent.send(sent_ids)
            ledger.compressed.send(forwarded_ids)
            self.nbytes += counted.nbytes - ledger.nbytes
            ledger.known, ledger.nbytes = counted.fresh, counted.nbytes
            while len(self.ledgers) > self.max_sessions:
                self.nbytes -= self.ledgers.popitem(last=False)[1].nbytes
            for old in self.ledgers.values():  # least recently used first
                if self.nbytes <= self.max_bytes:
                    break
                self.nbytes -= old.nbytes
                old.forget_tokens()

    def report(self, tenant: str | None = None) -> dict[str, Any]:
        """The sessions of ``tenant`` (None: every tenant), named by a short hash, with their totals."""
        with self.lock:
            chosen = [(key, ledger.calls, ledger.compressed_calls, ledger.sent.totals(), ledger.compressed.totals())
                      for key, ledger in self.ledgers.items() if tenant is None or key[0] == tenant]
        sessions = [{"session": hashlib.sha256(f"{t}\x1f{s}".encode("utf-8", "surrogatepass")).hexdigest()[:12],
                     **figures(calls, compressed_calls, sent, compressed, self.prices)}
                    for (t, s), calls, compressed_calls, sent, compressed in chosen]
        totals: dict[str, float | int] = {}
        if chosen:
            _, calls, compressed_calls, sent, compressed = zip(*chosen)
            totals = figures(sum(calls), sum(compressed_calls), sum(sent, Timeline()), sum(compressed, Timeline()),
                             self.prices)
        return {"tokenizer": self.tokenizer, "prices": {"cached": self.prices.cached, "uncached": self.prices.uncached},
                "sessions": sessions, "totals": totals}


def report_table(report: dict[str, Any]) -> str:
    """An observe-mode report as a markdown table, one row per session and a total."""
    rows = [f"Tokens counted with {report['tokenizer']}; price: cached at {report['prices']['cached']:g}, uncached "
            f"at {report['prices']['uncached']:g} a token.", "",
            "| session | calls | compressed | tokens sent | if compressed | price sent | if compressed | saved |",
            "|---|---|---|---|---|---|---|---|"]
    for line in [*report["sessions"], {"session": "all", **report["totals"]}] if report["totals"] else []:
        rows.append(f"| {line['session']} | {line['calls']} | {line['compressed_calls']} | {line['tokens_sent']:,} | "
                    f"{line['tokens_if_compressed']:,} | {line['price_sent']:,.1f} | "
                    f"{line['price_if_compressed']:,.1f} | {line.get('saved', 0.0):.1%} |")
    return "\n".join(rows)
