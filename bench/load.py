"""Load: N concurrent sessions replaying real runs' growing histories through ``gem serve`` (and, optionally,
LiteLLM's proxy) against a fake upstream that answers after 500 ms, and the same load sent straight to it.

    python -m bench.load [PATHS ...] [--sessions 10 100 200] [--steps 16] [--warm 0] [--delay 0.5] [--encoder hash]
                         [--budget-ms 200]
                         [--modes off cache-aware paper cache-aware@redis cache-aware@process] [--redis URL]
                         [--workers N] [--threads N]
                         [--litellm /tmp/litellm-venv/bin/litellm]

Runs come from PATHS (default ``../shared/data/trajectories/``, read with `gemkernels.evaluate.loaders`; without it,
``examples/django-11276.json``). Session i replays run i mod R: its checkpoints ``--start`` to ``--start + --steps``
(one request per agent step, each the history before that step, OpenAI chat format), its tool outputs tagged with
the session so that no block is shared, with its own ``X-GEM-Session``, ``Authorization`` and connection. Session i
starts i/N x ``--delay`` after the first, so that N requests are in flight at a steady N/delay per second (not in
waves). Every target runs in its own process on 127.0.0.1: the fake upstream (`gemkernels.testing.fake_upstream`),
one ``gem serve`` per mode (``off`` is forwarding only: ``--set min_blocks=1000000``, the body parsed and never
compressed; the others are presets: a bare ``PRESET`` compresses in the proxy's own process (``--compress-process
0``), ``PRESET@process`` in ``--processes`` processes of its own (``--compress-process N``; gem serve's default,
``auto``, is 2 on a 2-core host), ``PRESET@redis`` keeps its sessions in Redis (``--redis``, or a ``redis-server``
started here), as ``gem serve --workers N`` with ``--workers``, and the table then counts the store's round trips
per request and Redis's memory per session), LiteLLM (forwarding only: one model routed to the upstream, no
database, no master key). For each N the targets are measured one after the other in one run: latency (request sent
to full response read) p50 / p99, added p50 / p99 (target minus direct at the same N), the target's CPU seconds per
request (its process tree, from /proc, counted until it is idle again: blocks encoded in the background after their
request went out included), the share of gem's requests sent on before their blocks were encoded or analysed
(``--budget-ms``: its budget), the mean time a compression waited for a thread or its session's earlier request
(``queued``: gem's saturation), the share of its requests selected anew (rewrites), the share of the characters of
the histories it compressed or appended to that it forwarded (deferred appends included, as they count no tokens;
requests that went out whole are not counted), and the client's share of a core.
With ``--warm K`` each session's first K requests are sent first and not measured, and the sessions start again,
staggered, once the target is idle: the steady state of N sessions in flight, without all N sessions' first
compressions (each analyses every block it holds) falling in the same second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.presets import DEFAULT_RUNS
from bench.proxy_overhead import percentiles, start
from gemkernels.evaluate.loaders import Run, checkpoints, load_run, load_runs
from gemkernels.testing.fake_upstream import FakeUpstream, free_port
from gemkernels.testing.processes import GemServeProcess, RedisServer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django-11276.json"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def serve_upstream(port: int, delay_s: float) -> None:
    """The fake upstream, answering every chat call after ``delay_s`` and recording nothing; its idle connections
    are kept 60 s (a provider's are; uvicorn's 5 s would race the proxy's pools, which drop theirs after 5 s)."""
    import uvicorn

    uvicorn.run(FakeUpstream(delay_s=delay_s, record=False).app(), host="127.0.0.1", port=port, log_level="warning",
                timeout_keep_alive=60)


def serve_gem(port: int, upstream: str, encoder: str, preset: str, overrides: tuple[str, ...],
              store: str = "memory", compress_process: int = 0, threads: int | None = None,
              budget_s: float | None = None) -> None:
    """``gem serve`` with ``preset``, ``overrides``, ``store`` and ``--compress-process N``, its connection timeouts as
    ``gem serve`` sets them, ``threads`` compression threads and a ``budget_s`` encoding budget (None: its
    defaults); access log off (as for LiteLLM)."""
    import uvicorn

    from gemkernels.serve.app import ServerConfig, create_app
    from gemkernels.serve.connections import uvicorn_options

    config = ServerConfig(upstream=upstream, encoder=encoder, preset=preset, overrides=overrides, store=store,
                          compress_process=compress_process, **({} if threads is None else {"threads": threads}),
                          **({} if budget_s is None else {"encode_budget": budget_s}))
    uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning", **uvicorn_options())


def start_litellm(executable: str, upstream: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """LiteLLM's proxy in front of ``upstream`` (model ``m``, forwarding only), once it answers; its log in
    ``folder``."""
    config = folder / "litellm.yaml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": upstream + "/v1",
                                                              "api_key": "dummy"}}],
        "litellm_settings": {"drop_params": True, "turn_off_message_logging": True}}))
    port = free_port()
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
           "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}  # no auth, as gem serve: on 127.0.0.1 only
    env.pop("DATABASE_URL", None)
    with (folder / "litellm.log").open("w") as log:
        proc = subprocess.Popen([executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                 "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"LiteLLM did not start; see {folder / 'litellm.log'}")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (all their threads), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime, stime: fields 14, 15 of stat
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def settle(pid: int, idle_share: float = 0.05, timeout_s: float = 300.0) -> None:
    """Wait until process ``pid`` (and its descendants) uses less than ``idle_share`` of a core over 0.5 s: its
    background work done, so that it neither runs into the next measurement nor goes uncounted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = tree_cpu_seconds(pid)
        time.sleep(0.5)
        if tree_cpu_seconds(pid) - before < idle_share * 0.5:
            return


def load_sessions_runs(paths: list[str], start_at: int, steps: int) -> list[Run]:
    """Runs with at least ``start_at + steps`` agent steps from ``paths``; else those of the example run."""
    existing = [p for p in paths if Path(p).exists()]
    if not existing:
        print(f"bench.load: {', '.join(paths)} not found; replaying {EXAMPLE.name} only")
        return [load_run(EXAMPLE)]
    runs, errors = load_runs(existing)
    for path, error in errors:
        print(f"bench.load: skipped {path}: {error}")
    long_enough = [run for run in runs if len(checkpoints(run.messages)) >= start_at + steps]
    if not long_enough:
        print(f"bench.load: no run has {start_at + steps} agent steps; replaying {EXAMPLE.name} only")
        return [load_run(EXAMPLE)]
    return long_enough


def session_bodies(run: Run, tag: str, start_at: int, steps: int) -> list[bytes]:
    """One session's requests: the histories before its steps ``start_at`` .. ``start_at + steps`` (the last
    ``steps`` if the run is shorter), tool outputs tagged with ``tag``."""
    messages = [{**m, "content": f"{m['content']}\n[{tag}]"} if m.get("role") == "tool"
                and isinstance(m.get("content"), str) else m for m in run.messages]
    cuts = checkpoints(messages)
    window = cuts[start_at:start_at + steps] if len(cuts) >= start_at + steps else cuts[-steps:]
    return [json.dumps({"model": "m", "messages": messages[:cut]}).encode() for cut in window]


@dataclass
class Phase:
    """One target at one load: every request's latency, the errors, the wall time and the CPU seconds spent."""

    target: str
    sessions: int
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # kind (status or exception) -> count
    wall_s: float = 0.0
    target_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    store_round_trips: float | None = None  # to the shared session store, over the phase (gem with --store only)
    deferred: float | None = None  # requests sent on before their blocks were encoded or analysed (gem only)
    queued: tuple[float, float] | None = None  # compressions' seconds waiting for a thread or their session, count
    rewrites: float | None = None  # requests whose history was selected anew (gem only)
    chars: tuple[float, float] | None = None  # characters of the histories received and forwarded (gem only)


async def replay(url: str, bodies: list[list[bytes]], tag: str, delay_s: float, phase: Phase) -> None:
    """Each session's bodies one after the other, the sessions started evenly over ``delay_s``, into ``phase``
    with the wall time and the client's CPU seconds while they ran."""
    # One client (one connection) a session, made before the clock starts: making an httpx client loads the CA
    # bundle (~25 ms), which would stall the sessions already running.
    clients = [httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1), verify=False) for _ in bodies]

    async def one_session(s: int, requests: list[bytes]) -> None:
        await asyncio.sleep(s * delay_s / len(bodies))
        headers = {"content-type": "application/json", "authorization": f"Bearer sk-load-{s}",
                   "x-gem-session": f"{tag}-{s}"}
        for body in requests:
            started = time.perf_counter()
            try:
                response = await clients[s].post(url + "/v1/chat/completions", content=body, headers=headers)
                error = None if response.status_code == 200 else f"status {response.status_code}"
            except httpx.HTTPError as err:
                error = type(err).__name__
            phase.latencies.append(time.perf_counter() - started)
            if error is not None:
                phase.errors[error] = phase.errors.get(error, 0) + 1

    client_before, started = os.times(), time.perf_counter()
    await asyncio.gather(*(one_session(s, requests) for s, requests in enumerate(bodies)))
    phase.wall_s = time.perf_counter() - started
    client_after = os.times()
    phase.client_cpu_s = client_after.user + client_after.system - client_before.user - client_before.system
    await asyncio.gather(*(client.aclose() for client in clients))


