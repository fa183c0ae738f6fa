"""`Http1Transport`: the proxy's upstream requests over HTTP/1.1 keep-alive connections, parsed by httptools (the C
parser uvicorn uses), as an ``httpx.AsyncBaseTransport``.

The request goes out as ``httpx.Request`` holds it: its method, raw target and headers, bytes as given (the caller's
``Host``, ``Content-Length`` or ``Transfer-Encoding``), its body whole or chunk-framed when it is a stream. The answer
comes back as an ``httpx.Response`` whose stream yields the body as it arrives (transfer coding removed, content
coding kept: what ``aiter_raw`` gives). Errors and timeouts are httpx's (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``WriteTimeout``, ``RemoteProtocolError``, ``ReadError``, ``WriteError``), so callers need not know
which transport ran.

Why not httpcore: its pure-Python HTTP/1.1 (h11), its anyio cancel scopes around every read and write and its pool's
bookkeeping were about half of the proxy's CPU per forwarded request (bench/RESULTS.md). One transport serves every
origin; idle connections wait in a LIFO per origin (at most ``max_idle`` each, closed after ``idle_expiry`` s).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import httptools
import httpx

#: A response body buffered past this many bytes pauses reading from the upstream until the client takes it.
READ_BUFFER_BYTES = 1 << 20
#: Each body chunk held counts this much more than its bytes (the object around them), so that an upstream sending
#: tiny chunks cannot hold many times the buffer in memory before reading pauses.
CHUNK_OVERHEAD = 64
#: An answer's status line and headers may take this many bytes at most (httpcore's h11 allowed 100 KiB; llhttp sets
#: no limit); past it the answer is refused.
MAX_HEAD_BYTES = 256 << 10


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, origin: tuple[bytes, bytes, int]):
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.eof = False  # the upstream ended its side
        self.idle_since = 0.0
        self.writable: asyncio.Future[None] | None = None  # set while the transport's write buffer is full
        self.start(head_only=False)

    def start(self, head_only: bool) -> None:
        """Ready for the next answer (``head_only``: the answer to a HEAD request, which has no body)."""
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head_bytes = 0
        self.head_size = 0
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0  # the chunks' bytes, each with CHUNK_OVERHEAD
        self.complete = False
        self.past_end = False  # bytes came after the answer's end: ignored, and the connection is not reused
        self.keep = False  # whether the upstream keeps the connection open after this answer
        self.error: Exception | None = None
        self.arrived: asyncio.Future[None] | None = None  # set while the reader waits for body bytes
        self.reading_paused = False

    # --------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.complete:  # bytes after the answer, or on an idle connection: not HTTP we can follow
            self.keep = False
            self.close()
            return
        counting = not self.head.done()
        if counting:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # 101 and the upstream's next protocol: the answer ends at its head
            self.complete = True
            self.keep = False
            self.wake()
        except httptools.HttpParserError as err:
            self.fail(httpx.RemoteProtocolError(f"malformed answer from the upstream: {err}"))
            self.close()
        if counting and not self.head.done() and MAX_HEAD_BYTES < max(self.head_bytes, self.head_size):
            self.fail(httpx.RemoteProtocolError(f"the upstream's answer head passed {MAX_HEAD_BYTES} bytes"))
            self.close()
        if self.past_end:
            self.close()

    def eof_received(self) -> bool:
        self.eof = True  # never reused from now on (connection_lost comes a loop turn later)
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            if self.head.done() and not self.has_length() and exc is None:  # a body framed by the connection's end
                self.complete, self.keep = True, False
                self.wake()
            else:
                where = "its answer" if self.head.done() else "an answer"
                self.fail(httpx.RemoteProtocolError(f"the upstream closed the connection before {where} was complete")
                          if exc is None else httpx.ReadError(str(exc) or type(exc).__name__))
        if self.writable is not None and not self.writable.done():
            self.writable.set_exception(httpx.WriteError("the upstream closed the connection"))
            self.writable.exception()  # retrieved: its waiter may have timed out or been cancelled

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # --------------------------------------------------------------- httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: ignored, and the connection is not reused
            self.past_end, self.keep = True, False

    def on_status(self, reason: bytes) -> None:
        if not self.past_end and not self.head.done():
            self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.past_end and not self.head.done():  # after the head: a chunked body's trailers, dropped
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.past_end or self.head.done():
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # interim (RFC 9110 §15.2, unknown ones too): the final one follows
            self.reason, self.headers = b"", []
            return
        self.head_size = 17 + len(self.reason) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if self.head_size > MAX_HEAD_BYTES:  # refused once the read is parsed (data_received)
            return
        self.status = status
        self.head.set_result(None)
        if self.head_only:
            self.complete, self.keep = True, False  # llhttp does not know the request was HEAD: never reused
            self.wake()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.chunks.append(body)
        self.buffered += len(body) + CHUNK_OVERHEAD
        if self.buffered > READ_BUFFER_BYTES and not self.reading_paused and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        self.wake()

    def on_message_complete(self) -> None:
        if self.status == 0 or self.complete:  # an interim answer, a HEAD answer already complete, or past the end
            return
        self.complete = True
        self.keep = self.parser.should_keep_alive()
        self.wake()

    # --------------------------------------------------------------- the request's side

    def has_length(self) -> bool:
        """Whether the answer's body is framed by a length or chunks (not by the end of the connection: RFC 9112
        §6.3, a transfer coding that does not end in chunked included)."""
        if self.status in (204, 304) or self.status < 200:
            return True
        codings = [value.lower() for name, value in self.headers if name.lower() == b"transfer-encoding"]
        if codings:
            return b",".join(codings).rsplit(b",", 1)[-1].strip() == b"chunked"
        return any(name.lower() == b"content-length" for name, _ in self.headers)

    def wake(self) -> None:
        if self.arrived is not None and not self.arrived.done():
            self.arrived.set_result(None)

    def fail(self, error: Exception) -> None:
        if self.complete:  # junk after a whole answer: the answer stands, the connection goes
            self.keep = False
            return
        self.error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a failure nobody waits for is not logged as never retrieved
        self.wake()

    def usable(self) -> bool:
        """Open both ways, as far as this side knows."""
        return not (self.closed or self.eof or self.transport is None or self.transport.is_closing())

    def close(self) -> None:
        if not self.complete and self.error is None:  # cut by this side: never reported whole
            self.fail(httpx.ReadError("the connection was closed before the answer was complete"))
        if self.transport is not None and not self.closed:
            if self.complete and not self.transport.get_write_buffer_size():
                self.transport.close()
            else:  # close() would go on sending the unsent request bytes, holding the socket until they are taken
                self.transport.abort()
        self.closed = True

    async def write(self, data: bytes, timeout: float | None) -> None:
        """``data`` to the upstream, waiting (at most ``timeout`` s) while the transport's buffer is full."""
        if self.closed or self.transport is None:
            raise httpx.WriteError("the upstream closed the connection")
        self.transport.write(data)
        if self.writable is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.writable), timeout)
            except asyncio.TimeoutError:
                raise httpx.WriteTimeout("the upstream did not take the request body in time") from None

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The next piece of the body, or None once it is complete; ReadTimeout after ``timeout`` s without one."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return None
            self.arrived = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self.arrived, timeout)
            except asyncio.TimeoutError:
                raise httpx.ReadTimeout("the upstream sent nothing in time") from None
            finally:
                self.arrived = None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk) + CHUNK_OVERHEAD
        if self.reading_paused and self.buffered <= READ_BUFFER_BYTES // 2 and self.transport is not None:
            self.transport.resume_reading()
            self.reading_paused = False
        return chunk


