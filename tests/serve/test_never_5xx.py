"""Requests the proxy could forward are forwarded, never answered with a 5xx of its own: bodies it cannot read or
compress go out byte for byte with the reason in the metrics, header bytes pass both ways as sent, and nothing is
added to what the client sent (the ASGI app in process, the upstream an httpx MockTransport)."""

from __future__ import annotations

import json
import logging

import anyio
import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
from helpers import EXAMPLE  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gemkernels import GEM  # noqa: E402
from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402

MESSAGES = json.loads(EXAMPLE.read_text())["messages"]
JSON = {"content-type": "application/json"}


@pytest.fixture
def proxy():
    """(client, the requests the upstream received); the client adds no headers of its own."""
    received: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(request)
        return httpx.Response(200, json={"ok": True})

    app = create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash"),
                     transport=httpx.MockTransport(upstream))
    with TestClient(app, raise_server_exceptions=False) as client:
        for name in ("accept", "accept-encoding", "user-agent"):
            client.headers.pop(name, None)
        yield client, received


def passthroughs(client: TestClient) -> str:
    return "\n".join(line for line in client.get("/metrics").text.splitlines() if line.startswith("gem_passthroughs"))


@pytest.mark.parametrize("case", ["nested-3000-deep", "tool-call-id-a-list"])
def test_bodies_it_cannot_compress_go_out_byte_for_byte(proxy, case):
    client, received = proxy
    messages = json.loads(json.dumps(MESSAGES))
    if case == "nested-3000-deep":
        raw = b'{"model": "m", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    else:
        messages[3]["tool_call_id"] = ["call", 1]
        raw = json.dumps({"model": "m", "messages": messages}).encode()
    reply = client.post("/v1/chat/completions", content=raw, headers=JSON)
    assert reply.status_code == 200 and received[-1].content == raw
    assert passthroughs(client)  # the reason is counted


@pytest.mark.parametrize("case", ["escaped", "raw-bytes"])
def test_a_lone_surrogate_is_forwarded_as_sent_in_a_cut_body(proxy, case):
    """A lone surrogate (``\\ud800``, or ED A0 80, which is not UTF-8) is text like any other: the body goes out
    as the client's bytes less whole messages, the surrogate's bytes among them as sent (the hash encoder raised on
    it, so such bodies went out uncut)."""
    client, received = proxy
    messages = json.loads(json.dumps(MESSAGES))
    if case == "escaped":
        messages[1]["content"] = "x\ud800y " + messages[1]["content"]
        raw, mark = json.dumps({"model": "m", "messages": messages}).encode(), b"x\\ud800y"
    else:
        messages[1]["content"] = "MARK " + messages[1]["content"]
        raw = json.dumps({"model": "m", "messages": messages}).encode().replace(b"MARK", b"\xed\xa0\x80", 1)
        mark = b"\xed\xa0\x80"
    reply = client.post("/v1/chat/completions", content=raw, headers=JSON)
    sent = received[-1].content
    assert reply.status_code == 200 and mark in sent and len(sent) < len(raw)
    original = json.loads(raw.decode("utf-8", "surrogatepass"))["messages"]
    forwarded = json.loads(sent.decode("utf-8", "surrogatepass"))["messages"]
    at = iter(range(len(original)))
    assert all(any(original[i] == message for i in at) for message in forwarded)  # an ordered sub-list


DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000  # a JSON string nested past json.loads' depth


@pytest.mark.parametrize(("path", "history"), [("/v1/chat/completions", "messages"), ("/v1/messages", "messages"),
                                               ("/v1/responses", "input")])
def test_a_session_name_nested_past_the_parsers_depth_is_forwarded(proxy, path, history):
    """``metadata.user_id`` that starts with ``{`` is parsed for Claude Code's ``session_id``: one nested past the
    parser's depth raised RecursionError, a 500 of the proxy's own, and nothing went upstream."""
    client, received = proxy
    raw = json.dumps({"model": "m", "max_tokens": 5, "metadata": {"user_id": DEEP},
                      history: [{"role": "user", "content": "hi"}]}).encode()
    reply = client.post(path, content=raw, headers=JSON)
    assert reply.status_code == 200 and received[-1].content == raw


