"""``gem serve``: an OpenAI- and Anthropic-compatible proxy that compresses chat histories with GEM.

Agents point their base URL at the proxy; each ``POST /v1/chat/completions`` or ``POST /v1/messages``
reaches ``--upstream`` with its ``messages`` compressed and everything else as sent: other body
fields, query string and headers (``Authorization`` included, never logged; hop-by-hop headers and
``X-GEM-Session`` are dropped). A request whose messages GEM leaves as they are, or whose body is not
a JSON object with a ``messages`` list, is forwarded byte for byte. Responses, server-sent events
included, are relayed chunk by chunk with the upstream's status, headers and body.

Contracts (issue 6):
- nothing is lost: any failure inside compression, or a full compression queue, forwards the
  original body; an upstream that cannot be reached answers 502, one that times out before
  answering 504 (both ``{"error": {"type", "message"}}``); a stream the upstream drops mid-way is
  cut off for the client too (the connection closes without the final chunk);
- session identity: the ``X-GEM-Session`` header, else the body's ``user``, else
  ``metadata.user_id``, else GEM's prefix hash; requests of one session are compressed one at a time;
- selection and block encoding of concurrent requests run batched (`gemkernels.batching`);
- bounded: at most ``max_pending`` compressions queued or running, GEM's session store bounded;
  shutdown (uvicorn's graceful shutdown) drains in-flight requests before the batchers stop;
- with ``--set backend=triton`` on a GPU, or ``--set backend=numba``, the selection kernels are compiled at
  start-up, not on the first requests (`gemkernels.select.api.warm_up`).

Also ``POST /v1/gem/compress`` (``{"messages", "session_id"?, "goal"?}`` -> ``{"messages", "stats"}``,
400 for a malformed body), ``GET /healthz`` and ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gemkernels.compress.blocks import json_object
from gemkernels.compress.config import with_overrides
from gemkernels.compress.encoders import make_encoder
from gemkernels.compress.gem import GEM, PASSTHROUGH, Compressed
from gemkernels.compress.sessions import SessionStore, request_session
from gemkernels.select.api import warm_up
from gemkernels.serve.batching import BatchingEncoder, SelectionBatcher

logger = logging.getLogger("gemkernels.server")

SESSION_HEADER = "x-gem-session"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
LOCK_STRIPES = 64
LATENCY_BUCKETS = (.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1)


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``gem serve`` needs; ``upstream`` is the API root (``http://host:port`` or ``.../v1``);
    ``overrides`` are ``field=value`` items applied to the preset (`config.with_overrides`)."""

    upstream: str
    preset: str = "paper"
    overrides: tuple[str, ...] = ()
    encoder: str = "minilm"
    max_wait: float = 0.002
    max_batch: int = 64
    workers: int = 8
    max_pending: int = 1024
    max_sessions: int = 10_000
    timeout: float = 600.0


