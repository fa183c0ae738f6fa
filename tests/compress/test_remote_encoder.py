"""OpenAIEmbeddingsEncoder against a fake OpenAI-compatible embeddings server (stdlib http.server on 127.0.0.1)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("httpx")
from gemkernels.compress.encoders import CachedEncoder, Encoder  # noqa: E402
from gemkernels.compress.encoders.remote import OpenAIEmbeddingsEncoder  # noqa: E402

KEY = "sk-test-secret-0123456789"


def vector(text, width):
    """The fake model: an unnormalised, text-dependent row of ``width`` numbers."""
    return [float(len(text) + 1)] + [float((sum(map(ord, text)) * (j + 3)) % 17 + 1) for j in range(width - 1)]


class FakeServer:
    """Answers POST /v1/embeddings; ``plan`` holds what the next requests get (a status, or "hang"), then 200."""

    def __init__(self):
        self.plan, self.requests, self.release = [], [], threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                step = server.plan.pop(0) if server.plan else 200
                if step == "hang":
                    server.release.wait(5)
                    return
                if step != 200:  # an error body that echoes the credentials, as careless servers do
                    self.reply(step, {"error": f"status {step}; you sent {self.headers.get('Authorization')}"})
                    return
                width = body.get("dimensions", 4)
                data = [{"object": "embedding", "index": i, "embedding": vector(text, width)}
                        for i, text in enumerate(body["input"])]
                self.reply(200, {"object": "list", "data": data[::-1], "model": body["model"]})

            def reply(self, status, payload):
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GEM_TEST_KEY", KEY)
    fake = FakeServer()
    yield fake
    fake.close()


def encoder(server, **options):
    return OpenAIEmbeddingsEncoder(server.url + "/", "fake-embed", api_key_env="GEM_TEST_KEY", backoff=0.01,
                                   **options)


def expected(texts, width):
    rows = np.array([vector(t, width) for t in texts])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_batches_follow_index_order_and_rows_are_normalised(server):
    texts = [f"block {i} " * (i + 1) for i in range(7)]
    with encoder(server, batch_size=3) as enc:
        out = enc.encode(texts)
    assert [len(body["input"]) for _, _, body in server.requests] == [3, 3, 1]
    assert all(path == "/v1/embeddings" and body["model"] == "fake-embed" and "dimensions" not in body
               for path, _, body in server.requests)
    assert out.dtype == np.float32 and out.shape == (7, 4) and enc.dim == 4
    np.testing.assert_allclose(out, expected(texts, 4), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)


def test_dimensions_are_forwarded_and_fix_dim_and_name(server):
    enc = encoder(server, dimensions=6)
    assert enc.dim == 6 and enc.name == "fake-embed@6" and isinstance(enc, Encoder)
    assert server.requests == []  # dim known without a request
    assert enc.encode(["a", "bb"]).shape == (2, 6)
    assert server.requests[0][2]["dimensions"] == 6


def test_dim_without_dimensions_comes_from_one_probe(server):
    enc = encoder(server)
    assert enc.dim == 4 and len(server.requests) == 1
    assert enc.encode([]).shape == (0, 4) and len(server.requests) == 1


def test_wrappers_probe_the_width_only_when_it_is_read(server):
    """A cache around the remote encoder takes its name and width from it when asked: building the cache sends
    nothing, reading ``dim`` sends the one probe, encoding through the cache reuses what the probe learnt."""
    cached = CachedEncoder(encoder(server))
    assert server.requests == [] and cached.name == "fake-embed"
    assert cached.dim == 4 and len(server.requests) == 1
    assert cached.encode(["a", "a"]).shape == (2, 4) and len(server.requests) == 2


def test_authorization_header_carries_the_environment_key(server, monkeypatch):
    encoder(server).encode(["x"])
    assert server.requests[0][1]["Authorization"] == f"Bearer {KEY}"
    monkeypatch.delenv("GEM_TEST_KEY")
    encoder(server).encode(["x"])
    assert "Authorization" not in server.requests[1][1]


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_statuses_are_retried_then_succeed(server, status):
    server.plan = [status, status]
    out = encoder(server, max_retries=3).encode(["retry me"])
    assert len(server.requests) == 3
    np.testing.assert_allclose(out, expected(["retry me"], 4), rtol=1e-6)


def test_persistent_5xx_fails_after_the_last_retry(server):
    server.plan = [502] * 3
    with pytest.raises(RuntimeError, match="HTTP 502 after 3 attempt") as err:
        encoder(server, max_retries=2).encode(["x"])
    assert KEY not in str(err.value) and "[redacted]" in str(err.value)


def test_client_error_fails_fast_without_leaking_the_key(server):
    server.plan = [400]
    with pytest.raises(RuntimeError, match="HTTP 400 after 1 attempt") as err:
        encoder(server).encode(["x"])
    assert len(server.requests) == 1 and KEY not in str(err.value) and "status 400" in str(err.value)


def test_hanging_server_hits_the_timeout(server):
    server.plan = ["hang", "hang"]
    with pytest.raises(RuntimeError, match="ReadTimeout") as err:
        encoder(server, timeout=0.2, max_retries=1).encode(["x"])
    assert len(server.requests) == 2 and KEY not in str(err.value)


def test_connection_refused_is_retried_then_reported(server):
    url = server.url
    server.close()
    enc = OpenAIEmbeddingsEncoder(url, "fake-embed", dimensions=4, max_retries=1, backoff=0.01)
    with pytest.raises(RuntimeError, match="failed after 2 attempt.*ConnectError"):
        enc.encode(["x"])
