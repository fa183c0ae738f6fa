"""`Http1Transport` against a scripted upstream on 127.0.0.1 that answers each request with the bytes a test gives
(any framing, any fault): bodies framed by length, chunks or the end of the connection; keep-alive reuse and when a
connection must not be reused; HEAD, 1xx and 204; headers as bytes both ways; streamed request bodies; a dropped,
stalled or malformed answer as httpx's errors; back-pressure on a large body."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("httptools")

from gemkernels.serve.http1 import MAX_HEAD_BYTES, READ_BUFFER_BYTES, Connection, Http1Transport  # noqa: E402

#: What the upstream does with one request: given its head and body, the writer to answer on.
Answer = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A raw HTTP/1.1 server: reads each request (head, then a Content-Length or chunked body) and runs the next of
    ``answers`` (the last one repeats); records the requests' bytes and how many connections it accepted."""

    def __init__(self, *answers: Answer):
        self.answers = list(answers)
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                body = await read_body(reader, head)
                self.requests.append((head, body))
                answer = self.answers[min(len(self.requests) - 1, len(self.answers) - 1)]
                await answer(head, body, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()


async def read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    lines = [line.lower() for line in head.split(b"\r\n")]
    if b"transfer-encoding: chunked" in lines:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                return body
    length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), 0)
    return await reader.readexactly(length)


def answer(raw: bytes, close: bool = False, pause: float = 0.0) -> Answer:
    """Write ``raw`` (after ``pause`` s), then close the connection if ``close``."""
    async def write(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(pause)
        writer.write(raw)
        await writer.drain()
        if close:
            writer.close()
    return write


OK = answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")


def request(url: str, method: str = "POST", content: object = b"{}", headers: list | None = None,
            timeout: float = 5.0) -> httpx.Request:
    return httpx.Request(method, url + "/v1/chat/completions", content=content, headers=headers or [],
                         extensions={"timeout": httpx.Timeout(timeout).as_dict()})


async def fetch(transport: Http1Transport, req: httpx.Request) -> tuple[httpx.Response, bytes]:
    response = await transport.handle_async_request(req)
    body = b"".join([chunk async for chunk in response.stream])
    await response.aclose()
    return response, body


def run(scenario: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(asyncio.wait_for(scenario(), 30))


def fetched_in_turn(upstream_answer: Answer, count: int) -> tuple[list[bytes], int]:
    """``count`` requests one after another through one transport to an upstream answering each with
    ``upstream_answer``: their bodies, and how many connections the upstream accepted."""
    async def scenario() -> tuple[list[bytes], int]:
        async with Upstream(upstream_answer) as upstream:
            transport = Http1Transport()
            bodies = [(await fetch(transport, request(upstream.url)))[1] for _ in range(count)]
            await transport.aclose()
            return bodies, upstream.connections

    return run(scenario)


@pytest.mark.parametrize("raw, expected", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", b"hello"),
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
     b"f\r\ndata: {\"a\":1}\n\n\r\n0\r\n\r\n", b'data: {"a":1}\n\n'),
])
def test_bodies_framed_by_length_or_chunks_arrive_whole_and_the_connection_is_reused(raw, expected):
    assert fetched_in_turn(answer(raw), 3) == ([expected] * 3, 1)


def test_a_body_framed_by_the_end_of_the_connection_arrives_whole_and_it_is_not_reused():
    assert fetched_in_turn(answer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close=True), 2) == (
        [b"until the end"] * 2, 2)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
])
def test_an_answer_that_ends_the_connection_is_not_reused(raw):
    """The upstream says the connection ends but leaves it open (it would read another request): not reused."""
    assert fetched_in_turn(answer(raw), 2) == ([b"{}"] * 2, 2)


