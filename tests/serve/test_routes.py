"""Every route agents call, through the proxy to fake upstreams on 127.0.0.1: the Responses API (JSON, SSE, stored
conversations, compressed bodies), count_tokens, the relay of any other method and path, two upstreams on one
port, and sessions per agent."""

from __future__ import annotations

import gzip
import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history, synthetic_responses_input  # noqa: E402


@pytest.fixture(scope="module")
def upstreams():
    openai, anthropic = FakeUpstream(), FakeUpstream()
    servers = [ServerThread(openai.app()), ServerThread(anthropic.app())]
    yield openai, anthropic, servers[0].url, servers[1].url
    for server in servers:
        server.stop()


def serve(upstreams, overrides=("thinking_bound=False",), **config):
    """The proxy in front of both fake upstreams (its Anthropic histories compress as for a model without preserved
    thinking unless ``overrides`` say otherwise)."""
    _, _, openai_url, anthropic_url = upstreams
    return ServerThread(create_app(ServerConfig(upstream=openai_url + "/v1", anthropic_upstream=anthropic_url,
                                                encoder="hash", encode_budget=30.0, overrides=overrides, **config)))


@pytest.fixture(scope="module")
def proxy(upstreams):
    server = serve(upstreams)
    yield server.url
    server.stop()


def body_bytes(fields: dict, history_field: str, history: list, sep: bytes = b" ,\n ") -> tuple[bytes, bytes, bytes]:
    """A body as a client might write it, split as (before the history array, its elements, after it)."""
    head = b'{"model":  "m" , "stream": false, "num": 1e400, "' + history_field.encode() + b'" : [ '
    elements = [json.dumps(item, ensure_ascii=False).encode() for item in history]
    tail = b" ]," + json.dumps(fields).encode()[1:]
    return head, elements, tail


def last(fake: FakeUpstream, path: str):
    return [r for r in fake.received if r.path == path][-1]


def test_a_long_responses_input_arrives_compressed_byte_for_byte(upstreams, proxy):
    openai, _, _, _ = upstreams
    items = synthetic_responses_input(60, seed=4)
    head, elements, tail = body_bytes({"instructions": "be brief", "store": False}, "input", items)
    raw = head + b" ,\n ".join(elements) + tail
    reply = httpx.post(proxy + "/v1/responses", content=raw, headers={"authorization": "Bearer k",
                                                                       "session_id": "codex-1"})
    assert reply.status_code == 200 and reply.json()["object"] == "response"
    sent = last(openai, "/v1/responses").raw
    assert sent.startswith(head) and sent.endswith(tail)  # every other byte as the client wrote it (1e400 too)
    kept = json.loads(b"[" + sent[len(head):len(sent) - len(tail)] + b"]")
    assert 20 < len(kept) < len(items)
    positions, p = [], 0  # where each kept item was, in order (repeated items match the earliest unused)
    for item in kept:
        while elements[p] != json.dumps(item, ensure_ascii=False).encode():
            p += 1
        positions.append(p)
        p += 1
    assert sent[len(head):len(sent) - len(tail)] == b" ,\n ".join(elements[p] for p in positions)
    removed = set(range(len(items))) - set(positions)
    calls = {items[p]["call_id"] for p in removed if "call_id" in items[p]}
    assert all(items[p]["call_id"] in calls for p in removed if "call_id" in items[p])
    assert not any(items[p]["type"] == "message" for p in removed)  # messages are never removed
    for p in removed:  # a removed output's call went too, and a removed call's output
        if items[p]["type"] == "reasoning":
            assert items[p + 1]["type"] == "function_call" and p + 1 in removed


def test_responses_streams_relay_unchanged_and_stateful_requests_go_out_as_sent(upstreams, proxy):
    openai, _, openai_url, _ = upstreams
    items = synthetic_responses_input(60, seed=5)
    body = {"model": "m", "input": items, "stream": True}
    with httpx.stream("POST", proxy + "/v1/responses", json=body) as reply:
        relayed = b"".join(reply.iter_raw())
    forwarded = last(openai, "/v1/responses").raw
    with httpx.stream("POST", openai_url + "/v1/responses", content=forwarded) as direct:  # what the proxy got
        expected = b"".join(direct.iter_raw())
    assert relayed == expected and relayed.count(b"event: response.") == 4 and len(forwarded) < len(json.dumps(body))
    for extra in ({"previous_response_id": "resp_0"}, {"conversation": "conv_1"}):
        raw = json.dumps({"model": "m", "input": items, **extra}).encode()
        assert httpx.post(proxy + "/v1/responses", content=raw).status_code == 200
        assert last(openai, "/v1/responses").raw == raw  # the history is on the provider's side
    raw = b'{"model": "m", "input": "just a question"}'
    httpx.post(proxy + "/v1/responses", content=raw)
    assert last(openai, "/v1/responses").raw == raw


