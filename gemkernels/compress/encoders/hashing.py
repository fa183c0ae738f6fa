"""`HashEncoder`: feature hashing of words and word pairs; deterministic, dependency-free (tests, laptops)."""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows

#: What each byte of a text's lowercased UTF-8 is: ASCII whitespace and control bytes separate words, each ASCII
#: punctuation byte but ``_`` is a word of its own, every other byte (letters, digits, ``_``, non-ASCII) is part
#: of a word.
SEPARATOR, WORD, MARK = 0, 1, 2
BYTE_KINDS = np.full(256, WORD, dtype=np.int8)
BYTE_KINDS[:33] = BYTE_KINDS[127] = SEPARATOR
BYTE_KINDS[[ord(c) for c in string.punctuation if c != "_"]] = MARK
#: A word's digest is ``fmix64(sum(byte_i * BASE**i))`` over its bytes, a word pair's
#: ``fmix64(first * PAIR_MULTIPLIER + second)`` over its words' sums (all modulo 2^64; fmix64 is MurmurHash3's
#: finaliser).
BASE, PAIR_MULTIPLIER = 0x100000001B3, np.uint64(0x9E3779B97F4A7C15)
FMIX1, FMIX2, SHIFT, HALF = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33), np.uint64(32)
_powers = (np.ones(1, np.uint64), np.ones(1, np.uint64))  # BASE**i and BASE**-i mod 2^64, grown when needed
#: The longest `_powers` kept (2 MB); a longer text (a goal is not cut to a block's length) makes its own.
MAX_KEPT_POWERS = 1 << 17


class HashEncoder:
    """Feature hashing of word unigrams and bigrams into ``dim`` signed buckets: deterministic, no dependencies.

    Every word and word pair (`text_digests`) lands in slot ``(digest >> 32) * 2 * dim >> 32``: it adds +1 to bucket
    ``slot // 2`` when the slot is odd, else -1; rows are normalised (a text with no word gets bucket 0)."""

    version = 2  # 1: a blake2b digest per word and word pair (until 2026-12-02); caches key on it (`stored_name`)

    def __init__(self, dim: int = 256):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.name = f"hash-{dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        slots = np.uint64(2 * self.dim)
        for row, text in enumerate(texts):
            digests = text_digests(text)
            if len(digests):
                counts = np.bincount(((digests >> HALF) * slots >> HALF).astype(np.intp), minlength=2 * self.dim)
                out[row] = counts[1::2] - counts[::2]
            if not out[row].any():
                out[row, 0] = 1.0
        return normalise_rows(out)


def text_digests(text: str) -> np.ndarray:
    """The uint64 digests of the words of ``text`` (its lowercased UTF-8 cut by `BYTE_KINDS`), then of each pair of
    neighbouring words; the same in every process."""
    data = np.frombuffer(text.lower().encode("utf-8", "surrogatepass"), dtype=np.uint8)
    kinds = BYTE_KINDS[data]
    inside = kinds != SEPARATOR
    mark = kinds == MARK
    in_word = kinds == WORD
    starts = inside.copy()
    starts[1:] &= mark[1:] | ~in_word[:-1]
    ends = inside.copy()
    ends[:-1] &= mark[:-1] | ~in_word[1:]
    first, last = np.flatnonzero(starts), np.flatnonzero(ends) + 1
    if not len(first):
        return np.zeros(0, np.uint64)
    powers, inverses = powers_of_base(len(data))
    sums = np.zeros(len(data) + 1, np.uint64)
    np.cumsum(data * powers[:len(data)], out=sums[1:])
    features = np.empty(2 * len(first) - 1, np.uint64)
    words = features[:len(first)]
    np.multiply(sums[last] - sums[first], inverses[first], out=words)
    np.multiply(words[:-1], PAIR_MULTIPLIER, out=features[len(first):])
    features[len(first):] += words[1:]
    return fmix64(features)


def powers_of_base(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``BASE**i`` and ``BASE**-i`` modulo 2^64 for i < n (at least), as uint64."""
    global _powers
    powers, inverses = _powers
    if len(powers) < n:
        size = max(n, 2 * len(powers), 4096)
        powers, inverses = np.empty(size, np.uint64), np.empty(size, np.uint64)
        powers[0] = inverses[0] = 1
        powers[1:] = BASE
        inverses[1:] = pow(BASE, -1, 1 << 64)
        np.cumprod(powers, out=powers)
        np.cumprod(inverses, out=inverses)
        if size <= MAX_KEPT_POWERS:
            _powers = powers, inverses
    return powers, inverses


def fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, element-wise, in place (uint64)."""
    values ^= values >> SHIFT
    values *= FMIX1
    values ^= values >> SHIFT
    values *= FMIX2
    values ^= values >> SHIFT
    return values