def measure(target: str, url: str, pid: int | None, runs: list[Run], sessions: int, start_at: int, steps: int,
            delay_s: float, warm: int = 0) -> Phase:
    """``sessions`` sessions of ``steps`` requests from step ``start_at`` on against ``url``, served by process
    ``pid`` (None for the upstream itself, whose CPU is not counted); the target's CPU seconds are counted until it
    is idle again, background work (blocks encoded after their request went out) included. ``warm``: each
    session's first that many requests are sent first and not measured; once the target is idle the sessions start
    again, staggered as at first, with the rest (a steady state instead of every session's cold start at once)."""
    tag = f"{target}-{sessions}"
    bodies = [session_bodies(runs[s % len(runs)], f"{tag} {s}", start_at, steps) for s in range(sessions)]
    if warm:
        asyncio.run(replay(url, [requests[:warm] for requests in bodies], tag, delay_s, Phase(target, sessions)))
        if pid:
            settle(pid)
        bodies = [requests[warm:] for requests in bodies]
    phase = Phase(target, sessions)
    cpu_before = tree_cpu_seconds(pid) if pid else 0.0
    before = gem_counters(url) if pid else None
    asyncio.run(replay(url, bodies, tag, delay_s, phase))
    if pid:
        settle(pid)
        phase.target_cpu_s = tree_cpu_seconds(pid) - cpu_before
        if before is not None:
            after = gem_counters(url) or before
            d = {name: after[name] - before[name] for name in GEM_COUNTERS}
            phase.store_round_trips, phase.deferred, phase.rewrites = d[TRIPS], d[DEFERRED], d[REQUESTS]
            phase.queued, phase.chars = (d[QUEUED_SUM], d[QUEUED_COUNT]), (d[CHARS_BEFORE], d[CHARS_AFTER])
    return phase


