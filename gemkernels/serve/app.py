"""``gem serve``: an OpenAI- and Anthropic-compatible proxy that compresses chat histories with GEM.

Agents point their base URL at the proxy; each ``POST /v1/chat/completions`` or ``POST /v1/messages``
reaches ``--upstream`` with its ``messages`` compressed and everything else as sent (the client's bytes with the
removed blocks' elements cut out, nothing re-serialised: `gemkernels.serve.body`): other body
fields, query string and headers (``Authorization`` included, never logged; hop-by-hop headers and
``X-GEM-Session`` are dropped). A request whose messages GEM leaves as they are, or whose body is not
a JSON object with a ``messages`` list, is forwarded byte for byte. Responses, server-sent events
included, are relayed chunk by chunk with the upstream's status, headers and body.

Contracts (DESIGN.md §5):
- nothing is lost: any failure inside compression, or a full compression queue, forwards the
  original body; an upstream that cannot be reached answers 502, one that times out before
  answering 504 (both ``{"error": {"type", "message"}}``); a stream the upstream drops mid-way is
  cut off for the client too (the connection closes without the final chunk);
- session identity: the ``X-GEM-Session`` header, else the body's ``user``, else
  ``metadata.user_id``, else GEM's prefix hash; requests of one session are compressed one at a time;
- selection and block encoding of concurrent requests run batched (`gemkernels.serve.batching`, in `gemkernels.serve.compressor`);
- bounded: at most ``max_pending`` compressions queued or running, GEM's session store bounded;
  a body past ``max_body_bytes`` gets a 413, one with no byte for ``body_timeout`` seconds a 408 (both with
  ``Connection: close``); under ``gem serve``, headers not complete ``--header-timeout`` seconds after a
  connection opened or a new request began close it, and so does ``--keep-alive-timeout`` idle
  (`gemkernels.serve.connections`);
  shutdown (uvicorn's graceful shutdown) drains in-flight requests before the batchers stop;
- with ``--set backend=triton`` on a GPU, or ``--set backend=numba``, the selection kernels are compiled at
  start-up, not on the first requests (`gemkernels.select.api.warm_up`).

Also ``POST /v1/gem/compress`` (``{"messages", "session_id"?, "goal"?}`` -> ``{"messages", "stats"}``,
400 for a malformed body), ``GET /healthz`` (the process answers), ``GET /readyz`` (the encoder is loaded and
the upstream answers) and ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gemkernels.compress.blocks import json_object
from gemkernels.compress.gem import PASSTHROUGH
from gemkernels.compress.sessions import request_session
from gemkernels.serve.body import element_sizes, forwarded_body, parse_body
from gemkernels.serve.compressor import Compressor, warm_up_kernels
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.metrics import Metrics

logger = logging.getLogger("gemkernels.serve")

SESSION_HEADER = "x-gem-session"
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length"})
#: Header names (lower-case bytes) not forwarded: hop-by-hop ones both ways, the proxy's own session header upstream.
NOT_FORWARDED = HOP_BY_HOP | {SESSION_HEADER.encode()}
NOT_RELAYED = HOP_BY_HOP - {b"content-length"}


#: Request headers that carry a credential, in the order the tenant is read from.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")


def tenant_of(headers: Mapping[str, str]) -> str:
    """Whose sessions a request reaches: a hash of its credential (``Authorization``, else ``x-api-key``, else
    ``api-key``), so that a client can neither overwrite nor probe another's sessions; ``anonymous`` without one."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return hashlib.sha256(value.encode("latin-1")).hexdigest()[:24]
    return "anonymous"


async def read_body(request: Request, limit: int, timeout: float) -> bytes | Response:
    """The request body, or the error to answer instead: 413 once it passes ``limit`` bytes (declared or streamed:
    never more is held), 408 when ``timeout`` seconds pass without a byte of it (a stalled upload)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return too_large(limit)
    chunks, size = [], 0
    stream = request.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            return body_unread(408, "request_timeout", f"no byte of the request body came for {timeout:g} s "
                               "(gem serve --body-timeout)")
        size += len(chunk)
        if size > limit:
            return too_large(limit)
        chunks.append(chunk)


def body_unread(status: int, kind: str, message: str) -> Response:
    """An error answered before the body was read in full; the connection closes, since the rest is never read."""
    response = error_response(status, kind, message)
    response.headers["connection"] = "close"
    return response


def too_large(limit: int) -> Response:
    """413 for a body past ``limit``."""
    return body_unread(413, "request_too_large", f"the request body is larger than {limit} bytes "
                       "(gem serve --max-body-mb raises the limit)")


def session_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The session a request belongs to (`gemkernels.compress.sessions.request_session`: Claude Code's and Codex's
    session headers, ``X-GEM-Session`` first, then the body, each per agent), else None (prefix hash)."""
    return request_session(body, headers)


def upstream_url(base: str, path: str) -> str:
    """``base`` + ``path``, without doubling ``/v1`` when ``base`` already ends with it."""
    base = base.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


