"""``gem serve --compress-process [N]``: the same forwarded bytes as compressing in the proxy's own process, the
process's metrics on the proxy's ``/metrics``, unchanged requests (never an error) while the process is down, a new
process after it died, and no process left behind when the proxy stops; with N processes, each session in one of
them, and a dead one costing only its own sessions."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def serve(upstream_url: str, process: int, preset: str = "cache-aware") -> ServerThread:
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


def test_a_dead_process_sends_requests_unchanged_until_a_new_one_serves(upstream, monkeypatch, caplog):
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
        assert "stopped (exit status -9)" in caplog.text
        assert compression_children() - {child} and child not in compression_children()
    finally:
        server.stop()
    assert compression_children() == set()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_process_that_cannot_start_stops_the_proxy_with_its_error(capfd, processes):
    """As the in-process compressor does: an encoder that cannot load is an error at start-up, not a proxy that
    silently never compresses."""
    from starlette.testclient import TestClient

    config = ServerConfig(upstream="http://127.0.0.1:9/v1", encoder="no-such-encoder", compress_process=processes)
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


# --------------------------------------------------------------------------- the proxy's side, driven directly


def run_with(compressor_test, **config):
    """``compressor_test(pc)`` inside an event loop, with a started `ProcessCompressor` of the hash encoder, closed
    after (whatever the test did to its process)."""
    import asyncio

    from gemkernels.serve.metrics import Metrics

    async def main():
        pc = compression_process.ProcessCompressor(
            ServerConfig(upstream="http://127.0.0.1:9/v1", preset="cache-aware", encoder="hash", **config), Metrics())
        await pc.start()
        try:
            return await compressor_test(pc)
        finally:
            await pc.aclose()

    return asyncio.run(main())


def passthroughs(pc, reason: str) -> float:
    return pc.metrics.passthroughs.labels(reason)._value.get()


def test_a_history_that_cannot_be_pickled_goes_out_unchanged_not_as_an_error():
    """JSON nested close to the recursion limit parses, but pickling it on the event loop's deeper stack raised
    RecursionError out of `compress`: the proxy's own 500 (review of the first version)."""
    import sys

    deep: list = []
    for _ in range(sys.getrecursionlimit()):
        deep = [deep]
    messages = [{"role": "user", "content": "hi", "meta": deep}]

    async def test(pc):
        result = await pc.compress("/v1/chat/completions", messages, "deep")
        return result, passthroughs(pc, "internal_error")

    assert run_with(test) == (None, 1.0)


def test_an_orderly_stop_lets_the_process_exit_by_itself_and_nothing_restarts_it():
    """aclose: the process finishes and exits 0 (it was killed, -9, after its socket closed), a compression asked
    after that goes out unchanged (it raised: write after write_eof), and no process is started for it."""
    import asyncio

    async def test(pc):
        child = pc.child
        assert os.getsid(child.process.pid) != os.getsid(0)  # a terminal's Ctrl-C reaches the proxy only
        await pc.aclose()
        after = await pc.compress("/v1/chat/completions", MESSAGES[:28], "late")
        await asyncio.sleep(0.2)
        return child.process.returncode, after, pc.starting.done(), passthroughs(pc, "compressor_down")

    status, after, no_start, down = run_with(test)
    assert (status, after, no_start, down) == (0, None, True, 1.0)
    assert compression_children() == set()


def test_a_stopped_process_costs_a_request_its_budget_and_the_grace_not_forever(monkeypatch):
    monkeypatch.setattr(compression_process, "ANSWER_GRACE_S", 0.5)

    async def test(pc):
        pid = pc.child.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            result = await pc.compress("/v1/chat/completions", MESSAGES[:40], "stopped")
            waited = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        return result, waited, passthroughs(pc, "compressor_timeout"), len(pc.waiting)

    result, waited, timeouts, waiting = run_with(test, encode_budget=0.2)
    assert result is None and timeouts == 1.0 and waiting == 0
    assert 0.6 <= waited < 5