#: The gem counters a phase reports: store round trips, deferred requests, seconds queued, requests selected anew
#: (summed over routes), history characters received and forwarded.
TRIPS, DEFERRED = "gem_store_round_trips_total ", "gem_encoding_deferred_total "
QUEUED_SUM, QUEUED_COUNT = 'gem_stage_seconds_sum{stage="queued"} ', 'gem_stage_seconds_count{stage="queued"} '
CHARS_BEFORE, CHARS_AFTER = 'gem_chars_total{stage="before"} ', 'gem_chars_total{stage="after"} '
REQUESTS = "gem_requests_total{"  # only the lines of REWRITES, summed
GEM_COUNTERS = (TRIPS, DEFERRED, QUEUED_SUM, QUEUED_COUNT, CHARS_BEFORE, CHARS_AFTER, REQUESTS)
REWRITES = 'action="reselected"'  # the gem_requests_total lines counted


def gem_counters(url: str) -> dict[str, float] | None:
    """`GEM_COUNTERS` of a gem target, every worker's (None for any other target)."""
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    values = dict.fromkeys(GEM_COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith(GEM_COUNTERS):
            name, _, value = line.rpartition(" ")
            if name.startswith(REQUESTS):
                if REWRITES in name:
                    values[REQUESTS] += float(value)
            else:
                values[name + " "] = float(value)
    return values if "gem_" in text else None


def redis_memory(url: str) -> str:
    """What the sessions and the shared embeddings hold in Redis (``MEMORY USAGE`` of every gemkernels key)."""
    import redis

    client = redis.Redis.from_url(url)
    lines = []
    for kind, pattern in (("session", "gem:s:*"), ("embedding", "gem:e:*")):
        sizes = [client.memory_usage(key) or 0 for key in client.scan_iter(pattern, count=1000)]
        if sizes:
            lines.append(f"Redis: {len(sizes)} {kind} keys, {sum(sizes) / len(sizes):,.0f} bytes each on average, "
                         f"{sum(sizes) / 2**20:.1f} MiB in all")
    client.close()
    return "\n".join(lines)


def table(phases: list[Phase]) -> str:
    """The markdown table of ``phases``, each target's added latency against ``direct`` at the same load, and the
    kinds of the errors under it."""
    direct = {p.sessions: percentiles(p.latencies) for p in phases if p.target == "direct"}
    lines = [("| target | sessions in flight | requests (errors) | req/s | p50 / p99 ms | added p50 / p99 ms "
              "| target CPU ms / request | deferred / request | queued ms / compression | rewrites / request "
              "| characters forwarded | store round trips / request | client core share |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in phases:
        p50, p99 = percentiles(p.latencies)
        d50, d99 = direct[p.sessions]
        added = "-" if p.target == "direct" else f"{p50 - d50:.1f} / {p99 - d99:.1f}"
        cpu = "-" if p.target == "direct" else f"{1e3 * p.target_cpu_s / len(p.latencies):.2f}"
        trips = "-" if p.store_round_trips is None else f"{p.store_round_trips / len(p.latencies):.2f}"
        deferred = "-" if p.deferred is None else f"{p.deferred / len(p.latencies):.3f}"
        queued = "-" if not p.queued or not p.queued[1] else f"{1e3 * p.queued[0] / p.queued[1]:.1f}"
        rewrites = "-" if p.rewrites is None else f"{p.rewrites / len(p.latencies):.3f}"
        chars = "-" if not p.chars or not p.chars[0] else f"{p.chars[1] / p.chars[0]:.1%}"
        lines.append(f"| {p.target} | {p.sessions} | {len(p.latencies)} ({sum(p.errors.values())}) | "
                     f"{len(p.latencies) / p.wall_s:.0f} | {p50:.1f} / {p99:.1f} | {added} | {cpu} | {deferred} | "
                     f"{queued} | {rewrites} | {chars} | {trips} | {p.client_cpu_s / p.wall_s:.2f} |")
    lines.extend(f"errors, {p.target} at {p.sessions}: {p.errors}" for p in phases if p.errors)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RUNS)])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 100, 200], help="sessions in flight")
    parser.add_argument("--start", type=int, default=12, help="first agent step replayed")
    parser.add_argument("--steps", type=int, default=16, help="agent steps (requests) per session")
    parser.add_argument("--delay", type=float, default=0.5, help="the upstream's answer time, seconds")
    parser.add_argument("--warm", type=int, default=0,
                        help="requests of each session sent, unmeasured, before the sessions start again "
                             "(steady state)")
    parser.add_argument("--encoder", default="hash", help="gem's encoder (hash, minilm, ...)")
    parser.add_argument("--modes", nargs="+", default=["off", "cache-aware", "paper"],
                        help="gem targets: off (forwarding only) or preset names; PRESET@redis keeps the sessions "
                             "in Redis (--redis), PRESET@process compresses in --processes processes of its own "
                             "(--compress-process N)")
    parser.add_argument("--redis", help="the Redis of the @redis modes (default: a redis-server started here)")
    parser.add_argument("--workers", type=int, default=1,
                        help="the @redis modes run as gem serve --workers N (one process per core)")
    parser.add_argument("--processes", type=int, default=1, help="the @process modes' compression processes")
    parser.add_argument("--threads", type=int, help="gem's compression threads (default: gem serve's)")
    parser.add_argument("--budget-ms", type=float, help="gem's encoding and analysis budget (default: gem serve's)")
    parser.add_argument("--litellm", help="LiteLLM's executable (e.g. /tmp/litellm-venv/bin/litellm): measure it too")
    parser.add_argument("--json", help="also write the per-phase figures here")
    args = parser.parse_args()
    runs = load_sessions_runs(args.paths, args.start, args.steps)
    print(f"{len(runs)} runs; steps {args.start}..{args.start + args.steps - 1}; upstream delay {args.delay} s; "
          f"gem encoder {args.encoder}")
    stops: list[Callable[[], Any]] = []
    phases: list[Phase] = []
    try:
        upstream_proc, upstream = start(serve_upstream, args.delay)
        stops.append(upstream_proc.kill)
        targets: list[tuple[str, str, int | None]] = [("direct", upstream, None)]
        redis_url = args.redis
        if redis_url is None and any(mode.endswith("@redis") for mode in args.modes):
            server = RedisServer(maxmemory_mb=2048)
            server.start()
            stops.append(server.stop)
            redis_url = server.url
        for mode in args.modes:
            mode, _, where = mode.partition("@")
            store = redis_url if where == "redis" else "memory"
            preset, overrides = ("paper", ("min_blocks=1000000",)) if mode == "off" else (mode, ())
            name = "gem forwarding only" if mode == "off" else f"gem {mode} ({args.encoder})"
            if where == "redis" and args.workers > 1:
                server = GemServeProcess("--upstream", upstream, "--encoder", args.encoder, "--preset", preset,
                                         *[f"--set={item}" for item in overrides], "--store", redis_url,
                                         "--workers", str(args.workers), "--compress-process", "0",
                                         *([] if args.budget_ms is None else ["--encode-budget-ms",
                                                                              str(args.budget_ms)]))
                server.__enter__()
                stops.append(server.kill)
                url, pid = server.url, server.process.pid
                name += f", sessions in Redis, {args.workers} workers"
            else:
                proc, url = start(serve_gem, upstream, args.encoder, preset, overrides, store,
                                  args.processes if where == "process" else 0,
                                  args.threads, None if args.budget_ms is None else args.budget_ms / 1000)
                stops.append(proc.kill)
                pid = proc.pid
                name += {"redis": ", sessions in Redis", "process": f", {args.processes} compression process"
                         + "es" * (args.processes > 1), "": ", in process" * (mode != "off")}.get(where, "")
            targets.append((name, url, pid))
        if args.litellm:
            folder = Path(tempfile.mkdtemp(prefix="bench-load-"))
            litellm_proc, litellm = start_litellm(args.litellm, upstream, folder)
            stops.append(litellm_proc.kill)
            targets.append(("litellm forwarding only", litellm, litellm_proc.pid))
        for name, url, pid in targets:  # warm up: connections, imports, the encoder
            measure(name + " warm-up", url, pid, runs, 2, args.start, 2, args.delay)
        for sessions in args.sessions:
            for name, url, pid in targets:
                phases.append(measure(name, url, pid, runs, sessions, args.start, args.steps, args.delay, args.warm))
                print(f"  {name}, {sessions} sessions: {phases[-1].wall_s:.1f} s", file=sys.stderr)
        if redis_url is not None:
            print(redis_memory(redis_url))
    finally:
        for stop in reversed(stops):
            stop()
    print(table(phases))
    if args.json:
        Path(args.json).write_text(json.dumps([{**vars(p), "latencies": None, "p50_p99_ms": percentiles(p.latencies)}
                                               for p in phases], indent=1))


if __name__ == "__main__":
    main()
