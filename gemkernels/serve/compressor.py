"""`Compressor`: GEM behind the proxy, in a bounded worker pool, one compression per session at a time, with the
selections of concurrent requests batched, block encoding fair between requests, encoding and analysis bounded in
time (what a request left undone finished after it, for its session's next request), and the selection kernels
compiled before serving."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gemkernels.compress.config import GEMConfig, with_overrides
from gemkernels.compress.encoders import Encoder, make_encoder
from gemkernels.compress.gem import DEFERRED, GEM, PASSTHROUGH, Compressed
from gemkernels.compress.sessions import SessionLocks, SessionStore, StateStore
from gemkernels.select.api import warm_up
from gemkernels.serve.batching import SelectionBatcher
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.embedding_queue import EncodingQueue
from gemkernels.serve.metrics import Metrics

logger = logging.getLogger("gemkernels.serve")


def make_gem(config: ServerConfig, selector: SelectionBatcher, encoder: EncodingQueue,
             store: StateStore | None = None) -> GEM:
    """GEM over the shared encoding queue, with the batched selection (default store: this process's)."""
    if store is None:
        store = SessionStore(max_sessions=config.max_sessions, max_bytes=config.max_session_bytes)
    return GEM(with_overrides(config.preset, config.overrides), encoder=encoder, store=store,
               select_fn=selector.select)


#: Deferred requests' histories held for the preparing thread at most (each holds its request's messages).
PREPARE_QUEUE = 8
#: How long Redis keeps a shared embedding at least (a session's TTL when that is longer): a week.
EMBEDDING_TTL_S = 7 * 86400.0


def shared_state(config: ServerConfig, encoder: Encoder, count_round_trips: Callable[[int], None]
                 ) -> tuple[StateStore, Encoder, Callable[[], None]]:
    """For a ``redis://`` store: the Redis session store, ``encoder`` behind the shared embedding cache (their round
    trips told to ``count_round_trips``), and what closes both (`gemkernels.compress.redis_store`)."""
    from gemkernels.compress.encoders.redis_cache import RedisEmbeddingCache
    from gemkernels.compress.redis_store import RedisConnection, RedisSessionStore

    connection = RedisConnection(config.store, count_round_trips=count_round_trips)
    store = RedisSessionStore(connection, ttl_s=config.store_ttl, local_max_sessions=config.max_sessions,
                              local_max_bytes=config.max_session_bytes)
    shared = RedisEmbeddingCache(encoder, connection, ttl_s=max(config.store_ttl, EMBEDDING_TTL_S),
                                 dtype=config.embedding_dtype)

    def close() -> None:
        shared.close()
        connection.close()

    return store, shared, close


class Compressor:
    """Runs `GEM.compress` in a worker pool, at most ``max_pending`` at a time, one per session at a time.

    ``compress`` returns None when the request must go out unchanged for a reason outside GEM
    (queue full, unexpected error); GEM's own passthroughs come back as its `Compressed`. A request waits for its
    blocks' embeddings and analysis until ``encode_budget`` seconds after it reached ``compress`` at most, then goes
    out on the append path or unchanged (GEM's ``deadline``) while they finish encoding, and, while the compression
    threads have room, one thread analyses what it left (`GEM.prepare`), for its next call."""

    def __init__(self, config: ServerConfig, metrics: Metrics):
        self.metrics, self.max_pending, self.workers = metrics, config.max_pending, config.threads
        self.max_batch = config.max_batch
        self.encode_budget = config.encode_budget
        self.pending = 0
        self.selector = SelectionBatcher(config.max_batch, config.max_wait, config.max_pending,
                                         metrics.observe_batch, self.running)
        model = make_encoder(config.encoder, cached=False)
        store, self.close_store = None, None
        if config.store != "memory":
            store, model, self.close_store = shared_state(config, model, metrics.store_round_trips.inc)
        self.encoder = EncodingQueue(model, config.max_batch, cache_bytes=config.encode_cache_bytes,
                                     observer=metrics.observe_batch)
        self.gem = make_gem(config, self.selector, self.encoder, store)
        self.executor = ThreadPoolExecutor(config.threads, thread_name_prefix="gem-compress")
        self.preparer = ThreadPoolExecutor(1, thread_name_prefix="gem-prepare")
        self.preparing: set[tuple[str | None, str | None]] = set()  # sessions whose deferred work is queued
        self.locks = SessionLocks()

    @property
    def encoder_name(self) -> str:
        """The encoder's name, as ``/readyz`` reports it."""
        return self.encoder.name

    @property
    def gem_config(self) -> GEMConfig:
        """GEM's resolved config."""
        return self.gem.config

    async def start(self) -> None:
        """Before the first request, off the event loop: compile the selection kernels (`warm_up_kernels`) and load
        what GEM loads on first use (`warm_up_gem`)."""
        await asyncio.to_thread(warm_up_kernels, self)
        await asyncio.to_thread(warm_up_gem, self)

    def running(self) -> int:
        """Compressions that could be inside GEM now (the batchers wait for no more than this)."""
        return max(1, min(self.pending, self.workers))

    async def compress(self, route: str, messages: Any, session_id: str | None, goal: str | None = None,
                       message_sizes: Sequence[int] | None = None, tenant: str | None = None,
                       wait_for_encoding: bool = False, save: bool = True,
                       message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None = None,
                       started: float | None = None, thinking: str = "content") -> Compressed | None:
        """`GEM.compress` in the pool (``message_sizes``: each message's bytes in the body that will go out;
        ``tenant``: whose sessions these are; ``wait_for_encoding``: no encoding budget; ``save=False``: a dry run;
        ``message_bytes``: the body and each message's byte range in it, and ``thinking``, `GEM.compress`'s;
        ``started``: the ``time.monotonic()`` the encoding budget and the ``queued`` seconds count from, default now);
        None when the request must go out unchanged for a reason outside GEM."""
        started = time.monotonic() if started is None else started
        deadline = None if wait_for_encoding or self.encode_budget is None else started + self.encode_budget
        if self.pending >= self.max_pending:
            self.metrics.requests.labels(route, PASSTHROUGH).inc()
            self.metrics.passthroughs.labels("queue_full").inc()
            return None
        self.pending += 1
        self.metrics.pending.inc()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._compress, messages, session_id, goal, message_sizes, tenant, deadline, save,
                message_bytes, thinking, started)
        except Exception:
            logger.exception("gemkernels: compression crashed; forwarding the original request")
            self.metrics.requests.labels(route, PASSTHROUGH).inc()
            self.metrics.passthroughs.labels("internal_error").inc()
            return None
        finally:
            self.pending -= 1
            self.metrics.pending.dec()
            self.metrics.sessions.set(len(self.gem.store))  # the store changes only inside compressions
        self.metrics.observe_compression(route, result)
        if save and result.stats.reason.startswith(DEFERRED):
            self.prepare(messages, session_id or result.stats.session_id, tenant)
        return result

    def _compress(self, messages: Any, session_id: str | None, goal: str | None,
                  message_sizes: Sequence[int] | None, tenant: str | None, deadline: float | None,
                  save: bool, message_bytes: tuple[bytes, Sequence[tuple[int, int]]] | None,
                  thinking: str, started: float) -> Compressed:
        """`GEM.compress` in this thread, once the session's earlier request is done; its stats' ``queued`` seconds
        are those it waited for a thread and for that request (from ``started``, `time.monotonic`)."""
        with self.locks.of(messages, session_id, tenant), self.encoder.deadline(deadline):
            queued = time.monotonic() - started
            result = self.gem.compress(messages, session_id=session_id, goal=goal, message_sizes=message_sizes,
                                       tenant=tenant, save=save, message_bytes=message_bytes,
                                       thinking=thinking, deadline=deadline)
        result.stats.seconds["queued"] = queued
        return result

    def prepare(self, messages: Any, session_id: str | None, tenant: str | None) -> None:
        """Queue `GEM.prepare` of a deferred request's history on the preparing thread while the compression threads
        have room (past it, the load sheds: each request keeps what it analysed in its budget for the next one),
        unless its session's is queued already or `PREPARE_QUEUE` are."""
        session = (tenant, session_id)
        if self.pending >= self.workers or session in self.preparing or len(self.preparing) >= PREPARE_QUEUE:
            return
        try:
            future = self.preparer.submit(self._prepare, messages, session_id, tenant)
        except RuntimeError:  # shut down: the server is stopping
            return
        self.preparing.add(session)
        future.add_done_callback(lambda _: self.preparing.discard(session))

    def _prepare(self, messages: Any, session_id: str | None, tenant: str | None) -> int:
        """`GEM.prepare`, unless the compression threads have filled up since it was queued."""
        return 0 if self.pending >= self.workers else self.gem.prepare(messages, session_id, tenant)

    async def aclose(self) -> None:
        """`close`, off the event loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Finish queued compressions, drop queued preparations, then stop the batchers."""
        self.executor.shutdown(wait=True)
        self.preparer.shutdown(wait=True, cancel_futures=True)
        self.selector.close()
        self.encoder.close()
        if self.close_store is not None:
            self.close_store()


