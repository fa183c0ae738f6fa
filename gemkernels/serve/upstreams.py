"""The APIs the proxy forwards to (an OpenAI-format and an Anthropic-format root), the connection pools that
carry the requests, and the WebSockets opened to them (`Upstreams.websocket`)."""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import AsyncIterable, Sequence
from urllib.parse import urlsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect

from gemkernels.serve.formats import ANTHROPIC_UPSTREAM, OPENAI_UPSTREAM
from gemkernels.serve.http1 import Http1Transport

#: httpx's connection pools the requests through a proxy are spread over, each to the one with the fewest requests
#: awaiting an answer (a light load stays on the first pool's warm connections). httpcore 1.0's pool scans all of
#: its connections for each idle one whenever a request starts or ends (O(n^2) in the connections), which made
#: forwarding alone collapse past ~100 requests in flight; k pools cut that work k^2-fold (bench/RESULTS.md §i).
#: Requests straight to an upstream go through one `Http1Transport` instead, whose idle connections are a list.
UPSTREAM_POOLS = 32
#: Frames an upstream WebSocket buffers before websockets stops reading from its socket (flow control: the relay
#: takes one message at a time, so an upstream faster than its client waits instead of filling memory).
WEBSOCKET_QUEUE_FRAMES = 4


def upstream_url(base: str, path: str) -> str:
    """``base`` + ``path``, without doubling ``/v1`` when ``base`` already ends with it."""
    base = base.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


def websocket_url(url: str) -> str:
    """``url`` with ``ws://`` for ``http://`` and ``wss://`` for ``https://`` (any other scheme as it is)."""
    scheme, sep, rest = url.partition("://")
    return {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme) + sep + rest


class NoRedirects(connect):
    """websockets' ``connect`` that follows no redirect: a 3xx is the upstream's answer, relayed to the client like
    any refusal (as the HTTP relay does), and the client's credentials never go to another host."""

    def process_redirect(self, exc: Exception) -> Exception:
        return exc