@pytest.mark.parametrize("where", ["session_of", "cut_body"])
def test_a_failure_of_the_proxys_own_goes_out_as_sent_with_its_reason(proxy, monkeypatch, caplog, where):
    """Whatever raises around GEM's call (naming the session before it, cutting the body after it) forwards the
    client's bytes, counts ``internal_error`` and logs the traceback, instead of a 500."""
    from gemkernels.serve import serving

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(serving, where, broken)
    client, received = proxy
    raw = json.dumps({"model": "m", "messages": MESSAGES}).encode()  # long enough to compress
    with caplog.at_level(logging.ERROR, logger="gemkernels"):
        reply = client.post("/v1/chat/completions", content=raw, headers=JSON)
    assert reply.status_code == 200 and received[-1].content == raw
    assert 'gem_passthroughs_total{reason="internal_error"} 1.0' in passthroughs(client)
    assert any(record.exc_info for record in caplog.records)


@pytest.mark.parametrize("literal", [b"1e400", b"NaN", b"-Infinity", b"1.50E+2"])
def test_the_compress_endpoint_answers_with_the_kept_messages_bytes_as_sent(proxy, literal):
    """Its messages are the client's bytes less whole messages, as the proxy forwards them: a number JSON cannot
    write again (1e400 was read as inf) answered 500 when they were written anew."""
    from gemkernels.serve.body import parse_body

    client, _ = proxy
    messages = json.loads(json.dumps(MESSAGES))
    messages[-1]["n"] = "MARK"  # in the newest message, which is always kept
    raw = json.dumps({"messages": messages}, indent=1).encode().replace(b'"MARK"', literal)
    reply = client.post("/v1/gem/compress", content=raw, headers=JSON)
    assert reply.status_code == 200

    def elements(data: bytes) -> list[bytes]:
        return [data[a:b] for a, b in parse_body(data, "messages")[1].elements]

    sent, kept = elements(raw), elements(reply.content)
    assert len(kept) < len(sent) and kept[-1] == sent[-1] and literal in kept[-1]
    at = iter(sent)
    assert all(any(element == s for s in at) for element in kept)  # an ordered sub-list of the sent bytes
    assert json.loads(reply.content)["stats"]["messages_after"] == len(kept)


def test_the_compress_endpoint_answers_valid_json_for_a_lone_surrogate(proxy):
    client, _ = proxy
    messages = json.loads(json.dumps(MESSAGES))
    messages[2]["content"] = "x\ud800y"
    reply = client.post("/v1/gem/compress", content=json.dumps({"messages": messages}).encode(), headers=JSON)
    assert reply.status_code == 200 and json.loads(reply.content)["messages"][2]["content"] == "x\ud800y"


def test_header_bytes_pass_both_ways_as_sent_and_nothing_is_added():
    """Over real sockets (the in-process test client cannot carry non-ASCII header bytes): a UTF-8 request header
    and a UTF-8 response header arrive as the same bytes; no Accept-Encoding, Accept or User-Agent is added, and the
    answer carries one Date and one Server (the upstream's were relayed beside uvicorn's)."""
    pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from gemkernels.testing.fake_upstream import ServerThread

    received: list[tuple[list[tuple[bytes, bytes]], bytes]] = []

    async def chat(request):
        received.append((request.headers.raw, await request.body()))
        reply = Response(b'{"ok": true}', media_type="application/json")
        reply.raw_headers.append((b"x-reply", "réponse ✓".encode()))
        return reply

    upstream = ServerThread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    server = ServerThread(create_app(ServerConfig(upstream=upstream.url + "/v1", preset="core", encoder="hash")))
    try:
        with httpx.Client() as client:
            for name in ("accept", "accept-encoding", "user-agent"):
                client.headers.pop(name, None)
            reply = client.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES[:4]},
                                headers=[(b"x-note", "café ✓".encode()), (b"authorization", b"Bearer sk-1")])
    finally:
        server.stop()
        upstream.stop()
    assert reply.status_code == 200 and reply.json() == {"ok": True}
    sent = dict(received[-1][0])
    assert sent[b"x-note"] == "café ✓".encode() and sent[b"authorization"] == b"Bearer sk-1"
    assert not {b"accept-encoding", b"user-agent", b"accept"} & set(sent)
    assert dict(reply.headers.raw)[b"x-reply"] == "réponse ✓".encode()
    names = [name.lower() for name, _ in reply.headers.raw]  # uvicorn writes its Date and Server: not twice
    assert names.count(b"date") == 1 and names.count(b"server") == 1


