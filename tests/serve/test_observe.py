"""Observe mode: every body goes out byte for byte, and each session's record equals what a compressing proxy
forwarded on the same calls, priced independently here under a prefix cache."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402
from gemkernels.serve.observe import report_table  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402

CALLS = [synthetic_history(blocks, seed=21) for blocks in range(30, 60, 4)]
BODIES = [json.dumps({"model": "m", "messages": messages}).encode() for messages in CALLS]


def run(observe: bool) -> tuple[list[bytes], FakeUpstream, dict]:
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    proxy = ServerThread(create_app(ServerConfig(upstream=upstream.url, encoder="hash", preset="cache-aware",
                                                 encode_budget=30.0, observe=observe)))
    try:
        for body in BODIES:
            httpx.post(proxy.url + "/v1/chat/completions", content=body,
                       headers={"authorization": "Bearer a", "x-gem-session": "s"})
        report = httpx.get(proxy.url + "/v1/gem/sessions", headers={"authorization": "Bearer a"})
        other = httpx.get(proxy.url + "/v1/gem/sessions", headers={"authorization": "Bearer b"})
    finally:
        proxy.stop()
        upstream.stop()
    if observe:
        assert other.json()["sessions"] == []  # another tenant sees nothing
        return [r.raw for r in fake.received], fake, report.json()
    assert report.status_code == 404
    return [r.raw for r in fake.received], fake, {}


def priced(bodies: list[bytes], cached_price: float = 0.1) -> tuple[int, float]:
    """Tokens (bytes / 4 per message, as the client wrote them) and price under a whole-message prefix cache."""
    tokens, price, last = 0, 0.0, []
    for body in bodies:
        messages = [json.dumps(m, ensure_ascii=False).encode() for m in json.loads(body)["messages"]]
        sizes = [-(-len(m) // 4) for m in messages]
        shared = 0
        while shared < min(len(last), len(messages)) and last[shared] == messages[shared]:
            shared += 1
        tokens += sum(sizes)
        price += cached_price * sum(sizes[:shared]) + sum(sizes[shared:])
        last = messages
    return tokens, price


def test_observe_mode_forwards_as_sent_and_records_what_compression_would_have_sent():
    sent, _, report = run(observe=True)
    assert sent == BODIES  # byte for byte
    compressed, _, _ = run(observe=False)
    assert any(len(c) < len(b) for c, b in zip(compressed, BODIES))
    (session,) = report["sessions"]
    assert session["calls"] == len(BODIES) == report["totals"]["calls"]
    assert session["compressed_calls"] == sum(len(c) < len(b) for c, b in zip(compressed, BODIES))
    tokens, price = priced(BODIES)
    assert session["tokens_sent"] == tokens and session["price_sent"] == pytest.approx(price, abs=0.1)
    tokens, price = priced(compressed)
    assert session["tokens_if_compressed"] == tokens and session["price_if_compressed"] == pytest.approx(price, abs=0.1)
    assert 0 < session["saved"] < 1
    table = report_table(report)
    assert table.count("\n") == 3 and session["session"] in table and "| all |" in table
