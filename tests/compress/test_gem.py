"""`GEM.compress`: invariants on synthetic and bundled histories, the online policy, and passthrough on bad input."""

import copy
import json

import numpy as np
import pytest
from helpers import EXAMPLE, array_layout

from gemkernels import GEM, GEMConfig
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import HashEncoder
from gemkernels.testing.histories import synthetic_history


def make_gem(config="paper", **kw) -> GEM:
    return GEM(config, encoder=HashEncoder(64), token_counter=None, **kw)


def assert_valid_sublist(out, messages):
    """Order-preserving sub-list of the caller's own objects, still a valid history."""
    ids = [id(m) for m in messages]
    positions = [ids.index(id(m)) for m in out]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    parse_history(out)
    return positions


def test_short_history_comes_back_identical():
    messages = synthetic_history(15)
    result = make_gem().compress(messages)
    assert result.messages is messages and result.stats.action == "unchanged"


@pytest.mark.parametrize("preset", ["paper", "balanced", "core"])
@pytest.mark.parametrize("num_blocks", [16, 40, 120])
def test_first_rewrite_invariants(preset, num_blocks):
    messages = synthetic_history(num_blocks, seed=num_blocks)
    before = copy.deepcopy(messages)
    gem = make_gem(preset)
    result = gem.compress(messages, session_id="s")
    stats = result.stats
    assert messages == before  # caller's objects untouched
    positions = assert_valid_sublist(result.messages, messages)
    assert positions[:2] == [0, 1]  # prefix kept
    blocks = parse_history(messages).blocks
    kept = set(positions)
    for block in blocks[-4:]:
        assert set(block.positions) <= kept  # recent evidence
    for b in stats.core:
        assert set(blocks[b].positions) <= kept  # the selected core is never removed
    total = len(json.dumps(messages))
    assert stats.chars_before == total and stats.chars_after == len(json.dumps(result.messages))
    assert stats.chars_after >= (1 - gem.config.delta) * total
    assert stats.action == "reselected" and sorted(stats.protected["recent"]) == list(range(num_blocks - 4, num_blocks))
    assert len(stats.removed_blocks) + stats.forwarded_blocks == num_blocks


def test_deeper_presets_remove_more():
    messages = synthetic_history(80, seed=3)
    after = {p: make_gem(p).compress(messages).stats.chars_after for p in ("paper", "balanced", "core")}
    assert after["paper"] > after["balanced"] > after["core"]


def test_append_keeps_saved_set_and_adds_new_blocks():
    gem = make_gem("core")
    full = synthetic_history(60, seed=7)
    first = gem.compress(full[:2 + 2 * 50], session_id="a")
    removed = set(first.stats.removed_blocks)
    assert removed
    second = gem.compress(full, session_id="a")
    assert second.stats.action == "appended" and second.stats.encoded_blocks == 10
    assert set(second.stats.removed_blocks) <= removed
    blocks = parse_history(full).blocks
    kept = set(assert_valid_sublist(second.messages, full))
    for b in range(50, 60):
        assert set(blocks[b].positions) <= kept
    newly_protected = {b for picks in second.stats.protected.values() for b in picks}
    assert removed - set(second.stats.removed_blocks) <= newly_protected


@pytest.mark.parametrize("change, reason", [
    (lambda h: h[:1] + [{"role": "user", "content": "Now refactor the admin site"}] + h[2:], "goal changed"),
    (lambda h: h[:2] + h[4:], "not an extension"),
])
def test_reselection_triggers(change, reason):
    gem = make_gem()
    messages = synthetic_history(40, seed=11)
    gem.compress(messages, session_id="b")
    again = gem.compress(change(messages) + synthetic_history(41, seed=11)[-2:], session_id="b")
    assert again.stats.action == "reselected" and reason in again.stats.reason


@pytest.mark.parametrize("goal_from, action", [("latest", "reselected"), ("first", "appended")])
def test_an_injected_reminder_is_a_goal_change_only_for_the_latest_instruction(goal_from, action):
    gem = make_gem(GEMConfig(goal_from=goal_from))
    messages = synthetic_history(40, seed=12)
    gem.compress(messages, session_id="r")
    reminder = {"role": "user", "content": "Please always provide EXACTLY ONE action."}
    later = synthetic_history(42, seed=12)
    result = gem.compress(messages + later[-4:-2] + [reminder] + later[-2:], session_id="r")
    assert result.stats.action == action
    history = parse_history(messages + [reminder])
    assert history.task_text() == reminder["content"] and history.task_text("first") == messages[1]["content"]