class Metrics:
    """The proxy's Prometheus metrics, in their own registry (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gem_requests", "Requests by route and GEM action", ["route", "action"], registry=r)
        self.passthroughs = Counter("gem_passthroughs", "Requests forwarded unchanged by reason", ["reason"],
                                    registry=r)
        self.chars = Counter("gem_chars", "Serialised message characters", ["stage"], registry=r)
        self.tokens = Counter("gem_tokens", "o200k message tokens (when counted)", ["stage"], registry=r)
        self.upstream_errors = Counter("gem_upstream_errors", "Upstream failures by kind", ["kind"], registry=r)
        self.stage_seconds = Histogram("gem_stage_seconds", "GEM stage latency (encode, select, total)", ["stage"],
                                       registry=r, buckets=LATENCY_BUCKETS + (2, 5))
        self.batch_size = Histogram("gem_batch_size", "Requests per batched call", ["kind"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.batch_seconds = Histogram("gem_batch_seconds", "Seconds per batched call", ["kind"], registry=r,
                                       buckets=LATENCY_BUCKETS)
        self.sessions = Gauge("gem_sessions", "Sessions held in GEM's store", registry=r)
        self.pending = Gauge("gem_pending_compressions", "Compressions queued or running", registry=r)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        self.batch_size.labels(kind).observe(size)
        self.batch_seconds.labels(kind).observe(seconds)

    def observe_compression(self, route: str, result: Compressed) -> None:
        stats = result.stats
        self.requests.labels(route, stats.action).inc()
        if stats.action == PASSTHROUGH:
            self.passthroughs.labels(passthrough_reason(stats.reason)).inc()
        if stats.chars_before:
            self.chars.labels("before").inc(stats.chars_before)
            self.chars.labels("after").inc(stats.chars_after)
        if stats.tokens_before is not None and stats.tokens_after is not None:
            self.tokens.labels("before").inc(stats.tokens_before)
            self.tokens.labels("after").inc(stats.tokens_after)
        for stage, seconds in stats.seconds.items():
            self.stage_seconds.labels(stage).observe(seconds)


def passthrough_reason(reason: str) -> str:
    """A GEM passthrough reason as a low-cardinality label."""
    if reason.startswith("invalid structure"):
        return "invalid_structure"
    if reason.startswith("QueueFullError"):
        return "queue_full"
    return "compression_error"


def make_gem(config: ServerConfig, selector: SelectionBatcher, encoder: BatchingEncoder) -> GEM:
    """GEM over the batching encoder, with the batched selection when GEM accepts a ``select_fn``."""
    return GEM(with_overrides(config.preset, config.overrides), encoder=encoder,
               store=SessionStore(max_sessions=config.max_sessions),
               select_fn=selector.select)


class Compressor:
    """Runs `GEM.compress` in a worker pool, at most ``max_pending`` at a time, one per session at a time.

    ``compress`` returns None when the request must go out unchanged for a reason outside GEM
    (queue full, unexpected error); GEM's own passthroughs come back as its `Compressed`."""

    def __init__(self, config: ServerConfig, metrics: Metrics):
        self.metrics, self.max_pending, self.workers = metrics, config.max_pending, config.workers
        self.pending = 0
        self.selector = SelectionBatcher(config.max_batch, config.max_wait, config.max_pending,
                                         metrics.observe_batch, self.running)
        self.encoder = BatchingEncoder(make_encoder(config.encoder), config.max_batch, config.max_wait,
                                       config.max_pending, metrics.observe_batch, self.running)
        self.gem = make_gem(config, self.selector, self.encoder)
        metrics.sessions.set_function(lambda: len(self.gem.store))
        self.executor = ThreadPoolExecutor(config.workers, thread_name_prefix="gem-compress")
        self.locks = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def running(self) -> int:
        """Compressions that could be inside GEM now (the batchers wait for no more than this)."""
        return max(1, min(self.pending, self.workers))

    async def compress(self, route: str, messages: Any, session_id: str | None,
                       goal: str | None = None) -> Compressed | None:
        if self.pending >= self.max_pending:
            self.metrics.requests.labels(route, PASSTHROUGH).inc()
            self.metrics.passthroughs.labels("queue_full").inc()
            return None
        self.pending += 1
        self.metrics.pending.inc()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._compress, messages, session_id, goal)
        except Exception:
            logger.exception("gemkernels: compression crashed; forwarding the original request")
            self.metrics.requests.labels(route, PASSTHROUGH).inc()
            self.metrics.passthroughs.labels("internal_error").inc()
            return None
        finally:
            self.pending -= 1
            self.metrics.pending.dec()
        self.metrics.observe_compression(route, result)
        return result

    def _compress(self, messages: Any, session_id: str | None, goal: str | None) -> Compressed:
        key = session_id if session_id is not None else json.dumps(messages[:2], default=str, sort_keys=True)
        stripe = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little") % LOCK_STRIPES
        with self.locks[stripe]:
            return self.gem.compress(messages, session_id=session_id, goal=goal)

    def close(self) -> None:
        """Finish queued compressions, then stop the batchers."""
        self.executor.shutdown(wait=True)
        self.selector.close()
        self.encoder.close()


def session_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """``X-GEM-Session``, else the body's ``user``, else ``metadata.user_id``, else None (prefix hash)."""
    return headers.get(SESSION_HEADER) or request_session(body)


def upstream_url(base: str, path: str) -> str:
    """``base`` + ``path``, without doubling ``/v1`` when ``base`` already ends with it."""
    base = base.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