def test_a_cookie_the_upstream_sets_is_relayed_to_its_client_and_never_sent_on_anyones_later_request():
    """An upstream's ``Set-Cookie`` (Cloudflare sets ``__cf_bm`` on API answers) is the client's to keep: the proxy
    relays it and sends no ``Cookie`` the client did not (an httpx client's cookie jar replayed one tenant's
    cookies on every later request, whoever sent it)."""
    pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from gemkernels.testing.fake_upstream import ServerThread

    received: list[dict[bytes, bytes]] = []

    async def chat(request):
        received.append(dict(request.headers.raw))
        reply = Response(b'{"ok": true}', media_type="application/json")
        reply.set_cookie("__cf_bm", f"tenant-{len(received)}", path="/", domain=None)
        return reply

    upstream = ServerThread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    server = ServerThread(create_app(ServerConfig(upstream=upstream.url + "/v1", preset="core", encoder="hash")))
    try:
        answers = []
        for key in ("sk-a", "sk-b", "sk-b"):
            with httpx.Client() as client:  # a fresh client each time: it keeps no cookie either
                answers.append(client.post(server.url + "/v1/chat/completions",
                                           json={"model": "m", "messages": MESSAGES[:4]},
                                           headers={"authorization": f"Bearer {key}"}))
    finally:
        server.stop()
        upstream.stop()
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.cookies.get("__cf_bm") for a in answers] == ["tenant-1", "tenant-2", "tenant-3"]
    assert [b"cookie" in headers for headers in received] == [False, False, False]
def test_a_message_longer_than_the_tokenizer_takes_is_counted_in_pieces():
    """bpe-openai refuses a text of more than 200,000 tokens; such an output disabled compression for the rest of
    the session (every request failed counting the same block)."""
    pytest.importorskip("bpe_openai")
    from gemkernels.compress.tokens import o200k_encode, pieces

    messages = json.loads(json.dumps(MESSAGES))
    messages[5]["content"] = "ab cd " * 200_000  # 400,000 tokens
    gem = GEM("core", encoder="hash")
    for _ in range(2):
        stats = gem.compress(messages, session_id="long").stats
        assert stats.action in ("reselected", "appended") and stats.tokens_before > 400_000, stats.reason
    text = "word " * 50_000 + "x" * 250_000
    cut = pieces(text, 100_000)
    assert "".join(cut) == text and all(len(p) <= 100_000 for p in cut) and cut[0].endswith(" ")
    assert len(o200k_encode()(text)) > 0



def asgi_get(client: TestClient, raw_path: bytes, query: bytes) -> list[dict]:
    """The ASGI messages the app sends for a GET of ``raw_path`` and ``query`` as bytes a server parsed (uvicorn's
    httptools protocol passes bytes that no httpx client can send, so the request skips the test client)."""
    sent: list[dict] = []

    async def call() -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": raw_path.decode("utf-8", "replace"), "raw_path": raw_path,
                 "query_string": query, "headers": [(b"host", b"proxy")], "client": ("127.0.0.1", 1),
                 "server": ("proxy", 80)}

        requested = False

        async def receive() -> dict:
            nonlocal requested
            if requested:  # the client stays connected until the response is complete
                await anyio.sleep_forever()
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        try:
            await client.app(scope, receive, send)
        except Exception:  # Starlette re-raises what it answered 500 for
            pass

    client.portal.call(call)
    return sent


def test_a_url_httpx_cannot_carry_is_answered_400_not_500(proxy):
    """httpx refuses a URL past 64 KiB (``InvalidURL``, not an ``HTTPError``), which uvicorn's httptools parser
    does read: the proxy answered 500; now it says why, as a 400 in its own error JSON."""
    client, received = proxy
    sent = asgi_get(client, b"/v1/models", b"q=" + b"a" * 70_000)
    assert sent[0]["status"] == 400 and not received
    error = json.loads(sent[1]["body"])["error"]
    assert error["type"] == "invalid_request_url" and "too long" in error["message"]