def test_goal_from_must_be_latest_or_first():
    with pytest.raises(ValueError, match="goal_from"):
        GEMConfig(goal_from="middle")


def test_reselect_every_n_blocks():
    gem = make_gem(GEMConfig(reselect_every=5))
    full = synthetic_history(30, seed=5)
    assert gem.compress(full[:2 + 2 * 20], session_id="c").stats.action == "reselected"
    assert gem.compress(full[:2 + 2 * 24], session_id="c").stats.action == "appended"
    assert gem.compress(full, session_id="c").stats.action == "reselected"


def test_sessions_without_id_are_told_apart_by_prefix():
    gem = make_gem()
    a, b = synthetic_history(20, seed=1), synthetic_history(20, seed=1)
    b[1] = {"role": "user", "content": "A different task entirely"}
    sa, sb = gem.compress(a).stats.session_id, gem.compress(b).stats.session_id
    assert sa != sb and sa.startswith("prefix-")


@pytest.mark.parametrize("mutate, reason", [
    (lambda h: h.pop(3), "invalid structure"),
    (lambda h: h.__setitem__(5, {**h[5], "tool_call_id": "call_0"}), "invalid structure"),
    (lambda h: h.append({"role": "tool", "tool_call_id": "orphan", "content": "x"}), "invalid structure"),
    (lambda h: h.__setitem__(5, {**h[5], "content": b"raw bytes"}), "not JSON serializable"),
])
def test_malformed_requests_pass_through_unchanged(mutate, reason):
    messages = synthetic_history(30)
    mutate(messages)
    before = copy.deepcopy(messages)
    result = make_gem().compress(messages)
    assert result.messages is messages and messages == before
    assert result.stats.action == "passthrough" and reason in result.stats.reason


