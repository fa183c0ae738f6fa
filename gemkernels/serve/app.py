"""``gem serve``: an OpenAI- and Anthropic-compatible proxy that compresses agents' histories with GEM.

Agents point their base URL at the proxy. ``POST /v1/chat/completions`` and ``POST /v1/responses`` go to the
OpenAI-format upstream (``upstream``), ``POST /v1/messages`` to the Anthropic-format one (``anthropic_upstream``,
default the same), each with its history (``messages``, or the Responses ``input``) compressed and everything else
as the client sent it (its bytes with the removed blocks' elements cut out, nothing re-serialised:
`gemkernels.serve.body`). ``POST /v1/messages/count_tokens`` and every other method and path (``GET /v1/models``,
...) are relayed to the upstream of their format, streaming both ways (`gemkernels.serve.serving`); so is a
WebSocket upgrade on any path (Codex's ``/v1/responses``), message by message and uncompressed
(`gemkernels.serve.websocket_relay`).

Contracts (DESIGN.md §5):
- nothing is lost: any failure inside compression, or a full compression queue, forwards the original body; an
  upstream that cannot be reached answers 502, one that times out before answering 504 (both
  ``{"error": {"type", "message"}}``); a stream the upstream drops mid-way is cut off for the client too;
- sessions: per credential (tenant) and per agent (`gemkernels.compress.sessions.request_session`); requests of
  one session are compressed one at a time;
- selections of concurrent requests run batched, block encoding is fair between requests, and a request waits
  for its blocks' encoding and analysis ``encode_budget`` at most (`gemkernels.serve.compressor`); with
  ``compress_process`` they run in that many processes of their own, so that compression never holds the event
  loop's GIL, each session in one of them (`gemkernels.serve.compression_process`);
- bounded: at most ``max_pending`` compressions queued or running, GEM's session store bounded; a body past
  ``max_body_bytes`` gets a 413, one with no byte for ``body_timeout`` seconds a 408 (both with
  ``Connection: close``); under ``gem serve``, headers not complete ``--header-timeout`` seconds after a connection
  opened or a new request began close it, and so does ``--keep-alive-timeout`` idle
  (`gemkernels.serve.connections`); shutdown (uvicorn's graceful shutdown) drains in-flight requests first;
- before serving, the selection kernels are compiled (``--set backend=triton`` on a GPU, ``--set backend=numba``:
  `gemkernels.select.api.warm_up`) and GEM compresses a made-up history once, as a dry run, so that what a first
  compression loads does not fall on a request (`gemkernels.serve.compressor.warm_up_gem`).

Also ``POST /v1/gem/compress``, ``GET /v1/gem/sessions`` (observe mode, ``--observe``), ``GET /healthz`` (the
process answers), ``GET /readyz`` (the encoder is loaded and the upstreams answer) and ``GET /metrics``
(Prometheus text).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gemkernels.compress.tokens import Prices
from gemkernels.serve.compression_process import ProcessCompressor, ShardedCompressor
from gemkernels.serve.compressor import Compressor
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.formats import FORMATS
from gemkernels.serve.metrics import Metrics
from gemkernels.serve.observe import Observer, report_table
from gemkernels.serve.serving import Proxy
from gemkernels.serve.upstreams import Upstreams

logger = logging.getLogger("gemkernels.serve")

#: Every method the relay answers.
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(config: ServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The ASGI app; ``transport`` replaces the network (tests)."""
    metrics = Metrics()
    proxies: list[Proxy] = []  # the one Proxy, built when the app starts

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        upstreams = Upstreams(config.upstream_roots(), config.timeout, transport)
        kind = {0: Compressor, 1: ProcessCompressor}.get(config.compress_process, ShardedCompressor)
        compressor = kind(config, metrics)
        await compressor.start()
        logger.info("gem serve: compressing with %s, encoder %s, in %s",
                    " ".join((config.preset, *(f"--set {item}" for item in config.overrides))),
                    compressor.encoder_name, compression_place(config.compress_process))
        observer = None
        if config.observe:
            cfg = compressor.gem_config
            observer = Observer(Prices(cfg.cached_price, cfg.uncached_price), config.max_sessions,
                                config.max_session_bytes)
        proxies.append(Proxy(config, metrics, upstreams, compressor, observer))
        try:
            yield
        finally:
            proxies.clear()
            if observer is not None and config.report:
                print(report_table(observer.report()), flush=True)
            await upstreams.aclose()
            await compressor.aclose()

    def route(path: str, work: Callable[[Proxy, Request], Awaitable[Response]], methods: list[str]) -> Route:
        async def endpoint(request: Request) -> Response:
            return await work(proxies[0], request)

        return Route(path, endpoint, methods=methods)

    async def websocket(client: WebSocket) -> None:
        await proxies[0].websocket(client)

    app = Starlette(routes=[
        *[route(api.path, functools.partial(Proxy.compressing, api=api), ["POST"]) for api in FORMATS],
        route("/v1/messages/count_tokens", Proxy.count_tokens, ["POST"]),
        route("/v1/gem/compress", Proxy.compress_only, ["POST"]),
        route("/v1/gem/sessions", Proxy.sessions, ["GET"]),
        route("/healthz", Proxy.healthz, ["GET"]),
        route("/readyz", Proxy.readyz, ["GET"]),
        route("/metrics", Proxy.metrics_text, ["GET"]),
        route("/{path:path}", Proxy.relay, ALL_METHODS),
        WebSocketRoute("/{path:path}", websocket),
    ], lifespan=lifespan)
    app.state.metrics = metrics
    return app


def compression_place(processes: int) -> str:
    """Where the proxy compresses, as its start-up line says it."""
    if processes == 0:
        return "the proxy's own process (--compress-process 0)"
    return f"{processes} process{'es' * (processes > 1)} of its own (--compress-process {processes})"
