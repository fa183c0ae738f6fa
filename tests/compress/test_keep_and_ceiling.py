"""``keep_tools`` (blocks of these tools are never removed) and ``max_forward_tokens`` (a hard ceiling on what is
forwarded), on generated histories, against an independent count of what went out."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

import gemkernels as gk
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.config import with_overrides
from gemkernels.compress.policy import ceiling_drops
from gemkernels.testing.histories import synthetic_history


def with_todo_calls(messages: list[dict], every: int = 5) -> list[dict]:
    """Every ``every``-th block's tool renamed ``todo_write``."""
    out = [dict(m) for m in messages]
    for n, p in enumerate(p for p, m in enumerate(out) if m.get("tool_calls")):
        if n % every == 0:
            call = out[p]["tool_calls"][0]
            out[p]["tool_calls"] = [{**call, "function": {**call["function"], "name": "todo_write"}}]
    return out


def tools_kept(messages: list[dict]) -> int:
    return sum(m["tool_calls"][0]["function"]["name"] == "todo_write" for m in messages if m.get("tool_calls"))


def test_blocks_of_kept_tools_are_never_removed():
    messages = with_todo_calls(synthetic_history(80, seed=11))
    plain = gk.GEM("core", encoder="hash", token_counter=None).compress(messages)
    assert tools_kept(plain.messages) < tools_kept(messages)  # without the setting some go
    config = with_overrides("core", ["keep_tools=todo_write"])
    kept = gk.GEM(config, encoder="hash", token_counter=None).compress(messages)
    assert tools_kept(kept.messages) == tools_kept(messages) == 16
    assert len(kept.stats.protected["kept_tool"]) == 16 and kept.stats.removed_blocks


def request_tokens(messages: list[dict]) -> int:
    """GEM's estimate without a token counter, computed apart: serialised characters / 4 per block, rounded up,
    plus those of the messages outside blocks."""
    history = parse_history(messages)
    in_blocks = history.block_positions
    chars = lambda m: len(json.dumps(m)) + 2  # noqa: E731
    other = sum(chars(m) for p, m in enumerate(messages) if p not in in_blocks)
    blocks = sum(-(-sum(chars(messages[p]) for p in span.positions) // 4) for span in history.spans)
    return -(-other // 4) + blocks


@settings(max_examples=25, deadline=None)
@given(st.integers(20, 60), st.integers(0, 10**6), st.sampled_from(["paper", "cache-aware"]),
       st.floats(0.05, 1.2))
def test_the_ceiling_holds_whenever_dropping_blocks_can_make_it_hold(blocks, seed, preset, fraction):
    messages = synthetic_history(blocks, seed=seed)
    full = request_tokens(messages)
    ceiling = max(1, int(full * fraction))
    config = with_overrides(preset, [f"max_forward_tokens={ceiling}"])
    out = gk.GEM(config, encoder="hash", token_counter=None).compress(messages).messages
    parse_history(out)  # whole blocks only
    history = parse_history(messages)
    newest = [messages[p] for p in history.spans[-1].positions]
    assert all(any(m is kept for kept in out) for m in newest)  # the newest block always stays
    floor = request_tokens([m for p, m in enumerate(messages) if p not in history.block_positions] + newest)
    sent = request_tokens(out)
    assert sent <= max(ceiling, floor) + 1  # +1: the messages outside blocks are rounded once, not per message
    if sent > ceiling:  # it could not fit: everything but the newest block went
        assert len(parse_history(out).spans) == 1


def test_ceiling_drops_go_outside_the_core_first_then_the_core_then_the_protected():
    sizes = [10] * 8
    assert ceiling_drops(set(range(8)), sizes, fixed=0, core=[1, 2, 5], seeds=[1], ceiling=80) == []
    assert ceiling_drops(set(range(8)), sizes, fixed=0, core=[1, 2, 5], seeds=[1], ceiling=35) == [0, 3, 4, 6, 2]
    assert ceiling_drops(set(range(8)), sizes, fixed=0, core=[1, 2, 5], seeds=[1], ceiling=5) == [0, 3, 4, 6, 2, 5, 1]


class DeferringHash:
    """The hash encoder that raises `EncodingDeferred` for new texts while ``defer`` is set (a proxy's budget)."""

    def __init__(self) -> None:
        from gemkernels.compress.encoders import HashEncoder

        self.inner, self.known, self.defer = HashEncoder(256), set(), False
        self.name, self.dim = self.inner.name, self.inner.dim

    def encode(self, texts):
        from gemkernels.compress.encoders import EncodingDeferred

        if self.defer and not set(texts) <= self.known:
            raise EncodingDeferred("not yet")
        self.known.update(texts)
        return self.inner.encode(texts)


def test_the_ceiling_holds_on_a_request_sent_before_its_blocks_were_encoded():
    """A request past the encoding budget goes out as the saved forwarded set plus every new block; that append
    passed max_forward_tokens (the model's window, say) by as much as the new blocks weighed."""
    messages = synthetic_history(80, seed=3)
    history = parse_history(messages)
    first = messages[:history.spans[40].start]
    ceiling = request_tokens(first)
    encoder = DeferringHash()
    gem = gk.GEM(with_overrides("paper", [f"max_forward_tokens={ceiling}"]), encoder=encoder, token_counter=None)
    assert gem.compress(first, session_id="s").stats.action != "passthrough"
    encoder.defer = True
    out = gem.compress(messages, session_id="s")
    assert "encoding deferred" in out.stats.reason and "max_forward_tokens" in out.stats.reason
    assert request_tokens(out.messages) <= ceiling + 1 < request_tokens(messages)
    parse_history(out.messages)  # whole blocks only
    assert out.messages[-2:] == messages[-2:]  # the newest block stays
