"""`EncodingQueue` and the encoding budget: the same rows as the wrapped encoder, fair between calls, bounded in
time, queue and memory; GEM on `EncodingDeferred`; through the proxy, a 1,000-block request does not delay a
warm session; and the budget bounds a request's analysis too, the rest prepared for its next (DESIGN.md §5)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from helpers import EXAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st

import gemkernels as gk
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import EncodingDeferred, HashEncoder, WrappedEncoder
from gemkernels.compress.gem import APPENDED, PASSTHROUGH, RESELECTED
from gemkernels.serve.embedding_queue import EncodingQueue

MESSAGES = json.loads(EXAMPLE.read_text())["messages"]


class SlowEncoder(WrappedEncoder):
    """The hash encoder at ``seconds`` per text, recording every text it is asked for."""

    def __init__(self, seconds: float = 0.0, fail_on: str | None = None):
        super().__init__(HashEncoder(64))
        self.seconds, self.fail_on = seconds, fail_on
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError("this encoder cannot take that text")
        time.sleep(self.seconds * len(texts))
        return self.encoder.encode(texts)

    def seen(self) -> list[str]:
        return [text for call in self.calls for text in call]


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=20))
def test_rows_equal_the_wrapped_encoder_and_each_text_is_encoded_once(texts):
    inner = SlowEncoder()
    queue = EncodingQueue(inner, max_batch=4)
    try:
        out = queue.encode(texts)
        assert out.shape == (len(texts), 64) and out.dtype == np.float32
        if texts:
            assert np.array_equal(out, HashEncoder(64).encode(texts))
        again = queue.encode(list(reversed(texts)))
        assert np.array_equal(again, out[::-1])
        assert sorted(inner.seen()) == sorted(set(texts))  # duplicates and repeats: once each
        assert all(len(call) <= 4 for call in inner.calls)
    finally:
        queue.close()


def test_a_small_call_waits_for_a_chunk_not_behind_a_large_one():
    inner = SlowEncoder(seconds=0.01)
    queue = EncodingQueue(inner, max_batch=64, chunk_seconds=0.05)
    big = [f"big {i}" for i in range(300)]  # 3 s of encoding
    started = time.monotonic()
    worker = threading.Thread(target=queue.encode, args=(big,), daemon=True)
    worker.start()
    wait_until(lambda: len(inner.calls) >= 3)  # the big call is under way and the rate is measured
    small_started = time.monotonic()
    queue.encode(["small one", "small two", "small three"])
    small_seconds = time.monotonic() - small_started
    worker.join(30)
    big_seconds = time.monotonic() - started
    assert small_seconds < 0.5 < 2.5 < big_seconds  # before: the small call waited for all 300 texts
    assert max(len(call) for call in inner.calls) <= 8  # chunks of about 50 ms at 10 ms a text


def test_a_call_past_its_deadline_is_deferred_and_its_texts_finish_for_the_next_call():
    inner = SlowEncoder(seconds=0.005)
    queue = EncodingQueue(inner)
    texts = [f"text {i}" for i in range(200)]  # about 1 s
    started = time.monotonic()
    with queue.deadline(time.monotonic() + 0.1), pytest.raises(EncodingDeferred, match="still encoding"):
        queue.encode(texts)
    assert time.monotonic() - started < 0.6
    with queue.deadline(time.monotonic() + 60):  # the same texts: the queued encodings are joined, not repeated
        out = queue.encode(texts)
    assert np.array_equal(out, HashEncoder(64).encode(texts))
    assert sorted(inner.seen()) == sorted(texts)
    later = time.monotonic()
    with queue.deadline(time.monotonic()):  # all cached: no wait even with no time left
        assert np.array_equal(queue.encode(texts[:5]), out[:5])
    assert time.monotonic() - later < 0.1
    queue.close()


def test_the_queue_the_cache_and_failures_are_bounded():
    gate = threading.Event()

    class Gated(SlowEncoder):
        def encode(self, texts):
            gate.wait(10)
            return super().encode(texts)

    queue = EncodingQueue(Gated(), max_queue=10, cache_bytes=5 * (64 * 4 + 200))
    holder = threading.Thread(target=queue.encode, args=([f"t{i}" for i in range(10)],), daemon=True)
    holder.start()
    wait_until(lambda: queue.queued == 9)  # one taken by the runner, nine waiting
    with pytest.raises(EncodingDeferred, match="queue is full"):
        queue.encode(["one more", "and another"])
    gate.set()
    holder.join(10)
    assert len(queue.cache) == 5 and queue.cached_bytes <= queue.cache_bytes  # the least recent evicted
    queue.close()

    failing = SlowEncoder(fail_on="poison")
    queue = EncodingQueue(failing, max_batch=1)
    with pytest.raises(ValueError, match="cannot take"):
        queue.encode(["poison"])
    assert queue.encode(["fine"]).shape == (1, 64) and not queue.inflight  # the runner lives on
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.encode(["after close"])


class DeferringEncoder(WrappedEncoder):
    """Raises `EncodingDeferred` while ``defer`` is set and a text is new to it."""

    def __init__(self) -> None:
        super().__init__(HashEncoder(256))
        self.known: set[str] = set()
        self.defer = False

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.defer and not set(texts) <= self.known:
            raise EncodingDeferred("not yet")
        self.known.update(texts)
        return self.encoder.encode(texts)


def test_gem_sends_a_deferred_request_on_the_append_path_or_unchanged():
    encoder = DeferringEncoder()
    gem = gk.GEM("paper", encoder=encoder, token_counter=None)
    first = MESSAGES[:40]
    encoder.defer = True
    cold = gem.compress(first, session_id="s")
    assert cold.stats.action == PASSTHROUGH and cold.messages == first and "encoding deferred" in cold.stats.reason
    assert len(gem.store) == 0
    encoder.defer = False
    warm = gem.compress(first, session_id="s")
    assert warm.stats.action == RESELECTED and warm.stats.removed_blocks
    state = gem.store.get("s")
    encoder.defer = True
    grown = MESSAGES[:48]
    out = gem.compress(grown, session_id="s")
    assert out.stats.action == APPENDED and "encoding deferred" in out.stats.reason
    assert out.messages == warm.messages + grown[40:]  # the saved forwarded set, every new block appended
    assert out.stats.removed_blocks == warm.stats.removed_blocks
    assert out.stats.chars_after == len(json.dumps(out.messages))  # GEM's default size: the messages' JSON
    parse_history(out.messages)  # every tool result still with its call
    assert gem.store.get("s") is state  # the session is left as the last request saved it
    other = [dict(m) for m in grown]
    other[3] = {**other[3], "content": "a different history"}
    assert gem.compress(other, session_id="s").stats.action == PASSTHROUGH  # not an extension: unchanged


def test_a_huge_request_does_not_delay_a_warm_session_through_the_proxy(monkeypatch):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from gemkernels.serve import compressor
    from gemkernels.serve.app import ServerConfig, create_app
    from gemkernels.testing.fake_upstream import FakeUpstream, ServerThread

    slow = SlowEncoder(seconds=0.004)
    slow.encoder = HashEncoder(256)
    monkeypatch.setattr(compressor, "make_encoder", lambda name, cached=True: slow)
    fake = FakeUpstream()
    upstream = ServerThread(fake.app())
    proxy = ServerThread(create_app(ServerConfig(upstream=upstream.url, encoder="hash", preset="paper",
                                                 encode_budget=0.3)))

    def post(messages, session, out=None):
        started = time.monotonic()
        response = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": messages},
                              headers={"x-gem-session": session}, timeout=30)
        assert response.status_code == 200
        if out is not None:
            out.append(time.monotonic() - started)
        return json.loads(fake.received[-1].raw)["messages"] if out is None else None

    try:
        warm = MESSAGES[:60]
        post(warm, "warm")  # its 29 blocks take ~0.12 s: within the budget
        huge = [MESSAGES[0], MESSAGES[1]]
        for i in range(1000):  # 1,000 blocks: ~4 s of encoding
            call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {i}}}'}}
            huge += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": f"output number {i}"}]
        times: list[float] = []
        big = threading.Thread(target=post, args=(huge, "huge", times), daemon=True)
        big.start()
        wait_until(lambda: any("output number" in text for text in slow.seen()))  # the huge one is encoding
        started = time.monotonic()
        forwarded = post(MESSAGES[:62], "warm")  # one new block
        warm_seconds = time.monotonic() - started
        big.join(30)
        assert warm_seconds < 1.0, warm_seconds  # before: it waited for the huge request's 4 s of encoding
        assert times and times[0] < 2.0, times  # the huge request went out unchanged at its budget
        assert len(forwarded) < 62
        metrics = httpx.get(proxy.url + "/metrics").text
        assert "gem_encoding_deferred_total 1.0" in metrics
        wait_until(lambda: not proxy_queue_busy(slow, 1000), timeout=30)  # the huge one finishes in the background
        for _ in range(5):  # its analysis finished in the background too (or, on a slow host, over the next calls,
            if len(post(huge, "huge")) < len(huge):  # each keeping what it analysed): then it is compressed
                break
        assert len(json.loads(fake.received[-1].raw)["messages"]) < len(huge)
    finally:
        proxy.stop()
        upstream.stop()


def proxy_queue_busy(encoder: SlowEncoder, blocks: int) -> bool:
    """Whether the huge request's block texts are not all encoded yet."""
    return sum("output number" in text for text in encoder.seen()) < blocks