@pytest.mark.parametrize("where", [1, 4, 5])
def test_an_unhashable_type_field_is_forwarded_not_raised(where):
    """A client's ``"type": []`` on a message or Responses item names no type (a set lookup raised TypeError)."""
    messages = synthetic_history(30)
    messages[where] = {**messages[where], "type": ["not", "a", "type"]}
    result = make_gem().compress(messages)
    assert result.stats.action in ("reselected", "passthrough") and messages[where] in result.messages
    items = [{"type": {"a": 1}, "role": "user", "content": "x"},
             *({"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"} if j == 0 else
               {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"} for i in range(20) for j in (0, 1))]
    assert make_gem().compress(items).stats.action == "reselected"

    class Unhashable(str):
        __eq__ = str.__eq__
        __hash__ = None

    items[0] = {**items[0], "type": Unhashable("message")}  # a str subclass that cannot be hashed: no type either
    assert make_gem().compress(items).stats.action == "reselected"


@pytest.mark.parametrize("not_a_history", [None, "hello", {"role": "user"}, [1, 2], [{"content": "no role"}]])
def test_non_lists_pass_through(not_a_history):
    result = make_gem().compress(not_a_history)
    assert result.messages is not_a_history and result.stats.action == "passthrough"


def test_none_content_and_image_parts_are_handled():
    messages = synthetic_history(20)
    messages[2] = {**messages[2], "content": None}
    messages[1] = {"role": "user", "content": [{"type": "text", "text": "fix it"},
                                              {"type": "image_url", "image_url": {"url": "data:,"}}]}
    result = make_gem().compress(messages)
    assert result.stats.action == "reselected"
    assert_valid_sublist(result.messages, messages)


class BrokenEncoder:
    name, dim = "broken", 8

    def __init__(self, output):
        self.output = output

    def encode(self, texts):
        if isinstance(self.output, Exception):
            raise self.output
        return np.full((len(texts), self.dim), self.output, dtype=np.float32)


@pytest.mark.parametrize("output, reason", [
    (RuntimeError("embedding server down"), "embedding server down"),
    (np.nan, "unusable embeddings"),
])
def test_encoder_failure_forwards_original(output, reason, caplog):
    messages = synthetic_history(30)
    result = GEM("paper", encoder=BrokenEncoder(output), token_counter=None).compress(messages)
    assert result.messages is messages and reason in result.stats.reason
    assert "forwarding" in caplog.text


def test_token_counts_shrink_with_the_request():
    gem = GEM("core", encoder=HashEncoder(64), token_counter=lambda text: len(text.split()))
    stats = gem.compress(synthetic_history(40)).stats
    assert stats.tokens_before > stats.tokens_after > 0


def test_bundled_example_compresses_with_evidence():
    messages = json.loads(EXAMPLE.read_text())["messages"]
    result = make_gem("balanced").compress(messages)
    assert result.stats.action == "reselected" and result.stats.removed_blocks
    assert_valid_sublist(result.messages, messages)


def test_dict_arguments_and_rewritten_blocks_are_handled():
    messages = synthetic_history(20)
    messages[2] = {**messages[2], "tool_calls": [{**messages[2]["tool_calls"][0],
                                                  "function": {"name": "bash", "arguments": {"command": "ls"}}}]}
    gem = make_gem()
    first = gem.compress(messages, session_id="d")
    assert first.stats.action == "reselected"
    rewritten = messages[:3] + [{**messages[3], "content": "[old output elided]"}] + messages[4:]
    again = gem.compress(rewritten, session_id="d")
    assert again.stats.action == "reselected" and "not an extension" in again.stats.reason
    assert again.stats.encoded_blocks == 1 and again.stats.chars_before == len(json.dumps(rewritten))


def test_the_block_cache_holds_only_the_blocks_of_the_last_request():
    gem = make_gem()
    messages = synthetic_history(20, seed=13)
    gem.compress(messages, session_id="m")
    elided = messages[:7] + [{**messages[7], "content": "[output elided]"}] + messages[8:]  # block 2 rewritten
    result = gem.compress(elided, session_id="m")
    cache = gem.store.get("m").block_cache
    assert result.stats.encoded_blocks == 1 and len(cache) == 20


def test_token_counts_of_a_repeated_prefix_and_of_blocks_are_made_once():
    counted: list[str] = []
    gem = GEM("paper", encoder=HashEncoder(64), token_counter=lambda text: counted.append(text) or len(text))
    messages = synthetic_history(20, seed=3)
    messages[0] = {**messages[0], "content": "You are a coding agent. " * 500}  # a long system prompt
    for _ in range(3):
        gem.compress([dict(m) for m in messages], session_id="t")
    assert len(counted) == 2 + 20 * 2  # system and task once; each block's two messages once (block cache)
    others = gem.count_other_tokens
    assert others.misses == 2 and others.hits == 2 * 2  # the messages outside blocks: counted on the first request


def test_the_guard_counts_the_bytes_that_go_out_when_given_them():
    """A proxy forwards the client's bytes; a long non-ASCII system prompt is 3 UTF-8 bytes a character there but
    6 in ASCII-escaped JSON. Measured as JSON, one rewrite removed more than ``delta`` of the bytes actually sent;
    with the body's byte sizes it stays within the budget."""

    from gemkernels.serve.body import element_sizes, without_elements

    messages = synthetic_history(40, seed=5)
    messages[0] = {"role": "system", "content": "你是一个编程助手。" * 3000}
    raw = json.dumps({"model": "m", "messages": messages}, ensure_ascii=False).encode()
    layout = array_layout(raw, "messages")
    sizes = element_sizes(layout)

    def removed_bytes(**kw) -> int:
        out = make_gem("paper").compress(messages, session_id="bytes", **kw)
        kept = {id(m) for m in out.messages}
        return len(raw) - len(without_elements(raw, layout, [i for i, m in enumerate(messages) if id(m) not in kept]))

    budget = GEMConfig().delta * sum(sizes)
    assert removed_bytes() > budget  # JSON-escaped sizes: the prompt looked twice its size
    assert 0 < removed_bytes(message_sizes=sizes) <= budget
    stats = make_gem("paper").compress(messages, session_id="b", message_sizes=sizes).stats
    assert stats.chars_before == sum(sizes)
    passthrough = make_gem("paper").compress(messages, message_sizes=sizes[:-1]).stats
    assert passthrough.action == "passthrough" and "message sizes" in passthrough.reason
