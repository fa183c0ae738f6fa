"""`EncodingQueue`: the proxy's block encoder, fair between requests and bounded in time (DESIGN.md §5).

Compression threads call ``encode(texts)``. Texts already encoded come from a bounded in-memory cache at once; the
others are encoded by one runner thread in chunks, round robin over the waiting calls, so a call of three new texts
waits for about one chunk, not behind every text of a 3,000-block request that came first. A chunk holds as many
texts as the runner encodes in about ``chunk_seconds`` (measured as it goes, at most ``max_batch``), so a chunk is
large on a GPU and small for MiniLM on a CPU. Concurrent calls for the same text share one encoding.

A call made under `EncodingQueue.deadline` that is not answered by then raises `EncodingDeferred`: its texts go on
encoding into the cache, and the session's next request finds them there.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait

import numpy as np

from gemkernels.compress.encoders import Encoder, EncodingDeferred, WrappedEncoder

#: Called after every encoder call with ("encode", texts in the chunk, seconds the call ran).
EncodeObserver = Callable[[str, int, float], None]
#: Bytes a cached row costs besides its floats (the key and the dictionary entry), for the cache's byte bound.
ROW_OVERHEAD = 200


class EncodingQueue(WrappedEncoder):
    """An `Encoder` shared by threads: cached rows at once, the rest encoded fairly by one thread (module doc);
    ``max_queue`` texts may wait at most (past it a call raises `EncodingDeferred` and queues nothing), the cache
    holds up to ``cache_bytes``."""

    def __init__(self, encoder: Encoder, max_batch: int = 64, chunk_seconds: float = 0.05, max_queue: int = 65536,
                 cache_bytes: int = 128 << 20, observer: EncodeObserver | None = None):
        if max_batch < 1 or chunk_seconds <= 0 or max_queue < 1 or cache_bytes < 0:
            raise ValueError("max_batch and max_queue must be >= 1, chunk_seconds > 0 and cache_bytes >= 0")
        super().__init__(encoder)
        self.max_batch, self.chunk_seconds, self.max_queue = max_batch, chunk_seconds, max_queue
        self.cache_bytes, self.observer = cache_bytes, observer
        self.cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.cached_bytes = 0
        self.inflight: dict[bytes, Future[np.ndarray]] = {}
        self.jobs: deque[deque[tuple[bytes, str]]] = deque()  # one per call, its texts not taken yet
        self.queued = 0
        self.seconds_per_text: float | None = None
        self.local = threading.local()
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="gem-encode", daemon=True)
        self.thread.start()

    @contextlib.contextmanager
    def deadline(self, when: float | None) -> Iterator[None]:
        """Calls from this thread inside the block wait until ``when`` (`time.monotonic`) at most; None: no limit."""
        before = getattr(self.local, "deadline", None)
        self.local.deadline = when
        try:
            yield
        finally:
            self.local.deadline = before

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest() for text in texts]
        rows: dict[bytes, np.ndarray] = {}
        waiting: dict[bytes, Future[np.ndarray]] = {}
        with self.cond:
            if self.closed:
                raise RuntimeError("the encoding queue is closed")
            todo: dict[bytes, str] = {}
            for key, text in zip(keys, texts):
                row = self.cache.get(key)
                if row is not None:
                    self.cache.move_to_end(key)
                    rows[key] = row
                elif key in self.inflight:
                    waiting[key] = self.inflight[key]
                else:
                    todo.setdefault(key, text)
            if todo:
                if self.queued + len(todo) > self.max_queue:
                    raise EncodingDeferred(f"the encoding queue is full ({self.queued} texts waiting)")
                for key in todo:
                    waiting[key] = self.inflight[key] = Future()
                self.jobs.append(deque(todo.items()))
                self.queued += len(todo)
                self.cond.notify()
        if waiting:
            when = getattr(self.local, "deadline", None)
            timeout = None if when is None else max(0.0, when - time.monotonic())
            done, late = wait(waiting.values(), timeout=timeout)
            if late:
                raise EncodingDeferred(f"{len(late)} of {len(keys)} texts still encoding at the deadline")
            rows.update((key, future.result()) for key, future in waiting.items())
        return np.stack([rows[key] for key in keys]) if keys else np.zeros((0, self.dim), np.float32)

    def close(self) -> None:
        """Stop the runner; texts still queued are not encoded (their callers, if any, get an error)."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify()
        self.thread.join()
        with self.cond:
            futures, self.inflight = list(self.inflight.values()), {}
        for future in futures:
            future.set_exception(RuntimeError("the encoding queue closed"))

    def chunk_size(self) -> int:
        """Texts per encoder call: about ``chunk_seconds`` of work at the measured rate, 1 to ``max_batch``."""
        if self.seconds_per_text is None:
            return 1
        return max(1, min(self.max_batch, int(self.chunk_seconds / max(self.seconds_per_text, 1e-9))))

    def _take(self) -> list[tuple[bytes, str]]:
        """The next chunk: one text from each waiting call in turn (caller holds ``cond``)."""
        chunk: list[tuple[bytes, str]] = []
        size = self.chunk_size()
        while self.jobs and len(chunk) < size:
            job = self.jobs.popleft()
            chunk.append(job.popleft())
            if job:
                self.jobs.append(job)
        self.queued -= len(chunk)
        return chunk

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.jobs and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                chunk = self._take()
            self._run(chunk)

    def _run(self, chunk: list[tuple[bytes, str]]) -> None:
        started = time.perf_counter()
        try:
            rows = np.asarray(self.encoder.encode([text for _, text in chunk]), dtype=np.float32)
            if rows.shape != (len(chunk), self.dim):
                raise ValueError(f"encoder {self.name} returned shape {rows.shape} for {len(chunk)} texts")
        except BaseException as err:  # every waiter must wake up
            if len(chunk) > 1 and isinstance(err, Exception):  # a text the encoder rejects fails its own call only
                for item in chunk:
                    self._run([item])
                return
            with self.cond:
                futures = [self.inflight.pop(key) for key, _ in chunk]
            for future in futures:
                future.set_exception(err)
            return
        seconds = time.perf_counter() - started
        per_text = seconds / len(chunk)
        self.seconds_per_text = per_text if self.seconds_per_text is None else (
            0.7 * self.seconds_per_text + 0.3 * per_text)
        with self.cond:
            futures = [self.inflight.pop(key) for key, _ in chunk]
            for (key, _), row in zip(chunk, rows):
                self._remember(key, row.copy())  # a row of its own: the cache's byte bound counts what it holds
        for future, row in zip(futures, rows):
            future.set_result(row)
        if self.observer is not None:
            self.observer("encode", len(chunk), seconds)

    def _remember(self, key: bytes, row: np.ndarray) -> None:
        """Cache ``row``, evicting the least recently used past ``cache_bytes`` (caller holds ``cond``)."""
        self.cache[key] = row
        self.cached_bytes += row.nbytes + ROW_OVERHEAD
        while self.cached_bytes > self.cache_bytes and self.cache:
            _, old = self.cache.popitem(last=False)
            self.cached_bytes -= old.nbytes + ROW_OVERHEAD
