"""Connection timeouts of ``gem serve`` on a real uvicorn (`gemkernels.serve.connections`, ``read_body``'s 408):
idle and slowloris connections are closed after the header timeout, a stalled body gets a 408, keep-alive
connections keep working across the header timeout and after error responses.

Raw sockets speak HTTP through h11 (`Wire`), so that each test knows which connection a request used and when the
server closed it. The timeouts are short (`HEADER_S`, `KEEP_ALIVE_S`, `BODY_S`); waits for a close poll up to
`WAIT_S`, so a loaded machine only makes a test slower."""

from __future__ import annotations

import json
import logging
import select
import socket
import time
import types

import pytest

httpx = pytest.importorskip("httpx")
h11 = pytest.importorskip("h11")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402
from gemkernels.serve.connections import HeaderDeadline, http_protocol, http_protocol_on, uvicorn_options  # noqa: E402
from gemkernels.serve.redact import QueryCredentialFilter  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread, free_port  # noqa: E402

HEADER_S = 0.5
KEEP_ALIVE_S = 2.0
BODY_S = 1.0
WAIT_S = 10.0  # the longest any wait polls: far past every timeout, for a loaded machine
MAX_BODY = 10_000
CHAT = "/v1/chat/completions"


def chat_body(model: str = "m") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def base_protocol(name: str) -> type:
    if name == "httptools":
        pytest.importorskip("httptools")
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


@pytest.fixture(scope="module")
def upstream():
    server = ServerThread(FakeUpstream().app())
    yield server.url
    server.stop()


@pytest.fixture(scope="module", params=["h11", "httptools"])
def proxy(request, upstream):
    """The proxy on uvicorn with each HTTP protocol (httptools where installed), short timeouts."""
    config = ServerConfig(upstream=upstream + "/v1", encoder="hash", timeout=0.5, max_body_bytes=MAX_BODY,
                          body_timeout=BODY_S)
    server = ServerThread(create_app(config), http=http_protocol_on(base_protocol(request.param), HEADER_S),
                          timeout_keep_alive=KEEP_ALIVE_S, ws="none")
    yield server
    server.stop()


class Wire:
    """One client connection on a raw socket, HTTP spoken through an h11 client."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.opened = time.monotonic()
        self.http = h11.Connection(h11.CLIENT)

    def request(self, method: str, path: str, body: bytes = b"", headers: tuple = (),
                declared: int | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
        """Send a request (headers alone when ``declared`` gives a larger length than ``body``) and read the
        response: status, lower-case headers, body."""
        length = len(body) if declared is None else declared
        head = [(b"host", b"127.0.0.1"), (b"content-length", str(length).encode()), *headers]
        self.sock.sendall(self.http.send(h11.Request(method=method, target=path, headers=head)))
        try:
            if body:
                self.sock.sendall(self.http.send(h11.Data(data=body)))
            if declared is None:
                self.sock.sendall(self.http.send(h11.EndOfMessage()))
        except (BrokenPipeError, ConnectionResetError):  # answered before the body was sent: read that, as httpx does
            pass
        return self.response()

    def response(self) -> tuple[int, dict[bytes, bytes], bytes]:
        status, headers, body = 0, {}, bytearray()
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                self.http.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, dict(event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"the connection ended before the response did: {event!r}")
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
        return status, headers, bytes(body)

    def closed(self, wait: float = 0.0) -> bool:
        """Whether the server closed the connection (EOF or reset) within ``wait`` seconds; bytes are an error."""
        if not select.select([self.sock], [], [], wait)[0]:
            return False
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return True
        assert data == b"", f"unexpected bytes from the server: {data[:80]!r}"
        return True

    def close(self) -> None:
        self.sock.close()


def wait_closed(wire: Wire, wait: float = WAIT_S) -> float:
    """Seconds from ``wire``'s opening until the server closed it; fails past ``wait``."""
    assert wire.closed(wait), f"the server kept the connection open for {wait} s"
    return time.monotonic() - wire.opened


def healthz(proxy: ServerThread) -> int:
    return httpx.get(proxy.url + "/healthz", timeout=WAIT_S).status_code


def test_idle_connections_are_closed_after_the_header_timeout_and_healthz_answers_meanwhile(proxy):
    """50 connections that never send a byte are all closed from HEADER_S on (uvicorn alone held them forever),
    and ``/healthz`` answers on fresh connections while they are open."""
    wires = [Wire(proxy.port) for _ in range(50)]
    try:
        open_wires, closed_after, health = set(wires), [], []
        deadline = time.monotonic() + WAIT_S
        while open_wires and time.monotonic() < deadline:
            health.append(healthz(proxy))
            for sock in select.select([w.sock for w in open_wires], [], [], 0.05)[0]:
                wire = next(w for w in open_wires if w.sock is sock)
                assert wire.closed()
                open_wires.discard(wire)
                closed_after.append(time.monotonic() - wire.opened)
        assert not open_wires, f"{len(open_wires)} of 50 idle connections still open after {WAIT_S} s"
        assert min(closed_after) >= HEADER_S * 0.9 and health and set(health) == {200}
        assert healthz(proxy) == 200
    finally:
        for wire in wires:
            wire.close()