def test_non_ascii_bytes_in_the_path_and_query_go_out_percent_encoded():
    """httptools passes raw UTF-8 bytes in a request target: the query's made httpx raise UnicodeDecodeError (a
    500), the path's were read as Latin-1 and sent re-encoded as other bytes (``%C3%83%C2%A9`` for ``é``)."""
    received: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(request)
        return httpx.Response(200, json={"ok": True})

    app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash"),
                     transport=httpx.MockTransport(upstream))
    with TestClient(app) as client:
        sent = asgi_get(client, "/v1/files/é".encode(), "q=é&r=%C3%A9".encode())
    assert sent[0]["status"] == 200
    assert received[-1].url.raw_path == b"/v1/files/%C3%A9?q=%C3%A9&r=%C3%A9"  # the same bytes, as an upstream reads


def test_the_headers_a_connection_header_names_are_not_passed_on_either_way():
    """A name listed in Connection is hop-by-hop by declaration (RFC 9110 §7.6.1): dropped from the request going
    upstream and from the answer coming back; every other header passes as sent."""
    received: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(request)
        return httpx.Response(200, json={"ok": True}, headers=[("Connection", "keep-alive, X-Answer-Hop"),
                                                               ("X-Answer-Hop", "1"), ("X-Answer-Kept", "2")])

    app = create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash"),
                     transport=httpx.MockTransport(upstream))
    with TestClient(app, raise_server_exceptions=False) as client:
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES[:4]},
                            headers={"Connection": "keep-alive, x-request-hop", "X-Request-Hop": "1",
                                     "X-Request-Kept": "2"})
    sent = received[-1].headers
    assert reply.status_code == 200 and sent["x-request-kept"] == "2" and "x-request-hop" not in sent
    assert reply.headers["x-answer-kept"] == "2" and "x-answer-hop" not in reply.headers


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32-le"])
def test_a_body_not_in_utf8_goes_out_as_sent_without_compressing(proxy, encoding):
    """JSON reads a BOM or UTF-16/32 body, but no cut of its bytes can go out: it was compressed all the same,
    counted as compressed and saved to the session as if its cut had gone out, then sent unchanged."""
    client, received = proxy
    raw = json.dumps({"model": "m", "messages": MESSAGES}).encode(encoding)
    reply = client.post("/v1/chat/completions", content=raw, headers={**JSON, "x-gem-session": encoding})
    assert reply.status_code == 200 and received[-1].content == raw
    metrics = client.get("/metrics").text
    assert 'gem_passthroughs_total{reason="body_layout"} 1.0' in metrics
    assert 'action="passthrough",route="/v1/chat/completions"} 1.0' in metrics and "gem_sessions 0.0" in metrics


def test_chat_messages_typed_as_responses_items_are_not_paired_as_them(proxy):
    """A chat history is paired by ``tool_calls``/``tool_call_id`` whatever other fields its messages carry: with
    Responses ``type``/``call_id`` fields that pair differently, it was read as a Responses input and tool
    messages went out without their calls (the upstream refuses that). It now goes out as sent."""
    client, received = proxy
    messages = json.loads(json.dumps(MESSAGES))
    calls = [m for m in messages if m.get("tool_calls")]
    results = [m for m in messages if m.get("role") == "tool"]
    assert len(calls) == len(results) > 16
    for k, (call, result) in enumerate(zip(calls, results)):
        call.update(type="function_call", call_id=f"z{k}")
        result.update(type="function_call_output", call_id=f"z{k - 1}" if k else "z-first")
    messages.insert(2, {"role": "user", "content": "x", "type": "function_call", "call_id": "z-first"})
    messages.append({"role": "user", "content": "y", "type": "function_call_output", "call_id": f"z{len(calls) - 1}"})
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    reply = client.post("/v1/chat/completions", content=raw, headers=JSON)
    assert reply.status_code == 200 and received[-1].content == raw
    assert 'gem_passthroughs_total{reason="responses_items"} 1.0' in passthroughs(client)