def test_compressed_request_bodies_are_read_and_sent_decoded_only_when_cut(upstreams, proxy):
    openai, _, _, _ = upstreams
    long = json.dumps({"model": "m", "messages": synthetic_history(60, seed=6)}).encode()
    httpx.post(proxy + "/v1/chat/completions", content=gzip.compress(long), headers={"content-encoding": "gzip"})
    got = last(openai, "/v1/chat/completions")
    assert "content-encoding" not in got.headers and len(json.loads(got.raw)["messages"]) < 122
    short = gzip.compress(json.dumps({"model": "m", "messages": synthetic_history(3)}).encode())
    httpx.post(proxy + "/v1/chat/completions", content=short, headers={"content-encoding": "gzip"})
    got = last(openai, "/v1/chat/completions")
    assert got.raw == short and got.headers["content-encoding"] == "gzip"  # unchanged: as the client sent it
    broken = short[: len(short) // 2]
    httpx.post(proxy + "/v1/chat/completions", content=broken, headers={"content-encoding": "gzip"})
    assert last(openai, "/v1/chat/completions").raw == broken


def test_two_upstreams_on_one_port_and_count_tokens(upstreams, proxy):
    openai, anthropic, _, _ = upstreams
    messages = synthetic_anthropic_history(60, seed=7)
    body = json.dumps({"model": "claude", "system": "You are Claude Code.", "messages": messages}).encode()
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-claude-code-session-id": "cc-1"}
    assert httpx.post(proxy + "/v1/messages", content=body, headers=headers).json()["type"] == "message"
    forwarded = last(anthropic, "/v1/messages").raw
    assert len(json.loads(forwarded)["messages"]) < len(messages)
    assert httpx.post(proxy + "/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 200
    assert last(openai, "/v1/chat/completions").raw  # chat went to the OpenAI-format upstream
    count = httpx.post(proxy + "/v1/messages/count_tokens?beta=true", content=body, headers=headers)
    got = last(anthropic, "/v1/messages/count_tokens")
    assert count.json() == {"input_tokens": len(body) // 4} and got.raw == body and got.query == "beta=true"


def test_count_compressed_counts_what_would_be_forwarded_without_touching_the_session(upstreams):
    _, anthropic, _, _ = upstreams
    server = serve(upstreams, count_compressed=True)
    try:
        messages = synthetic_anthropic_history(60, seed=8)
        body = json.dumps({"model": "claude", "system": "agent", "messages": messages}).encode()
        headers = {"x-api-key": "k2", "x-claude-code-session-id": "cc-2"}
        counted = httpx.post(server.url + "/v1/messages/count_tokens", content=body, headers=headers).json()
        dry = last(anthropic, "/v1/messages/count_tokens").raw
        httpx.post(server.url + "/v1/messages", content=body, headers=headers)
        real = last(anthropic, "/v1/messages").raw
        assert dry == real and counted == {"input_tokens": len(real) // 4} and len(real) < len(body)
        grown = json.dumps({"model": "claude", "system": "agent", "messages": synthetic_anthropic_history(61, seed=8)})
        httpx.post(server.url + "/v1/messages", content=grown, headers=headers)
        after = json.loads(last(anthropic, "/v1/messages").raw)["messages"]
        assert after[:len(json.loads(real)["messages"])] == json.loads(real)["messages"]  # the session went on
    finally:
        server.stop()


def test_any_other_method_and_path_is_relayed_with_its_query_headers_and_body(upstreams, proxy):
    openai, anthropic, _, _ = upstreams
    models = httpx.get(proxy + "/v1/models?beta=true", headers={"anthropic-version": "2023-06-01",
                                                                "anthropic-beta": "x-1", "x-api-key": "k"})
    got = last(anthropic, "/v1/models")
    assert models.json()["data"][0]["id"] == "m" and got.query == "beta=true" and got.method == "GET"
    assert got.headers["anthropic-beta"] == "x-1" and got.headers["x-api-key"] == "k"
    assert httpx.get(proxy + "/v1/models").status_code == 200 and last(openai, "/v1/models").method == "GET"
    payload = bytes(range(256)) * 20_000  # 5 MB, streamed through
    reply = httpx.put(proxy + "/v1/files/abc?purpose=x&purpose=y", content=payload, headers={"openai-beta": "b"})
    got = last(openai, "/v1/files/abc")
    assert reply.json() == {"method": "PUT", "path": "/v1/files/abc", "query": "purpose=x&purpose=y",
                            "body_bytes": len(payload)} and reply.headers["x-echo"] == "1"
    assert got.raw == payload and got.headers["openai-beta"] == "b"
    assert httpx.delete(proxy + "/v1/files/abc").json()["method"] == "DELETE"
    assert httpx.get(proxy + "/v1/missing").status_code == 404


def test_a_side_request_under_the_same_session_leaves_the_main_prefix_alone(upstreams):
    _, anthropic, _, _ = upstreams

    def run(with_side_requests: bool) -> list[bytes]:
        server = serve(upstreams, preset="cache-aware")
        headers = {"x-api-key": "k3", "x-claude-code-session-id": "cc-3"}
        sent = []
        try:
            for blocks in range(40, 70, 3):
                body = {"model": "claude", "system": "You are Claude Code.",
                        "messages": synthetic_anthropic_history(blocks, seed=9)}
                httpx.post(server.url + "/v1/messages", json=body, headers=headers)
                sent.append(last(anthropic, "/v1/messages").raw)
                if with_side_requests:  # a title and a summary of the same conversation, under the same session id
                    for system in ("Write a 5-word title for this conversation.", "Summarise this conversation."):
                        side = {"model": "haiku", "system": system,
                                "messages": synthetic_anthropic_history(blocks - 5, seed=9)}
                        httpx.post(server.url + "/v1/messages", json=side, headers=headers)
        finally:
            server.stop()
        return sent

    assert run(with_side_requests=True) == run(with_side_requests=False)


def test_a_relayed_request_keeps_its_framing_no_body_stays_no_body_and_a_length_stays_a_length(upstreams, proxy):
    """httpx sends an iterator body chunked: a relayed GET went out with ``Transfer-Encoding: chunked`` and a PUT
    lost its ``Content-Length`` (servers that refuse a chunked upload, or any body on a GET, refused them)."""
    openai, _, _, _ = upstreams
    assert httpx.get(proxy + "/v1/models").status_code == 200
    got = last(openai, "/v1/models")
    assert "transfer-encoding" not in got.headers and "content-length" not in got.headers and got.raw == b""
    payload = b"x" * 300_000
    assert httpx.put(proxy + "/v1/files/f1", content=payload).json()["body_bytes"] == len(payload)
    got = last(openai, "/v1/files/f1")
    assert got.headers["content-length"] == str(len(payload)) and "transfer-encoding" not in got.headers

    def chunks():
        yield b"a" * 1000
        yield b"b" * 1000

    assert httpx.post(proxy + "/v1/files/f2", content=chunks()).json()["body_bytes"] == 2000  # chunked as sent
    assert last(openai, "/v1/files/f2").headers["transfer-encoding"] == "chunked"


def test_observe_mode_relays_count_tokens_as_sent_even_with_count_compressed(upstreams):
    """Observe mode sends every request as the client wrote it; count_tokens under --count-compressed went out cut,
    so an agent's auto-compaction counted a history shorter than the one it was sending."""
    _, anthropic, _, _ = upstreams
    server = serve(upstreams, count_compressed=True, observe=True)
    try:
        messages = synthetic_anthropic_history(60, seed=8)
        body = json.dumps({"model": "claude", "system": "agent", "messages": messages}).encode()
        headers = {"x-api-key": "k4", "x-claude-code-session-id": "cc-4"}
        counted = httpx.post(server.url + "/v1/messages/count_tokens", content=body, headers=headers).json()
        assert last(anthropic, "/v1/messages/count_tokens").raw == body and counted == {"input_tokens": len(body) // 4}
        httpx.post(server.url + "/v1/messages", content=body, headers=headers)
        assert last(anthropic, "/v1/messages").raw == body
    finally:
        server.stop()


@pytest.mark.parametrize("process", [False, True])
def test_an_anthropic_history_goes_out_whole_unless_the_request_lets_the_api_drop_bound_thinking(upstreams, process):
    """Default ``thinking_bound``: a model with preserved thinking refuses thinking whose preceding messages changed,
    and may think in any response, so every Messages history is forwarded as sent, one without tool_use parts or
    thinking yet too; a request asking ``prefix_mismatch_behavior: "drop_block"`` is compressed, in the proxy's
    process or the compression process (old code cut the first two)."""
    _, anthropic, _, _ = upstreams
    server = serve(upstreams, overrides=(), compress_process=process)
    text_actions = [{"role": "user", "content": "Fix the tests."}]
    for step in range(40):
        text_actions += [{"role": "assistant", "content": f"Look.\n```bash\ngrep -rn word{step} src\n```"},
                         {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{'x' * (60 * step)}"
                                                     "\n</output>"}]
    try:
        for n, messages in enumerate((synthetic_anthropic_history(60, seed=12), text_actions)):
            headers = {"x-api-key": "k4", "x-claude-code-session-id": f"cc-4-{process}-{n}"}
            plain = json.dumps({"model": "claude", "messages": messages}).encode()
            httpx.post(server.url + "/v1/messages", content=plain, headers=headers)
            assert last(anthropic, "/v1/messages").raw == plain
            thinking = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
            dropping = json.dumps({"model": "claude", "thinking": thinking, "messages": messages}).encode()
            headers["x-claude-code-session-id"] += "-drop"
            httpx.post(server.url + "/v1/messages", content=dropping, headers=headers)
            assert len(json.loads(last(anthropic, "/v1/messages").raw)["messages"]) < len(messages)
    finally:
        server.stop()
