"""Budgeted, append-mostly forwarding: amortized forgetting by recency, and GEM's cache-aware preset."""

import sys
from pathlib import Path

import pytest

from gemkernels import GEM, GEMConfig
from gemkernels.blocks import parse_history
from gemkernels.encoders import CachedEncoder, HashEncoder
from gemkernels.online_policies import AmortizedForgetting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gem import synthetic_history  # noqa: E402


def steps(messages):
    """Histories before each new block: the first 2 + 2b messages for b = 1..."""
    return [messages[:2 + 2 * b] for b in range(1, (len(messages) - 2) // 2 + 1)]


def forwarded_blocks(out):
    return len(parse_history(out).spans)


def test_amortized_forgetting_rewrites_once_per_budget_minus_keep_blocks():
    policy = AmortizedForgetting(budget=10, keep=4)
    counts = [forwarded_blocks(policy(h).messages) for h in steps(synthetic_history(30))]
    assert counts[:10] == list(range(1, 11))
    assert counts[10] == 4 and counts[11:17] == list(range(5, 11)) and counts[17] == 4


def test_amortized_forgetting_prefix_is_stable_between_rewrites():
    policy = AmortizedForgetting(budget=10, keep=4)
    outs = [policy(h).messages for h in steps(synthetic_history(30))]
    for before, after in zip(outs[10:16], outs[11:17]):
        assert after[:len(before)] == before  # append only: the previous request is a prefix


@pytest.mark.parametrize("budget, keep", [(5, 5), (3, 4), (4, -1)])
def test_amortized_forgetting_rejects_bad_sizes(budget, keep):
    with pytest.raises(ValueError):
        AmortizedForgetting(budget, keep)


def test_cache_aware_preset_rewrites_at_the_budget_and_appends_in_between():
    gem = GEM("cache-aware", encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    actions, sizes, outs = [], [], []
    for history in steps(synthetic_history(70, seed=2)):
        result = gem.compress(history, session_id="c")
        actions.append(result.stats.action)
        sizes.append(forwarded_blocks(result.messages))
        outs.append(result.messages)
    assert set(actions[:40]) == {"unchanged"} and actions[40] == "reselected"
    assert sizes[40] <= 20 + 4 and max(sizes) <= 41
    rewrites = [i for i, a in enumerate(actions) if a == "reselected"]
    assert len(rewrites) == 2 and all(actions[i] == "appended" for i in range(41, rewrites[1]))
    for i in range(41, rewrites[1]):  # between rewrites the previous request is a prefix of the next
        assert outs[i][:len(outs[i - 1])] == outs[i - 1]


def test_cache_aware_goal_change_waits_for_the_next_rewrite():
    gem = GEM("cache-aware", encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    history = synthetic_history(45, seed=4)
    gem.compress(history[:-2], session_id="g")
    changed = history[:1] + [{"role": "user", "content": "A new task"}] + history[2:]
    assert gem.compress(changed, session_id="g").stats.action == "appended"


def test_budget_must_exceed_k():
    with pytest.raises(ValueError, match="rewrite_above_blocks"):
        GEMConfig(k=20, rewrite_above_blocks=20)