@pytest.mark.parametrize("after_a_response", [False, True], ids=["fresh", "after_a_response"])
def test_a_slowloris_client_is_closed_after_the_header_timeout(proxy, after_a_response):
    """Request headers sent a byte every 0.2 s never complete: the connection is closed HEADER_S after it opened
    (or after the first byte of the next request, on a keep-alive connection whose timer uvicorn cancels then)."""
    wire = Wire(proxy.port)
    try:
        if after_a_response:
            assert wire.request("GET", "/healthz")[0] == 200
        started = time.monotonic()
        wire.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-pad: ")
        while time.monotonic() - started < WAIT_S:
            try:
                wire.sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            if wire.closed(0.2):
                break
        else:
            pytest.fail(f"a slowloris client was held for {WAIT_S} s")
        assert time.monotonic() - started >= HEADER_S * 0.9
    finally:
        wire.close()


def test_a_stalled_body_gets_a_408_and_the_connection_closes(proxy):
    """Headers complete, 10 of 1,000 declared bytes, then nothing: a 408 JSON error with ``Connection: close``
    BODY_S later, and the server closes (uvicorn alone waited forever); counted in the metrics."""
    wire = Wire(proxy.port)
    try:
        started = time.monotonic()
        status, headers, body = wire.request("POST", CHAT, b'{"model": ', declared=1000)
        assert status == 408 and json.loads(body)["error"]["type"] == "request_timeout"
        assert headers[b"connection"] == b"close" and time.monotonic() - started >= BODY_S * 0.9
        wait_closed(wire)
    finally:
        wire.close()
    metrics = httpx.get(proxy.url + "/metrics", timeout=WAIT_S).text
    assert f'gem_requests_total{{action="body_timeout",route="{CHAT}"}}' in metrics


def test_a_stalled_relayed_upload_gets_a_408_too(proxy):
    """The relay streams a body to the upstream; one that stops sending gets the same 408 after BODY_S (before,
    it was held until the upstream's write timeout, 600 s by default)."""
    wire = Wire(proxy.port)
    try:
        started = time.monotonic()
        status, headers, body = wire.request("PUT", "/v1/files/upload", b"0123456789", declared=1000)
        assert status == 408 and json.loads(body)["error"]["type"] == "request_timeout"
        assert headers[b"connection"] == b"close" and BODY_S * 0.9 <= time.monotonic() - started < WAIT_S
    finally:
        wire.close()


