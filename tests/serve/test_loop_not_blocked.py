"""Reading a large body (decoding its content coding, laying it out) happens off the event loop: one client's
64 MiB body never holds up the other requests the proxy is serving."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from gemkernels.serve import serving  # noqa: E402
from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402

SLOW_S = 1.0


def test_a_slow_body_parse_does_not_stall_other_requests(monkeypatch):
    """Parsing stands in for a 64 MiB body (about a second on one core); ``/healthz`` meanwhile answers at once."""
    parse, started = serving.parse_body, threading.Event()

    def slow_parse(raw, key):
        started.set()
        time.sleep(SLOW_S)  # what the C decoder costs a large body, the loop's thread held as long
        return parse(raw, key)

    monkeypatch.setattr(serving, "parse_body", slow_parse)
    app = create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash"),
                     transport=httpx.MockTransport(lambda request: httpx.Response(200, json={})))
    with TestClient(app) as client:
        big = threading.Thread(target=client.post, args=("/v1/chat/completions",),
                               kwargs={"json": {"model": "m", "messages": []}})
        big.start()
        assert started.wait(5)
        at = time.monotonic()
        assert client.get("/healthz").status_code == 200
        waited = time.monotonic() - at
        big.join()
    assert waited < SLOW_S / 2