class ResponseBody(httpx.AsyncByteStream):
    """An answer's body as it arrives; when it is read to its end the connection goes back to its transport's idle
    connections (if the upstream keeps it alive), and closing it earlier closes the connection."""

    def __init__(self, owner: Http1Transport, connection: Connection, read_timeout: float | None):
        self.owner, self.connection, self.read_timeout = owner, connection, read_timeout
        self.done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self.connection
        while not self.done:
            try:
                chunk = await connection.next_chunk(self.read_timeout)
            except BaseException:
                self.finish(reuse=False)
                raise
            if chunk is None:
                self.finish(reuse=connection.keep)
                return
            yield chunk

    def finish(self, reuse: bool) -> None:
        if not self.done:
            self.done = True
            self.owner.release(self.connection, reuse and self.connection.complete and not self.connection.closed)

    async def aclose(self) -> None:
        self.finish(reuse=False)


class Http1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to any origin over keep-alive connections (module doc); ``ssl_context`` for ``https://``."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, max_idle: int = 256, idle_expiry: float = 5.0):
        self.ssl_context = ssl_context
        self.max_idle, self.idle_expiry = max_idle, idle_expiry
        self.idle: dict[tuple[bytes, bytes, int], list[Connection]] = {}
        self.busy: set[Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port or (443 if url.raw_scheme == b"https" else 80))
        connection = self.idle_connection(origin) or await self.connect(origin, timeouts.get("connect"))
        self.busy.add(connection)
        head_only = request.method == "HEAD"
        connection.start(head_only)
        try:
            try:
                await self.send_request(connection, request, timeouts.get("write"))
            except httpx.WriteError:  # the upstream may have answered before it closed (an early 401, 413): that
                pass  # answer stands, as in httpcore; else the head fails with the connection's error
            try:
                await asyncio.wait_for(asyncio.shield(connection.head), timeouts.get("read"))
            except asyncio.TimeoutError:
                raise httpx.ReadTimeout("the upstream did not answer in time") from None
        except BaseException:
            self.release(connection, reuse=False)
            raise
        return httpx.Response(connection.status, headers=connection.headers,
                              stream=ResponseBody(self, connection, timeouts.get("read")),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": connection.reason})

    def idle_connection(self, origin: tuple[bytes, bytes, int]) -> Connection | None:
        """The most recently used idle connection to ``origin`` still open and not expired, else None."""
        idle = self.idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable() and now - connection.idle_since < self.idle_expiry:
                return connection
            connection.close()
        return None

    async def connect(self, origin: tuple[bytes, bytes, int], timeout: float | None) -> Connection:
        scheme, host, port = origin
        secure = scheme == b"https"
        if secure and self.ssl_context is None:
            self.ssl_context = httpx.create_ssl_context()
        hostname = host.decode("ascii")
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(loop.create_connection(
                lambda: Connection(origin), hostname, port, ssl=self.ssl_context if secure else None,
                server_hostname=hostname if secure else None), timeout)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {hostname}:{port} in time") from None
        except OSError as err:
            raise httpx.ConnectError(str(err) or type(err).__name__) from None
        return connection

    async def send_request(self, connection: Connection, request: httpx.Request, timeout: float | None) -> None:
        """The request line, the headers as given and the body (chunk-framed when it is a stream and the headers
        say chunked)."""
        head = b"".join([request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n",
                         *(name + b": " + value + b"\r\n" for name, value in request.headers.raw), b"\r\n"])
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):  # the whole body: one write with the head
            await connection.write(head + b"".join([bytes(chunk) for chunk in stream]), timeout)
            return
        await connection.write(head, timeout)
        chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
        assert isinstance(stream, AsyncIterable)
        async for chunk in stream:
            if chunk:
                await connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else bytes(chunk), timeout)
        if chunked:
            await connection.write(b"0\r\n\r\n", timeout)

    def release(self, connection: Connection, reuse: bool) -> None:
        """``connection`` back among the idle ones (``reuse``) or closed."""
        self.busy.discard(connection)
        idle = self.idle.setdefault(connection.origin, [])
        now = time.monotonic()
        while idle and now - idle[0].idle_since >= self.idle_expiry:  # the oldest, which LIFO reuse leaves longest
            idle.pop(0).close()
        if reuse and len(idle) < self.max_idle:
            connection.idle_since = now
            idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        for connection in [*self.busy, *(c for idle in self.idle.values() for c in idle)]:
            connection.close()
        self.idle.clear()
        self.busy.clear()
