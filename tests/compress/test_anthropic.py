"""Anthropic Messages histories (content parts) and OpenAI legacy function calls: blocks, content, GEM.compress."""

import copy
import json

import numpy as np
import pytest

from gemkernels import GEM
from gemkernels.compress.blocks import ANTHROPIC, OPENAI, BlockStructureError, detect_format, parse_history, reconstruct
from gemkernels.compress.config import resolve_config
from gemkernels.compress.encoders import HashEncoder


def unbound(preset):
    """``preset`` for a model without preserved thinking: Anthropic histories compress (test_anthropic_thinking covers
    ``thinking_bound``, which forwards them whole)."""
    return resolve_config(preset, thinking_bound=False)


def tool_use(use_id, name="bash", **inputs):
    return {"type": "tool_use", "id": use_id, "name": name, "input": inputs}


def tool_result(use_id, content, is_error=False):
    return {"type": "tool_result", "tool_use_id": use_id, "content": content, "is_error": is_error}


def small_history():
    """Task, one single call, one parallel pair answered in swapped order, a mixed answer, a plain exchange."""
    return [
        {"role": "user", "content": "Fix the failing test in utils.py"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "start by listing files", "signature": "sig"},
            {"type": "text", "text": "Let me look around."},
            tool_use("tu_1", command="ls -la")]},
        {"role": "user", "content": [tool_result("tu_1", "setup.py\nutils.py")]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading both files."},
            tool_use("tu_2", "read_file", path="utils.py"),
            tool_use("tu_3", "read_file", path="test_utils.py", lines=[1, 40])]},
        {"role": "user", "content": [
            tool_result("tu_3", [{"type": "text", "text": "def test_x():"},
                                 {"type": "text", "text": "    assert x() == 2"}]),
            tool_result("tu_2", "def x():\n    return 1")]},
        {"role": "assistant", "content": [tool_use("tu_4", command="python -m pytest", timeout=60)]},
        {"role": "user", "content": [tool_result("tu_4", "Error: 1 failed", is_error=True),
                                     {"type": "text", "text": "Please hurry up."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Working on it."}]},
        {"role": "user", "content": "Thanks."},
    ]


# ----------------------------------------------------------------------------- structure


def test_format_detected_and_blocks_found():
    h = small_history()
    history = parse_history(h)
    assert detect_format(h) == ANTHROPIC and history.format == ANTHROPIC
    # the mixed answer (message 6 carries text besides its tool_result) is valid but not a removable block
    assert [s.positions for s in history.spans] == [(1, 2), (3, 4)]
    assert [s.call_ids for s in history.spans] == [("tu_1",), ("tu_2", "tu_3")]
    assert history.prefix_end == 1
    assert history.block_positions.isdisjoint({0, 5, 6, 7, 8})


def test_parallel_tool_use_answered_by_one_user_message_is_one_block():
    h = small_history()[:5]
    spans = parse_history(h).spans
    assert len(spans) == 2 and spans[1].positions == (3, 4) and spans[1].key == "tu_2\x1ftu_3"


def test_mixed_tool_result_and_text_is_valid_and_never_dropped():
    h = small_history()
    history = parse_history(h)
    assert len(history.spans) == 2
    out = reconstruct(history, set())  # drop every removable block
    assert out == [h[0]] + h[5:]
    assert all(a is b for a, b in zip(out, [h[0]] + h[5:]))


def test_string_content_history_is_openai():
    h = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
    assert detect_format(h) == OPENAI and parse_history(h).spans == ()


# ----------------------------------------------------------------------------- content


def test_block_content_reasoning_text_actions_observations():
    h = small_history()
    before = copy.deepcopy(h)
    first, second = parse_history(h).blocks
    assert first.reasoning == "start by listing files" and first.text == "Let me look around."
    assert [a.name for a in first.actions] == ["bash"]
    assert json.loads(first.actions[0].arguments) == {"command": "ls -la"}
    assert first.observations == ("setup.py\nutils.py",)

    assert second.reasoning == "" and second.text == "Reading both files."
    assert [a.name for a in second.actions] == ["read_file", "read_file"]
    assert [json.loads(a.arguments) for a in second.actions] == [{"path": "utils.py"},
                                                                {"path": "test_utils.py", "lines": [1, 40]}]
    # observations in the order of the answering message; list content joined from its text parts
    assert second.observations == ("def test_x():\n    assert x() == 2", "def x():\n    return 1")
    assert h == before


def test_several_thinking_and_text_parts_are_joined():
    h = [{"role": "user", "content": "task"},
         {"role": "assistant", "content": [{"type": "thinking", "thinking": "one"}, {"type": "text", "text": "a"},
                                           {"type": "thinking", "thinking": "two"}, {"type": "text", "text": "b"},
                                           tool_use("x", "edit", path="é.py", new="ünïcode")]},
         {"role": "user", "content": [tool_result("x", [])]}]
    (block,) = parse_history(h).blocks
    assert block.reasoning == "one\ntwo" and block.text == "a\nb" and block.observations == ("",)
    assert json.loads(block.actions[0].arguments) == {"path": "é.py", "new": "ünïcode"}


# ----------------------------------------------------------------------------- invalid structures


def _dup_within(h):
    h[3]["content"][2]["id"] = "tu_2"


def _dup_across(h):
    h[3]["content"][1]["id"] = "tu_1"
    h[4]["content"][1]["tool_use_id"] = "tu_1"


def _missing_result(h):
    h[4]["content"].pop(1)


def _no_answer_at_all(h):
    del h[2]


def _tool_use_is_last(h):
    del h[5:]
    del h[4]


def _orphan_result_first(h):
    h.insert(0, {"role": "user", "content": [tool_result("tu_0", "stale")]})


def _orphan_result_after_plain_turn(h):
    h.append({"role": "user", "content": [tool_result("tu_1", "answered again")]})


def _split_answers(h):
    h[4:5] = [{"role": "user", "content": [h[4]["content"][0]]}, {"role": "user", "content": [h[4]["content"][1]]}]


def _wrong_id(h):
    h[2]["content"][0]["tool_use_id"] = "tu_9"


def _answer_from_assistant(h):
    h[2]["role"] = "assistant"


def _tool_use_without_id(h):
    del h[1]["content"][2]["id"]


def _result_without_id_in_a_parallel_answer(h):
    del h[4]["content"][0]["tool_use_id"]


def _result_with_an_int_id_in_a_parallel_answer(h):
    h[4]["content"][0]["tool_use_id"] = 7


@pytest.mark.parametrize("mutate", [_dup_within, _dup_across, _missing_result, _no_answer_at_all, _tool_use_is_last,
                                    _orphan_result_first, _orphan_result_after_plain_turn, _split_answers, _wrong_id,
                                    _answer_from_assistant, _tool_use_without_id,
                                    _result_without_id_in_a_parallel_answer,
                                    _result_with_an_int_id_in_a_parallel_answer])
def test_invalid_structure_raises_and_compress_passes_through(mutate):
    h = small_history()
    mutate(h)
    with pytest.raises(BlockStructureError):
        parse_history(h)
    before = copy.deepcopy(h)
    result = GEM(unbound("core"), encoder=HashEncoder(32), token_counter=None).compress(h)
    assert result.messages is h and h == before and result.stats.action == "passthrough"


# ----------------------------------------------------------------------------- GEM.compress

WORDS = ["models", "views", "migration", "router", "template", "cache", "session", "query", "index", "admin"]


def anthropic_history(num_blocks=40, seed=0):
    rng = np.random.default_rng(seed)
    h = [{"role": "user", "content": [{"type": "text", "text": "Fix the cache invalidation bug in views.py"}]}]
    for b in range(num_blocks):
        topic = WORDS[int(rng.integers(len(WORDS)))]
        body = " ".join(f"{WORDS[int(v) % 10]}{int(v)}" for v in rng.integers(0, 300, size=int(rng.integers(10, 400))))
        parallel = 1 + (b % 3 == 1)
        uses = [tool_use(f"toolu_{b}_{j}", "bash", command=f"grep -rn {topic}{j} src/") for j in range(parallel)]
        content = ([{"type": "thinking", "thinking": f"check {topic}", "signature": "s"}] if b % 2 else [])
        content += [{"type": "text", "text": f"Step {b}: {topic}"}] + uses
        h.append({"role": "assistant", "content": content})
        results = [tool_result(u["id"], f"{topic}\n{body}" if j == 0 else [{"type": "text", "text": body[:200]}],
                               is_error=(b % 7 == 3)) for j, u in enumerate(uses)]
        if b == 20:  # a mixed answer: valid, not removable
            results.append({"type": "text", "text": "Also, keep the public API stable."})
        h.append({"role": "user", "content": results[::-1]})
        if b == 10:  # a plain exchange in the middle: not a block
            h.append({"role": "assistant", "content": [{"type": "text", "text": "Progress so far: found it."}]})
            h.append({"role": "user", "content": "Good, continue."})
    return h


def positions_in(out, messages):
    ids = [id(m) for m in messages]
    return [ids.index(id(m)) for m in out]


@pytest.mark.parametrize("preset", ["paper", "balanced", "core"])
def test_compress_anthropic_history(preset):
    h = anthropic_history()
    history = parse_history(h)
    assert history.format == ANTHROPIC and len(history.spans) == 39  # block 20's answer is mixed
    before = copy.deepcopy(h)
    gem = GEM(unbound(preset), encoder=HashEncoder(128), token_counter=None)
    result = gem.compress(h, session_id="anthropic")
    stats = result.stats
    out = result.messages
    assert h == before  # neither the list nor its dicts were mutated
    assert stats.action == "reselected"
    assert all(any(m is x for x in h) for m in out)  # the caller's own objects
    positions = positions_in(out, h)
    assert positions == sorted(set(positions))  # order preserved, no repeats
    assert parse_history(out).format == ANTHROPIC
    kept = set(positions)
    assert set(range(history.prefix_end)) <= kept
    for span in history.spans[-4:]:
        assert set(span.positions) <= kept
    non_block = set(range(len(h))) - history.block_positions
    assert non_block <= kept  # plain turns and the mixed block are never removed
    assert stats.chars_before == len(json.dumps(h))
    assert stats.chars_after == len(json.dumps(out))
    assert stats.chars_after >= (1 - gem.config.delta) * stats.chars_before
    dropped = {p for b in stats.removed_blocks for p in history.spans[b].positions}
    assert kept == set(range(len(h))) - dropped
    if preset != "paper":
        assert stats.removed_blocks  # the deeper presets really remove blocks here


def test_anthropic_session_appends_new_blocks():
    full = anthropic_history(46, seed=4)
    gem = GEM(unbound("core"), encoder=HashEncoder(128), token_counter=None)
    cut = len(full) - 2 * 6
    first = gem.compress(full[:cut], session_id="a")
    second = gem.compress(full, session_id="a")
    assert first.stats.action == "reselected" and second.stats.action == "appended"
    assert second.stats.encoded_blocks == 6
    kept = set(positions_in(second.messages, full))
    assert set(range(cut, len(full))) <= kept
    parse_history(second.messages)


# ----------------------------------------------------------------------------- OpenAI legacy function calls


def legacy_history(num_blocks=40):
    h = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Update the docs index."}]
    for b in range(num_blocks):
        call_id = f"call_{b}"
        h.append({"role": "assistant", "content": f"step {b}", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"cat docs/page{b}.rst"})}}]})
        h.append({"role": "tool", "tool_call_id": call_id,
                  "content": f"page {b}\n" + " ".join(f"tok{(b * 31 + i) % 97}" for i in range(40 + 13 * (b % 9)))})
        if b % 8 == 2:
            h.append({"role": "assistant", "content": None,
                      "function_call": {"name": "lookup", "arguments": json.dumps({"page": b})}})
            h.append({"role": "function", "name": "lookup", "content": f"page {b} has {b * 3} lines"})
    return h


