"""`HashEncoder`: feature hashing of words and word pairs; deterministic, dependency-free (tests, laptops)."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

import numpy as np

from gemkernels.compress.encoders.base import normalise_rows


class HashEncoder:
    """Feature hashing of word unigrams and bigrams into ``dim`` signed buckets: deterministic, no dependencies."""

    _words = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[^\sA-Za-z0-9_]")

    def __init__(self, dim: int = 256):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.name = f"hash-{dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for row, text in enumerate(texts):
            words = self._words.findall(text.lower())
            features = words + list(map(" ".join, zip(words, words[1:])))
            if features:
                digests = np.fromiter(map(feature_digest, features), dtype=np.uint64, count=len(features))
                signs = np.where(digests >> np.uint64(63), 1.0, -1.0)
                out[row] = np.bincount((digests % np.uint64(self.dim)).astype(np.intp), weights=signs,
                                       minlength=self.dim)
            if not out[row].any():
                out[row, 0] = 1.0
        return normalise_rows(out)


@functools.lru_cache(maxsize=1 << 16)
def feature_digest(feature: str) -> int:
    """A word's or word pair's 64-bit hash (the same in every process; a history repeats its words, so cached)."""
    return int.from_bytes(hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
