"""Replicas of ``gem serve`` sharing one real ``redis-server`` (``--store redis://``), each in a process of its own,
a client sending each session's requests round-robin across them: every forwarded body equals what one in-memory
proxy forwards, byte for byte; a replica killed with SIGKILL mid-load costs no wrong answer; Redis stopped
mid-load leaves every request answered, forwarded as sent, the reason in the metrics, and compression resumes
when it returns. ``--workers 2`` behaves as one process too, its ``/metrics`` the whole server's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("redis")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from gemkernels.serve.app import ServerConfig, create_app  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402
from gemkernels.testing.processes import GemServeProcess, RedisServer  # noqa: E402

SESSIONS = 6
PRESET = "cache-aware"
#: Growing prefixes ending after a tool result: 16 blocks up to 50.
ENDS = tuple(range(34, 103, 3 * 2))


def request_body(session: int, end: int) -> bytes:
    messages = synthetic_history(50, seed=100 + session)[:end]
    return json.dumps({"model": "m", "user": f"session-{session}", "messages": messages}).encode()


def send(url: str, session: int, end: int, tenant: str = "sk-test", client: httpx.Client | None = None
         ) -> httpx.Response:
    """Request ``end`` of ``session`` as ``tenant`` (its credential: each test's sessions are its own)."""
    return (client or httpx).post(url + "/v1/chat/completions", content=request_body(session, end), timeout=30,
                                  headers={"Authorization": f"Bearer {tenant}", "Content-Type": "application/json",
                                           "X-GEM-Session": f"s{session}"})


def by_session(fake: FakeUpstream) -> dict[str, list[bytes]]:
    """The forwarded bodies per session, in arrival order."""
    out: dict[str, list[bytes]] = defaultdict(list)
    for received in fake.received:
        out[json.loads(received.raw)["user"]].append(received.raw)
    return out


def scrape(url: str) -> str:
    """``/metrics`` over a new connection (any worker may answer)."""
    with httpx.Client() as client:
        return client.get(url + "/metrics").text


def total(metrics: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that have ``labels``, whatever their other labels (in any order)."""
    found = re.findall(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", metrics, re.M)
    return sum(float(value) for sample_labels, value in found
               if labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', sample_labels)).items())


def workers_of(pid: int) -> list[int]:
    """The worker processes of the supervisor ``pid``: its children but multiprocessing's resource tracker."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def environment_of(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with."""
    return dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)


def serve_args(upstream: str, store: str, *more: str, preset: str = PRESET) -> list[str]:
    return ["--upstream", upstream + "/v1", "--encoder", "hash", "--preset", preset, "--store", store,
            "--encode-budget-ms", "inf", *more]


@pytest.fixture(scope="module")
def single_process():
    """What one in-memory proxy forwards for every (session, request) of the schedule."""
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    proxy = ServerThread(create_app(ServerConfig(upstream=upstream.url + "/v1", encoder="hash", preset=PRESET,
                                                 encode_budget=None)))
    for end in ENDS:
        for session in range(SESSIONS):
            assert send(proxy.url, session, end).status_code == 200
    proxy.stop()
    upstream.stop()
    forwarded = by_session(fake)
    assert all(len(bodies) == len(ENDS) for bodies in forwarded.values())
    assert any(len(body) < len(request_body(0, ENDS[-1])) for body in forwarded["session-0"])  # it compressed
    return forwarded


def test_three_replicas_forward_what_one_process_forwards_and_survive_a_sigkill(redis_server, single_process,
                                                                               tmp_path):
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    replicas = [GemServeProcess(*serve_args(upstream.url, redis_server.url), log_path=str(tmp_path / f"r{i}.log"))
                for i in range(3)]
    for replica in replicas:
        replica.__enter__()
    try:
        alive = [True, True, True]
        sent = 0
        for j, end in enumerate(ENDS):
            for session in range(SESSIONS):
                if j == len(ENDS) // 2 and session == 2:
                    replicas[1].kill()  # mid-load; the client moves to the next replica, as a load balancer would
                    alive[1] = False
                target = (session + j) % 3
                while not alive[target]:
                    target = (target + 1) % 3
                assert send(replicas[target].url, session, end, "sk-replicas").status_code == 200
                sent += 1
        forwarded = by_session(fake)
        assert sum(map(len, forwarded.values())) == sent
        for name, bodies in single_process.items():
            assert forwarded[name] == bodies, name  # byte for byte, so no more prefix breaks than one process
        metrics = httpx.get(replicas[0].url + "/metrics").text
        assert total(metrics, "gem_store_round_trips_total") > 0
    finally:
        for replica in replicas:
            replica.__exit__(None, None, None)
        upstream.stop()


def test_redis_down_mid_load_forwards_as_sent_then_compression_resumes(redis_server, tmp_path):
    with RedisServer() as own:
        fake = FakeUpstream()
        upstream = ServerThread(fake.app())
        with GemServeProcess(*serve_args(upstream.url, own.url, preset="paper"),  # compresses from the first
                             log_path=str(tmp_path / "r.log")) as replica:
            for end in ENDS[:3]:
                assert send(replica.url, 0, end).status_code == 200
            assert len(fake.received[-1].raw) < len(request_body(0, ENDS[2]))
            own.stop()
            for end in ENDS[3:5]:
                response = send(replica.url, 0, end)
                assert response.status_code == 200
                assert fake.received[-1].raw == request_body(0, end)  # forwarded exactly as sent
            metrics = httpx.get(replica.url + "/metrics").text
            assert re.search(r'^gem_passthroughs_total\{reason="store_unavailable"\} [1-9]', metrics, re.M)
            own.start()
            time.sleep(1.2)  # a replica tries Redis again 1 s after its last failure
            for end in ENDS[5:]:
                assert send(replica.url, 0, end).status_code == 200
            assert len(fake.received[-1].raw) < len(request_body(0, ENDS[-1]))  # compressing again
        upstream.stop()


def test_two_workers_behave_as_one_process(redis_server, single_process, tmp_path):
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    with GemServeProcess(*serve_args(upstream.url, redis_server.url, "--workers", "2"),
                         log_path=str(tmp_path / "w.log")) as server:
        workers = workers_of(server.process.pid)
        assert len(workers) == 2
        metrics_dir = environment_of(workers[0]).get("PROMETHEUS_MULTIPROC_DIR")
        for end in ENDS:
            for session in range(SESSIONS):
                with httpx.Client() as client:  # a new connection each time: the kernel spreads them
                    assert send(server.url, session, end, "sk-workers", client).status_code == 200
        sent = len(ENDS) * SESSIONS
        for _ in range(6):  # whichever worker answers reports both
            metrics = scrape(server.url)
            assert total(metrics, "gem_requests_total") == sent
            compressed = sent - total(metrics, "gem_requests_total", action="passthrough")
            assert compressed > 0
            assert total(metrics, "gem_store_round_trips_total") >= 2 * compressed  # a read and a save each
        assert Path(metrics_dir).is_dir()  # the workers' multiprocess directory
    upstream.stop()
    assert not Path(metrics_dir).exists()  # removed with the server
    forwarded = by_session(fake)
    for name, bodies in single_process.items():
        assert forwarded[name] == bodies, name


def test_a_dead_workers_counts_stay_in_the_metrics_and_its_gauges_go(redis_server, tmp_path):
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    with GemServeProcess(*serve_args(upstream.url, redis_server.url, "--workers", "2"),
                         log_path=str(tmp_path / "w.log")) as server:
        for end in ENDS[:4]:
            for session in range(SESSIONS):
                with httpx.Client() as client:
                    assert send(server.url, session, end, "sk-dead-worker", client).status_code == 200
        assert total(scrape(server.url), "gem_sessions") > SESSIONS  # some sessions are held by both workers
        victim = workers_of(server.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim in workers_of(server.process.pid) or len(workers_of(server.process.pid)) < 2:
            assert time.monotonic() < deadline, "no worker replaced the dead one"
            time.sleep(0.1)  # the supervisor marks the dead worker's metrics, then starts its replacement
        metrics = scrape(server.url)
        assert total(metrics, "gem_requests_total") == 4 * SESSIONS  # the dead worker's counts stay
        assert total(metrics, "gem_sessions") <= SESSIONS  # the survivor's own: the dead worker's are gone
    upstream.stop()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_workers_stop_when_their_supervisor_is_killed(redis_server, tmp_path):
    """A SIGKILLed supervisor leaves no worker serving its port (they would hold it, and its sessions, forever)."""
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    server = GemServeProcess(*serve_args(upstream.url, redis_server.url, "--workers", "2"),
                             log_path=str(tmp_path / "w.log"))
    server.__enter__()
    workers = workers_of(server.process.pid)
    metrics_dir = environment_of(workers[0])["PROMETHEUS_MULTIPROC_DIR"]  # a killed supervisor leaves it
    try:
        assert len(workers) == 2
        server.kill()
        deadline = time.monotonic() + 30
        while any(map(running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(running, workers))
    finally:
        for pid in filter(running, workers):
            os.kill(pid, signal.SIGKILL)
        server.__exit__(None, None, None)
        upstream.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def test_the_supervisor_logs_a_dead_worker_and_stops_on_a_worker_that_cannot_start(redis_server, tmp_path):
    """The supervisor's own lines reach the log (a worker's death was logged nowhere), and a worker that fails to
    start (uvicorn's status 3: a bad setting) stops the server with that status instead of restarting forever."""
    log = tmp_path / "w.log"
    with GemServeProcess(*serve_args("http://127.0.0.1:9", redis_server.url, "--workers", "2"),
                         log_path=str(log)) as server:
        victim = workers_of(server.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while f"(pid {victim}) exited" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "2 workers on http://127.0.0.1" in log.read_text()
        assert f"(pid {victim}) exited with -9; starting another" in log.read_text()
    bad = GemServeProcess(*serve_args("http://127.0.0.1:9", redis_server.url, "--workers", "2", "--set",
                                      f"router={tmp_path / 'absent.json'}", preset="cache-aware"))  # none can start
    process = subprocess.Popen(bad.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert process.wait(60) == 3
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