def test_legacy_function_messages_are_not_blocks():
    h = legacy_history()
    history = parse_history(h)
    assert history.format == OPENAI and len(history.spans) == 40
    legacy = [i for i, m in enumerate(h) if m["role"] == "function" or "function_call" in m]
    assert len(legacy) == 10 and history.block_positions.isdisjoint(legacy)


@pytest.mark.parametrize("preset", ["paper", "core"])
def test_legacy_function_messages_are_never_removed(preset):
    h = legacy_history()
    before = copy.deepcopy(h)
    result = GEM(unbound(preset), encoder=HashEncoder(128), token_counter=None).compress(h, session_id="legacy")
    assert h == before and result.stats.action == "reselected" and result.stats.removed_blocks
    positions = positions_in(result.messages, h)
    assert positions == sorted(set(positions))
    legacy = {i for i, m in enumerate(h) if m["role"] == "function" or "function_call" in m}
    assert legacy <= set(positions)
    parse_history(result.messages)
    assert result.stats.chars_after == len(json.dumps(result.messages))


def long_anthropic_history(num_blocks: int) -> list[dict]:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Fix the failing test in utils.py"}]}]
    for b in range(num_blocks):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"step {b}"},
                                                          tool_use(f"tu_{b}", command=f"grep -n f{b} utils.py")]})
        messages.append({"role": "user", "content": [tool_result(f"tu_{b}", f"utils.py:{b}: def f{b}(): " + "x" * b)]})
    return messages


