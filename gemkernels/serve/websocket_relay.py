"""The WebSocket relay of ``gem serve``: an upgrade on any path (Codex's ``/v1/responses``, ...) is relayed to the
upstream an HTTP request of that path would reach (`gemkernels.serve.formats.upstream_for`), ``ws://`` for an
``http://`` upstream and ``wss://`` for ``https://``. Nothing is compressed: every message goes on unchanged.

- Handshake: the client's headers go upstream as sent (``Authorization``, ``OpenAI-Beta``, session ids,
  ``User-Agent``, ...) except hop-by-hop ones, ``X-GEM-Session`` and the handshake's own (``Sec-WebSocket-Key``,
  ``-Version``, ``-Extensions``: each hop negotiates its own, permessage-deflate included); the client's
  subprotocols are offered upstream, and the client is accepted with the one the upstream chose and the upstream's
  response headers (Codex reads ``x-codex-turn-state``, ``openai-model``, ``x-reasoning-included``) less hop-by-hop,
  handshake, ``Date`` and ``Server`` headers.
- An upstream that answers without upgrading (401, 404, 426, ...) has its status, headers and body relayed as the
  answer to the client's handshake (ASGI's WebSocket denial response), so a client falls back as it would facing
  the upstream itself; one that cannot be reached, or whose handshake breaks or times out, is a close with
  `BAD_GATEWAY` (1014) and the reason, once the client is accepted.
- Messages: one at a time each way, in order, text as text and binary as binary (a fragmented message goes on
  whole). Each side's reading waits while its last message is being sent on (uvicorn pauses reading after each
  message, websockets past ``WEBSOCKET_QUEUE_FRAMES``), so a slow reader holds the other end back instead of
  filling memory. A message past ``max_message_bytes`` closes its connection with 1009 (uvicorn's ``ws_max_size``
  on the client's side, websockets' ``max_size`` on the upstream's), and so the other too.
- Closing: each side is closed with the other's code and reason. A close without a code (1005; uvicorn reports a
  client that drops its connection so too) goes upstream as a close without a code, and to the client as 1000 (ASGI
  sends no empty close); an upstream that drops its connection without a close has the client's dropped too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response as HandshakeResponse

NORMAL, NO_STATUS, ABNORMAL, BAD_GATEWAY = 1000, 1005, 1006, 1014
#: The longest close reason a close frame carries (RFC 6455 §5.5: 125 bytes of payload, 2 of them the code).
MAX_REASON_BYTES = 123
#: Header names (lower-case bytes) of the handshake itself, which each hop negotiates for itself.
HANDSHAKE = frozenset({b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-accept",
                       b"sec-websocket-extensions", b"sec-websocket-protocol"})


@dataclass(frozen=True)
class Closed:
    """How one side ended: ``side`` (``client`` or ``upstream``), its close code and reason (`NO_STATUS`: a close
    without a code, `ABNORMAL`: dropped without a close)."""

    side: str
    code: int
    reason: str


def reason_text(text: str) -> str:
    """``text`` cut to what a close frame carries (`MAX_REASON_BYTES` of UTF-8, whole characters)."""
    return text.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


def upstream_headers(raw: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[tuple[str, str]]:
    """The client's handshake headers to send upstream, in order, less ``dropped`` and `HANDSHAKE` names (values as
    ISO-8859-1 text, which websockets writes back as the same bytes)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k.lower() not in dropped | HANDSHAKE]


