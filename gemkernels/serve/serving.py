"""`Proxy`: what each route of ``gem serve`` does (DESIGN.md §5); `gemkernels.serve.app` maps the routes to it.

- `Proxy.compressing` (``POST /v1/chat/completions``, ``/v1/messages``, ``/v1/responses``): reads the body
  (bounded in bytes and time; gzip, deflate or zstd decoded), compresses its history with GEM and forwards the
  client's bytes with the removed blocks' elements cut out; anything it cannot or need not compress goes out as
  the client sent it, with the reason in the metrics;
- `Proxy.count_tokens` (``POST /v1/messages/count_tokens``): relayed, or with ``count_compressed`` counted as the
  request would be forwarded (a dry run: the session is left as it was);
- `Proxy.relay` (every other method and path): streamed both ways, untouched, to the upstream of its format;
- `Proxy.websocket` (a WebSocket upgrade on any path): relayed message by message, unchanged, to the upstream of its
  path (`gemkernels.serve.websocket_relay`);
- the proxy's own routes: `Proxy.compress_only`, `Proxy.sessions` (observe mode), `Proxy.healthz`, `Proxy.readyz`,
  `Proxy.metrics_text`.

In observe mode (``--observe``) every request goes out as the client sent it; compression runs as usual and its
sessions carry on as if their requests had been compressed, and `gemkernels.serve.observe` records both.

Headers and the query string go out as sent (bytes), except hop-by-hop headers and ``X-GEM-Session`` (and
``Content-Encoding`` when the body goes out decoded). On the Messages API, a cache breakpoint of a removed message
moves to the nearest kept one before it (`gemkernels.serve.cache_marks`): that one message is re-serialised.
Responses, server-sent events included, are relayed chunk by chunk with the upstream's status and headers; an
unreachable upstream is a 502, a timeout before its answer a 504, a stream it drops mid-way is cut off for the
client too.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.exceptions import InvalidStatus, WebSocketException

from gemkernels.compress.blocks import json_object
from gemkernels.compress.gem import PASSTHROUGH, Compressed
from gemkernels.compress.sessions import GEM_SESSION_HEADER, request_session
from gemkernels.serve.body import ArrayLayout, cut_body, element_sizes, json_bytes, parse_body, removed_positions
from gemkernels.serve.cache_marks import moved_marks
from gemkernels.serve.compression_process import ProcessCompressor
from gemkernels.serve.compressor import Compressor
from gemkernels.serve.config import ServerConfig
from gemkernels.serve.content_coding import UndecodableBody, decoded
from gemkernels.serve.formats import ANTHROPIC_UPSTREAM, MESSAGES, OPENAI_UPSTREAM, ApiFormat, upstream_for
from gemkernels.serve.metrics import Metrics
from gemkernels.serve.observe import Observer
from gemkernels.serve.redact import redact_query
from gemkernels.serve.upstreams import Upstreams
from gemkernels.serve.websocket_relay import BAD_GATEWAY, client_headers, reason_text, refuse, relay, upstream_headers

logger = logging.getLogger("gemkernels.serve")

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length"})
#: Header names (lower-case bytes) not forwarded: hop-by-hop ones both ways, the proxy's own session header upstream.
NOT_FORWARDED = HOP_BY_HOP | {GEM_SESSION_HEADER.encode()}
NOT_FORWARDED_DECODED = NOT_FORWARDED | {b"content-encoding"}
#: A relayed body goes out as it comes, so its Content-Length goes with it (httpx sends an iterator chunked otherwise).
NOT_FORWARDED_STREAMED = NOT_FORWARDED - {b"content-length"}
#: Answer headers not relayed: hop-by-hop ones, and the upstream's Date and Server, since uvicorn writes its own
#: (two of each otherwise; nginx's convention too).
NOT_RELAYED = HOP_BY_HOP - {b"content-length"} | {b"date", b"server"}
#: A body up to this size, not content-coded, is parsed on the event loop (about 3 ms at most); a larger or coded one
#: in a thread, so that it does not hold up the other requests (a thread hop costs more than parsing a small body).
INLINE_PARSE_BYTES = 256 << 10
#: Request headers that carry a credential, in the order the tenant is read from.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")
#: How long ``/readyz`` waits for the upstream to answer.
READY_TIMEOUT_S = 3.0
#: The route label of relayed requests (one label for every path: paths are the client's to choose).
RELAYED = "relayed"
#: The route label and passthrough reason of relayed WebSockets.
WEBSOCKET = "websocket"
#: Upstream handshake answer headers not relayed to the client: an upgrade's answer has no body to frame.
NOT_RELAYED_HANDSHAKE = NOT_RELAYED | {b"content-length"}


def tenant_of(headers: Mapping[str, str]) -> str:
    """Whose sessions a request reaches: a hash of its credential (``Authorization``, else ``x-api-key``, else
    ``api-key``), so that a client can neither overwrite nor probe another's sessions; ``anonymous`` without one."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return hashlib.sha256(value.encode("latin-1")).hexdigest()[:24]
    return "anonymous"


