"""Reading a large or content-coded body (decoding it, laying it out) happens off the event loop: one client's 64 MiB
body never holds up the other requests the proxy is serving; a small one is read on the loop (no thread hop)."""

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


def app_over(parse_body, monkeypatch):
    monkeypatch.setattr(serving, "parse_body", parse_body)
    return create_app(ServerConfig(upstream="http://upstream/v1", preset="core", encoder="hash"),
                      transport=httpx.MockTransport(lambda request: httpx.Response(200, json={})))


def test_a_slow_body_parse_does_not_stall_other_requests(monkeypatch):
    """Parsing stands in for a 64 MiB body (about a second on one core); ``/healthz`` meanwhile answers at once."""
    parse, started = serving.parse_body, threading.Event()

    def slow_parse(raw, key):
        started.set()
        time.sleep(SLOW_S)  # what the C decoder costs a large body, the loop's thread held as long
        return parse(raw, key)

    with TestClient(app_over(slow_parse, monkeypatch)) as client:
        big = threading.Thread(target=client.post, args=("/v1/chat/completions",),
                               kwargs={"json": {"model": "m", "messages": [],
                                                "pad": "x" * serving.INLINE_PARSE_BYTES}})
        big.start()
        assert started.wait(5)
        at = time.monotonic()
        assert client.get("/healthz").status_code == 200
        waited = time.monotonic() - at
        big.join()
    assert waited < SLOW_S / 2


@pytest.mark.parametrize(("size", "coding", "inline"), [(100, "", True), (serving.INLINE_PARSE_BYTES + 1, "", False),
                                                         (100, "gzip", False)])
def test_a_small_plain_body_is_parsed_on_the_loop_and_a_large_or_coded_one_in_a_thread(monkeypatch, size, coding,
                                                                                          inline):
    import gzip
    import json

    parse, threads = serving.parse_body, []

    def recording_parse(raw, key):
        threads.append(threading.current_thread().name)
        return parse(raw, key)

    body = json.dumps({"model": "m", "messages": [], "pad": "x" * size}).encode()
    with TestClient(app_over(recording_parse, monkeypatch)) as client:
        loop_thread = client.portal.call(lambda: threading.current_thread().name)
        client.post("/v1/chat/completions", content=gzip.compress(body) if coding else body,
                    headers={"content-encoding": coding} if coding else {})
    assert (threads == [loop_thread]) is inline and len(threads) == 1