class AsciiJSONResponse(JSONResponse):
    """The proxy's own JSON answers, ASCII-escaped: a client's lone surrogate (``"\\ud800"``) echoed back stays
    valid JSON instead of failing to encode as UTF-8."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    return AsciiJSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


#: How long ``/readyz`` waits for the upstream to answer.
READY_TIMEOUT_S = 3.0
#: Headers httpx adds to every request by default; the upstream must see only what the client sent.
HTTPX_DEFAULT_HEADERS = ("accept", "accept-encoding", "user-agent")
#: Upstream clients (connection pools) the requests are spread over, each to the one with the fewest requests
#: awaiting an answer (a light load stays on the first pool's warm connections). httpcore 1.0's pool scans all of
#: its connections for each idle one whenever a request starts or ends (O(n^2) in the connections), which made
#: forwarding alone collapse past ~100 requests in flight; k pools cut that work k^2-fold (bench/RESULTS.md §i).
UPSTREAM_POOLS = 32


def create_app(config: ServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The ASGI app; ``transport`` replaces the network (tests)."""
    metrics = Metrics()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        verify = httpx.create_ssl_context()  # one CA bundle load (~30 ms) for all the clients
        clients = [httpx.AsyncClient(timeout=timeout, transport=transport, limits=limits, verify=verify)
                   for _ in range(1 if transport is not None else UPSTREAM_POOLS)]
        for client in clients:
            for name in HTTPX_DEFAULT_HEADERS:
                del client.headers[name]
        state["client"], state["clients"], state["awaiting"] = clients[0], clients, [0] * len(clients)
        state["compressor"] = Compressor(config, metrics)
        await asyncio.get_running_loop().run_in_executor(None, warm_up_kernels, state["compressor"])
        try:
            yield
        finally:
            for client in clients:
                await client.aclose()
            await asyncio.get_running_loop().run_in_executor(None, state["compressor"].close)

    async def proxy(request: Request) -> Response:
        route = request.url.path
        raw = await read_body(request, config.max_body_bytes, config.body_timeout)
        if isinstance(raw, Response):
            metrics.requests.labels(route, "refused" if raw.status_code == 413 else "body_timeout").inc()
            return raw
        body, layout = parse_body(raw, "messages") or (json_object(raw), None)  # one parse lays the body out
        content = raw
        if body is None or not isinstance(body.get("messages"), list):
            reason = "malformed_body" if body is None else "no_messages"
            metrics.requests.labels(route, PASSTHROUGH).inc()
            metrics.passthroughs.labels(reason).inc()
        else:
            messages = body["messages"]
            sizes = None if layout is None else element_sizes(layout)  # the layout parse_body gave these messages
            result = await state["compressor"].compress(route, messages, session_of(request.headers, body),
                                                        message_sizes=sizes, tenant=tenant_of(request.headers))
            if result is not None and len(result.messages) != len(messages):
                cut = None if sizes is None else forwarded_body(raw, layout, messages, result.messages)
                if cut is None:  # the bytes do not line up with the parsed messages: send what the client sent
                    logger.warning("gemkernels: could not cut the removed blocks out of the body; forwarding it "
                                   "unchanged")
                    metrics.passthroughs.labels("body_layout").inc()
                else:
                    content = cut
        return await forward(request, content)

    async def forward(request: Request, content: bytes) -> Response:
        awaiting: list[int] = state["awaiting"]
        pool = awaiting.index(min(awaiting))
        client: httpx.AsyncClient = state["clients"][pool]
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in NOT_FORWARDED]  # bytes as sent
        upstream = client.build_request(request.method, upstream_url(config.upstream, request.url.path),
                                        params=request.query_params, headers=headers, content=content)
        awaiting[pool] += 1
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
        finally:
            awaiting[pool] -= 1
        if response.status_code >= 500:
            metrics.upstream_errors.labels(f"status_{response.status_code}").inc()
        relayed = StreamingResponse(relay(response), status_code=response.status_code,
                                    background=BackgroundTask(response.aclose))
        relayed.raw_headers = [(k, v) for k, v in response.headers.raw  # bytes as sent, repeated headers kept
                               if k.lower() not in NOT_RELAYED]
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
        if not config.compress_endpoint:
            return error_response(404, "not_found", "POST /v1/gem/compress is switched off on this proxy")
        if config.compress_token is not None and not hmac.compare_digest(
                request.headers.get("x-gem-token", "").encode("latin-1"), config.compress_token.encode()):
            return error_response(401, "unauthorized", "POST /v1/gem/compress needs this proxy's X-GEM-Token")
        raw = await read_body(request, config.max_body_bytes, config.body_timeout)
        if isinstance(raw, Response):
            return raw
        body = json_object(raw)
        if body is None or not isinstance(body.get("messages"), list):
            return error_response(400, "invalid_request", "the body must be a JSON object with a 'messages' list")
        goal, session = body.get("goal"), body.get("session_id")
        if not isinstance(session, str):
            session = session_of(request.headers, body)
        result = await state["compressor"].compress(request.url.path, body["messages"], session,
                                                    goal if isinstance(goal, str) else None,
                                                    tenant=tenant_of(request.headers), wait_for_encoding=True)
        if result is None:
            return AsciiJSONResponse({"messages": body["messages"], "stats": None})
        return AsciiJSONResponse({"messages": result.messages, "stats": result.stats.to_dict()})

    async def healthz(request: Request) -> Response:
        return AsciiJSONResponse({"status": "ok", "upstream": config.upstream, "preset": config.preset,
                             "overrides": list(config.overrides), "encoder": config.encoder})

    async def readyz(request: Request) -> Response:
        """Ready when the encoder is loaded and the upstream answers at all (any HTTP status): 200, else 503."""
        compressor = state.get("compressor")
        try:
            await state["client"].head(config.upstream, timeout=READY_TIMEOUT_S)
            upstream = "reachable"
        except httpx.HTTPError as err:
            upstream = f"unreachable ({type(err).__name__})"
        ready = compressor is not None and upstream == "reachable"
        return AsciiJSONResponse({"status": "ready" if ready else "not ready", "upstream": upstream,
                                  "encoder": compressor.encoder.name if compressor is not None else None},
                                 status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[
        Route("/v1/chat/completions", proxy, methods=["POST"]),
        Route("/v1/messages", proxy, methods=["POST"]),
        Route("/v1/gem/compress", compress_only, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ], lifespan=lifespan)
    app.state.metrics = metrics
    return app