class Upstreams:
    """The OpenAI-format and Anthropic-format API roots (``roots``: kind -> URL) behind keep-alive connections: one
    `Http1Transport` for the upstreams reached directly, `UPSTREAM_POOLS` httpx pools through each proxy the
    environment names (`environment_proxy`); ``transport`` replaces the network (tests, one pool, no proxy).

    Requests go to the pools' transports as built here, not through an ``httpx.AsyncClient``: a client would add
    its default headers and replay the cookies any upstream answer set on every later request, whoever sent it
    (one tenant's cookies in another's requests), and its URL merging, auth, redirect and cookie bookkeeping cost
    a fifth of a request's send (`bench.upstream_send`: 1.04 against 0.85 ms of CPU)."""

    def __init__(self, roots: dict[str, str], timeout: float, transport: httpx.AsyncBaseTransport | None = None):
        missing = {OPENAI_UPSTREAM, ANTHROPIC_UPSTREAM} - set(roots)
        if missing:
            raise ValueError(f"no upstream for {sorted(missing)}")
        self.roots = roots
        self.limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        verify = httpx.create_ssl_context()  # one CA bundle load (~30 ms) for all the pools, WebSockets too
        self.ssl, self.connect_timeout = verify, min(timeout, 10.0)
        self.timeout = httpx.Timeout(timeout, connect=self.connect_timeout).as_dict()  # a request extension
        self.fixed = transport
        self.proxies: dict[str, str | None] = {}  # origin -> its proxy
        self.pools: dict[str | None, Pools] = {}  # proxy -> the pools through it
        for root in roots.values():
            self.pools_for(root)

    def pools_for(self, url: str) -> Pools:
        """The pools for ``url``'s origin (made on first use): through the proxy the environment names for it."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self.proxies:
            self.proxies[origin] = None if self.fixed is not None else environment_proxy(url)
        proxy = self.proxies[origin]
        if proxy not in self.pools:
            if self.fixed is not None:
                transports: list[httpx.AsyncBaseTransport] = [self.fixed]
            elif proxy is None:
                transports = [Http1Transport(self.ssl, max_idle=self.limits.max_keepalive_connections or 256)]
            else:
                transports = [httpx.AsyncHTTPTransport(verify=self.ssl, limits=self.limits, proxy=proxy)
                              for _ in range(UPSTREAM_POOLS)]
            self.pools[proxy] = Pools(transports)
        return self.pools[proxy]

    def url(self, kind: str, path: str) -> str:
        return upstream_url(self.roots[kind], path)

    async def send(self, method: str, url: str, query: str, headers: Sequence[tuple[bytes, bytes]],
                   content: bytes | AsyncIterable[bytes] | None) -> httpx.Response:
        """The upstream's response, streaming (the caller closes it); raises httpx's errors (whose ``request`` is not
        set). ``headers`` go out as given, plus ``Host`` and the body's length (or chunked framing) when absent and
        Basic credentials from ``url``'s ``user:password@`` when it has them and the headers no Authorization;
        ``query`` is the raw query string (ASCII), forwarded as sent."""
        request = httpx.Request(method, url, headers=headers, content=content, extensions={"timeout": self.timeout})
        if request.url.userinfo and "authorization" not in request.headers:  # an upstream URL's user:password
            credentials = f"{request.url.username}:{request.url.password}".encode()
            request.headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode("ascii")
        if query:
            request.url = request.url.copy_with(query=query.encode("ascii"))
        response = await self.pools_for(url).send(request)
        response.request = request
        return response

    async def websocket(self, kind: str, path: str, query: str, headers: Sequence[tuple[str, str]],
                        subprotocols: Sequence[str], max_size: int) -> ClientConnection:
        """An open WebSocket to the ``kind`` upstream's ``path`` and raw ``query`` (ASCII), its handshake carrying
        ``headers`` and offering ``subprotocols``; messages past ``max_size`` bytes close it with 1009. Raises
        ``OSError`` or ``TimeoutError`` (unreachable) and websockets' ``InvalidStatus`` (it answered without
        upgrading) or other ``WebSocketException`` (a broken handshake)."""
        url = websocket_url(self.url(kind, path)) + (f"?{query}" if query else "")
        secure = url.startswith("wss://")
        return await NoRedirects(url, additional_headers=list(headers), subprotocols=list(subprotocols) or None,
                                 user_agent_header=None, open_timeout=self.connect_timeout, max_size=max_size,
                                 max_queue=WEBSOCKET_QUEUE_FRAMES, ssl=self.ssl if secure else None)

    async def reachable(self, kind: str, timeout: float) -> str:
        """``reachable`` when the upstream answers at all (any HTTP status), else why not."""
        timeouts = httpx.Timeout(timeout).as_dict()
        try:
            response = await self.pools_for(self.roots[kind]).send(
                httpx.Request("HEAD", self.roots[kind], extensions={"timeout": timeouts}))
            await response.aclose()
        except httpx.HTTPError as err:
            return f"unreachable ({type(err).__name__})"
        return "reachable"

    async def aclose(self) -> None:
        for pools in self.pools.values():
            for transport in pools.transports:
                await transport.aclose()


class Pools:
    """Connection pools (httpx transports) a request is sent over: the one with the fewest requests awaiting an
    answer (the first of the least busy, so a light load stays on the first pool's warm connections)."""

    def __init__(self, transports: Sequence[httpx.AsyncBaseTransport]):
        self.transports = list(transports)
        self.awaiting = [0] * len(self.transports)

    async def send(self, request: httpx.Request) -> httpx.Response:
        pool = self.awaiting.index(min(self.awaiting))
        self.awaiting[pool] += 1
        try:
            return await self.transports[pool].handle_async_request(request)
        finally:
            self.awaiting[pool] -= 1


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY`` or ``ALL_PROXY`` by its scheme,
    less the hosts ``NO_PROXY`` lists, as urllib and curl read it: ``.example.com`` covers example.com too), else
    None."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    host = parts.hostname or ""  # no credentials, no IPv6 brackets
    if not proxy or urllib.request.proxy_bypass(f"{host}:{parts.port}" if parts.port else host):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"