def test_a_client_that_goes_away_mid_stream_closes_the_upstream_s_connection_at_once():
    """A streamed answer whose client leaves between two events: the proxy closes its upstream connection then (so a
    generation nobody reads stops), not when the upstream's next event comes."""
    import socket
    import threading
    import time

    pytest.importorskip("uvicorn")
    from gemkernels.testing.fake_upstream import ServerThread

    listener = socket.create_server(("127.0.0.1", 0))
    closed_at: list[float] = []

    def upstream() -> None:
        conn, _ = listener.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"f\r\ndata: {\"a\":1}\n\n\r\n")
        conn.settimeout(10)
        try:
            while conn.recv(65536):  # the rest of the body, then the proxy's close
                pass
        except OSError:
            pass
        closed_at.append(time.monotonic())
        conn.close()

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    server = ServerThread(create_app(ServerConfig(upstream=f"http://127.0.0.1:{port}/v1", preset="core",
                                                  encoder="hash")))
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # uvicorn's loggers do not reach the root logger (caplog)
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        with httpx.Client() as client, client.stream("POST", server.url + "/v1/chat/completions",
                                                     json={"model": "m", "messages": MESSAGES[:4]}) as reply:
            first = next(reply.iter_raw())
            left_at = time.monotonic()
        thread.join(15)
    finally:
        server.stop()
        listener.close()
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert first == b'data: {"a":1}\n\n'
    assert closed_at and closed_at[0] - left_at < 2.0
    assert not errors, [record.getMessage() for record in errors]


def test_a_relay_whose_client_leaves_ends_without_an_error_and_closes_the_upstream_answer():
    """The client leaves while the relay waits for the upstream's next chunk: the relay ends quietly (no error for
    uvicorn to log) and the upstream's answer is closed once."""
    import asyncio

    from gemkernels.serve.serving import RelayedAnswer

    async def scenario() -> tuple[list[bool], list[dict]]:
        closed: list[bool] = []
        sent: list[dict] = []

        async def chunks():
            yield b"first"
            await asyncio.sleep(10)
            yield b"never"

        async def close() -> None:
            closed.append(True)

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        await RelayedAnswer(200, [], chunks(), close)({"type": "http"}, receive, send)
        return closed, sent

    closed, sent = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert closed == [True]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_a_client_that_leaves_during_a_relayed_upload_is_not_a_500():
    """The client sends part of a relayed body, then goes: the upstream's connection is dropped and the app ends
    without an error (it raised Starlette's ClientDisconnect, a 500 and a logged traceback)."""
    import asyncio

    def upstream(request: httpx.Request) -> httpx.Response:
        request.read()
        return httpx.Response(200)

    app = create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash"),
                     transport=httpx.MockTransport(upstream))

    async def scenario() -> list[dict]:
        sent: list[dict] = []
        events = iter([{"type": "http.request", "body": b"x" * 10, "more_body": True}, {"type": "http.disconnect"}])

        async def receive() -> dict:
            return next(events, {"type": "http.disconnect"})

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/files", "raw_path": b"/v1/files", "query_string": b"",
                 "root_path": "", "headers": [(b"content-length", b"100"), (b"host", b"proxy")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8088), "app": app}
        lifespan = TestClient(app)
        with lifespan:
            await app(scope, receive, send)
        return sent

    sent = asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] < 500


def test_the_compress_endpoint_reads_a_content_encoded_body(proxy):
    """A gzip body is decoded as on the compressing routes (it was parsed as it came: a 400)."""
    import gzip

    client, _ = proxy
    raw = json.dumps({"messages": MESSAGES}).encode()
    reply = client.post("/v1/gem/compress", content=gzip.compress(raw), headers={**JSON, "content-encoding": "gzip"})
    assert reply.status_code == 200 and 0 < len(json.loads(reply.content)["messages"]) < len(MESSAGES)


def test_the_compress_endpoint_answers_utf8_for_a_raw_surrogate(proxy):
    """A lone surrogate sent as raw bytes (ED A0 80) parses; the kept messages' bytes would echo it, which is not
    UTF-8: the answer is written anew, escaped."""
    client, _ = proxy
    messages = json.loads(json.dumps(MESSAGES))
    messages[-1]["content"] = "MARK " + str(messages[-1]["content"])
    raw = json.dumps({"messages": messages}).encode().replace(b"MARK", b"\xed\xa0\x80", 1)
    reply = client.post("/v1/gem/compress", content=raw, headers=JSON)
    assert reply.status_code == 200
    kept = json.loads(reply.content.decode("utf-8"))["messages"]  # strict UTF-8
    assert kept[-1]["content"].startswith("\ud800")