def test_the_process_dies_with_the_thread_that_started_it(tmp_path):
    """`die_with_parent`: a parent killed outright (no socket closed in order) takes the process with it."""
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    (tmp_path / "child.py").write_text(
        "import os, sys, time\n"
        "from gemkernels.serve.compression_process import die_with_parent\n"
        "die_with_parent(os.getppid())\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n")
    (tmp_path / "parent.py").write_text(
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(tmp_path / 'child.py')!r}])\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")])

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.kill()


def test_a_large_history_is_pickled_off_the_event_loop(monkeypatch):
    """A 40 MiB body pickled on the event loop stalled every other request for 580 ms (review of the first version):
    past `INLINE_FRAME_BYTES` the frame is built in a thread, and a small one stays inline."""
    import threading

    built = []
    original = compression_process.frame

    def frame(obj):
        built.append(threading.current_thread() is threading.main_thread())
        return original(obj)

    monkeypatch.setattr(compression_process, "frame", frame)
    history = MESSAGES[:28]
    big_history = [*history[:-1], {**history[-1], "content": "x" * (compression_process.INLINE_FRAME_BYTES + 1)}]

    async def test(pc):
        built.clear()  # the config frame the start sent
        for messages in (history, big_history):
            body = json.dumps({"model": "m", "messages": messages}).encode()
            await pc.compress("/v1/chat/completions", messages, "sizes", message_bytes=(body, []))

    run_with(test)
    assert built == [True, False]


def test_a_process_that_never_finishes_is_killed_when_the_proxy_stops(monkeypatch):
    monkeypatch.setattr(compression_process, "STOP_TIMEOUT_S", 0.5)

    async def test(pc):
        child = pc.child
        os.kill(child.process.pid, signal.SIGSTOP)  # it never reads the end of its socket, never exits by itself
        started = time.monotonic()
        await pc.aclose()
        return time.monotonic() - started, child.process.returncode

    waited, status = run_with(test)
    assert waited < 5 and status == -signal.SIGKILL
    assert compression_children() == set()


def test_a_process_that_keeps_dying_is_restarted_at_growing_intervals(monkeypatch):
    """A request that kills the process must not have it reload its encoder on every call: one that dies within
    `STEADY_S` of starting waits the interval, which doubles; one that served longer is replaced at once."""
    import asyncio

    monkeypatch.setattr(compression_process, "RESTART_INTERVAL_S", 0.4)
    monkeypatch.setattr(compression_process, "STEADY_S", 0.1)  # less than a start: it counts from the ready frame

    async def kill_and_wait(pc):
        child = pc.child
        os.kill(child.process.pid, signal.SIGKILL)
        await asyncio.gather(child.answers, return_exceptions=True)
        return time.monotonic()

    async def serving_again(pc, old):
        while pc.child is old or pc.child is None or pc.child.answers.done():
            await pc.compress("/v1/chat/completions", MESSAGES[:28], "k")  # a request is what restarts it
            await asyncio.sleep(0.02)
        return time.monotonic()

    async def test(pc):
        gaps = []
        for _ in range(2):
            old = pc.child
            died = await kill_and_wait(pc)
            gaps.append(pc.next_start - died)  # the earliest the next start may begin
            await serving_again(pc, old)
        pc.child.started_at -= compression_process.STEADY_S  # this one served long enough
        await kill_and_wait(pc)
        await pc.compress("/v1/chat/completions", MESSAGES[:28], "k")
        return gaps, not pc.starting.done() and pc.next_start == 0.0  # a start in flight, not waiting

    gaps, at_once = run_with(test)
    assert 0.2 <= gaps[0] <= 0.4 and 0.6 <= gaps[1] <= 0.8 and at_once
    assert compression_children() == set()


