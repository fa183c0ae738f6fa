"""The upstream pools: direct requests over one `Http1Transport`; through a proxy, requests spread to the pool with
the fewest awaiting an answer (httpcore's pool is quadratic in its connections), a light load staying on the first
pool; URLs and raw query strings as sent."""

from __future__ import annotations

import asyncio
import base64

import pytest

httpx = pytest.importorskip("httpx")

from gemkernels.serve import upstreams as upstreams_module  # noqa: E402
from gemkernels.serve.http1 import Http1Transport  # noqa: E402
from gemkernels.serve.upstreams import UPSTREAM_POOLS, Upstreams, upstream_url  # noqa: E402

PROXY = "http://proxy.invalid:3128"


def test_direct_upstreams_share_one_http1_transport(monkeypatch):
    monkeypatch.setattr(upstreams_module, "environment_proxy", lambda url: None)
    upstreams = Upstreams({"openai": "http://u/v1", "anthropic": "http://a"}, timeout=5)
    assert list(upstreams.pools) == [None]
    assert [type(t) for t in upstreams.pools[None].transports] == [Http1Transport]


def test_requests_through_a_proxy_spread_over_the_pools_and_a_light_load_stays_on_the_first(monkeypatch):
    monkeypatch.setattr(upstreams_module, "environment_proxy", lambda url: PROXY)

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

        pools = upstreams.pools[PROXY]
        for pool, transport in enumerate(pools.transports):
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
        assert pools.awaiting == [0] * UPSTREAM_POOLS
        await upstreams.aclose()
        return sequential, concurrent, urls

    sequential, concurrent, urls = asyncio.run(scenario())
    assert sequential == [0] * 5
    assert sorted(concurrent[:UPSTREAM_POOLS]) == list(range(UPSTREAM_POOLS))  # one each before any doubles up
    assert max(concurrent.count(p) for p in range(UPSTREAM_POOLS)) == 2
    assert urls[-1] == b"/v1/models?a=1&a=2&b=%20"  # the query string exactly as the client wrote it


def test_requests_go_through_the_proxy_the_environment_names_unless_no_proxy_lists_the_host(monkeypatch):
    """``HTTP_PROXY`` / ``NO_PROXY`` as httpx's client read them (the pools' transports read no environment)."""

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        lines: dict[str, list[bytes]] = {"proxy": [], "direct": []}

        def server(name: str):
            async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                head = await reader.readuntil(b"\r\n\r\n")
                lines[name].append(head.split(b"\r\n", 1)[0])
                lines[name] += [line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization")]
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                await writer.drain()
                writer.close()
            return answer

        proxy = await asyncio.start_server(server("proxy"), "127.0.0.1", 0)
        direct = await asyncio.start_server(server("direct"), "127.0.0.1", 0)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.delenv("http_proxy", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        upstreams = Upstreams({"openai": "http://user:p%40ss@api.example/v1",
                               "anthropic": f"http://127.0.0.1:{direct.sockets[0].getsockname()[1]}"}, timeout=5)
        for kind, path in (("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")):
            response = await upstreams.send("POST", upstreams.url(kind, path), "", [], b"{}")
            assert response.status_code == 200 and await response.aread() == b"{}"
            await response.aclose()
        await upstreams.aclose()
        proxy.close()
        direct.close()
        return lines["proxy"], lines["direct"]

    through_proxy, direct = asyncio.run(scenario())
    assert through_proxy == [b"POST http://api.example/v1/chat/completions HTTP/1.1",  # absolute form, via it
                             b"Authorization: Basic " + base64.b64encode(b"user:p@ss")]  # the URL's, as httpx's client
    assert direct == [b"POST /v1/messages HTTP/1.1"]


@pytest.mark.parametrize(("url", "no_proxy", "proxied"), [
    ("https://api.example/v1", "", True),
    ("https://api.example/v1", "api.example", False),
    ("https://user:pw@api.example/v1", "api.example", False),  # credentials are not the host
    ("https://[::1]:8080/v1", "::1", False),  # nor are an IPv6 address's brackets
    ("https://sub.example.com/v1", ".example.com", False),
    ("https://other.example/v1", "api.example", True),
])
def test_no_proxy_is_matched_against_the_host(monkeypatch, url, no_proxy, proxied):
    from gemkernels.serve.upstreams import environment_proxy

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert environment_proxy(url) == ("http://proxy.local:3128" if proxied else None)


def test_upstream_urls_do_not_double_v1():
    assert upstream_url("http://h/v1/", "/v1/messages") == "http://h/v1/messages"
    assert upstream_url("http://h", "/v1/messages") == "http://h/v1/messages"
    assert upstream_url("http://h/api/v1", "/v1/files/x") == "http://h/api/v1/files/x"
    with pytest.raises(ValueError, match="no upstream"):
        Upstreams({"openai": "http://u"}, timeout=1)
