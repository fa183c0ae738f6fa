"""Token accounting: prices refuse a cached price outside [0, uncached]; the token cache tokenises once; the default
tokenizer is o200k, and without bpe-openai token accounting counts bytes / 4 (the call costs built on them:
tests/evaluate/test_costs.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gemkernels.compress import tokens
from gemkernels.compress.tokens import Prices, TextCache, TokenCache, byte_quads, serialise, token_encoder


@pytest.mark.parametrize("cached, uncached", [(-0.1, 1.0), (0.5, 0.4), (0.0, 0.0)])
def test_prices_refuse_a_cached_price_outside_zero_to_uncached(cached, uncached):
    with pytest.raises(ValueError, match="cached"):
        Prices(cached, uncached)


def test_token_cache_tokenises_each_distinct_text_once():
    seen = []
    cache = TokenCache(lambda text: seen.append(text) or [len(w) for w in text.split()])
    message = {"role": "user", "content": "fix the bug"}
    assert cache.message(message) == tuple(len(w) for w in serialise(message).split())
    assert cache.message(message) is cache.message(message)
    assert cache.message(dict(message)) is cache.message(message)   # an equal copy: the text cache answers
    assert cache.request([message, {"role": "user", "content": "fix the bug"}]) == [cache.message(message)] * 2
    assert seen == [serialise(message)]
    assert cache.text("a bc") == (1, 2) and cache.text("a bc") == (1, 2) and seen[-1] == "a bc" and len(seen) == 2


@given(st.text(), st.text())
def test_byte_quads_count_bytes_in_fours_and_share_whole_pieces(a, b):
    data = (a + b).encode("utf-8", "surrogatepass")
    quads = byte_quads(a + b)
    assert len(quads) == -(-len(data) // 4)
    assert b"".join(q.to_bytes(4, "little") for q in quads).rstrip(b"\0") == data.rstrip(b"\0")
    whole = len(a.encode("utf-8", "surrogatepass")) // 4
    assert quads[:whole] == byte_quads(a)[:whole]


def test_token_encoder_is_o200k_with_bpe_openai_else_bytes_in_fours(monkeypatch):
    pytest.importorskip("bpe_openai")
    name, encode = token_encoder()
    assert name == "o200k" and list(encode("hello world")) == list(TokenCache().text("hello world"))

    def missing():
        raise ImportError("no bpe-openai")

    monkeypatch.setattr(tokens, "o200k_encode", missing)
    assert token_encoder() == ("bytes/4", byte_quads)


def test_default_tokenizer_is_o200k():
    pytest.importorskip("bpe_openai")
    cache = TokenCache()
    assert len(cache.text("hello world")) == 2
    assert cache.message({"role": "user", "content": "hi"}) == cache.text('{"role": "user", "content": "hi"}')


def test_a_bounded_text_cache_forgets_the_least_recently_used_text():
    """At most ``max_texts`` texts are remembered; a hit makes a text the most recent (the proxy's cache of the
    messages outside blocks must not grow with every distinct system prompt it ever saw)."""
    calls = []
    cache = TextCache(lambda text: calls.append(text) or len(text), max_texts=2)
    assert [cache("a"), cache("bb"), cache("a"), cache("ccc")] == [1, 2, 1, 3]  # "bb" is now the oldest
    assert calls == ["a", "bb", "ccc"] and (cache.hits, cache.misses) == (1, 3)
    cache("a")
    cache("bb")
    assert calls == ["a", "bb", "ccc", "bb"] and len(cache._values) == 2
    unbounded = TextCache(len)
    for i in range(100):
        unbounded(str(i))
    assert unbounded.misses == 100 and len(unbounded._values) == 100


def test_a_bounded_text_cache_shared_by_threads_stays_consistent():
    """The server's worker threads share GEM's cache of non-block token counts: interleaved hits, misses and
    evictions must neither raise, nor lose a count, nor return another text's value. The counting function is
    Python that yields, so threads switch while a miss is being computed (the cache computes outside its lock)."""
    import sys
    import threading
    import time

    def slow_len(text: str) -> int:
        time.sleep(0)
        return len(text)

    cache = TextCache(slow_len, max_texts=2)
    texts = ["a", "bb", "ccc", "dddd"]
    errors: list[BaseException] = []

    def hammer(seed: int) -> None:
        try:
            for i in range(20_000):
                text = texts[(i * (seed + 1)) % len(texts)]
                assert cache(text) == len(text)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=hammer, args=(s,)) for s in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and len(cache._values) <= 2 and cache.hits + cache.misses == 6 * 20_000
