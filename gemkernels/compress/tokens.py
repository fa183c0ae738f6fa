"""Tokens and prices (DESIGN.md §4): one serialisation of a message, one o200k tokenizer, one text cache, and
a provider's input prices.

A message is counted as ``json.dumps(message, ensure_ascii=False)`` tokenised with o200k (``bpe-openai``,
offline; `token_encoder` falls back to `byte_quads`, its UTF-8 bytes in fours, without it). `Prices` bills cached
and uncached input tokens relative to a plain one (default 0.1 and 1.0).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, TypeVar

Tokens = tuple[int, ...]
Encode = Callable[[str], Sequence[int]]
T = TypeVar("T")


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


#: bpe-openai refuses a text of more than about 200,000 tokens (and some long runs without a break); a longer
#: text is tokenised in pieces of at most this many characters, cut after whitespace where there is some.
PIECE_CHARS = 100_000


@cache
def o200k_encode() -> Encode:
    """The o200k_base ``encode_ordinary`` of ``bpe-openai`` (offline, built once), for texts of any length (long
    ones in pieces: the count may differ from one whole-text encoding by a token per cut); ImportError naming the
    extra."""
    try:
        import bpe_openai
    except ImportError as err:
        raise ImportError("token accounting needs pip install 'gemkernels[tokens]' (bpe-openai)") from err
    encode = bpe_openai.get_encoding("o200k_base").encode_ordinary

    def encode_any_length(text: str) -> Sequence[int]:
        if len(text) <= PIECE_CHARS:
            return encode(text)
        return [token for piece in pieces(text, PIECE_CHARS) for token in encode(piece)]

    return encode_any_length


def byte_quads(text: str) -> list[int]:
    """The stand-in tokenizer without ``bpe-openai``: the UTF-8 bytes of ``text`` in pieces of 4 (the last one
    shorter), each piece one token (its value), so a text counts ⌈bytes / 4⌉ and two texts share whole pieces."""
    data = text.encode("utf-8", "surrogatepass")
    return [int.from_bytes(data[at:at + 4], "little") for at in range(0, len(data), 4)]


def token_encoder() -> tuple[str, Encode]:
    """The tokenizer of token accounting and its name: ``("o200k", o200k_encode())`` with ``bpe-openai`` (the
    ``[tokens]`` extra), else ``("bytes/4", byte_quads)``."""
    try:
        return "o200k", o200k_encode()
    except ImportError:
        return "bytes/4", byte_quads


def pieces(text: str, size: int) -> list[str]:
    """``text`` cut into consecutive pieces of at most ``size`` characters, each ending after whitespace when its
    last half has some."""
    out, at = [], 0
    while len(text) - at > size:
        cut = max(text.rfind(" ", at + size // 2, at + size), text.rfind("\n", at + size // 2, at + size))
        cut = at + size if cut < 0 else cut + 1
        out.append(text[at:cut])
        at = cut
    return out + [text[at:]]


def serialise(message: Any) -> str:
    """The text a message is counted as: its JSON, unescaped."""
    return json.dumps(message, ensure_ascii=False)


class TextCache(Generic[T]):
    """``fn(text)`` computed once per distinct text; at most ``max_texts`` remembered, least recently used out
    first (None: every text, for a cache that lives as long as one run). Safe to share between threads (a
    server's workers): ``fn`` runs outside the lock, so two threads may compute the same new text once each."""

    def __init__(self, fn: Callable[[str], T], max_texts: int | None = None):
        self.fn, self.max_texts = fn, max_texts
        self._values: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __call__(self, text: str) -> T:
        with self._lock:
            if text in self._values:
                self.hits += 1
                if self.max_texts is not None:
                    self._values.move_to_end(text)
                return self._values[text]
            self.misses += 1
        value = self.fn(text)
        with self._lock:
            self._values[text] = value
            if self.max_texts is not None and len(self._values) > self.max_texts:
                self._values.popitem(last=False)
        return value


class TokenCache:
    """Token ids of texts and messages; each distinct text is tokenised once (a `TextCache`).

    Messages are also remembered by identity (a reference is kept, so an id is never reused
    while cached): a message object seen before is neither serialised nor tokenised again, so a
    message must not be mutated once counted. One cache per run keeps memory bounded by the run.
    """

    def __init__(self, encode: Encode | None = None):
        self.encode = encode or o200k_encode()
        self.text: TextCache[Tokens] = TextCache(lambda text: tuple(self.encode(text)))
        self._messages: dict[int, tuple[Any, Tokens]] = {}

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
