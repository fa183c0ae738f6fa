"""Connection timeouts for ``gem serve``: uvicorn's HTTP protocol with a deadline for request headers.

uvicorn 0.54 (its h11 and httptools protocols alike) has one timer, ``timeout_keep_alive``, armed only once a
response is complete and cancelled by the first byte of the next request. So a connection that never sends a byte,
or sends its headers a byte every few seconds (slowloris), is held forever; so is a request whose body stalls (the
app waits in ``receive``; `gemkernels.serve.serving.read_body` times that out). `HeaderDeadline` adds the missing timer:
a connection whose request headers are not complete ``header_timeout`` seconds after it opened, or after the first
byte that follows a response, is closed (nothing is sent: no request was read that could be answered). A connection
upgraded to a WebSocket leaves the HTTP protocol (uvicorn hands its transport to a WebSocket protocol), and the timer
goes with it: an open WebSocket is bounded by its pings and its messages' size, not by this timer.

Defaults (`DEFAULT_HEADER_TIMEOUT`, `DEFAULT_KEEP_ALIVE_TIMEOUT`, ``ServerConfig.body_timeout``):
- headers: 10 s. nginx allows 60 s (``client_header_timeout``), Apache 20 s for the first byte
  (``mod_reqtimeout``), both for people on slow links; an API call's headers come from a program in one or two
  packets, so 10 s is ample and an idle socket is held a sixth as long as under nginx;
- keep-alive: 75 s, nginx's ``keepalive_timeout``. It must exceed the idle expiry of the clients' pools (httpx's,
  which the openai and anthropic SDKs use: 5 s; a load balancer's: AWS ALB 60 s) so that the client, not the proxy,
  ends an idle connection: with uvicorn's 5 s both close at once and a request sent at that moment fails;
- body: 30 s without a byte of the body (an inactivity timeout, like nginx's ``client_body_timeout``: a slow upload
  that keeps moving is never cut), long enough for TCP's retransmission backoff on a lossy link.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gemkernels.serve.config import ServerConfig

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 75.0

#: What `HeaderDeadline` reads of uvicorn's protocol (instance attributes, checked on each connection).
PROTOCOL_ATTRIBUTES = ("cycle", "loop", "transport")


class HeaderDeadline:
    """Mixin for uvicorn's ``H11Protocol`` or ``HttpToolsProtocol``: closes a connection that has not completed a
    request's headers ``header_timeout`` seconds after it opened or after the first byte following a response.

    A request's headers are complete when the protocol starts its request-response cycle (``self.cycle`` changes);
    the connection is between requests while there is no cycle or the last one's response is complete."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(self, name)]
        if missing:
            raise TypeError(f"{type(self).__name__}: this uvicorn's protocol has no {', '.join(missing)}; "
                            "gem serve's header timeout needs updating for it")
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        upgraded = self.transport.get_protocol()
        if upgraded is not self:  # a WebSocket upgrade: the timer goes only once the handshake has started
            if getattr(upgraded, "handshake_initiated", True):  # (a request it could not parse never starts one)
                self.disarm_header_deadline()
        elif self.cycle is not cycle:  # headers complete
            self.disarm_header_deadline()
        elif cycle is None or cycle.response_complete:  # bytes of the next request's headers
            self.arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm_header_deadline()
        super().connection_lost(exc)

    def arm_header_deadline(self) -> None:
        """Start the header timer unless it runs already (later bytes do not extend it)."""
        if self.header_deadline is None and not self.transport.is_closing():
            self.header_deadline = self.loop.call_later(self.header_timeout, self.header_deadline_passed)

    def disarm_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def header_deadline_passed(self) -> None:
        """Close the connection (also one handed to a WebSocket protocol that never started its handshake)."""
        self.header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def http_protocol(header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> type[asyncio.Protocol]:
    """The protocol class to pass as ``uvicorn.run(http=...)``: uvicorn's own choice (httptools when installed,
    else h11) with `HeaderDeadline` at ``header_timeout`` seconds."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    else:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    return http_protocol_on(base, header_timeout)


def http_protocol_on(base: type[asyncio.Protocol], header_timeout: float) -> type[asyncio.Protocol]:
    """``base`` (a uvicorn HTTP protocol class) with `HeaderDeadline` at ``header_timeout`` seconds."""
    if header_timeout <= 0:
        raise ValueError(f"header_timeout must be positive, got {header_timeout}")
    return type(f"HeaderDeadline{base.__name__}", (HeaderDeadline, base), {"header_timeout": header_timeout})


def uvicorn_options(header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                    keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT,
                    max_message_bytes: int = ServerConfig.max_message_bytes) -> dict[str, Any]:
    """The ``uvicorn.run``/``uvicorn.Config`` arguments for these timeouts, and WebSockets (uvicorn's pick: the
    ``websockets`` package that ``gemkernels[serve]`` installs) with messages of at most ``max_message_bytes``."""
    return {"http": http_protocol(header_timeout), "timeout_keep_alive": keep_alive_timeout, "ws": "auto",
            "ws_max_size": max_message_bytes}