def test_a_process_that_stops_reading_costs_requests_their_deadline_then_is_replaced(monkeypatch):
    """A stopped process fills the socket: sending then waited in drain() (and behind its lock) with no limit. The
    deadline covers the sending too, and `WEDGED_AFTER` such requests in a row replace the process."""
    import asyncio

    monkeypatch.setattr(compression_process, "ANSWER_GRACE_S", 0.3)
    big = [*MESSAGES[:27], {**MESSAGES[27], "content": "x" * (2 << 20)}]

    async def test(pc):
        child = pc.child
        os.kill(child.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        results = await asyncio.gather(*(pc.compress("/v1/chat/completions", big, f"big-{i}") for i in range(3)),
                                       pc.compress("/v1/chat/completions", MESSAGES[:28], "small"))
        waited = time.monotonic() - started
        await asyncio.gather(child.answers, return_exceptions=True)  # killed as wedged, then reaped
        return (results, waited, passthroughs(pc, "compressor_timeout"), passthroughs(pc, "compressor_down"),
                child.process.returncode)

    results, waited, timeouts, down, status = run_with(test, encode_budget=0.2)
    # the request whose deadline fires after the replacing kill may see the process gone first
    assert results == [None] * 4 and timeouts >= 3 and timeouts + down == 4 and waited < 5
    assert status == -signal.SIGKILL


def test_aclose_on_a_socket_the_reader_already_closed_does_not_raise():
    """uvloop raises on write_eof() to a closed transport (asyncio ignores it): aclose must still end the process."""
    uvloop = pytest.importorskip("uvloop")

    from gemkernels.serve.metrics import Metrics

    async def main():
        pc = compression_process.ProcessCompressor(
            ServerConfig(upstream="http://127.0.0.1:9/v1", preset="cache-aware", encoder="hash"), Metrics())
        await pc.start()
        child = pc.child
        child.writer.close()  # as the reader does when it sees the end, before it has reaped the process
        await pc.aclose()
        return child.process.returncode

    assert uvloop.run(main()) is not None
    assert compression_children() == set()


def test_a_start_that_fails_after_the_process_began_leaves_no_process(monkeypatch):
    import asyncio

    from gemkernels.serve.metrics import Metrics

    async def no_connection(*args, **kwargs):
        raise OSError("no connection")

    monkeypatch.setattr(compression_process.asyncio, "open_connection", no_connection)

    async def main():
        pc = compression_process.ProcessCompressor(
            ServerConfig(upstream="http://127.0.0.1:9/v1", preset="cache-aware", encoder="hash"), Metrics())
        with pytest.raises(RuntimeError, match="did not start"):
            await pc.start()

    asyncio.run(main())
    assert compression_children() == set()


def test_the_process_imports_the_proxys_modules_not_the_working_directorys(tmp_path, monkeypatch):
    """``python -c`` puts the working directory first on sys.path: a json.py there was imported before the proxy's
    path was set, and the process did not start."""
    import sys

    (tmp_path / "json.py").write_text("raise ImportError('the working directory shadows json')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])

    async def test(pc):
        return pc.child is not None

    assert run_with(test)


def test_a_process_whose_proxy_died_while_it_started_exits():
    import subprocess
    import sys

    code = "from gemkernels.serve.compression_process import die_with_parent; die_with_parent(0); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "alive" not in done.stdout and not done.stderr


# --------------------------------------------------------------------------- several processes (--compress-process N)


CACHED = {"type": "ephemeral"}


def anthropic_run(turns: int, marks: int) -> list[dict]:
    """An Anthropic history of ``turns`` tool calls, a cache breakpoint on each of its last ``marks`` user messages
    (the documented multi-turn pattern moves them along as the history grows)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "fix the tests"}]}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "bash",
                                                         "input": {"cmd": f"ls {i}"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                   "content": f"out {i}"}]}]
    for message in [m for m in messages if m["role"] == "user"][-marks:] if marks else []:
        message["content"][0]["cache_control"] = CACHED
    return messages


def chat_run(steps: int, system: bool) -> list[dict]:
    """A chat history with tool calls (``steps`` of them), with or without a system message."""
    messages = ([{"role": "system", "content": "agent"}] if system else []) + [{"role": "user", "content": "task"}]
    for i in range(steps):
        messages += [{"role": "assistant", "content": None,
                      "tool_calls": [{"id": f"c{i}", "type": "function",
                                      "function": {"name": "bash", "arguments": f'{{"n": {i}}}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"}]
    return messages


@settings(max_examples=60, deadline=None)
@given(tenant=st.one_of(st.none(), st.text(max_size=8)), session=st.one_of(st.none(), st.text(max_size=12)),
       steps=st.integers(0, 6), marks=st.integers(0, 2), system=st.booleans(), shards=st.integers(1, 6))
def test_every_request_of_a_session_goes_to_one_process(tenant, session, steps, marks, system, shards):
    """Named, by tenant and name whatever the messages; unnamed, the same process for every history GEM names the
    same (`prefix_session_id`): a first request before any tool call, cache breakpoints that move along, a first
    message that is the task (Anthropic, chat without a system message)."""
    from gemkernels.compress.blocks import parse_history
    from gemkernels.compress.gem import prefix_session_id

    shard_of = compression_process.shard_of
    for runs in ([anthropic_run(t, marks) for t in range(steps + 1)], [chat_run(t, system) for t in range(steps + 1)]):
        assert len({prefix_session_id(parse_history(m)) for m in runs}) == 1  # one session, as GEM names it
        assert len({shard_of(tenant, session, m, shards) for m in runs}) == 1
        assert 0 <= shard_of(tenant, session, runs[0], shards) < shards
    if session is not None:
        assert shard_of(tenant, session, [], shards) == shard_of(tenant, session, chat_run(steps, system), shards)


def test_sessions_spread_over_the_processes():
    shard_of = compression_process.shard_of
    named = [0, 0, 0]
    for i in range(600):
        named[shard_of("tenant", f"session-{i}", [], 3)] += 1
    unnamed = {shard_of("tenant", None, [{"role": "system", "content": "agent"},
                                         {"role": "user", "content": f"task {i}"}], 3) for i in range(30)}
    assert min(named) > 150 and unnamed == {0, 1, 2}


def names_on_each_shard(shards: int, tenant: str | None, body: dict) -> list[str]:
    """One ``X-GEM-Session`` value per process whose requests (from ``tenant``, with ``body``'s instructions) go to
    that process."""
    from gemkernels.compress.sessions import request_session

    found: dict[int, str] = {}
    for i in range(1000):
        name = f"spread-{i}"
        found.setdefault(compression_process.shard_of(
            tenant, request_session(body, {GEM_SESSION_HEADER: name}), [], shards), name)
        if len(found) == shards:
            return [found[s] for s in range(shards)]
    raise AssertionError("no session name for some process")


def test_two_processes_forward_the_bytes_one_process_forwards_and_count_every_session(upstream):
    """Sessions in both processes and one unnamed session, their requests interleaved: the upstream gets the same
    bytes as from the proxy's own compressor, and ``gem_sessions`` counts the sessions of both processes."""
    from gemkernels.serve.serving import tenant_of

    fake, root = upstream
    tenant = tenant_of({"authorization": "Bearer sk-test"})
    names = [*names_on_each_shard(2, tenant, {"messages": MESSAGES}), None]
    sent, sessions = {}, {}
    for processes in (0, 2):
        server = serve(root, processes)
        try:
            before = len(fake.received)
            for cut in CUTS:
                for name in names:
                    headers = {"content-type": "application/json", "authorization": "Bearer sk-test"}
                    if name is not None:
                        headers[GEM_SESSION_HEADER] = name
                    body = json.dumps({"model": "m", "messages": MESSAGES[:cut]}).encode()
                    assert httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers,
                                      timeout=30).status_code == 200
            sent[processes] = [r.raw for r in fake.received[before:]]
            sessions[processes] = metric(server.url, "gem_sessions")
            if processes:
                assert len(compression_children()) == processes
        finally:
            server.stop()
    assert sent[2] == sent[0] and len(sent[2]) == len(names) * len(CUTS)
    assert sum(raw != json.dumps({"model": "m", "messages": MESSAGES[:cut]}).encode()
               for raw, cut in zip(sent[2], [c for c in CUTS for _ in names])) > 0  # something was compressed
    assert sessions[2] == sessions[0] == len(names)
    assert compression_children() == set()


def test_one_dead_process_of_two_costs_only_its_own_sessions(monkeypatch):
    """A killed process's sessions go out unchanged (``compressor_down``) until its replacement serves; the other
    process's sessions are compressed all along, and ``gem_sessions`` drops the dead process's."""
    import asyncio

    from gemkernels.serve.metrics import Metrics

    monkeypatch.setattr(compression_process, "RESTART_INTERVAL_S", 0.0)
    names = [next(f"s{i}" for i in range(100) if compression_process.shard_of(None, f"s{i}", [], 2) == shard)
             for shard in (0, 1)]

    async def main():
        metrics = Metrics()
        sharded = compression_process.ShardedCompressor(ServerConfig(
            upstream="http://127.0.0.1:9/v1", preset="cache-aware", encoder="hash", encode_budget=30.0,
            compress_process=2), metrics)
        await sharded.start()
        try:
            for name in names:
                assert await sharded.compress("/v1/chat/completions", MESSAGES[:40], name) is not None
            assert metrics.sessions._value.get() == 2
            dead = sharded.shards[0].child
            os.kill(dead.process.pid, signal.SIGKILL)
            await asyncio.wait_for(asyncio.shield(dead.answers), 30)
            unchanged = await sharded.compress("/v1/chat/completions", MESSAGES[:42], names[0])
            alive = await sharded.compress("/v1/chat/completions", MESSAGES[:42], names[1])
            sessions_after = metrics.sessions._value.get()
            deadline = time.monotonic() + 60
            while sharded.shards[0].child is dead and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            again = await sharded.compress("/v1/chat/completions", MESSAGES[:44], names[0])
            return unchanged, alive, sessions_after, again, metrics.passthroughs.labels("compressor_down")._value.get()
        finally:
            await sharded.aclose()

    unchanged, alive, sessions_after, again, down = asyncio.run(main())
    assert unchanged is None and down == 1.0
    assert alive is not None and alive.stats.action != "passthrough"
    assert sessions_after == 1
    assert again is not None and again.stats.action != "passthrough"
    assert compression_children() == set()


@pytest.mark.parametrize("niceness", [0, 7])
def test_the_process_runs_as_much_nicer_than_the_proxy_as_configured(niceness):
    """So that the proxy's event loop, forwarding every request, gets a core before compression does."""
    async def test(pc):
        return os.getpriority(os.PRIO_PROCESS, pc.child.process.pid)

    assert run_with(test, compress_niceness=niceness) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness)


@pytest.mark.parametrize("processes", [0, -1])
def test_a_count_below_one_is_refused_by_name_not_a_division_by_zero_per_request(processes):
    from gemkernels.serve.metrics import Metrics

    config = ServerConfig(upstream="http://127.0.0.1:9/v1", encoder="hash", compress_process=processes)
    with pytest.raises(ValueError, match="compress_process must be a number of processes"):
        compression_process.ShardedCompressor(config, Metrics())


@pytest.mark.parametrize(("process", "overrides", "what"), [
    (0, (), "cache-aware"), (2, (), "cache-aware"), (0, ("k=9", "tau=0.9"), "cache-aware --set k=9 --set tau=0.9")])
def test_the_proxy_says_at_start_where_it_compresses(upstream, caplog, process, overrides, what):
    """The start-up line names the preset with its overrides, the encoder and the processes that compress (0: the
    proxy's own)."""
    _, url = upstream
    config = ServerConfig(upstream=url + "/v1", preset="cache-aware", overrides=overrides, encoder="hash",
                          compress_process=process)
    with caplog.at_level("INFO", logger="gemkernels.serve"):
        ServerThread(create_app(config), graceful_s=10).stop()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gem serve: compressing")]
    where = "the proxy's own process (--compress-process 0)" if process == 0 else \
        "2 processes of its own (--compress-process 2)"
    assert lines == [f"gem serve: compressing with {what}, encoder hash-256, in {where}"]