def test_a_text_the_encoder_rejects_fails_only_its_own_call_not_the_others_in_its_chunk():
    """MiniLM's tokenizer raises on a lone surrogate (a tool output decoded with surrogateescape): the chunk it
    shares with other calls' texts is retried text by text, so only the call that sent it fails."""
    gate = threading.Event()

    class Gated(SlowEncoder):
        def encode(self, texts):
            if "warm" in texts:
                gate.wait(10)
            return super().encode(texts)

    inner = Gated(fail_on="poison")
    queue = EncodingQueue(inner, max_batch=64, chunk_seconds=1000.0)  # after the first call, one chunk takes all
    try:
        threading.Thread(target=queue.encode, args=(["warm"],), daemon=True).start()
        wait_until(lambda: queue.inflight and not queue.queued)  # the runner holds "warm" at the gate
        failed: list[BaseException] = []

        def poisoned() -> None:
            try:
                queue.encode(["poison"])
            except ValueError as err:
                failed.append(err)

        bad = threading.Thread(target=poisoned, daemon=True)
        bad.start()
        wait_until(lambda: queue.queued == 1)
        rows: list[np.ndarray] = []
        good = threading.Thread(target=lambda: rows.append(queue.encode(["fine one", "fine two"])), daemon=True)
        good.start()
        wait_until(lambda: queue.queued == 3)
        gate.set()
        bad.join(10)
        good.join(10)
        assert len(failed) == 1 and "cannot take" in str(failed[0])
        assert len(rows) == 1 and np.array_equal(rows[0], HashEncoder(64).encode(["fine one", "fine two"]))
        assert sorted(["poison", "fine one", "fine two"]) in map(sorted, inner.calls)  # they did share a chunk
        assert not queue.inflight and len(queue.cache) == 3  # warm and the two fine texts
    finally:
        gate.set()
        queue.close()