def session_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The session a request belongs to (`gemkernels.compress.sessions.request_session`: Claude Code's and Codex's
    session headers, ``X-GEM-Session`` first, then the body, each per agent), else None (prefix hash)."""
    return request_session(body, headers)


def url_part(raw: bytes) -> str:
    """A path or query as the client sent it, each non-ASCII byte percent-encoded (httpx takes ASCII only; the
    upstream decodes the same bytes)."""
    return re.sub(rb"[\x80-\xff]", lambda match: b"%%%02X" % match[0][0], raw).decode("ascii")


class AsciiJSONResponse(JSONResponse):
    """The proxy's own JSON answers, ASCII-escaped: a client's lone surrogate (``"\\ud800"``) echoed back stays
    valid JSON instead of failing to encode as UTF-8."""

    def render(self, content: Any) -> bytes:
        return ascii_json(content)


def strict_utf8(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 without surrogates (a client's raw ``ED A0 80`` parses, but cannot be answered)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def ascii_json(content: Any) -> bytes:
    """``content`` as compact, ASCII-escaped JSON; ValueError for a number JSON cannot write (NaN, infinities)."""
    return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    return AsciiJSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def body_unread(status: int, kind: str, message: str) -> Response:
    """An error answered before the body was read in full; the connection closes, since the rest is never read."""
    response = error_response(status, kind, message)
    response.headers["connection"] = "close"
    return response


def too_large(limit: int) -> Response:
    """413 for a body past ``limit``."""
    return body_unread(413, "request_too_large", f"the request body is larger than {limit} bytes "
                       "(gem serve --max-body-mb raises the limit)")


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


def passed_headers(raw: Sequence[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """``raw`` in order, bytes as sent and repeated names kept, less the ``dropped`` names and those its Connection
    header lists (hop-by-hop by declaration, RFC 9110 §7.6.1)."""
    listed = {name.strip().lower() for key, value in raw if key.lower() == b"connection" for name in value.split(b",")}
    gone = dropped | listed if listed else dropped
    return [(key, value) for key, value in raw if key.lower() not in gone]


def read_json(raw: bytes, coding: str, key: str, limit: int
              ) -> tuple[bytes, dict[str, Any] | None, ArrayLayout | None]:
    """``raw`` decoded from ``coding`` (`UndecodableBody` when it cannot be), the JSON object it holds (None: not
    one) and the layout of its ``key`` array (`parse_body`: one parse lays the body out; None when it cannot)."""
    text = decoded(raw, coding, limit)
    body, layout = parse_body(text, key) or (json_object(text), None)
    return text, body, layout


async def read_request_json(request: Request, raw: bytes, key: str, limit: int
                            ) -> tuple[bytes, dict[str, Any] | None, ArrayLayout | None]:
    """`read_json` of a request's body, on the event loop when it is small and plain, else in a thread (a large
    body takes up to a second to read: other requests go on meanwhile)."""
    coding = request.headers.get("content-encoding", "")
    if len(raw) <= INLINE_PARSE_BYTES and not coding:
        return read_json(raw, coding, key, limit)
    return await asyncio.to_thread(read_json, raw, coding, key, limit)


class RelayedAnswer(Response):
    """An upstream's answer relayed to the client chunk by chunk as it arrives; ``close`` (the upstream response's)
    runs when the relay ends, and at once when the client goes away, so that a generation streamed to nobody stops.

    Starlette's ``StreamingResponse`` does the same with an anyio task group per answer: 75 against 22 us of CPU
    (a ``/tmp`` timing of both over one-chunk answers)."""

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], chunks: AsyncIterator[bytes],
                 close: Callable[[], Awaitable[None]]):
        self.status_code, self.raw_headers, self.chunks, self.close = status_code, raw_headers, chunks, close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = asyncio.ensure_future(self.relay(send))
        gone = asyncio.ensure_future(client_gone(receive))
        failed = None
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if relay.done() and not relay.cancelled():
                failed = relay.exception()
            gone.cancel()
            relay.cancel()
            try:
                await self.close()
            finally:
                await asyncio.gather(relay, gone, return_exceptions=True)  # both unwound, nothing left unretrieved
        if failed is not None:
            raise failed  # the upstream dropped its answer: the client's is cut off too

    async def relay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def client_gone(receive: Receive) -> None:
    """Returns once the client has gone (the request's body was read before the answer began)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class BodyStalled(Exception):
    """A streamed request body sent no byte for its timeout."""


async def stalls_after(stream: AsyncIterator[bytes], timeout: float) -> AsyncIterator[bytes]:
    """``stream``'s chunks; `BodyStalled` once ``timeout`` seconds pass without one."""
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise BodyStalled(f"no byte of the request body came for {timeout:g} s") from None
        yield chunk


class Proxy:
    """The routes' work over one set of upstreams and one `Compressor` (module doc)."""

    def __init__(self, config: ServerConfig, metrics: Metrics, upstreams: Upstreams,
                 compressor: Compressor | ProcessCompressor,
                 observer: Observer | None = None):
        self.config, self.metrics, self.upstreams, self.compressor = config, metrics, upstreams, compressor
        self.observer = observer  # observe mode: record what compression would do, forward everything as sent

    async def compressing(self, request: Request, api: ApiFormat) -> Response:
        """A request of a compressing route: its history compressed, everything else as sent."""
        raw = await read_body(request, self.config.max_body_bytes, self.config.body_timeout)
        if isinstance(raw, Response):
            self.metrics.requests.labels(api.path, "refused" if raw.status_code == 413 else "body_timeout").inc()
            return raw
        cut = await self.compressed_body(api, request, raw, save=True)
        return await self.forward(request, api.upstream, raw if cut is None else cut, decoded_body=cut is not None)

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: relayed; with ``count_compressed``, the request as it would be
        forwarded (a dry run of its compression); relayed in observe mode, where every request goes out as sent."""
        if not self.config.count_compressed or self.observer is not None:
            return await self.relay(request)
        raw = await read_body(request, self.config.max_body_bytes, self.config.body_timeout)
        if isinstance(raw, Response):
            return raw
        cut = await self.compressed_body(MESSAGES, request, raw, save=False)
        return await self.forward(request, ANTHROPIC_UPSTREAM, raw if cut is None else cut,
                                  decoded_body=cut is not None)

    async def compressed_body(self, api: ApiFormat, request: Request, raw: bytes, save: bool) -> bytes | None:
        """The body to forward, decoded, when compression removed something from ``raw``; else None (``raw`` goes
        out as sent: the reason is in the metrics)."""
        try:
            text, body, layout = await read_request_json(request, raw, api.history, self.config.max_body_bytes)
        except UndecodableBody as err:
            return self.unchanged(api, "undecodable_body", str(err))
        if body is None:
            return self.unchanged(api, "malformed_body")
        reason = api.unchanged_reason(body)
        if reason is not None:
            return self.unchanged(api, reason)
        if layout is None:  # JSON, but not UTF-8 (a BOM, UTF-16): no cut of it could go out, so GEM does not see it
            return self.unchanged(api, "body_layout")
        history = body[api.history]
        try:
            session = session_of(request.headers, body)
        except Exception:  # a bug of ours must not cost the client its request
            logger.exception("gemkernels: could not name this request's session; forwarding it unchanged")
            return self.unchanged(api, "internal_error")
        tenant = tenant_of(request.headers)
        written = (text, layout.elements)  # the next request resumes on these bytes
        result = await self.compressor.compress(api.path, history, session, message_sizes=element_sizes(layout),
                                                tenant=tenant, save=save, message_bytes=written,
                                                thinking=api.thinking_mode(body))
        try:
            return await self.cut(api, text, body, layout, result, tenant, session, save)
        except Exception:  # the compressor counted the request; the reason it went out as sent is counted here
            logger.exception("gemkernels: could not cut the compressed history out of the body; forwarding it "
                             "unchanged")
            self.metrics.passthroughs.labels("internal_error").inc()
            return None

    async def cut(self, api: ApiFormat, text: bytes, body: dict[str, Any], layout: ArrayLayout,
                  result: Compressed | None, tenant: str, session: str | None, save: bool) -> bytes | None:
        """`compressed_body`'s bytes from GEM's ``result`` for the body ``text`` (None: forward it as sent)."""
        history = body[api.history]
        removed = [] if result is None else removed_positions(history, result.messages)
        moved, replaced = {}, {}
        if api.upstream == ANTHROPIC_UPSTREAM and removed:  # a removed message's cache breakpoint moves to a kept one
            moved = moved_marks(body, history, removed)
            replaced = {p: data for p, message in moved.items() if (data := json_bytes(message)) is not None}
            moved = {p: moved[p] for p in replaced}  # one JSON cannot write again keeps its bytes, unmarked
        if self.observer is not None and save:  # what would have gone out: the history less ``removed``
            gone = set(removed or ())
            forwarded = [moved.get(p, m) for p, m in enumerate(history) if p not in gone]
            await asyncio.to_thread(self.observer.record, tenant,
                                    session or (result.stats.session_id if result else "") or "", history, forwarded)
            return None
        if result is None or len(result.messages) == len(history):
            return None
        cut = cut_body(text, layout, len(history), removed, replaced)
        if cut is None:  # the bytes do not line up with the parsed history: send what the client sent
            logger.warning("gemkernels: could not cut the removed blocks out of the body; forwarding it unchanged")
            self.metrics.passthroughs.labels("body_layout").inc()
        return cut

    def unchanged(self, api: ApiFormat, reason: str, detail: str | None = None) -> None:
        """Count a request that goes out as sent, before GEM saw it."""
        self.metrics.requests.labels(api.path, PASSTHROUGH).inc()
        self.metrics.passthroughs.labels(reason).inc()
        if detail is not None:
            logger.info("gemkernels: forwarding unchanged: %s", detail)

    async def relay(self, request: Request) -> Response:
        """Any other request: to the upstream of its format, its body streamed through untouched in the client's
        framing (a request without a body, a GET say, goes out without one)."""
        self.metrics.requests.labels(RELAYED, PASSTHROUGH).inc()
        kind = upstream_for(request.url.path, request.headers)
        framed = "content-length" in request.headers or "transfer-encoding" in request.headers
        body = stalls_after(request.stream(), self.config.body_timeout) if framed else b""
        return await self.forward(request, kind, body)

    async def websocket(self, client: WebSocket) -> None:
        """A WebSocket upgrade on any path: relayed unchanged to the upstream of its path, or the upstream's refusal
        relayed, or a close with 1014 when it cannot be reached (`gemkernels.serve.websocket_relay`)."""
        path, query = client.url.path, url_part(client.scope.get("query_string", b""))
        kind = upstream_for(path, client.headers)
        where = redact_query(path + (f"?{query}" if query else ""))  # for the log: no credential, no header
        try:
            upstream = await self.upstreams.websocket(
                kind, url_part(client.scope.get("raw_path") or path.encode()), query,
                upstream_headers(client.headers.raw, NOT_FORWARDED), client.scope.get("subprotocols", []),
                self.config.max_message_bytes)
        except InvalidStatus as err:  # it answered without upgrading: the client gets that answer
            self.metrics.websocket_connections.labels("refused").inc()
            logger.info("gemkernels: WebSocket %s: the %s upstream answered %d", where, kind, err.response.status_code)
            await refuse(client, err.response, NOT_RELAYED_HANDSHAKE)
            return
        except (OSError, asyncio.TimeoutError, WebSocketException) as err:
            self.metrics.websocket_connections.labels("unreachable").inc()
            self.metrics.upstream_errors.labels("unreachable").inc()
            logger.warning("gemkernels: WebSocket %s: the %s upstream could not be reached (%s)", where, kind,
                           type(err).__name__)
            await client.accept()
            await client.close(BAD_GATEWAY, reason_text(f"bad gateway: the upstream could not be reached "
                                                         f"({type(err).__name__})"))
            return
        messages = self.metrics.websocket_messages
        async with upstream:
            try:
                await client.accept(upstream.subprotocol,
                                    client_headers(upstream.response.headers, NOT_RELAYED_HANDSHAKE))
            except OSError:  # the client left during the upstream's handshake: close the upstream as a drop
                await upstream.close(code=None)
                return
            self.metrics.websocket_connections.labels("relayed").inc()
            self.metrics.requests.labels(WEBSOCKET, PASSTHROUGH).inc()
            self.metrics.passthroughs.labels(WEBSOCKET).inc()
            logger.info("gemkernels: WebSocket %s to the %s upstream: websocket relayed unchanged", where, kind)
            with self.metrics.websocket_open.track_inprogress():
                await relay(client, upstream, messages.labels("to_upstream").inc, messages.labels("to_client").inc)

    async def forward(self, request: Request, kind: str, content: bytes | AsyncIterator[bytes],
                      decoded_body: bool = False) -> Response:
        """``content`` to the ``kind`` upstream with the request's method, path, query and headers; its answer."""
        if isinstance(content, bytes):
            dropped = NOT_FORWARDED_DECODED if decoded_body else NOT_FORWARDED
        else:
            dropped = NOT_FORWARDED_STREAMED
        headers = passed_headers(request.headers.raw, dropped)
        url = self.upstreams.url(kind, url_part(request.scope.get("raw_path", request.url.path.encode())))
        try:
            response = await self.upstreams.send(request.method, url, url_part(request.scope.get("query_string", b"")),
                                                 headers, content)
        except httpx.TimeoutException as err:
            self.metrics.upstream_errors.labels("timeout").inc()
            return error_response(504, "upstream_timeout",
                                  f"the upstream did not answer in time ({type(err).__name__})")
        except BodyStalled as err:  # a relayed upload that stopped sending
            return body_unread(408, "request_timeout", f"{err} (gem serve --body-timeout)")
        except ClientDisconnect:  # the client left during its relayed upload: nobody reads an answer
            return body_unread(400, "client_disconnected", "the client left before its request body was sent")
        except httpx.InvalidURL as err:  # not an HTTPError: a URL httpx will not send (past 64 KiB, say)
            return error_response(400, "invalid_request_url", f"the request URL cannot be forwarded ({err})")
        except httpx.HTTPError as err:
            self.metrics.upstream_errors.labels("unreachable").inc()
            return error_response(502, "upstream_unreachable",
                                  f"the upstream could not be reached ({type(err).__name__})")
        if response.status_code >= 500:
            self.metrics.upstream_errors.labels(f"status_{response.status_code}").inc()
        return RelayedAnswer(response.status_code, passed_headers(response.headers.raw, NOT_RELAYED),
                             self.answer(response), response.aclose)

    async def answer(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The upstream's body, chunk by chunk as it arrives (at once from a transport that read it already, as
        ``httpx.MockTransport`` does)."""
        if response.is_stream_consumed:
            yield response.content
            return
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            self.metrics.upstream_errors.labels("stream_dropped").inc()
            logger.warning("gemkernels: the upstream dropped a response mid-stream; closing the client's too")
            raise

    async def compress_only(self, request: Request) -> Response:
        """``POST /v1/gem/compress``: ``{"messages", "session_id"?, "goal"?}`` -> ``{"messages", "stats"}`` within
        the caller's tenant (400 for a malformed body; switched off, 404; with a token, 401 without it)."""
        config = self.config
        if not config.compress_endpoint:
            return error_response(404, "not_found", "POST /v1/gem/compress is switched off on this proxy")
        if config.compress_token is not None and not hmac.compare_digest(
                request.headers.get("x-gem-token", "").encode("latin-1"), config.compress_token.encode()):
            return error_response(401, "unauthorized", "POST /v1/gem/compress needs this proxy's X-GEM-Token")
        raw = await read_body(request, config.max_body_bytes, config.body_timeout)
        if isinstance(raw, Response):
            return raw
        try:
            text, body, layout = await read_request_json(request, raw, "messages", config.max_body_bytes)
        except UndecodableBody as err:
            return error_response(400, "invalid_request", str(err))
        if body is None or not isinstance(body.get("messages"), list):
            return error_response(400, "invalid_request", "the body must be a JSON object with a 'messages' list")
        goal, session = body.get("goal"), body.get("session_id")
        if not isinstance(session, str):
            session = session_of(request.headers, body)
        messages = body["messages"]
        result = await self.compressor.compress(request.url.path, messages, session,
                                                goal if isinstance(goal, str) else None,
                                                tenant=tenant_of(request.headers), wait_for_encoding=True)
        kept = messages if result is None else result.messages
        stats = None if result is None else result.stats.to_dict()
        removed = removed_positions(messages, kept)
        if layout is not None and removed is not None and strict_utf8(text):
            gone = set(removed)  # the kept messages' bytes as the client sent them (NaN, 1e400 included)
            array = b",".join(text[a:b] for p, (a, b) in enumerate(layout.elements) if p not in gone)
            return Response(b'{"messages":[' + array + b'],"stats":' + ascii_json(stats) + b"}",
                            media_type="application/json")
        try:
            return AsciiJSONResponse({"messages": kept, "stats": stats})
        except ValueError:  # NaN, Infinity or 1e400 in a body that is not UTF-8: no bytes of it to echo
            return error_response(400, "invalid_request", "the messages hold a number JSON cannot write (NaN, "
                                  "Infinity, 1e400): send the body as UTF-8, or finite numbers")

    async def sessions(self, request: Request) -> Response:
        """``GET /v1/gem/sessions`` in observe mode: the caller's sessions (its tenant only) as sent and as
        compression would have sent them (`gemkernels.serve.observe`); 404 otherwise."""
        if self.observer is None:
            return error_response(404, "not_found", "GET /v1/gem/sessions answers in observe mode (gem serve "
                                  "--observe)")
        return AsciiJSONResponse(self.observer.report(tenant_of(request.headers)))

    async def healthz(self, request: Request) -> Response:
        """The process answers, with what it serves."""
        config = self.config
        return AsciiJSONResponse({"status": "ok", "upstream": config.upstream,
                                  "anthropic_upstream": self.upstreams.roots[ANTHROPIC_UPSTREAM],
                                  "preset": config.preset, "overrides": list(config.overrides),
                                  "encoder": config.encoder})

    async def readyz(self, request: Request) -> Response:
        """200 when the encoder is loaded and every upstream answers at all (any HTTP status), else 503."""
        kinds = dict.fromkeys([OPENAI_UPSTREAM, ANTHROPIC_UPSTREAM])
        for kind in kinds:
            kinds[kind] = await self.upstreams.reachable(kind, READY_TIMEOUT_S)
        ready = all(state == "reachable" for state in kinds.values())
        return AsciiJSONResponse({"status": "ready" if ready else "not ready", "upstream": kinds[OPENAI_UPSTREAM],
                                  "anthropic_upstream": kinds[ANTHROPIC_UPSTREAM],
                                  "encoder": self.compressor.encoder_name}, status_code=200 if ready else 503)

    async def metrics_text(self, request: Request) -> Response:
        """Prometheus text (`Metrics.exposition`)."""
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
