"""`RedisEmbeddingCache`: block embeddings shared by every replica through Redis, content-addressed, so a replica
never encodes a text another has encoded (DESIGN.md §5.1).

A text's key is a hash of the encoder's name and width and the text; its value the row as float32 (exact: a
replica that reads it selects what the one that encoded it would) or float16 (half the memory, rows within 1e-3),
kept ``ttl_s`` seconds. Lookups are one ``MGET`` per call; new rows are written behind, in pipelined batches off
the caller's thread, at most ``max_unwritten`` waiting (more are not shared). Redis's own ``maxmemory`` with a
``volatile-*`` eviction policy bounds the bytes: every key gemkernels writes has a TTL. A Redis that fails only
costs the sharing: the texts are encoded here.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
import redis

from gemkernels.compress.encoders.base import Encoder, WrappedEncoder, stored_name
from gemkernels.compress.redis_store import RedisConnection
from gemkernels.compress.sessions import StoreUnavailable

logger = logging.getLogger("gemkernels")

DTYPES = {"float32": np.float32, "float16": np.float16}


class RedisEmbeddingCache(WrappedEncoder):
    """``encoder`` behind a Redis cache shared by replicas (module doc)."""

    def __init__(self, encoder: Encoder, connection: RedisConnection, ttl_s: float = 7 * 86400,
                 dtype: str = "float32", max_unwritten: int = 65536, write_batch: int = 256):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        super().__init__(encoder)
        self.connection, self.ttl_s, self.dtype = connection, max(1, int(ttl_s)), DTYPES[dtype]
        self.max_unwritten, self.write_batch = max_unwritten, write_batch
        self.unwritten: deque[tuple[str, bytes]] = deque()
        self.cond = threading.Condition()
        self.writing = False
        self.closed = False
        self.hits = self.misses = 0
        self.writer = threading.Thread(target=self._write_loop, name="gem-embedding-writer", daemon=True)
        self.writer.start()

    @functools.cached_property
    def key_prefix(self) -> str:
        """What every text's key hashes before the text: the encoder's `stored_name` and width and the stored dtype
        (read once: a remote encoder's width is a probe)."""
        return f"{stored_name(self.encoder)}\x1f{self.encoder.dim}\x1f{np.dtype(self.dtype).name}\x1f"

    def key(self, text: str) -> str:
        digest = hashlib.sha256((self.key_prefix + text).encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{self.connection.prefix}e:{digest}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        keys = [self.key(text) for text in texts]
        found: list[bytes | None]
        try:
            found = self.connection.call(lambda: self.connection.client.mget(keys))
        except StoreUnavailable as err:
            logger.debug("gemkernels: shared embeddings unavailable, encoding here: %s", err)
            found = [None] * len(keys)
        width = self.dim * np.dtype(self.dtype).itemsize
        rows: list[np.ndarray | None] = [np.frombuffer(value, dtype=self.dtype)
                                         if value is not None and len(value) == width else None for value in found]
        missing = [i for i, row in enumerate(rows) if row is None]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            encoded = np.asarray(self.encoder.encode([texts[i] for i in missing]), dtype=np.float32)
            for i, row in zip(missing, encoded):
                rows[i] = row
            stored = encoded.astype(self.dtype, copy=False)
            self._write_behind([(keys[i], row.tobytes()) for i, row in zip(missing, stored)])
        return np.stack(rows).astype(np.float32, copy=False)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every row queued so far is written (or dropped); whether that happened within ``timeout``."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.unwritten and not self.writing, timeout)

    def close(self) -> None:
        """Write what is queued (a second at most), then stop the writer."""
        self.flush(1.0)
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.writer.join()

    def _write_behind(self, items: list[tuple[str, bytes]]) -> None:
        with self.cond:
            room = self.max_unwritten - len(self.unwritten)
            self.unwritten.extend(items[:max(0, room)])
            self.cond.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.unwritten or self.closed)
                if self.closed:
                    return
                batch = [self.unwritten.popleft() for _ in range(min(self.write_batch, len(self.unwritten)))]
                self.writing = True
            try:
                pipe = self.connection.client.pipeline(transaction=False)
                for key, value in batch:
                    pipe.set(key, value, ex=self.ttl_s)
                self.connection.call(pipe.execute)
            except (StoreUnavailable, redis.RedisError) as err:  # a refused write too (OOM, READONLY): these rows
                # are not shared; every replica still encodes what it lacks
                logger.debug("gemkernels: %d embeddings not shared: %s", len(batch), err)
            finally:
                with self.cond:
                    self.writing = False
                    self.cond.notify_all()