def test_a_request_waits_for_its_blocks_analysis_no_longer_than_the_budget_and_the_rest_is_prepared(monkeypatch):
    """A 300-block first request whose analysis takes 1.5 s (5 ms a block's features) with a 0.3 s budget goes out
    unchanged at its budget; the preparing thread analyses every block, so the session's next request analyses
    none of them and is compressed as a GEM that waited would compress it."""
    pytest.importorskip("prometheus_client")
    from gemkernels.compress import gem as gem_module
    from gemkernels.serve.compressor import Compressor
    from gemkernels.serve.config import ServerConfig
    from gemkernels.serve.metrics import Metrics
    from gemkernels.testing.histories import synthetic_history

    features = gem_module.block_features
    analysed: list[object] = []

    def slow_features(block):
        analysed.append(block)
        time.sleep(0.005)
        return features(block)

    monkeypatch.setattr(gem_module, "block_features", slow_features)
    history = synthetic_history(300, seed=7)
    grown = history + synthetic_history(301, seed=7)[-2:]
    config = ServerConfig(upstream="http://127.0.0.1:9", encoder="hash", preset="paper", encode_budget=0.3,
                          overrides=("min_blocks=16",))
    metrics = Metrics()
    compressor = Compressor(config, metrics)

    async def run() -> tuple[float, object, object]:
        started = time.monotonic()
        first = await compressor.compress("/v1/chat/completions", history, "s", tenant="t")
        seconds = time.monotonic() - started
        await asyncio.to_thread(wait_until, lambda: not compressor.preparing, 30)
        analysed.clear()
        second = await compressor.compress("/v1/chat/completions", grown, "s", tenant="t")
        return seconds, first, second

    try:
        seconds, first, second = asyncio.run(run())
    finally:
        compressor.close()
    assert first.stats.action == PASSTHROUGH and first.messages is history
    assert first.stats.reason.startswith("analysis deferred") and seconds < 1.0, (first.stats.reason, seconds)
    assert len(analysed) == 1  # the one block the prepared history lacked
    want = gk.GEM(compressor.gem.config, encoder=HashEncoder(compressor.encoder.dim)).compress(grown, session_id="s")
    assert second.stats.action == want.stats.action == RESELECTED
    assert second.stats.removed_blocks == want.stats.removed_blocks
    text = metrics.exposition().decode()
    assert "gem_encoding_deferred_total 1.0" in text
    assert 'gem_passthroughs_total{reason="analysis_deferred"} 1.0' in text


def test_a_deferral_answered_while_the_compressor_stops_is_not_turned_into_an_error():
    """`Compressor.prepare` after `close` (a compression that finished during shutdown): nothing raised, nothing
    left queued, so the deferred result still goes out."""
    pytest.importorskip("prometheus_client")
    from gemkernels.serve.compressor import Compressor
    from gemkernels.serve.config import ServerConfig
    from gemkernels.serve.metrics import Metrics

    compressor = Compressor(ServerConfig(upstream="http://127.0.0.1:9", encoder="hash"), Metrics())
    compressor.close()
    compressor.prepare(MESSAGES, "s", "t")
    assert not compressor.preparing
