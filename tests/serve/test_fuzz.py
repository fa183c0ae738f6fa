"""Fuzzed requests through the proxy in process (hypothesis, seeded, bounded): real histories from the bundled
example and fixtures, cut at any call, mutated the ways clients and agents get them wrong, formatted any way.
For every request: no 5xx of the proxy's own, no byte altered outside the removed messages, every forwarded
tool result still with its call."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
pytest.importorskip("hypothesis")
from helpers import EXAMPLE, FIXTURES, array_layout  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gemkernels.compress.blocks import BlockStructureError, parse_history  # noqa: E402
from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.body import without_elements  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402

HISTORIES = [json.loads(EXAMPLE.read_text())["messages"], json.loads((FIXTURES / "openai_messages.json").read_text())]
HISTORIES = [h["messages"] if isinstance(h, dict) else h for h in HISTORIES]
ODD = st.sampled_from([None, 0, -1, 1e300, True, [], {}, ["x"], {"a": 1}, "", "\ud800", "\x00", "é" * 3, "]},\""])


@st.composite
def requests(draw):
    """(raw body, session header, credential): a prefix of a real history, mutated, formatted at random."""
    history = json.loads(json.dumps(draw(st.sampled_from(HISTORIES[:1] * 3 + HISTORIES[1:]))))  # mostly long ones
    n = len(history)
    messages = history[:draw(st.integers(2, n) | st.integers(max(2, n - 12), n))]  # long prefixes compress
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        kind = draw(st.sampled_from(["drop", "duplicate", "field", "append-text"]))
        at = draw(st.integers(0, len(messages) - 1))
        if kind == "drop" and len(messages) > 2:
            del messages[at]
        elif kind == "duplicate":
            messages.insert(at, json.loads(json.dumps(messages[at])))
        elif kind == "field" and isinstance(messages[at], dict):
            field = draw(st.sampled_from(["content", "tool_call_id", "role", "tool_calls", "name"]))
            messages[at][field] = draw(ODD)
        elif kind == "append-text" and isinstance(messages[at].get("content"), str):
            messages[at]["content"] += draw(st.text(max_size=20))
    body = {"model": "m", "messages": messages, **draw(st.dictionaries(st.sampled_from(["user", "tools", "n"]), ODD,
                                                                         max_size=2))}
    raw = json.dumps(body, indent=draw(st.sampled_from([None, 1])), ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        raw = raw.replace('"model": "m"', '"model": "m", "temperature": 1e400, "temperature": 0.5', 1)
    session = draw(st.sampled_from(["s1", "s2", None]) | st.text("0123456789abcdef", min_size=12, max_size=12))
    return (raw.encode("utf-8", "surrogatepass"), session,
            draw(st.sampled_from(["Bearer a", "Bearer b", None])))


@pytest.fixture(scope="module")
def proxy():
    received: list[bytes] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(request.content)
        return httpx.Response(200, json={"ok": True})

    app = create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash", encode_budget=30.0),
                     transport=httpx.MockTransport(upstream))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, received


def pairs_hold(messages) -> bool:
    try:
        parse_history(messages)
    except (BlockStructureError, TypeError, ValueError):
        return False
    return True


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                    HealthCheck.function_scoped_fixture])
@given(requests())
def test_fuzzed_requests_are_forwarded_whole_or_minus_whole_messages(proxy, request):
    client, received = proxy
    raw, session, credential = request
    headers = {"content-type": "application/json"}
    headers.update({"x-gem-session": session} if session else {})
    headers.update({"authorization": credential} if credential else {})
    before = len(received)
    reply = client.post("/v1/chat/completions", content=raw, headers=headers)
    assert reply.status_code == 200 and len(received) == before + 1
    sent = received[-1]
    if sent == raw:
        event("forwarded as sent")
        return
    layout = array_layout(raw, "messages")
    original, forwarded = json.loads(raw)["messages"], json.loads(sent)["messages"]
    removed, at = [], 0
    for i, message in enumerate(original):  # the forwarded messages as a subsequence of the client's
        if at < len(forwarded) and forwarded[at] == message:
            at += 1
        else:
            removed.append(i)
    assert at == len(forwarded) and removed, "forwarded messages that the client did not send"
    assert sent == without_elements(raw, layout, removed)  # whole elements cut, every other byte as sent
    assert pairs_hold(forwarded) or not pairs_hold(original)
    event("compressed")
