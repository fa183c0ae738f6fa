"""``gem serve`` latency overhead against calling the fake upstream directly, p50 / p99, at 1 and 50
concurrent sessions (``--concurrency``), with batching on and off.

    python -m bench.proxy_overhead [--sessions 50] [--requests 4] [--concurrency 1 50] [--encoder hash]

The fake upstream (gemkernels/testing/fake_upstream.py) and the proxy each run in their own process on
127.0.0.1; the client (httpx, one process) replays agent sessions: each session sends growing
prefixes of examples/django-11276.json (the last ``--requests`` cuts, 28 to 32 blocks), its tool
outputs tagged with the session so no block is shared between sessions (every session encodes its
own blocks). Concurrency c means c sessions in flight at once. "batching off" is max_batch 1,
max_wait 0. Latency is request sent -> full response read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from gemkernels.testing.fake_upstream import FakeUpstream, free_port

MESSAGES = json.loads((Path(__file__).resolve().parents[1] / "examples" / "django-11276.json").read_text())["messages"]


def serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(FakeUpstream().app(), host="127.0.0.1", port=port, log_level="warning")


def serve_proxy(port: int, upstream: str, encoder: str, preset: str, batching: bool) -> None:
    import uvicorn

    from gemkernels.serve.app import ServerConfig, create_app

    config = ServerConfig(upstream=upstream, encoder=encoder, preset=preset,
                          max_batch=64 if batching else 1, max_wait=0.002 if batching else 0.0)
    uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning")


def start(target: Any, *args: Any) -> tuple[multiprocessing.Process, str]:
    port = free_port()
    proc = multiprocessing.Process(target=target, args=(port, *args), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.post(url + "/v1/chat/completions", content=b"{}", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{target.__name__} did not start")


def session_requests(session: int, requests: int, tag: str) -> list[bytes]:
    """One session's requests: growing prefixes, tool outputs tagged so blocks are the session's own."""
    messages = [{**m, "content": f"{m['content']}\n[{tag} {session}]"} if m["role"] == "tool" else m
                for m in MESSAGES]
    cuts = range(66 - 2 * (requests - 1), 67, 2)
    return [json.dumps({"model": "m", "user": f"{tag}-{session}", "messages": messages[:cut]}).encode()
            for cut in cuts]


async def replay(url: str, sessions: int, requests: int, concurrency: int, tag: str) -> tuple[list[float], float]:
    """Latencies of every request and the wall time, ``concurrency`` sessions in flight."""
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        async def one_session(s: int) -> None:
            async with gate:
                for body in session_requests(s, requests, tag):
                    started = time.perf_counter()
                    r = await client.post(url + "/v1/chat/completions", content=body,
                                          headers={"content-type": "application/json"})
                    r.raise_for_status()
                    latencies.append(time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(*(one_session(s) for s in range(sessions)))
        return latencies, time.perf_counter() - started


def percentiles(latencies: list[float]) -> tuple[float, float]:
    return float(np.percentile(latencies, 50)) * 1e3, float(np.percentile(latencies, 99)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--requests", type=int, default=4, help="per session, at most 20")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 50], help="sessions in flight")
    parser.add_argument("--encoder", default="hash")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    upstream_proc, upstream = start(serve_upstream)
    rows = []
    try:
        for batching in (True, False):
            proxy_proc, proxy = start(serve_proxy, upstream, args.encoder, args.preset, batching)
            try:
                for concurrency in args.concurrency:
                    tag = f"b{int(batching)}c{concurrency}"
                    direct, _ = asyncio.run(replay(upstream, args.sessions, args.requests, concurrency, tag + "d"))
                    via, wall = asyncio.run(replay(proxy, args.sessions, args.requests, concurrency, tag))
                    (d50, d99), (p50, p99) = percentiles(direct), percentiles(via)
                    rows.append({"batching": batching, "concurrency": concurrency, "requests": len(via),
                                 "direct_p50_ms": d50, "direct_p99_ms": d99, "proxy_p50_ms": p50,
                                 "proxy_p99_ms": p99, "overhead_p50_ms": p50 - d50, "overhead_p99_ms": p99 - d99,
                                 "proxy_req_per_s": len(via) / wall})
                metrics = httpx.get(proxy + "/metrics").text
                rows[-1]["metrics_batch_lines"] = [line for line in metrics.splitlines()
                                                   if line.startswith(("gem_batch_size_count", "gem_batch_size_sum"))]
            finally:
                proxy_proc.terminate()
                proxy_proc.join()
    finally:
        upstream_proc.terminate()
        upstream_proc.join()
    print(f"encoder {args.encoder}, preset {args.preset}, {args.sessions} sessions x {args.requests} requests")
    print("| batching | sessions in flight | direct p50 / p99 ms | proxy p50 / p99 ms | overhead p50 / p99 ms "
          "| proxy req/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['batching'] else 'off'} | {r['concurrency']} | {r['direct_p50_ms']:.1f} / "
              f"{r['direct_p99_ms']:.1f} | {r['proxy_p50_ms']:.1f} / {r['proxy_p99_ms']:.1f} | "
              f"{r['overhead_p50_ms']:.1f} / {r['overhead_p99_ms']:.1f} | {r['proxy_req_per_s']:.1f} |")
    for r in rows:
        for line in r.get("metrics_batch_lines", []):
            print(f"  (batching {'on' if r['batching'] else 'off'}) {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