def test_an_idle_connection_the_upstream_closed_is_not_reused():
    """The upstream answers with keep-alive, then closes the idle connection: the next request opens another."""
    async def scenario():
        async def answer_then_close(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
            asyncio.get_running_loop().call_later(0.05, writer.close)

        async with Upstream(answer_then_close) as upstream:
            transport = Http1Transport()
            first = (await fetch(transport, request(upstream.url)))[1]
            await asyncio.sleep(0.3)
            second = (await fetch(transport, request(upstream.url)))[1]
            await transport.aclose()
            return first, second, upstream.connections

    assert run(scenario) == (b"{}", b"{}", 2)


def test_head_1xx_and_204_answers_end_where_http_says():
    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"),  # HEAD: no body follows
                            answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
                                   b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-final: yes\r\n\r\nok"),
                            answer(b"HTTP/1.1 204 No Content\r\n\r\n")) as upstream:
            transport = Http1Transport()
            head = await fetch(transport, request(upstream.url, "HEAD", content=None))
            interim = await fetch(transport, request(upstream.url))
            empty = await fetch(transport, request(upstream.url))
            again = await fetch(transport, request(upstream.url))
            await transport.aclose()
            return head, interim, empty, again

    head, interim, empty, again = run(scenario)
    assert (head[0].status_code, head[0].headers["content-length"], head[1]) == (200, "1000", b"")
    assert (interim[0].status_code, interim[1], interim[0].headers.raw) == (
        201, b"ok", [(b"content-length", b"2"), (b"x-final", b"yes")])
    assert interim[0].extensions["reason_phrase"] == b"Created"
    assert (empty[0].status_code, empty[1]) == (204, b"")
    assert again[0].status_code == 204


def test_headers_go_out_and_come_back_as_bytes_in_order():
    """Non-ASCII and non-Latin-1 bytes, repeated names, the caller's casing: nothing decoded or merged."""
    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 200 OK\r\nX-Odd: \xe2\x98\x83\xff\r\nset-cookie: a=1\r\n"
                                   b"Set-Cookie: b=2\r\ncontent-length: 0\r\n\r\n")) as upstream:
            transport = Http1Transport()
            sent = [(b"X-Client", b"caf\xc3\xa9 \xff"), (b"x-rep", b"1"), (b"X-Rep", b"2")]
            response, _ = await fetch(transport, request(upstream.url, headers=sent))
            await transport.aclose()
            return upstream.requests[0][0], response.headers.raw

    head, received = run(scenario)
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert [line for line in lines if line.lower().startswith((b"x-client", b"x-rep"))] == [
        b"X-Client: caf\xc3\xa9 \xff", b"x-rep: 1", b"X-Rep: 2"]
    assert received == [(b"X-Odd", b"\xe2\x98\x83\xff"), (b"set-cookie", b"a=1"), (b"Set-Cookie", b"b=2"),
                        (b"content-length", b"0")]


@pytest.mark.parametrize("length", [True, False])
def test_a_streamed_request_body_goes_out_whole_with_its_framing(length):
    async def scenario():
        async def parts():
            for part in (b"one ", b"", b"two ", b"three"):
                yield part

        headers = [(b"content-length", b"13")] if length else None
        async with Upstream(OK) as upstream:
            transport = Http1Transport()
            await fetch(transport, request(upstream.url, content=parts(), headers=headers))
            await transport.aclose()
            return upstream.requests[0]

    head, body = run(scenario)
    assert body == b"one two three"
    assert (b"transfer-encoding: chunked" in head.lower()) is not length


@pytest.mark.parametrize("raw, close, error, when", [
    (b"", True, httpx.RemoteProtocolError, "head"),  # closed before answering
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten..", True, httpx.RemoteProtocolError, "body"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", True, httpx.RemoteProtocolError, "body"),
    (b"NOT HTTP AT ALL\r\n\r\n", False, httpx.RemoteProtocolError, "head"),
    (b"", False, httpx.ReadTimeout, "head"),  # never answers
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nstalls", False, httpx.ReadTimeout, "body"),
])
def test_a_dropped_stalled_or_malformed_answer_is_httpx_s_error(raw, close, error, when):
    async def scenario():
        async with Upstream(answer(raw, close=close)) as upstream:
            transport = Http1Transport()
            try:
                response = await transport.handle_async_request(request(upstream.url, timeout=0.3))
            except httpx.HTTPError as err:
                return "head", err
            try:
                [chunk async for chunk in response.stream]
            except httpx.HTTPError as err:
                return "body", err
            finally:
                await response.aclose()
                assert not transport.busy and not any(transport.idle.values())  # closed, never reused
            return "none", None

    where, err = run(scenario)
    assert (where, type(err)) == (when, error)