def test_a_slow_body_that_keeps_coming_is_not_cut():
    """The body timeout is one of inactivity: a body sent a byte every 0.1 s for longer than the timeout in all
    is read and forwarded (read_body on its own, in process)."""
    from starlette.testclient import TestClient

    received: list[bytes] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(request.content)
        return httpx.Response(200, json={"ok": True})

    raw = chat_body()
    app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash", body_timeout=0.4),
                     transport=httpx.MockTransport(upstream))

    def trickle():
        for i in range(0, len(raw), len(raw) // 8 + 1):
            time.sleep(0.1)
            yield raw[i:i + len(raw) // 8 + 1]

    with TestClient(app, raise_server_exceptions=False) as client:
        started = time.monotonic()
        reply = client.post(CHAT, content=trickle(), headers={"content-type": "application/json"})
        assert reply.status_code == 200 and received == [raw] and time.monotonic() - started > 0.4


def test_a_keep_alive_connection_outlives_the_header_timeout_then_closes_after_the_keep_alive_timeout(proxy):
    """Requests on one connection spaced past HEADER_S (under KEEP_ALIVE_S) all succeed on it; idle after the last
    response, it is closed KEEP_ALIVE_S later, by the server."""
    wire = Wire(proxy.port)
    try:
        for _ in range(2):
            status, _, body = wire.request("POST", CHAT, chat_body(), ((b"content-type", b"application/json"),))
            assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "got 1"
            answered = time.monotonic()
            assert not wire.closed(HEADER_S * 1.6)
        assert wire.closed(WAIT_S), f"an idle keep-alive connection was held for {WAIT_S} s"
        assert time.monotonic() - answered >= KEEP_ALIVE_S * 0.9
    finally:
        wire.close()


ERRORS = {  # name -> (method, path, body, declared length or None, expected status)
    "413_declared_too_large": ("POST", CHAT, b"", MAX_BODY + 1, 413),
    "413_sent_too_large": ("POST", CHAT, b"x" * (4 * MAX_BODY), None, 413),
    "400_compress_malformed": ("POST", "/v1/gem/compress", b"not json", None, 400),
    "400_upstream_relayed": ("POST", CHAT, b"not json", None, 400),
    "500_upstream_relayed": ("POST", CHAT, chat_body("fail"), None, 500),
    "504_upstream_timeout": ("POST", CHAT, chat_body("hang"), None, 504),
    "404_upstream_relayed": ("GET", "/missing/route", b"", None, 404),
}


def assert_usable_or_closed(wire: Wire, port: int, status: int, headers: dict[bytes, bytes]) -> None:
    """After an error response the connection either serves the next request, or the response said
    ``Connection: close`` and the server closed it."""
    if headers.get(b"connection") == b"close":
        wait_closed(wire)
        wire = Wire(port)
    else:
        assert not wire.closed(0.05), f"the server closed the connection after a {status} without saying so"
    assert wire.request("POST", CHAT, chat_body())[0] == 200
    wire.close()


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_after_an_error_the_connection_serves_the_next_request_or_says_it_closes(proxy, case):
    method, path, body, declared, expected = ERRORS[case]
    wire = Wire(proxy.port)
    status, headers, _ = wire.request(method, path, body, declared=declared)
    assert status == expected
    assert_usable_or_closed(wire, proxy.port, status, headers)


def test_after_a_502_the_connection_serves_the_next_request_or_says_it_closes():
    dead = ServerThread(create_app(ServerConfig(upstream=f"http://127.0.0.1:{free_port()}/v1", encoder="hash")),
                        **uvicorn_options(HEADER_S, KEEP_ALIVE_S))
    try:
        wire = Wire(dead.port)
        status, _, body = wire.request("POST", CHAT, chat_body())
        assert status == 502 and json.loads(body)["error"]["type"] == "upstream_unreachable"
        assert not wire.closed(0.05) and wire.request("GET", "/healthz")[0] == 200
        wire.close()
    finally:
        dead.stop()


def test_uvicorn_options_pick_uvicorns_protocol_and_the_guard_names_what_is_missing():
    """``http_protocol`` wraps uvicorn's own pick (httptools when installed, else h11); a protocol without the
    attributes HeaderDeadline reads fails on its first connection with their names, not on a timer later."""
    import asyncio

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    options = uvicorn_options(1.5, 9.0, 1234)
    assert options["timeout_keep_alive"] == 9.0 and options["ws"] == "auto" and options["ws_max_size"] == 1234
    assert issubclass(options["http"], HeaderDeadline) and issubclass(options["http"], AutoHTTPProtocol)
    assert http_protocol(3.0).header_timeout == 3.0
    with pytest.raises(TypeError, match="cycle, loop, transport"):
        http_protocol_on(asyncio.Protocol, 1.0)()
    with pytest.raises(ValueError):
        http_protocol_on(AutoHTTPProtocol, 0)


def test_gem_serve_passes_the_timeouts_to_uvicorn(monkeypatch):
    """``gem serve``'s flags reach uvicorn (protocol class, keep-alive, the WebSocket message limit) and the app's
    config; uvicorn's WebSocket lines get the credential filter."""
    import uvicorn

    import gemkernels.serve.app
    from gemkernels.cli import build_parser

    for name in ("gemkernels", "uvicorn.access", "uvicorn.error"):  # run() sets a level, adds filters: none outlive it
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "filters", list(logger.filters))
        monkeypatch.setattr(logger, "setLevel", lambda level: None)
    seen: dict = {}
    monkeypatch.setattr(gemkernels.serve.app, "create_app", lambda config: seen.update(config=config))
    monkeypatch.setattr(uvicorn, "Server", lambda config: types.SimpleNamespace(
        run=lambda sockets=None: seen.update(http=config.http, timeout_keep_alive=config.timeout_keep_alive,
                                             ws=config.ws, ws_max_size=config.ws_max_size)))
    args = build_parser().parse_args(["serve", "--upstream", "http://127.0.0.1:9", "--encoder", "hash",
                                      "--header-timeout", "2.5", "--keep-alive-timeout", "7", "--body-timeout", "4",
                                      "--max-message-mb", "2"])
    assert args.func(args) == 0
    assert seen["http"].header_timeout == 2.5 and issubclass(seen["http"], HeaderDeadline)
    assert seen["timeout_keep_alive"] == 7.0 and seen["ws"] == "auto" and seen["config"].body_timeout == 4.0
    assert seen["ws_max_size"] == seen["config"].max_message_bytes == 2 << 20
    assert any(isinstance(f, QueryCredentialFilter) for f in logging.getLogger("uvicorn.error").filters)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream", "http://u", "--header-timeout", "0"])
