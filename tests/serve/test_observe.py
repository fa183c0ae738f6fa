"""Observe mode: every body goes out byte for byte, and each session's record equals what a compressing proxy
forwarded on the same calls, priced independently here under a token-prefix cache, and equals what `gem online`
reports for a recorded run replayed through the proxy; its token records stay within their byte bound."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import FIXTURES

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from gemkernels.compress.config import with_overrides  # noqa: E402
from gemkernels.compress.tokens import Prices, byte_quads, token_encoder  # noqa: E402
from gemkernels.evaluate.loaders import load_runs  # noqa: E402
from gemkernels.evaluate.online_policies import PolicyOptions  # noqa: E402
from gemkernels.evaluate.online_replay import replay_run  # noqa: E402
from gemkernels.serve.app import create_app  # noqa: E402
from gemkernels.serve.config import ServerConfig  # noqa: E402
from gemkernels.serve.observe import ENTRY_BYTES, Observer, report_table  # noqa: E402
from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread  # noqa: E402
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history  # noqa: E402

TOKENIZER, ENCODE = token_encoder()


def marked(messages: list[dict]) -> list[dict]:
    """An Anthropic history with cache breakpoints on two early tool results (in blocks compression removes)."""
    out = [dict(m) for m in messages]
    for p in (4, 12):
        out[p]["content"] = [{**out[p]["content"][-1], "cache_control": {"type": "ephemeral"}}]
    return out


#: route -> (history field, the bodies of a growing session's calls)
SESSIONS = {
    "/v1/chat/completions": ("messages", [json.dumps({"model": "m", "messages": synthetic_history(blocks, seed=21)})
                                          .encode() for blocks in range(30, 60, 4)]),
    "/v1/messages": ("messages", [json.dumps({"model": "m", "messages": marked(synthetic_anthropic_history(
        blocks, seed=21))}).encode() for blocks in range(30, 60, 4)]),
}


def run(observe: bool, route: str) -> tuple[list[bytes], FakeUpstream, dict]:
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    proxy = ServerThread(create_app(ServerConfig(upstream=upstream.url, encoder="hash", preset="cache-aware",
                                                 overrides=("thinking_bound=False",), encode_budget=30.0,
                                                 observe=observe)))
    try:
        for body in SESSIONS[route][1]:
            httpx.post(proxy.url + route, content=body, headers={"authorization": "Bearer a", "x-gem-session": "s"})
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


def priced(bodies: list[bytes], cached_price: float = 0.1, field: str = "messages") -> tuple[int, int, float]:
    """Tokens, cached tokens and price of calls: each message its JSON tokenised, cached the common prefix with the
    previous call of the tokens tagged by message index (so it ends inside the first message that differs)."""
    tokens = cached = 0
    price, last = 0.0, []
    for body in bodies:
        tagged = [(i, token) for i, m in enumerate(json.loads(body)[field])
                  for token in ENCODE(json.dumps(m, ensure_ascii=False))]
        shared = 0
        while shared < min(len(last), len(tagged)) and last[shared] == tagged[shared]:
            shared += 1
        tokens, cached = tokens + len(tagged), cached + shared
        price += cached_price * shared + len(tagged) - shared
        last = tagged
    return tokens, cached, price


@pytest.mark.parametrize("route", sorted(SESSIONS))
def test_observe_mode_forwards_as_sent_and_records_what_compression_would_have_sent(route):
    """On the Messages API what compression forwards includes the breakpoints it moved onto kept messages."""
    field, bodies = SESSIONS[route]
    sent, _, report = run(True, route)
    assert sent == bodies  # byte for byte
    compressed, _, _ = run(False, route)
    assert any(len(c) < len(b) for c, b in zip(compressed, bodies))
    if route == "/v1/messages":  # a forwarded message that the client did not send: a breakpoint moved onto it
        assert any(json.dumps(m) not in b.decode() for c, b in zip(compressed, bodies) for m in json.loads(c)[field])
    (session,) = report["sessions"]
    assert session["calls"] == len(bodies) == report["totals"]["calls"]
    assert session["compressed_calls"] == sum(len(c) < len(b) for c, b in zip(compressed, bodies))
    tokens, cached, price = priced(bodies, field=field)
    assert (session["tokens_sent"], session["cached_tokens_sent"]) == (tokens, cached)
    assert session["price_sent"] == pytest.approx(price, rel=1e-12)
    tokens, cached, price = priced(compressed, field=field)
    assert (session["tokens_if_compressed"], session["cached_tokens_if_compressed"]) == (tokens, cached)
    assert session["price_if_compressed"] == pytest.approx(price, rel=1e-12)
    assert session["saved"] == round(1 - session["price_if_compressed"] / session["price_sent"], 4)
    assert report["tokenizer"] == TOKENIZER
    table = report_table(report)
    assert table.count("\n") == 5 and session["session"] in table and "| all |" in table and TOKENIZER in table


#: Recorded runs (tests/fixtures) and the API their agent speaks: (path, run name, route, history field, whether
#: compression must remove something, so that the compressed timeline is not the sent one).
RECORDED = [
    ("codex", "rollout-2025-11-14T10-00-00-0199aaaa-1111-7222-8333-000000000001", "/v1/responses", "input", True),
    ("mini_swe_agent.traj.json", "mini_swe_agent", "/v1/chat/completions", "messages", True),
    ("swe_agent_fc.traj", "swe_agent_fc", "/v1/chat/completions", "messages", True),
    ("claude-code", "5b7e2d0c-1111-4a2b-9c3d-000000000001", "/v1/messages", "messages", False),
]
#: Presets with overrides that make GEM compress these short runs (a handful of blocks each).
SMALL = {"cache-aware": ("min_blocks=2", "k=1", "rewrite_above_blocks=2", "evidence.recent=1"),
         "paper": ("min_blocks=2", "k=1", "delta=1.0", "evidence.recent=1")}


@pytest.mark.parametrize("preset", sorted(SMALL))
@pytest.mark.parametrize("path, name, route, field, compresses", RECORDED, ids=[r[1][:16] for r in RECORDED])
def test_observe_report_of_a_recorded_run_matches_gem_online(preset, path, name, route, field, compresses):
    """The run's calls sent through the proxy in observe mode and replayed by `gem online` with the same preset:
    the same calls, tokens, cached tokens, prefix breaks and prices, exactly, as sent and as compressed. The
    replay's run has no recorded goal: the proxy never sees the task apart from the request (GEM derives it)."""
    (run,) = [r for r in load_runs(FIXTURES / path)[0] if r.name == name]
    overrides = SMALL[preset]
    config = with_overrides(preset, overrides)
    prices = Prices(config.cached_price, config.uncached_price)
    bodies = [json.dumps({"model": "m", field: run.request(call.position)}, ensure_ascii=False).encode()
              for call in run.calls]
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    proxy = ServerThread(create_app(ServerConfig(upstream=upstream.url, encoder="hash", preset=preset,
                                                 overrides=overrides, encode_budget=None, observe=True)))
    try:
        for body in bodies:
            answer = httpx.post(proxy.url + route, content=body, headers={"authorization": "Bearer a",
                                                                           "x-gem-session": run.name})
            assert answer.status_code == 200
        report = httpx.get(proxy.url + "/v1/gem/sessions", headers={"authorization": "Bearer a"}).json()
    finally:
        proxy.stop()
        upstream.stop()
    assert [r.raw for r in fake.received] == bodies  # observe mode forwards byte for byte

    policy = f"gem-{preset}:" + ":".join(overrides)
    replay = replay_run(replace(run, goal=None), ["full", policy], PolicyOptions(encoder="hash", prices=prices),
                        encode=ENCODE, evidence=())
    totals = replay.totals()
    (session,) = report["sessions"]
    for timeline, online in (("sent", totals["full"]), ("if_compressed", totals[policy])):
        assert session[f"tokens_{timeline}"] == online.input
        assert session[f"cached_tokens_{timeline}"] == online.cached
        assert session[f"prefix_breaks_{timeline}"] == online.prefix_breaks
        assert session[f"price_{timeline}"] == online.price(prices)  # the same integers, the same formula
    assert session["calls"] == len(bodies) == totals["full"].calls
    smaller = sum(c.input < f.input for c, f in zip(replay.calls[policy], replay.calls["full"]))
    assert session["compressed_calls"] == smaller
    assert smaller > 0 or not compresses
    assert report["tokenizer"] == TOKENIZER and report["totals"] == {k: v for k, v in session.items() if k != "session"}