def client_headers(headers: Headers, dropped: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The upstream's handshake response headers to relay to the client, less ``dropped`` and `HANDSHAKE` names."""
    pairs = [(header_bytes(k).lower(), header_bytes(v)) for k, v in headers.raw_items()]
    return [(k, v) for k, v in pairs if k not in dropped | HANDSHAKE]


def header_bytes(text: str) -> bytes:
    """A header text websockets decoded back to its bytes: ISO-8859-1 (websockets 17 and later), else UTF-8 with
    surrogate escapes (earlier versions, Python 3.10), so that an odd value never fails the handshake."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


#: Set in the task that answered a handshake with a denial response (`refuse`), for `DeniedHandshakeFilter`.
DENIED = ContextVar("gem_websocket_denied", default=False)
#: What uvicorn 0.54 logs, as an error, after every denial response (Kludex/uvicorn#3138: it never marks such a
#: handshake complete); an upstream's refusal relayed is not an error.
UNCOMPLETED_HANDSHAKE = "ASGI callable returned without completing handshake."


async def refuse(client: WebSocket, answer: HandshakeResponse, dropped: frozenset[bytes]) -> None:
    """Answer the client's handshake with the upstream's refusal (its status, body and headers less ``dropped``)
    where the server can (the ASGI WebSocket denial response), else with a plain refusal (uvicorn: 403)."""
    if "websocket.http.response" not in client.scope.get("extensions", {}):
        await client.close()
        return
    refusal = Response(bytes(answer.body or b""), status_code=answer.status_code)
    refusal.raw_headers += client_headers(answer.headers, dropped)
    DENIED.set(True)
    await client.send_denial_response(refusal)


class DeniedHandshakeFilter(logging.Filter):
    """Drops uvicorn's `UNCOMPLETED_HANDSHAKE` error where the handshake was answered by `refuse` (the same task
    logs it after the app returned); every other record, that message elsewhere included, is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (DENIED.get() and record.getMessage() == UNCOMPLETED_HANDSHAKE)


def upstream_closed(closed: ConnectionClosed) -> Closed:
    """How the upstream connection ended: the close that came first, the proxy's own when websockets closed it
    (1009 past ``max_size``, 1011 a keepalive timeout), or `ABNORMAL` when it dropped without one."""
    first = closed.sent if closed.sent is not None and not closed.rcvd_then_sent else closed.rcvd
    if first is None:
        return Closed("upstream", ABNORMAL, "")
    return Closed("upstream", first.code, first.reason)


async def client_to_upstream(client: WebSocket, upstream: ClientConnection, count: Callable[[], None]) -> Closed | None:
    """The client's messages to the upstream, until the client closes (how) or the upstream does (None)."""
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return Closed("client", message.get("code", NO_STATUS), message.get("reason") or "")
        text = message.get("text")
        try:
            await upstream.send(text if text is not None else message.get("bytes") or b"")
        except ConnectionClosed:
            return None
        count()


async def upstream_to_client(upstream: ClientConnection, client: WebSocket, count: Callable[[], None]) -> Closed | None:
    """The upstream's messages to the client, until the upstream closes (how) or the client does (None)."""
    while True:
        try:
            data = await upstream.recv()
        except ConnectionClosed as closed:
            return upstream_closed(closed)
        try:
            await client.send({"type": "websocket.send", "text" if isinstance(data, str) else "bytes": data})
        except WebSocketDisconnect:
            return None
        count()


async def relay(client: WebSocket, upstream: ClientConnection, to_upstream: Callable[[], None],
                to_client: Callable[[], None]) -> Closed:
    """Messages both ways (``to_upstream`` / ``to_client`` called after each) until one side closes, then the other
    closed likewise (module doc); how the first side ended."""
    pumps = [asyncio.create_task(client_to_upstream(client, upstream, to_upstream)),
             asyncio.create_task(upstream_to_client(upstream, client, to_client))]
    try:
        done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        ended = next((task.result() for task in done if task.result() is not None), None)
        if ended is None and pending:  # a send found the other side closed: its own pump says how
            ended = await pending.pop()
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    ended = ended or Closed("upstream", ABNORMAL, "")
    if ended.side == "client":
        await close_upstream(upstream, ended)
    else:
        await close_client(client, ended)
    return ended


async def close_upstream(upstream: ClientConnection, ended: Closed) -> None:
    """Close the upstream as the client closed (without a code when it sent none or dropped)."""
    if ended.code in (NO_STATUS, ABNORMAL):
        await upstream.close(code=None)  # type: ignore[arg-type]  # websockets sends an empty close frame
    else:
        await upstream.close(ended.code, ended.reason)


async def close_client(client: WebSocket, ended: Closed) -> None:
    """Close the client as the upstream closed; an upstream that dropped leaves the client's connection to be dropped
    when the app returns."""
    if ended.code == ABNORMAL:
        return
    try:
        await client.close(NORMAL if ended.code == NO_STATUS else ended.code, ended.reason)
    except WebSocketDisconnect:  # the client went at the same time
        pass
