"""The upstream pools: requests spread to the pool with the fewest awaiting an answer (httpcore's pool is
quadratic in its connections), a light load stays on the first pool, and URLs and raw query strings as sent."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")

from gemkernels.serve.upstreams import UPSTREAM_POOLS, Upstreams, upstream_url  # noqa: E402


def test_requests_spread_over_the_pools_and_a_light_load_stays_on_the_first():
    async def scenario() -> tuple[list[int], list[int], list[bytes]]:
        upstreams = Upstreams({"openai": "http://u/v1", "anthropic": "http://a"}, timeout=5)
        release = asyncio.Event()
        used: list[int] = []
        urls: list[bytes] = []

        def fake_send(pool: int):
            async def send(request: httpx.Request) -> httpx.Response:
                used.append(pool)
                urls.append(bytes(request.url.raw_path))
                await release.wait()
                return httpx.Response(200)
            return send

        for pool, transport in enumerate(upstreams.transports):
            transport.handle_async_request = fake_send(pool)
        for _ in range(5):  # one at a time: always the first pool, whose connections are warm
            release.set()
            await upstreams.send("POST", upstreams.url("openai", "/v1/chat/completions"), "", [], b"{}")
        sequential = list(used)
        used.clear()
        release.clear()
        burst = [asyncio.create_task(upstreams.send("GET", upstreams.url("openai", "/v1/models"), "a=1&a=2&b=%20",
                                                    [], b"")) for _ in range(UPSTREAM_POOLS + 8)]
        await asyncio.sleep(0.05)
        concurrent = list(used)
        release.set()
        await asyncio.gather(*burst)
        assert upstreams.awaiting == [0] * UPSTREAM_POOLS
        await upstreams.aclose()
        return sequential, concurrent, urls

    sequential, concurrent, urls = asyncio.run(scenario())
    assert sequential == [0] * 5
    assert sorted(concurrent[:UPSTREAM_POOLS]) == list(range(UPSTREAM_POOLS))  # one each before any doubles up
    assert max(concurrent.count(p) for p in range(UPSTREAM_POOLS)) == 2
    assert urls[-1] == b"/v1/models?a=1&a=2&b=%20"  # the query string exactly as the client wrote it


def test_upstream_urls_do_not_double_v1():
    assert upstream_url("http://h/v1/", "/v1/messages") == "http://h/v1/messages"
    assert upstream_url("http://h", "/v1/messages") == "http://h/v1/messages"
    assert upstream_url("http://h/api/v1", "/v1/files/x") == "http://h/api/v1/files/x"
    with pytest.raises(ValueError, match="no upstream"):
        Upstreams({"openai": "http://u"}, timeout=1)