def warm_up_kernels(compressor: Compressor) -> None:
    """Compile the selection backend's kernels before the first request (`gemkernels.select.api.warm_up`: triton on
    a GPU, numba); logged, and a failure is logged and left to the requests, which then go out uncompressed."""
    cfg = compressor.gem.config
    start = time.perf_counter()
    try:
        shapes = warm_up(cfg.backend, compressor.encoder.dim, None if cfg.keep_recent_size else cfg.k)
    except Exception:
        logger.exception("could not compile the %s selection kernels ahead of the first request", cfg.backend)
        return
    if shapes:
        logger.info("compiled the %s selection kernels for sessions of up to %d rows in %.1f s", cfg.backend,
                    shapes[-1][0], time.perf_counter() - start)


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def create_app(config: ServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The ASGI app; ``transport`` replaces the network (tests)."""
    metrics = Metrics()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
        state["client"] = httpx.AsyncClient(timeout=timeout, transport=transport,
                                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        state["compressor"] = Compressor(config, metrics)
        await asyncio.get_running_loop().run_in_executor(None, warm_up_kernels, state["compressor"])
        try:
            yield
        finally:
            await state["client"].aclose()
            await asyncio.get_running_loop().run_in_executor(None, state["compressor"].close)

    async def proxy(request: Request) -> Response:
        route = request.url.path
        raw = await request.body()
        body = json_object(raw)
        content = raw
        if body is None or not isinstance(body.get("messages"), list):
            reason = "malformed_body" if body is None else "no_messages"
            metrics.requests.labels(route, PASSTHROUGH).inc()
            metrics.passthroughs.labels(reason).inc()
        else:
            messages = body["messages"]
            result = await state["compressor"].compress(route, messages, session_of(request.headers, body))
            if result is not None and len(result.messages) != len(messages):
                content = json.dumps({**body, "messages": result.messages}, ensure_ascii=False).encode()
        return await forward(request, content)

    async def forward(request: Request, content: bytes) -> Response:
        client: httpx.AsyncClient = state["client"]
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP and k != SESSION_HEADER]
        upstream = client.build_request(request.method, upstream_url(config.upstream, request.url.path),
                                        params=request.query_params, headers=headers, content=content)
        try:
            response = await client.send(upstream, stream=True)
        except httpx.TimeoutException as err:
            metrics.upstream_errors.labels("timeout").inc()
            return error_response(504, "upstream_timeout",
                                  f"the upstream did not answer in time ({type(err).__name__})")
        except httpx.HTTPError as err:
            metrics.upstream_errors.labels("unreachable").inc()
            return error_response(502, "upstream_unreachable",
                                  f"the upstream could not be reached ({type(err).__name__})")
        if response.status_code >= 500:
            metrics.upstream_errors.labels(f"status_{response.status_code}").inc()
        relayed = StreamingResponse(relay(response), status_code=response.status_code,
                                    background=BackgroundTask(response.aclose))
        relayed.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.multi_items()
                               if k not in HOP_BY_HOP - {"content-length"}]  # repeated headers kept as sent
        return relayed

    async def relay(response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            metrics.upstream_errors.labels("stream_dropped").inc()
            logger.warning("gemkernels: the upstream dropped a response mid-stream; closing the client's too")
            raise

    async def compress_only(request: Request) -> Response:
        body = json_object(await request.body())
        if body is None or not isinstance(body.get("messages"), list):
            return error_response(400, "invalid_request", "the body must be a JSON object with a 'messages' list")
        goal, session = body.get("goal"), body.get("session_id")
        if not isinstance(session, str):
            session = session_of(request.headers, body)
        result = await state["compressor"].compress(request.url.path, body["messages"], session,
                                                    goal if isinstance(goal, str) else None)
        if result is None:
            return JSONResponse({"messages": body["messages"], "stats": None})
        return JSONResponse({"messages": result.messages, "stats": result.stats.to_dict()})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "upstream": config.upstream, "preset": config.preset,
                             "overrides": list(config.overrides), "encoder": config.encoder})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[
        Route("/v1/chat/completions", proxy, methods=["POST"]),
        Route("/v1/messages", proxy, methods=["POST"]),
        Route("/v1/gem/compress", compress_only, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ], lifespan=lifespan)
    app.state.metrics = metrics
    return app


