"""Tenants and limits: sessions are keyed by the caller's credential as well as the session id, the compress
endpoint can be switched off or put behind a token, and a body past the limit gets a 413 without being held."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
from helpers import EXAMPLE  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402
from gemkernels.serve.serving import tenant_of  # noqa: E402

MESSAGES = json.loads(EXAMPLE.read_text())["messages"]


def client_for(received: list | None = None, **config) -> TestClient:
    def upstream(request: httpx.Request) -> httpx.Response:
        if received is not None:
            received.append(request)
        return httpx.Response(200, json={"ok": True})

    app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash", preset="paper", encode_budget=30.0,
                                  **config),
                     transport=httpx.MockTransport(upstream))
    return TestClient(app, raise_server_exceptions=False)


def test_a_tenant_cannot_overwrite_another_tenants_session():
    """A and B send the same ``X-GEM-Session`` with their own keys: B's unrelated history between A's two requests
    leaves A on the append path (one session store for both made A reselect: 'history is not an extension')."""
    other = json.loads(json.dumps(MESSAGES))
    for m in other[2:]:
        if isinstance(m.get("content"), str):
            m["content"] = "other tenant: " + m["content"]
    with client_for() as client:
        def compress(key: str, messages: list) -> dict:
            reply = client.post("/v1/gem/compress", json={"messages": messages},
                                headers={"authorization": f"Bearer {key}", "x-gem-session": "shared"})
            return reply.json()["stats"]

        assert compress("sk-a", MESSAGES[:-4])["action"] == "reselected"
        assert compress("sk-b", other)["action"] == "reselected"
        again = compress("sk-a", MESSAGES)
        assert again["action"] == "appended", again["reason"]
    assert tenant_of({"authorization": "Bearer sk-a"}) != tenant_of({"authorization": "Bearer sk-b"})
    assert tenant_of({"x-api-key": "k"}) == tenant_of({"x-api-key": "k"}) != tenant_of({}) == "anonymous"


def test_the_compress_endpoint_can_be_switched_off_or_put_behind_a_token():
    body = {"messages": MESSAGES}
    with client_for(compress_endpoint=False) as client:
        assert client.post("/v1/gem/compress", json=body).status_code == 404
    with client_for(compress_token="t0k3n") as client:
        assert client.post("/v1/gem/compress", json=body).status_code == 401
        assert client.post("/v1/gem/compress", json=body, headers={"x-gem-token": "wrong"}).status_code == 401
        assert client.post("/v1/gem/compress", json=body, headers={"x-gem-token": "t0k3n"}).status_code == 200


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_past_the_limit_gets_a_413_and_is_not_forwarded(declared):
    received: list = []
    raw = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    with client_for(received, max_body_bytes=len(raw) - 1) as client:
        content = raw if declared else iter([raw[:1000], raw[1000:]])  # a generator: sent chunked, no length
        reply = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
        assert reply.status_code == 413 and reply.json()["error"]["type"] == "request_too_large"
        assert reply.headers["connection"] == "close" and received == []
        small = json.dumps({"model": "m", "messages": MESSAGES[:4]}).encode()
        assert client.post("/v1/chat/completions", content=small).status_code == 200 and len(received) == 1


def test_readyz_says_whether_the_upstream_answers_and_healthz_only_that_the_process_does():
    reachable = {"yes": True}

    def upstream(request: httpx.Request) -> httpx.Response:
        if not reachable["yes"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(404)  # any answer counts: the upstream is there

    app = create_app(ServerConfig(upstream="http://upstream/v1", encoder="hash"),
                     transport=httpx.MockTransport(upstream))
    with TestClient(app) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["encoder"] == "hash-256"
        reachable["yes"] = False
        down = client.get("/readyz")
        assert down.status_code == 503 and down.json()["upstream"].startswith("unreachable")
        assert client.get("/healthz").status_code == 200


def test_credentials_in_query_strings_are_redacted_from_the_access_log():
    import logging

    from gemkernels.serve.redact import QueryCredentialFilter

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "POST", "/v1beta/models/g:generate?alt=sse&key=AIzaSECRET", "1.1", 200),
                               None)
    assert QueryCredentialFilter().filter(record)
    line = record.getMessage()
    assert "AIzaSECRET" not in line and "key=[redacted]" in line and "alt=sse" in line


@pytest.mark.parametrize("name", ["x-api-key", "subscription-key", "client_secret", "X-Amz-Signature",
                                  "X-Amz-Security-Token", "x-goog-api-key", "api%5Fkey", "apiKey", "access_token"])
@pytest.mark.parametrize("separator", ["?", "?a=1&", "?a=1;", "?;"])
def test_every_credential_like_query_parameter_is_redacted(name, separator):
    """Names that end in a credential word, however prefixed, spelt or percent-encoded, and after ``&`` or ``;``
    (the first form let ``x-api-key``, Azure's ``subscription-key`` and ``X-Amz-Signature`` through)."""
    from gemkernels.serve.redact import redact_query

    line = redact_query(f'"GET /v1/models{separator}{name}=S3CRET&alt=sse HTTP/1.1"')
    assert "S3CRET" not in line and f"{name}=[redacted]&alt=sse" in line


@pytest.mark.parametrize("query", ["?alt=sse", "?model=gpt-4o&stream=true", "?keyword=x", "?q=a=b"])
def test_other_query_parameters_stay_in_the_log(query):
    from gemkernels.serve.redact import redact_query

    assert redact_query(f"GET /v1/models{query} HTTP/1.1") == f"GET /v1/models{query} HTTP/1.1"

@pytest.mark.parametrize(("cores", "threads"), [(1, 2), (2, 2), (4, 4), (8, 8), (64, 8)])
def test_compression_threads_default_to_the_cores_from_2_to_8(monkeypatch, cores, threads):
    """Past the cores, threads only add GIL hand-offs to CPU-bound compression; below 2, one long request would hold
    up every other."""
    import os

    from gemkernels.serve.config import ServerConfig

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert ServerConfig(upstream="http://u").threads == threads


@pytest.mark.parametrize("query", ["?next=/a?token=S3CRET", "?redirect=https://h/p?api_key=S3CRET&x=1",
                                   "?token=S3C;RET", "?a=1;key=S3CRET"])
def test_a_credential_after_a_question_mark_or_semicolon_in_a_value_is_redacted(query):
    """A ``?`` inside a value (a redirect URL) hid the parameters after it, and ``;`` cut a value in two."""
    from gemkernels.serve.redact import redact_query

    line = redact_query(f"GET /v1/models{query} HTTP/1.1")
    assert "S3CRET" not in line and "RET" not in line.replace("[redacted]", ""), line
