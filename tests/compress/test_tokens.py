"""Token accounting: prices refuse a cached price outside [0, uncached]; the token cache tokenises once; the default
tokenizer is o200k (the call costs built on them: tests/evaluate/test_costs.py)."""

import pytest

from gemkernels.compress.tokens import Prices, TokenCache, serialise


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


def test_default_tokenizer_is_o200k():
    pytest.importorskip("bpe_openai")
    cache = TokenCache()
    assert len(cache.text("hello world")) == 2
    assert cache.message({"role": "user", "content": "hi"}) == cache.text('{"role": "user", "content": "hi"}')
