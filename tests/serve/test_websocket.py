"""The WebSocket relay of ``gem serve`` (`gemkernels.serve.websocket_relay`), through uvicorn with the options
``gem serve`` runs it with, to a websockets server on 127.0.0.1: messages byte for byte both ways and in order, the
handshake's headers, subprotocol and refusals, close codes both ways, the message limit, an unreachable upstream,
concurrent connections, the header timer and the metrics."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import random
import socket
import threading
import time
from http import HTTPStatus

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
websockets = pytest.importorskip("websockets")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from websockets.asyncio.server import serve  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from gemkernels.serve.app import ServerConfig, create_app  # noqa: E402
from gemkernels.serve.connections import uvicorn_options  # noqa: E402
from gemkernels.serve.upstreams import NoRedirects  # noqa: E402
from gemkernels.serve.workers import install_log_filters  # noqa: E402
from gemkernels.testing.fake_upstream import ServerThread, free_port  # noqa: E402

LIMIT = 1 << 20  # the proxy's max_message_bytes here
HEADER_S = 0.5  # the proxy's header timeout: an open WebSocket must outlive it
SUBPROTOCOL = "gem.test"


class WebSocketUpstream:
    """A websockets server on 127.0.0.1 (its own loop in a thread). Each connection echoes every message, records
    its handshake, the messages it got and the close it got; text commands ``cmd:close:CODE:REASON``,
    ``cmd:burst:N``, ``cmd:big:N`` (one binary message of N bytes) and ``cmd:drop`` (no close frame) script it.
    A path starting ``/v1/refused`` is answered 401 without an upgrade, ``/v1/moved`` 302 to ``moved_to``, and
    ``/v1/slow`` only after half a second."""

    def __init__(self) -> None:
        self.connections: list[dict] = []
        self.moved_to = ""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self.start(), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self):
        return await serve(self.handler, "127.0.0.1", 0, max_size=None, select_subprotocol=self.subprotocol,
                           process_request=self.refuse, process_response=self.answer_headers)

    @staticmethod
    def subprotocol(connection, offered):
        return SUBPROTOCOL if SUBPROTOCOL in offered else None

    async def refuse(self, connection, request):
        if request.path.startswith("/v1/refused"):
            response = connection.respond(HTTPStatus.UNAUTHORIZED, "no key for you\n")
            response.headers["x-request-id"] = "req-401"
            return response
        if request.path.startswith("/v1/moved"):
            response = connection.respond(HTTPStatus.FOUND, "moved\n")
            response.headers["Location"] = self.moved_to
            return response
        if request.path.startswith("/v1/slow"):
            await asyncio.sleep(0.5)
        return None

    @staticmethod
    def answer_headers(connection, request, response):
        response.headers["x-codex-turn-state"] = "ts-1"
        response.headers["openai-model"] = "gpt-test"

    async def handler(self, ws) -> None:
        record = {"path": ws.request.path, "headers": ws.request.headers, "subprotocol": ws.subprotocol,
                  "received": [], "close": None}
        self.connections.append(record)
        try:
            async for message in ws:
                record["received"].append(message)
                if isinstance(message, str) and message.startswith("cmd:"):
                    await self.command(ws, message.split(":"))
                else:
                    await ws.send(message)
        except ConnectionClosed:
            pass
        await ws.wait_closed()
        record["close"] = (ws.close_code, ws.close_reason)

    @staticmethod
    async def command(ws, parts: list[str]) -> None:
        if parts[1] == "close":
            await ws.close(int(parts[2]), parts[3])
        elif parts[1] == "burst":
            for i in range(int(parts[2])):
                await ws.send(f"event {i} é" if i % 2 else bytes([i % 256]) * i)
        elif parts[1] == "big":
            await ws.send(b"\x00" * int(parts[2]))
        elif parts[1] == "drop":
            ws.transport.abort()

    def connection(self, marker: str) -> dict:
        """The record of the connection whose path contains ``marker`` (waiting for it)."""
        return wait_for(lambda: next((c for c in self.connections if marker in c["path"]), None))

    def closed(self, marker: str) -> tuple[int, str]:
        record = self.connection(marker)
        return wait_for(lambda: record["close"])

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def wait_for(probe, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
    return value


@pytest.fixture(scope="module")
def upstreams():
    openai, anthropic = WebSocketUpstream(), WebSocketUpstream()
    yield openai, anthropic
    openai.stop()
    anthropic.stop()


def proxy_for(upstream: str, anthropic_upstream: str | None = None) -> ServerThread:
    config = ServerConfig(upstream=upstream, anthropic_upstream=anthropic_upstream, encoder="hash",
                          max_message_bytes=LIMIT)
    return ServerThread(create_app(config), **uvicorn_options(HEADER_S, 60.0, config.max_message_bytes))


@pytest.fixture(scope="module")
def proxy(upstreams):
    openai, anthropic = upstreams
    server = proxy_for(f"{openai.url}/v1", anthropic.url)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dead_proxy():
    server = proxy_for(f"http://127.0.0.1:{free_port()}/v1")
    yield server
    server.stop()


@pytest.fixture
def logs(proxy, dead_proxy):
    """Records of the proxy's and uvicorn's loggers (attached after the servers configured uvicorn's logging)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    install_log_filters()  # as gem serve runs: credentials redacted, a relayed refusal not an error
    loggers = [logging.getLogger(name) for name in ("gemkernels.serve", "uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)  # uvicorn logs each WebSocket's handshake line at info
        logger.addHandler(handler)
    yield records
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)
        logger.removeHandler(handler)


def ws_url(server: ServerThread, path: str) -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


def metric(server: ServerThread, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_messages_go_both_ways_byte_for_byte_and_in_order(proxy, upstreams):
    """Text as text, binary as binary, empty, non-ASCII, large (a text at the limit; random bytes, which deflate
    makes longer on the wire, at half of it), and hundreds sent at once: the upstream gets exactly what the client
    sent and the client exactly what the upstream sent, in order."""
    openai, _ = upstreams
    rng = random.Random(7)
    messages = ['{"type":"response.create","model":"m","input":[{"type":"message","content":"héllo 🦀"}]}',
                "", b"", os.urandom(1000), b"\x00\xff" * 10, "x" * LIMIT, os.urandom(LIMIT // 2)]
    messages += [rng.choice([f"delta {i}", os.urandom(i % 50)]) for i in range(400)]
    with connect(ws_url(proxy, "/v1/responses?t=order"), max_size=None) as ws:
        for message in messages:
            ws.send(message)
        echoed = [ws.recv(timeout=5) for _ in messages]
        ws.send("cmd:burst:300")
        burst = [ws.recv(timeout=5) for _ in range(300)]
    assert echoed == messages and [type(m) for m in echoed] == [type(m) for m in messages]
    assert openai.connection("t=order")["received"] == messages + ["cmd:burst:300"]
    assert burst == [f"event {i} é" if i % 2 else bytes([i % 256]) * i for i in range(300)]


def test_the_handshake_carries_the_clients_headers_and_subprotocol_and_the_upstreams_answer(proxy, upstreams, logs):
    """Authorization, OpenAI-Beta, the organisation, project and session headers and User-Agent reach the upstream
    once each and as sent, the query string too; hop-by-hop headers, X-GEM-Session and the client's own handshake
    key do not; the subprotocol the upstream picks and its response headers reach the client; the log names the
    connection without the credential."""
    openai, _ = upstreams
    sent = {"Authorization": "Bearer sk-secret-123", "OpenAI-Beta": "responses_websockets=2026-02-06",
            "OpenAI-Organization": "org-1", "OpenAI-Project": "proj-1", "session_id": "sess-42",
            "x-codex-turn-metadata": '{"turn_id":"t1"}', "ChatGPT-Account-ID": "acct-9"}
    hop_by_hop = {"Keep-Alive": "timeout=5", "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0", "TE": "trailers",
                  "X-GEM-Session": "gem-1"}
    with connect(ws_url(proxy, "/v1/responses?t=headers&api_key=qs-secret"), additional_headers={**sent, **hop_by_hop},
                 user_agent_header="codex_cli_rs/0.99 (test)", subprotocols=["other", SUBPROTOCOL]) as ws:
        assert ws.subprotocol == SUBPROTOCOL
        assert ws.response.headers["x-codex-turn-state"] == "ts-1" and ws.response.headers["openai-model"] == "gpt-test"
        client_key = ws.request.headers["Sec-WebSocket-Key"]
    record = openai.connection("t=headers")
    got = record["headers"]
    assert record["path"] == "/v1/responses?t=headers&api_key=qs-secret" and record["subprotocol"] == SUBPROTOCOL
    for name, value in {**sent, "User-Agent": "codex_cli_rs/0.99 (test)"}.items():
        assert got.get_all(name) == [value], name
    for name in hop_by_hop:
        assert name not in got, name
    assert got.get_all("Host") == [f"127.0.0.1:{openai.port}"] and got["Sec-WebSocket-Key"] != client_key
    lines = [r.getMessage() for r in logs if r.name == "gemkernels.serve"]
    assert any("websocket relayed unchanged" in line and "api_key=[redacted]" in line for line in lines), lines
    handshakes = [r.getMessage() for r in logs if r.name == "uvicorn.error" and "[accepted]" in r.getMessage()]
    assert any("api_key=[redacted]" in line for line in handshakes), handshakes  # uvicorn's own line, redacted
    assert not any("qs-secret" in line or "sk-secret" in line for r in logs for line in [r.getMessage()])


def test_each_path_goes_to_the_upstream_an_http_request_would(proxy, upstreams):
    """``/v1/responses`` to the OpenAI-format upstream, ``/v1/messages`` and any path with ``anthropic-version`` to
    the Anthropic-format one (its root has no ``/v1``: the path is kept whole)."""
    openai, anthropic = upstreams
    for path, headers, upstream in [("/v1/responses?t=route-openai", {}, openai),
                                    ("/v1/messages?t=route-messages", {}, anthropic),
                                    ("/v1/other?t=route-version", {"anthropic-version": "2023-06-01"}, anthropic)]:
        with connect(ws_url(proxy, path), additional_headers=headers) as ws:
            ws.send("ping")
            assert ws.recv(timeout=5) == "ping"
        assert upstream.connection(path.split("?")[1])["path"] == path


def test_close_codes_and_reasons_go_both_ways(proxy, upstreams):
    """The client's close code and reason reach the upstream, the upstream's reach the client; an upstream that
    drops its connection without a close drops the client's too (1006)."""
    openai, _ = upstreams
    with connect(ws_url(proxy, "/v1/responses?t=client-close")) as ws:
        ws.send("hi")
        ws.recv(timeout=5)
        ws.close(4000, "client done")
    assert openai.closed("t=client-close") == (4000, "client done")
    with connect(ws_url(proxy, "/v1/responses?t=normal-close")) as ws:
        ws.close()
    assert openai.closed("t=normal-close") == (1000, "")
    with connect(ws_url(proxy, "/v1/responses?t=upstream-close")) as ws:
        ws.send("cmd:close:4001:upstream done ✓")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "upstream done ✓")
    assert openai.closed("t=upstream-close") == (4001, "upstream done ✓")
    with connect(ws_url(proxy, "/v1/responses?t=drop")) as ws:
        ws.send("cmd:drop")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is None and ws.close_code == 1006


def test_an_upstream_refusal_is_the_clients_answer(proxy, upstreams, logs):
    """An upstream that answers without upgrading (401) has its status, body and headers relayed to the client, as
    a client facing the upstream itself would get them (Codex falls back to HTTP on such an answer); no error is
    logged for it."""
    refused = metric(proxy, "gem_websocket_connections_total", result="refused")
    with pytest.raises(InvalidStatus) as err:
        connect(ws_url(proxy, "/v1/refused?t=refused"), open_timeout=5)
    response = err.value.response
    assert response.status_code == 401 and response.body == b"no key for you\n"
    assert response.headers["x-request-id"] == "req-401"
    assert metric(proxy, "gem_websocket_connections_total", result="refused") == refused + 1
    time.sleep(0.2)  # uvicorn logs after the app returned
    assert not [r for r in logs if r.levelno >= logging.ERROR], [r.getMessage() for r in logs]


def test_an_upstream_redirect_is_relayed_not_followed(proxy, upstreams):
    """A 302 from the upstream goes to the client as the handshake's answer; the proxy never takes the client's
    credentials to the other host (a client that follows it does so itself)."""
    openai, anthropic = upstreams
    openai.moved_to = f"ws://127.0.0.1:{anthropic.port}/moved-here"

    async def handshake():
        async with NoRedirects(ws_url(proxy, "/v1/moved"), additional_headers={"api-key": "azure-secret"},
                               open_timeout=5):
            return None

    with pytest.raises(InvalidStatus) as err:
        asyncio.run(handshake())
    assert err.value.response.status_code == 302 and err.value.response.headers["Location"] == openai.moved_to
    time.sleep(0.2)
    assert not [c for c in anthropic.connections if "moved-here" in c["path"]]


def test_a_client_that_leaves_during_the_upstream_handshake_closes_the_upstream_as_a_drop(proxy, upstreams):
    """The client goes while the upstream is still answering: the upstream gets an empty close (as for any client
    that drops), not an internal error, and nothing is counted as relayed."""
    openai, _ = upstreams
    relayed = metric(proxy, "gem_websocket_connections_total", result="relayed")
    with socket.create_connection(("127.0.0.1", proxy.port)) as raw:
        raw.sendall(upgrade_request("/v1/slow-leaver").encode())
        time.sleep(0.1)
    assert openai.closed("slow-leaver")[0] == 1005  # no status: an empty close frame
    assert metric(proxy, "gem_websocket_connections_total", result="relayed") == relayed


@pytest.mark.parametrize("extra", ["Content-Length: 5", "Transfer-Encoding: chunked"], ids=["body", "chunked"])
def test_an_upgrade_the_websocket_protocol_cannot_take_is_closed_at_the_header_timeout(proxy, extra):
    """An upgrade request whose handshake never starts (websockets refuses a body on it and answers nothing) is
    closed when the header timeout passes, as a slow client's headers are: no connection held forever."""
    with socket.create_connection(("127.0.0.1", proxy.port)) as raw:
        raw.sendall(upgrade_request("/v1/responses", method="POST", extra=extra).encode())
        raw.settimeout(HEADER_S * 6)
        started = time.monotonic()
        while raw.recv(65536):
            pass
        assert time.monotonic() - started < HEADER_S * 6


def upgrade_request(path: str, method: str = "GET", extra: str = "") -> str:
    """A WebSocket upgrade request's head, with ``extra`` header lines."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", *([extra] if extra else [])]
    return "\r\n".join(lines) + "\r\n\r\n"


def test_an_unreachable_upstream_closes_the_client_with_1014_and_http_goes_on(dead_proxy, logs):
    """No upstream listening: the client is accepted and closed with 1014 (bad gateway) and the reason, the server
    logs no error, counts it, and answers HTTP as before."""
    with connect(ws_url(dead_proxy, "/v1/responses"), open_timeout=5) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1014 and "could not be reached" in closed.value.rcvd.reason
    assert not [r for r in logs if r.levelno >= logging.ERROR], [r.getMessage() for r in logs]
    assert httpx.get(f"{dead_proxy.url}/healthz").status_code == 200
    assert metric(dead_proxy, "gem_websocket_connections_total", result="unreachable") == 1
    assert metric(dead_proxy, "gem_upstream_errors_total", kind="unreachable") == 1


def test_a_message_past_the_limit_closes_both_sides_with_1009(proxy, upstreams):
    """A client message one byte past ``max_message_bytes`` closes the client with 1009 and the upstream likewise,
    which never gets it; so does an upstream message past it."""
    openai, _ = upstreams
    with connect(ws_url(proxy, "/v1/responses?t=big-up"), max_size=None) as ws:
        ws.send(b"\x01" * (LIMIT + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1009
    assert openai.closed("t=big-up")[0] == 1009 and openai.connection("t=big-up")["received"] == []
    with connect(ws_url(proxy, "/v1/responses?t=big-down"), max_size=None) as ws:
        ws.send(f"cmd:big:{LIMIT + 1}")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1009 and openai.closed("t=big-down")[0] == 1009


def test_concurrent_connections_keep_apart(proxy, upstreams):
    """Two connections at once, their messages interleaved: each gets its own echoes, and closing one leaves the
    other working."""
    openai, _ = upstreams
    with connect(ws_url(proxy, "/v1/responses?t=pair-a")) as a, connect(ws_url(proxy, "/v1/responses?t=pair-b")) as b:
        for i in range(50):
            a.send(f"a{i}")
            b.send(f"b{i}".encode())
        assert [a.recv(timeout=5) for _ in range(50)] == [f"a{i}" for i in range(50)]
        assert [b.recv(timeout=5) for _ in range(50)] == [f"b{i}".encode() for i in range(50)]
        a.close(4002, "a done")
        b.send("still here")
        assert b.recv(timeout=5) == "still here"
    assert openai.closed("t=pair-a") == (4002, "a done") and openai.closed("t=pair-b") == (1000, "")
    assert openai.connection("t=pair-b")["received"] == [f"b{i}".encode() for i in range(50)] + ["still here"]


def test_an_open_websocket_outlives_the_header_timeout(proxy):
    """The header timer of the HTTP connection it was upgraded from does not close a WebSocket."""
    with connect(ws_url(proxy, "/v1/responses?t=long")) as ws:
        time.sleep(HEADER_S * 2)
        ws.send("after the header timeout")
        assert ws.recv(timeout=5) == "after the header timeout"


def test_the_metrics_count_connections_and_messages(proxy, upstreams):
    """Relayed connections, messages each way and the websocket passthrough reason are counted; the open gauge
    returns to zero once they close."""
    names = [("gem_websocket_connections_total", {"result": "relayed"}),
             ("gem_websocket_messages_total", {"direction": "to_upstream"}),
             ("gem_websocket_messages_total", {"direction": "to_client"}),
             ("gem_passthroughs_total", {"reason": "websocket"})]
    before = [metric(proxy, name, **labels) for name, labels in names]
    for n in range(2):
        with connect(ws_url(proxy, f"/v1/responses?t=metrics-{n}")) as ws:
            for i in range(5):
                ws.send(f"m{i}")
                ws.recv(timeout=5)
    after = [metric(proxy, name, **labels) for name, labels in names]
    assert [a - b for a, b in zip(after, before)] == [2, 10, 10, 2]
    wait_for(lambda: metric(proxy, "gem_websocket_open") == 0 or None)


def test_header_values_come_back_as_the_bytes_they_were_on_any_websockets_version():
    """ISO-8859-1 text (websockets 17) and UTF-8 with surrogate escapes (earlier versions) both give the bytes back:
    an odd header value never fails the handshake."""
    from gemkernels.serve.websocket_relay import header_bytes

    raw = b"caf\xe9 \xff"
    assert header_bytes(raw.decode("latin-1")) == raw
    assert header_bytes(raw.decode("utf-8", "surrogateescape")) == raw
    assert header_bytes("plain") == b"plain"
