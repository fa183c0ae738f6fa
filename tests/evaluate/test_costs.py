"""Prompt-cache accounting: hand-computed prefixes, prices and totals of calls (the tokens and prices themselves:
tests/compress/test_tokens.py)."""

import pytest

from gemkernels.compress.tokens import Prices
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