#: The most blocks of the warm-up's history, and the seconds it waits for their embeddings (`warm_up_gem`).
MAX_WARM_UP_BLOCKS, WARM_UP_ENCODING_S = 128, 5.0


def warm_up_gem(compressor: Compressor) -> None:
    """One dry run (``save=False``: no session kept) over `warm_up_history`, long enough for a first selection and
    past ``rewrite_above_blocks`` (a rewrite's ranking), so that what a first compression loads (modules imported
    lazily, numpy's masked arrays behind ``np.unique``, patterns compiled on first match, the router) does not fall on
    a request: in a fresh process it took a compression 46 ms against 11-17 after it (bench/RESULTS.md). It waits
    `WARM_UP_ENCODING_S` at most for its embeddings (a remote encoder's calls); one that does not run to the end is
    logged and left to the requests."""
    cfg = compressor.gem.config
    blocks = min(max(cfg.min_blocks, cfg.rewrite_above_blocks or 0) + 4, MAX_WARM_UP_BLOCKS)
    try:
        with compressor.encoder.deadline(time.monotonic() + WARM_UP_ENCODING_S):
            result = compressor.gem.compress(warm_up_history(blocks), save=False)
        stats = result.stats
        failed = stats.reason if stats.action == PASSTHROUGH or stats.reason.startswith(DEFERRED) else None
    except Exception as err:  # GEM forwards what it cannot compress; anything else is said here too
        failed = f"{type(err).__name__}: {err}"
    if failed is not None:
        logger.warning("gemkernels: the warm-up compression did not run to the end (%s); the first requests load "
                       "what it would have", failed)