def test_token_records_stay_within_their_byte_bound():
    """A session's token ids are its last call's (a call tokenises only texts its session's last call lacked); past
    ``max_bytes`` in all, the least recently used sessions' ids go: their totals stay and their next call is priced
    as a first one (nothing cached)."""
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return byte_quads(text)

    history = synthetic_history(6, seed=3)
    size = sum(4 * len(byte_quads(json.dumps(m, ensure_ascii=False))) + ENTRY_BYTES for m in history)
    observer = Observer(Prices(), max_bytes=5 * size // 2, encoder=("test", encode))
    observer.record("t", "a", history, history[:-2])
    observer.record("t", "b", history, history[:-2])
    assert len(seen) == 2 * len(history) and observer.nbytes == 2 * size
    observer.record("t", "a", history, history)  # every message was in a's last call: nothing tokenised
    a = observer.ledgers["t", "a"]
    assert len(seen) == 2 * len(history)
    assert a.sent.cached == a.sent.tokens // 2 == observer.ledgers["t", "b"].sent.tokens
    observer.record("t", "c", [*history, {"role": "user", "content": "more"}], history)  # past the bound: b goes
    a, b = observer.ledgers["t", "a"], observer.ledgers["t", "b"]
    assert observer.nbytes <= observer.max_bytes and observer.nbytes == a.nbytes + observer.ledgers["t", "c"].nbytes
    assert not b.known and b.sent.last is None and b.compressed.last is None and a.known
    tokens = b.sent.tokens
    observer.record("t", "b", history, history[:-2])
    assert (b.calls, b.sent.tokens, b.sent.cached) == (2, 2 * tokens, 0)  # the totals kept; nothing cached
    assert observer.nbytes <= observer.max_bytes
