"""Token and prompt-cache accounting: hand-computed prefixes, prices and totals; the token cache tokenises once."""

import pytest

from gemkernels.compress.tokens import Prices, TokenCache, serialise
from gemkernels.evaluate.costs import CallCost, Totals, call_cost, common_prefix


def test_three_calls_by_hand():
    # call 1: nothing cached; call 2 appends a message; call 3 rewrites the second message.
    requests = [[(1, 2, 3), (4, 5)],
                [(1, 2, 3), (4, 5), (6, 7, 8, 9)],
                [(1, 2, 3), (4, 9), (6, 7, 8, 9), (10,)]]
    costs, previous = [], None
    for request in requests:
        costs.append(call_cost(previous, request))
        previous = request
    assert costs == [CallCost(5, 0), CallCost(9, 5), CallCost(10, 4, prefix_broken=True)]
    assert [c.uncached for c in costs] == [5, 4, 6]
    assert [Prices().of(c.cached, c.uncached) for c in costs] == pytest.approx([5.0, 4.5, 6.4])
    # with a cache-write premium every uncached token costs 1.25: 5 x 1.25, 0.5 + 4 x 1.25, 0.4 + 6 x 1.25
    assert [Prices(0.1, 1.25).of(c.cached, c.uncached) for c in costs] == pytest.approx([6.25, 5.5, 7.9])
    totals = Totals.of(costs)
    assert totals == Totals(calls=3, input=24, cached=9, embedding=0, prefix_breaks=1)
    assert totals.uncached == 15
    assert totals.price() == pytest.approx(15.9)
    assert totals.price(Prices(0.5)) == pytest.approx(4.5 + 15)
    assert totals.price(Prices(1.0)) == totals.input
    assert totals.price(Prices(0.1, 1.25)) == pytest.approx(0.9 + 15 * 1.25)


@pytest.mark.parametrize("cached, uncached", [(-0.1, 1.0), (0.5, 0.4), (0.0, 0.0)])
def test_prices_refuse_a_cached_price_outside_zero_to_uncached(cached, uncached):
    with pytest.raises(ValueError, match="cached"):
        Prices(cached, uncached)


@pytest.mark.parametrize("previous, current, expected", [
    ([], [(1, 2)], 0),
    ([(1, 2)], [], 0),
    ([(1, 2), (3,)], [(1, 2), (3,), (4,)], 3),        # pure append: all of the previous request
    ([(1, 2), (3, 4, 5)], [(1, 2), (3, 4, 6)], 4),    # a message changed at its last token
    ([(1, 2), (3, 4)], [(1, 2), (3, 4, 5), (3, 4)], 4),  # a grown message: its old tokens, nothing after
    ([(1, 2), (9,)], [(7, 2), (9,)], 0),              # the first message differs: nothing after counts
    ([(1,), (2,)], [(2,), (1,)], 0),
])
def test_common_prefix(previous, current, expected):
    assert common_prefix(previous, current) == expected


def test_embedding_tokens_and_breaks_add_up():
    total = Totals.of([CallCost(10, 0, embedding=3), CallCost(12, 10, embedding=2)]) + Totals.of(
        [CallCost(4, 1, prefix_broken=True)])
    assert total == Totals(calls=3, input=26, cached=11, embedding=5, prefix_breaks=1)
    assert Totals() + total == total


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
