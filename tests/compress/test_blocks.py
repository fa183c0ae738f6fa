"""Block splitting and representation text on real-looking OpenAI histories."""

import copy
import json

import pytest
from helpers import EXAMPLE

from gemkernels.compress.blocks import BlockStructureError, parse_history
from gemkernels.compress.representation import MAX_CHARS, block_text, truncate_middle


def call(call_id, name="bash", args='{"command": "ls"}'):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def history():
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Look around.", "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "setup.py src"},
        {"role": "assistant", "content": "Two reads at once.", "reasoning_content": "need both files",
         "tool_calls": [call("b", "read", '{"path": "x.py"}'), call("c", "read", '{"path": "y.py"}')]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "y = 2"}]},
        {"role": "tool", "tool_call_id": "b", "content": "x = 1"},
        {"role": "user", "content": "Any progress?"},
        {"role": "assistant", "content": "Almost done."},
    ]


def test_blocks_group_parallel_calls_with_all_their_results():
    blocks = parse_history(history()).blocks
    assert [b.positions for b in blocks] == [(2, 3), (4, 5, 6)]
    assert blocks[1].call_ids == ('b', 'c') and [a.name for a in blocks[1].actions] == ['read', 'read']


def test_plain_messages_and_prefix_are_not_blocks():
    covered = {p for block in parse_history(history()).blocks for p in block.positions}
    assert covered.isdisjoint({0, 1, 7, 8})


@pytest.mark.parametrize("mutate, problem", [
    (lambda h: h[4]["tool_calls"].append(call("a")), "used twice"),
    (lambda h: h.pop(6), "no result"),
    (lambda h: h.append({"role": "tool", "tool_call_id": "zzz", "content": ""}), "unknown call id"),
    (lambda h: h.append({"role": "tool", "tool_call_id": "a", "content": "again"}), "answered twice"),
    (lambda h: h[2]["tool_calls"][0].pop("id"), "without an id"),
    (lambda h: h.insert(0, "not a message"), "not an object"),
])
def test_invalid_structure_is_refused(mutate, problem):
    h = history()
    mutate(h)
    with pytest.raises(BlockStructureError, match=problem):
        parse_history(h)


def test_result_before_its_call_is_refused():
    h = history()
    h[2], h[3] = h[3], h[2]
    with pytest.raises(BlockStructureError, match="before its call"):
        parse_history(h)


def test_representation_has_markers_in_order_and_leaves_messages_untouched():
    h = history()
    before = copy.deepcopy(h)
    text = block_text(parse_history(h).blocks[1])
    markers = ["ASSISTANT_REASONING", "ASSISTANT_TEXT", "ACTION: read", "ACTION: read", "OBSERVATION", "OBSERVATION"]
    positions = [text.index(m, text.index(markers[i - 1]) + 1 if i else 0) for i, m in enumerate(markers)]
    assert positions == sorted(positions)
    assert "y = 2" in text and "x = 1" in text and '"path": "y.py"' in text
    assert h == before


def test_long_text_keeps_head_and_tail_within_limit():
    text = "HEAD" + "m" * 50_000 + "TAIL"
    cut = truncate_middle(text, MAX_CHARS)
    assert len(cut) == MAX_CHARS and cut.startswith("HEAD") and cut.endswith("TAIL")
    assert truncate_middle("short", MAX_CHARS) == "short"


def test_bundled_example_has_32_complete_blocks():
    messages = json.loads(EXAMPLE.read_text())["messages"]
    blocks = parse_history(messages).blocks
    assert len(blocks) == 32
    assert all(messages[b.start]["role"] == "assistant" and len(b.positions) == 2 for b in blocks)
    assert all(len(block_text(b)) <= MAX_CHARS for b in blocks)


@pytest.mark.parametrize("call_id", [["call_0"], {"id": "call_0"}, 7, None])
def test_a_tool_call_id_that_is_not_a_string_is_a_structure_error(call_id):
    """An id of another type was used as a dict key (a list or dict raised TypeError past the structure check)."""
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function",
                                                      "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    with pytest.raises(BlockStructureError, match="tool_call_id that is not a string"):
        parse_history(messages)