def test_an_unreachable_upstream_is_a_connect_error():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        transport = Http1Transport()
        with pytest.raises(httpx.ConnectError):
            await transport.handle_async_request(request(f"http://127.0.0.1:{port}"))

    run(scenario)


def test_a_response_closed_before_its_end_closes_its_connection():
    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345", pause=0.0)) as upstream:
            transport = Http1Transport()
            response = await transport.handle_async_request(request(upstream.url))
            connection = next(iter(transport.busy))
            await response.aclose()
            assert connection.closed and not transport.busy and not any(transport.idle.values())
            await transport.aclose()

    run(scenario)


@pytest.mark.parametrize("stage", ["head", "body-write"])
def test_a_request_cancelled_while_it_waits_closes_its_connection(stage):
    """The client left while the request was written (an upstream that reads nothing) or its answer awaited."""
    async def scenario():
        async def never(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        async with Upstream(never) as upstream:
            transport = Http1Transport()
            if stage == "head":
                req = request(upstream.url)
            else:  # the upstream reads the head, then nothing: 64 MiB fill both sockets' buffers
                req = request(upstream.url, content=b"x" * (64 << 20), headers=[(b"content-length", b"1")])
            task = asyncio.ensure_future(transport.handle_async_request(req))
            await asyncio.sleep(0.3)
            connections = list(transport.busy)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return [c.closed for c in connections], transport.busy, any(transport.idle.values())

    closed, busy, idle = run(scenario)
    assert closed == [True] and not busy and not idle


def test_a_body_the_upstream_does_not_read_is_a_write_timeout():
    async def scenario():
        async def never(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        async with Upstream(never) as upstream:
            transport = Http1Transport()
            req = request(upstream.url, content=b"x" * (64 << 20), headers=[(b"content-length", b"1")], timeout=0.5)
            with pytest.raises(httpx.WriteTimeout):
                await transport.handle_async_request(req)
            assert not transport.busy

    run(scenario)


@pytest.mark.parametrize("extra", [b"HTTP/1.1 500\r\ncontent-length: 0\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
                                   b"HTTP/1.1 2", b"\x00junk"])
def test_bytes_after_the_answer_neither_change_it_nor_let_its_connection_be_reused(extra):
    async def scenario():
        first = answer(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}" + extra)
        async with Upstream(first, OK) as upstream:
            transport = Http1Transport()
            response, body = await fetch(transport, request(upstream.url))
            await fetch(transport, request(upstream.url))
            await transport.aclose()
            return response, body, upstream.connections

    response, body, connections = run(scenario)
    assert (response.status_code, response.headers.raw, response.extensions["reason_phrase"], body) == (
        200, [(b"content-type", b"application/json"), (b"content-length", b"2")], b"OK", b"{}")
    assert connections == 2


def test_trailers_are_not_taken_for_headers():
    raw = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nx-trailer: t\r\n"
           b"content-type: text/evil\r\n\r\n")

    async def scenario():
        async with Upstream(answer(raw)) as upstream:
            transport = Http1Transport()
            response, body = await fetch(transport, request(upstream.url))
            await transport.aclose()
            return response.headers.raw, body

    assert run(scenario) == ([(b"transfer-encoding", b"chunked")], b"{}")


def test_a_body_framed_by_the_connection_s_end_cut_by_a_reset_is_a_read_error():
    import socket
    import struct

    async def reset(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def scenario():
        async with Upstream(reset) as upstream:
            response = await Http1Transport().handle_async_request(request(upstream.url))
            try:
                [chunk async for chunk in response.stream]
            except httpx.ReadError:
                return "error"
            finally:
                await response.aclose()
            return "complete"

    assert run(scenario) == "error"


def test_a_transfer_coding_not_ending_in_chunked_is_read_to_the_connection_s_end():
    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nsome bytes", close=True)) as up:
            transport = Http1Transport()
            _, body = await fetch(transport, request(up.url))
            await transport.aclose()
            return body

    assert run(scenario) == b"some bytes"


def test_an_answer_head_past_its_limit_is_refused():
    head = b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * MAX_HEAD_BYTES + b"\r\ncontent-length: 0\r\n\r\n"

    async def scenario():
        async with Upstream(answer(head)) as upstream:
            transport = Http1Transport()
            with pytest.raises(httpx.RemoteProtocolError, match="head"):
                await transport.handle_async_request(request(upstream.url))
            assert not transport.busy

    run(scenario)


def test_tiny_chunks_count_what_they_hold():
    """A body of one-byte chunks, read slowly: reading pauses after about a buffer's worth of chunk objects."""
    count = 200_000

    async def scenario():
        raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * count + b"0\r\n\r\n"
        async with Upstream(answer(raw)) as upstream:
            transport = Http1Transport()
            response = await transport.handle_async_request(request(upstream.url))
            connection = next(iter(transport.busy))
            most, total = 0, 0
            async for chunk in response.stream:
                most = max(most, len(connection.chunks))
                total += len(chunk)
                if total % 2000 == 0:
                    await asyncio.sleep(0.001)
            await response.aclose()
            await transport.aclose()
            return total, most

    total, most = run(scenario)
    assert total == count
    # a buffer's worth (READ_BUFFER_BYTES // (1 + CHUNK_OVERHEAD): 16k chunks) and what one read parses (~35k);
    # counted by their bytes alone, all 200k would be held
    assert most <= 100_000


def test_idle_connections_the_upstream_ended_or_that_expired_are_not_reused():
    async def scenario():
        async with Upstream(OK) as upstream:
            transport = Http1Transport(idle_expiry=0.2)
            await fetch(transport, request(upstream.url))
            (connection,) = [c for idle in transport.idle.values() for c in idle]
            connection.eof_received()  # the upstream's FIN seen, its connection_lost not yet run
            await fetch(transport, request(upstream.url))
            (second,) = [c for idle in transport.idle.values() for c in idle]
            await asyncio.sleep(0.3)
            await fetch(transport, request(upstream.url))
            await asyncio.sleep(0)
            await transport.aclose()
            return connection is not second, second.closed, upstream.connections

    assert run(scenario) == (True, True, 3)


def test_a_large_body_read_slowly_arrives_whole_with_reading_paused():
    """A body of 8 buffers read slowly: the transport pauses reading instead of holding it all."""
    size = 8 * READ_BUFFER_BYTES
    payload = bytes(range(256)) * (size // 256)

    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + payload)) as upstream:
            transport = Http1Transport()
            response = await transport.handle_async_request(request(upstream.url))
            connection = next(iter(transport.busy))
            received, most = [], 0
            async for chunk in response.stream:
                received.append(chunk)
                most = max(most, connection.buffered)
                await asyncio.sleep(0.001)
            await response.aclose()
            await transport.aclose()
            return b"".join(received), most

    body, most = run(scenario)
    assert body == payload
    assert most <= READ_BUFFER_BYTES + (1 << 18)  # at most a buffer and the read in flight


def test_https_upstreams_are_reached_over_tls_with_the_host_s_name_checked(tmp_path):
    """A self-signed certificate for 127.0.0.1: trusted, the request goes through; not trusted, a ConnectError."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)

    async def scenario():
        upstream = Upstream(OK)
        server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, ssl=server_side)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        trusting = Http1Transport(ssl.create_default_context(cafile=str(cert)))
        try:
            response, body = await fetch(trusting, request(url))
            with pytest.raises(httpx.ConnectError):
                await Http1Transport(ssl.create_default_context()).handle_async_request(request(url))
        finally:
            await trusting.aclose()
            server.close()
        return response.status_code, body

    assert run(scenario) == (200, b"{}")

def test_a_request_given_up_on_mid_write_stops_sending_its_body():
    """WriteTimeout (a 504 to the client): the rest of the body must not reach the upstream afterwards."""
    size = 32 << 20

    async def scenario():
        upstream = Upstream(OK)

        async def late(reader, writer):  # reads nothing for a second, then the request
            await asyncio.sleep(1.0)
            await upstream.serve(reader, writer)

        server = await asyncio.start_server(late, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        transport = Http1Transport()
        with pytest.raises(httpx.WriteTimeout):
            await transport.handle_async_request(request(url, content=b"x" * size, timeout=0.3))
        await asyncio.sleep(2.0)
        server.close()
        return [len(body) for _, body in upstream.requests]

    assert run(scenario) == []  # the body's rest never reaches the upstream once the proxy gave up on it


def test_a_write_given_up_on_leaves_no_unretrieved_error():
    async def scenario():
        contexts = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: contexts.append(context))

        async def reset_soon(reader, writer):  # well after the write gave up, even on a loaded machine
            await asyncio.sleep(2.0)
            writer.transport.abort()

        server = await asyncio.start_server(reset_soon, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        transport = Http1Transport()
        with pytest.raises(httpx.WriteTimeout):
            await transport.handle_async_request(
                request(url, content=b"x" * (64 << 20), headers=[(b"content-length", b"1")], timeout=0.2))
        await asyncio.sleep(2.5)
        gc.collect()
        server.close()
        return [context.get("message") for context in contexts]

    assert run(scenario) == []


def test_an_answer_sent_before_the_upstream_closed_on_an_unread_body_is_returned():
    async def early(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await reader.read(65536)
        writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 7\r\nconnection: close\r\n\r\nno key!")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async def scenario():
        server = await asyncio.start_server(early, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        transport = Http1Transport()
        try:
            response, body = await fetch(transport, request(url, content=b"x" * (16 << 20)))
        finally:
            server.close()
        return response.status_code, body

    assert run(scenario) == (401, b"no key!")  # the upstream's answer, not a 502


def test_body_bytes_read_with_the_end_of_a_split_head_are_not_counted_as_head():
    async def scenario():
        connection = Connection((b"http", b"upstream", 80))
        rest = b"content-length: 300000\r\n\r\n"
        connection.data_received(b"HTTP/1.1 200 OK\r\n")  # the status line alone in one read
        connection.data_received(rest + b"x" * (262144 - len(rest)))  # one 256 KiB read (asyncio's recv size)
        return connection.head.done() and connection.head.exception() is None, connection.status

    assert run(scenario) == (True, 200)


def test_an_unknown_1xx_is_interim():
    async def scenario():
        async with Upstream(answer(b"HTTP/1.1 104 Upload Resumption Supported\r\n\r\n"
                                   b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")) as upstream:
            transport = Http1Transport()
            response, body = await fetch(transport, request(upstream.url))
            await transport.aclose()
            return response.status_code, body

    assert run(scenario) == (200, b"ok")


def test_a_body_framed_by_the_connection_s_end_cut_by_our_own_close_is_an_error():
    async def slow(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npart one;")
        await writer.drain()
        await asyncio.sleep(5)

    async def scenario():
        async with Upstream(slow) as upstream:
            transport = Http1Transport()
            response = await transport.handle_async_request(request(upstream.url))

            async def read():
                try:
                    return b"".join([chunk async for chunk in response.stream])
                except httpx.HTTPError as err:
                    return type(err)

            reader = asyncio.ensure_future(read())
            await asyncio.sleep(0.2)
            await transport.aclose()  # shutdown while the body streams
            return await reader

    assert run(scenario) is httpx.ReadError  # a cut body is never reported whole