def warm_up_history(blocks: int) -> list[dict[str, Any]]:
    """A made-up chat history of a system prompt, a task and ``blocks`` tool calls with their results (files read,
    one edited, a failing test), enough for a first selection of GEM's."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool."},
        {"role": "user", "content": "Fix the failing test in tests/test_warm_up.py."}]
    for b in range(blocks):
        command, output = f"cat src/warm_up/module_{b}.py", f"def value_{b}():\n    return {b}\n"
        if b % 8 == 3:
            command = f"sed -i 's/return {b}/return {b + 1}/' src/warm_up/module_{b}.py"
            output = ""
        elif b % 8 == 5:
            command = "python -m pytest tests/test_warm_up.py -q"
            output = ("Traceback (most recent call last):\n  File \"tests/test_warm_up.py\", line 3, in test_value\n"
                      f"AssertionError: assert {b} == {b + 1}\n1 failed in 0.02s")
        call = {"id": f"call_warm_up_{b}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        history += [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": output}]
    return history


def warm_up_kernels(compressor: Compressor) -> None:
    """Compile the selection backend's kernels before the first request (`gemkernels.select.api.warm_up`: triton on
    a GPU, numba); logged, and a failure is logged and left to the requests, which then go out uncompressed."""
    cfg = compressor.gem.config
    start = time.perf_counter()
    try:
        shapes = warm_up(cfg.backend, compressor.encoder.dim, None if cfg.keep_recent_size else cfg.k,
                         max_batch=compressor.max_batch)
    except Exception:
        logger.exception("could not compile the %s selection kernels ahead of the first request", cfg.backend)
        return
    if shapes:
        logger.info("compiled the %s selection kernels for sessions of up to %d rows in %.1f s", cfg.backend,
                    max(batch.rows for batch in shapes), time.perf_counter() - start)
