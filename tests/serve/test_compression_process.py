"""``gem serve --compress-process``: the same forwarded bytes as compressing in the proxy's own process, the
process's metrics on the proxy's ``/metrics``, unchanged requests (never an error) while the process is down, a new
process after it died, and no process left behind when the proxy stops."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from helpers import EXAMPLE  # noqa: E402

from gemkernels.compress.sessions import GEM_SESSION_HEADER  # noqa: E402
from gemkernels.serve import compression_process  # noqa: E402
from gemkernels.serve.app import ServerConfig, create_app  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402

MESSAGES = json.loads(EXAMPLE.read_text())["messages"]
#: Growing prefixes of the example, each ending after a tool result (13 to 32 blocks).
CUTS = tuple(range(28, 67, 2))


def compression_children() -> set[int]:
    """The live compression processes this test process started."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and stat[0] != "Z" and b"compression_process" in cmdline:
            found.add(int(proc.name))
    return found


@pytest.fixture()
def upstream():
    fake = FakeUpstream()
    server = ServerThread(fake.app())
    yield fake, server.url
    server.stop()


def serve(upstream_url: str, process: bool, preset: str = "cache-aware") -> ServerThread:
    config = ServerConfig(upstream=upstream_url + "/v1", preset=preset, encoder="hash", encode_budget=30.0,
                          compress_process=process)
    return ServerThread(create_app(config), graceful_s=10)


def replay(url: str, session: str, cuts=CUTS) -> None:
    for cut in cuts:
        body = json.dumps({"model": "m", "messages": MESSAGES[:cut]}).encode()
        reply = httpx.post(url + "/v1/chat/completions", content=body, timeout=30,
                           headers={"content-type": "application/json", GEM_SESSION_HEADER: session,
                                    "authorization": "Bearer sk-test"})
        assert reply.status_code == 200, reply.text


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("preset", ["cache-aware", "paper"])
def test_the_process_forwards_the_bytes_the_thread_compressor_forwards(upstream, preset):
    fake, root = upstream
    sent = {}
    for process in (False, True):
        server = serve(root, process, preset)
        try:
            before = len(fake.received)
            replay(server.url, f"same-{preset}")
            sent[process] = [r.raw for r in fake.received[before:]]
        finally:
            server.stop()
    assert len(sent[True]) == len(CUTS)
    assert sent[True] == sent[False]
    originals = [json.dumps({"model": "m", "messages": MESSAGES[:cut]}).encode() for cut in CUTS]
    assert sum(a != b for a, b in zip(sent[True], originals)) > 0  # something was compressed: the test can fail


def test_the_processs_metrics_reach_the_proxys(upstream, caplog):
    server = serve(upstream[1], True)
    try:
        replay(server.url, "metrics")
        assert metric(server.url, "gem_requests_total", action="reselected") >= 1
        assert metric(server.url, "gem_requests_total") == len(CUTS)
        assert metric(server.url, "gem_batch_size_count", kind="encode") >= 1  # counted in the process
        assert metric(server.url, "gem_sessions") == 1
        assert metric(server.url, "gem_pending_compressions") == 0
    finally:
        server.stop()
    assert compression_children() == set()  # it exited with the proxy
    assert "compression process stopped" not in caplog.text  # asked to: no warning


def test_a_dead_process_sends_requests_unchanged_until_a_new_one_serves(upstream, monkeypatch):
    monkeypatch.setattr(compression_process, "RESTART_INTERVAL_S", 0.0)
    fake, root = upstream
    server = serve(root, True)
    try:
        replay(server.url, "before", CUTS[:3])
        (child,) = compression_children()
        os.kill(child, signal.SIGKILL)
        body = json.dumps({"model": "m", "messages": MESSAGES}).encode()
        deadline = time.monotonic() + 60
        unchanged = 0
        while time.monotonic() < deadline:
            reply = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=30,
                               headers={"content-type": "application/json", GEM_SESSION_HEADER: "after"})
            assert reply.status_code == 200
            if fake.received[-1].raw != body:  # compressed again: a new process serves
                break
            unchanged += 1
            time.sleep(0.2)
        else:
            pytest.fail("no new compression process served within 60 s")
        assert unchanged >= 1 and metric(server.url, "gem_passthroughs_total", reason="compressor_down") == unchanged
        assert compression_children() - {child} and child not in compression_children()
    finally:
        server.stop()
    assert compression_children() == set()


def test_a_process_that_cannot_start_stops_the_proxy_with_its_error(capfd):
    """As the in-process compressor does: an encoder that cannot load is an error at start-up, not a proxy that
    silently never compresses."""
    from starlette.testclient import TestClient

    config = ServerConfig(upstream="http://127.0.0.1:9/v1", encoder="no-such-encoder", compress_process=True)
    with pytest.raises(RuntimeError, match="compression process did not start"), TestClient(create_app(config)):
        pass
    assert "no-such-encoder" in capfd.readouterr().err  # the process's own error names the cause
    assert compression_children() == set()


def test_recorded_metrics_apply_as_the_direct_updates_and_no_event_is_lost_between_threads():
    """What the process's `Compressor` counts reaches the proxy's metrics as if counted there (the proxy's own
    pending gauge aside), and a drain racing the batchers' threads takes every event exactly once."""
    import threading

    from gemkernels.serve.metrics import Metrics

    recorded, direct, proxied = compression_process.RecordedMetrics(), Metrics(), Metrics()
    for metrics in (recorded, direct):
        metrics.requests.labels("/v1/chat/completions", "passthrough").inc()
        metrics.passthroughs.labels("queue_full").inc(2)
        metrics.sessions.set(7)
        metrics.observe_batch("encode", 5, 0.25)
        metrics.store_round_trips.inc()
    recorded.pending.inc()  # the proxy counts its own
    compression_process.apply_events(proxied, recorded.drain())
    def values(metrics: Metrics) -> list[bytes]:  # every sample but the metrics' creation times
        return [line for line in metrics.exposition().splitlines() if b"_created" not in line]

    assert values(proxied) == values(direct)
    assert any(line.startswith(b"gem_sessions 7") for line in values(proxied))

    def record(n: int) -> None:
        for _ in range(n):
            recorded.store_round_trips.inc()

    threads = [threading.Thread(target=record, args=(20_000,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    drained = []
    while any(thread.is_alive() for thread in threads):
        drained += recorded.drain()
    for thread in threads:
        thread.join()
    drained += recorded.drain()
    assert len(drained) == 60_000
