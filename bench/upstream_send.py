"""The proxy's upstream send, CPU per request: `Upstreams.send` (one `Http1Transport` to a direct upstream) against
httpcore's pools sent to directly (what it used before) and the same pools behind ``httpx.AsyncClient`` (what a proxy
written on httpx would use), side by side in one process against the fake upstream in another.

    python -m bench.upstream_send [--requests 1500] [--concurrency 30] [--rounds 5]

Each round sends ``--requests`` chat requests (a 20 KB body) with ``--concurrency`` in flight through each contender
in turn on uvloop, reading every answer to its end; CPU is this process's (``time.process_time``) over the round.
Reported: each contender's median of the rounds and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx

from gemkernels.serve.upstreams import UPSTREAM_POOLS, Pools, Upstreams
from gemkernels.testing.fake_upstream import FakeUpstream, free_port

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 20_000}]}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-bench")]


def serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(FakeUpstream(record=False).app(), host="127.0.0.1", port=port, log_level="warning")


class ClientPools:
    """`Upstreams`' pools and dispatch behind ``httpx.AsyncClient``s (default headers removed, as the proxy did)."""

    def __init__(self, timeout: float):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.clients = [httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits)
                        for _ in range(UPSTREAM_POOLS)]
        for client in self.clients:
            for name in ("accept", "accept-encoding", "user-agent"):
                del client.headers[name]
        self.awaiting = [0] * UPSTREAM_POOLS

    async def send(self, method: str, url: str, query: str, headers: list[tuple[bytes, bytes]],
                   content: bytes) -> httpx.Response:
        pool = self.awaiting.index(min(self.awaiting))
        client = self.clients[pool]
        request = client.build_request(method, url, headers=headers, content=content)
        self.awaiting[pool] += 1
        try:
            return await client.send(request, stream=True)
        finally:
            self.awaiting[pool] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


class HttpcorePools:
    """`UPSTREAM_POOLS` httpcore pools (httpx's transports) sent to directly, as `Upstreams` did before
    `Http1Transport`."""

    def __init__(self, timeout: float):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.pools = Pools([httpx.AsyncHTTPTransport(limits=limits) for _ in range(UPSTREAM_POOLS)])
        self.timeout = httpx.Timeout(timeout, connect=10.0).as_dict()

    async def send(self, method: str, url: str, query: str, headers: list[tuple[bytes, bytes]],
                   content: bytes) -> httpx.Response:
        return await self.pools.send(httpx.Request(method, url, headers=headers, content=content,
                                                   extensions={"timeout": self.timeout}))

    async def aclose(self) -> None:
        for transport in self.pools.transports:
            await transport.aclose()


async def cpu_per_request(send: Callable[..., Awaitable[httpx.Response]], url: str, requests: int,
                          concurrency: int) -> float:
    """Milliseconds of this process's CPU per request, ``requests`` of them ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await send("POST", url, "", HEADERS, BODY)
            async for _ in response.aiter_raw():
                pass
            await response.aclose()

    await asyncio.gather(*(one() for _ in range(min(100, requests))))  # connections open and warm
    started = time.process_time()
    await asyncio.gather(*(one() for _ in range(requests)))
    return (time.process_time() - started) / requests * 1e3


async def round_of(root: str, requests: int, concurrency: int) -> dict[str, float]:
    out = {}
    for name, make in (("httpx.AsyncClient pools", lambda: ClientPools(60.0)),
                       ("httpcore pools", lambda: HttpcorePools(60.0)),
                       ("Upstreams.send", lambda: Upstreams({"openai": root, "anthropic": root}, 60.0))):
        contender = make()
        out[name] = await cpu_per_request(contender.send, root + "/chat/completions", requests, concurrency)
        await contender.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    port = free_port()
    upstream = multiprocessing.Process(target=serve_upstream, args=(port,), daemon=True)
    upstream.start()
    root = f"http://127.0.0.1:{port}/v1"
    for _ in range(50):
        try:
            httpx.get(root + "/models", timeout=1.0)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    rounds = [run(round_of(root, args.requests, args.concurrency)) for _ in range(args.rounds)]
    upstream.terminate()
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    print(f"{args.requests} requests, {args.concurrency} in flight, {args.rounds} rounds (ms of CPU a request)")
    for name, median in medians.items():
        print(f"| {name} | {median:.3f} | {' / '.join(f'{r[name]:.3f}' for r in rounds)} |")
    client, pools, ours = medians.values()
    print(f"Upstreams.send / httpcore pools: {ours / pools:.2f}x; / httpx.AsyncClient pools: {ours / client:.2f}x")


if __name__ == "__main__":
    main()