def with_breakpoint_on_last(messages: list[dict]) -> list[dict]:
    """What prompt-caching clients send: a ``cache_control`` mark on the newest message's last part only."""
    out = copy.deepcopy(messages)
    out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


@pytest.mark.parametrize("preset", ["paper", "cache-aware"])
def test_a_moving_cache_breakpoint_neither_rewrites_nor_reencodes(preset):
    gem = GEM(unbound(preset), encoder=HashEncoder(64), token_counter=None)
    whole = long_anthropic_history(24)
    first = gem.compress(with_breakpoint_on_last(whole[:1 + 2 * 22]))
    second = gem.compress(with_breakpoint_on_last(whole[:1 + 2 * 23]))
    assert second.stats.session_id == first.stats.session_id
    assert second.stats.action == "appended" and second.stats.encoded_blocks == 1
    # the forwarded messages are the caller's own, marks included
    assert second.messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("carrier", ["assistant", "answer"])
@pytest.mark.parametrize("call", ["tool_calls", "function_call"])
def test_a_block_that_also_makes_openai_calls_is_never_dropped(carrier, call):
    """A history that mixes formats: a tool_use turn (or its answer) that also carries OpenAI calls, answered by a
    ``tool`` (or legacy ``function``) message after the block. Dropping the block left that result without its
    call; such a block is valid but not removable."""
    h = anthropic_history(30, seed=1)
    at = 13 if carrier == "assistant" else 14
    if call == "tool_calls":
        h[at] = {**h[at], "tool_calls": [{"id": "oa", "type": "function",
                                          "function": {"name": "bash", "arguments": "{}"}}]}
        h.insert(15, {"role": "tool", "tool_call_id": "oa", "content": "x"})
    else:
        h[at] = {**h[at], "function_call": {"name": "bash", "arguments": "{}"}}
        h.insert(15, {"role": "function", "name": "bash", "content": "x"})
    assert 13 not in parse_history(h).block_positions
    out = GEM(unbound("core"), encoder=HashEncoder(32), token_counter=None).compress(h).messages
    assert any(m is h[13] for m in out) and any(m is h[14] for m in out) and any(m is h[15] for m in out)


def test_blocks_that_load_deferred_tools_are_kept():
    """Tool search: a ``tool_reference`` result (a client's search tool) or a ``tool_search_tool_result`` part (the
    server's) loads tools the conversation may call later; such a block is not removable (old code removed it)."""
    h = [{"role": "user", "content": "Open a ticket."},
         {"role": "assistant", "content": [tool_use("tu_1", "search_tools", query="ticket")]},
         {"role": "user", "content": [tool_result("tu_1", [{"type": "tool_reference", "tool_name": "jira_create"}])]},
         {"role": "assistant", "content": [
             {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_regex", "input": {}},
             {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                 "type": "tool_search_tool_search_result", "tool_references": [{"type": "tool_reference",
                                                                                "tool_name": "jira_get"}]}},
             tool_use("tu_2", "jira_get", id=7)]},
         {"role": "user", "content": [tool_result("tu_2", "ticket 7")]},
         {"role": "assistant", "content": [tool_use("tu_3", "jira_create", title="x")]},
         {"role": "user", "content": [tool_result("tu_3", "created")]}]
    assert [span.positions for span in parse_history(h).spans] == [(5, 6)]
