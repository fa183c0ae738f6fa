"""Encoders that remember: `CachedEncoder` (in memory, per process, bounded LRU) and `EmbeddingCache` (on disk,
across processes and runs, for replay)."""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gemkernels.compress.encoders.base import Encoder, WrappedEncoder, stored_name

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gemkernels" / "embeddings"


class CachedEncoder(WrappedEncoder):
    """Wraps an encoder with a bounded LRU cache keyed by the text's SHA-256: each block is encoded once."""

    def __init__(self, encoder: Encoder, max_entries: int = 100_000):
        super().__init__(encoder)
        self.max_entries = max_entries
        self.cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest() for text in texts]
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


class EmbeddingCache(WrappedEncoder):
    """An `Encoder` whose vectors persist as ``.npz`` shards under ``folder/<encoder name>/``, keyed by the
    SHA-256 of the text: every distinct text is encoded once, across processes and runs. New vectors are
    written a shard of ``shard_size`` at a time; `flush` writes the rest (call it when a unit of work ends)."""

    def __init__(self, encoder: Encoder, folder: str | os.PathLike[str], shard_size: int = 128):
        super().__init__(encoder)
        self.folder = Path(folder) / re.sub(r"[^\w.-]+", "_", stored_name(encoder))
        self.shard_size = shard_size
        self.vectors: dict[str, np.ndarray] = {}
        self.unsaved: list[str] = []
        for shard in sorted(self.folder.glob("*.npz")):
            with np.load(shard) as data:
                self.vectors.update(zip(data["keys"].tolist(), data["vectors"]))

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def fill(self, texts: Sequence[str], progress: bool = False) -> int:
        """Encode the distinct texts not cached yet, in batches of ``shard_size``; returns how many."""
        todo = list({self.key(t): t for t in texts if self.key(t) not in self.vectors}.items())
        batches = range(0, len(todo), self.shard_size)
        if progress and todo:
            from tqdm import tqdm

            batches = tqdm(batches, desc=f"encoding {len(todo)} texts ({self.name})", unit="batch")
        for start in batches:
            keys, chunk = zip(*todo[start:start + self.shard_size])
            self.vectors.update(zip(keys, np.asarray(self.encoder.encode(list(chunk)), dtype=np.float32)))
            self.unsaved.extend(keys)
            if len(self.unsaved) >= self.shard_size:
                self.flush()
        return len(todo)

    def flush(self) -> None:
        """Write the vectors not on disk yet as one shard (atomically: a reader never sees half a shard)."""
        if not self.unsaved:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".{uuid.uuid4().hex}.npz"
        np.savez(partial, keys=np.array(self.unsaved), vectors=np.stack([self.vectors[k] for k in self.unsaved]))
        os.replace(partial, self.folder / partial.name[1:])
        self.unsaved = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.fill(texts)
        return np.stack([self.vectors[self.key(t)] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
