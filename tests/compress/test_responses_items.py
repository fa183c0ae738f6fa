"""Blocks of a Responses API ``input``: generated inputs (hypothesis), malformed ones, and the recorded Codex
rollouts in ../shared (skipped where absent)."""

from __future__ import annotations

import json

import pytest
from helpers import LOGS
from hypothesis import given, settings
from hypothesis import strategies as st

import gemkernels as gk
from gemkernels.compress.blocks import BlockStructureError
from gemkernels.compress.responses_items import CALL_OUTPUTS, responses_block, responses_spans

CODEX = LOGS / "codex"


def message(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def call(kind: str, call_id: str) -> dict:
    if kind == "function_call":
        arguments = json.dumps({"command": ["ls", call_id]})
        return {"type": kind, "name": "shell", "arguments": arguments, "call_id": call_id}
    if kind == "custom_tool_call":
        return {"type": kind, "name": "apply_patch", "input": f"*** Begin Patch {call_id}", "call_id": call_id}
    return {"type": kind, "call_id": call_id, "action": {"type": "exec", "command": ["ls"]}}


def output(kind: str, call_id: str, code: int = 0) -> dict:
    body = json.dumps({"output": f"out {call_id}", "metadata": {"exit_code": code}})
    return {"type": CALL_OUTPUTS[kind], "call_id": call_id, "output": body}


def reasoning(n: int) -> dict:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": f"thinking {n}"}],
            "encrypted_content": f"gAAAA{n}"}


@st.composite
def responses_inputs(draw) -> tuple[list[dict], list[set[int]]]:
    """A valid input and, per block, the positions it must hold: reasoning right before a run of calls, the
    calls, and their outputs (in any order after their run)."""
    items: list[dict] = [message("developer", "rules"), message("user", "the task")]
    blocks: list[set[int]] = []
    ids = iter(range(10**6))
    for _ in range(draw(st.integers(0, 6))):
        step: set[int] = set()
        for _ in range(draw(st.integers(0, 2))):
            step.add(len(items))
            items.append(reasoning(len(items)))
        calls = [(draw(st.sampled_from(sorted(CALL_OUTPUTS))), f"call_{next(ids)}")
                 for _ in range(draw(st.integers(0, 3)))]
        if not calls:  # reasoning then a message: the reasoning stays with it
            items.append(message("assistant", "done"))
            continue
        for kind, call_id in calls:
            step.add(len(items))
            items.append(call(kind, call_id))
        for kind, call_id in draw(st.permutations(calls)):
            step.add(len(items))
            items.append(output(kind, call_id, draw(st.sampled_from([0, 0, 1]))))
        blocks.append(step)
        if draw(st.booleans()):
            items.append(message("user", "a human instruction"))
    return items, blocks


@settings(max_examples=200, deadline=None)
@given(responses_inputs(), st.data())
def test_blocks_are_runs_of_calls_with_their_reasoning_and_outputs(case, data):
    items, expected = case
    spans = responses_spans(items)
    assert [set(span.positions) for span in spans] == expected
    for span in spans:
        block = responses_block(items, span)
        assert len(block.actions) == len(span.call_ids) == len(block.observations)
        assert block.failed == any('"exit_code": 1' in items[p].get("output", "") for p in span.positions)
    in_blocks = {p for span in spans for p in span.positions}
    assert all(items[p]["type"] != "message" for p in in_blocks)
    removed = {b for b in range(len(spans)) if data.draw(st.booleans())}
    dropped = {p for b in removed for p in spans[b].positions}
    kept = [item for p, item in enumerate(items) if p not in dropped]
    assert len(responses_spans(kept)) == len(spans) - len(removed)  # still valid, the other blocks intact


@pytest.mark.parametrize("items, why", [
    ([output("function_call", "a")], "answers no earlier call"),
    ([call("function_call", "a")], "has no output"),
    ([call("function_call", "a"), call("function_call", "a")], "used twice"),
    ([call("function_call", "a"), output("function_call", "a"), output("function_call", "a")], "answered twice"),
    ([call("function_call", "a"), output("custom_tool_call", "a")], "for a function_call"),
    ([{"type": "function_call", "name": "x", "arguments": "{}"}], "without a call_id"),
])
def test_malformed_inputs_are_refused(items, why):
    with pytest.raises(BlockStructureError, match=why):
        responses_spans(items)


@pytest.mark.skipif(not CODEX.is_dir(), reason="the recorded Codex rollouts (../shared/data/logs/codex) are absent")
def test_recorded_codex_rollouts_split_into_blocks():
    for path in sorted(CODEX.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        items = [r["payload"] for r in records if r.get("type") == "response_item"]
        spans = responses_spans(items)
        calls = sum(item.get("type") in CALL_OUTPUTS for item in items)
        assert sum(len(span.call_ids) for span in spans) == calls > 10, path.name
        in_blocks = {p for span in spans for p in span.positions}
        assert all(items[p]["type"] != "message" for p in in_blocks)
        for span in spans:  # every reasoning item in a block comes before the block's first call
            first_call = min(p for p in span.positions if items[p]["type"] in CALL_OUTPUTS)
            assert all(p < first_call for p in span.positions if items[p]["type"] == "reasoning")


def long_input(steps: int) -> list[dict]:
    items = [message("developer", "rules"), message("user", "fix the failing test in tests/test_app.py")]
    for n in range(steps):
        kind = sorted(CALL_OUTPUTS)[n % 3]
        items += [reasoning(n), call(kind, f"call_{n}"), output(kind, f"call_{n}", code=n % 5 == 0)]
        if n % 7 == 6:
            items.append(message("assistant", f"progress note {n}"))
    return items


def test_gem_removes_whole_responses_blocks_and_appends_on_the_next_call():
    gem = gk.GEM("paper", encoder="hash", token_counter=None)
    items = long_input(40)
    first = gem.compress(items, session_id="codex")
    assert first.stats.action == "reselected" and first.stats.removed_blocks
    spans = responses_spans(items)
    dropped = {p for b in first.stats.removed_blocks for p in spans[b].positions}
    assert first.messages == [item for p, item in enumerate(items) if p not in dropped]
    assert all(m is items[p] for m, p in zip(first.messages, sorted(set(range(len(items))) - dropped)))
    assert len(responses_spans(first.messages)) == len(spans) - len(first.stats.removed_blocks)
    grown = long_input(41)
    assert grown[:len(items)] == items
    second = gem.compress(grown, session_id="codex")
    assert second.stats.action == "appended"
    assert second.messages[:len(first.messages)] == first.messages  # the forwarded prefix holds


@pytest.mark.parametrize(("output", "expected"), [
    ('{"output": "ok", "metadata": {"exit_code": 2}}', ("ok", True)),
    ("{not json", ("{not json", False)),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, None),  # nested past json.loads' depth: RecursionError escaped
])
def test_an_outputs_text_unwraps_codex_shell_output_and_keeps_anything_else(output, expected):
    from gemkernels.compress.responses_items import output_text

    assert output_text({"type": "function_call_output", "call_id": "c", "output": output}) == (expected or
                                                                                               (output, False))


def test_a_reference_to_a_reasoning_item_goes_with_the_next_call():
    """``{"type": "item_reference", "id": "rs_..."}`` stands for a reasoning item: removing its call's block and
    leaving it would send reasoning without its call (old code did)."""
    items = [message("user", "task"), {"type": "item_reference", "id": "rs_1"}, call("function_call", "c1"),
             output("function_call", "c1"), {"type": "item_reference", "id": "msg_2"}, call("function_call", "c2"),
             output("function_call", "c2")]
    assert [span.positions for span in responses_spans(items)] == [(1, 2, 3), (5, 6)]


def test_a_call_run_that_more_output_of_its_response_follows_is_kept():
    """reasoning, function_call, then a computer_call or an assistant message of the same response: removing the
    function call's block takes the reasoning they need (old code removed it); a user message after it does not."""
    hosted = {"type": "computer_call", "id": "cu_1", "call_id": "cc_1", "action": {"type": "screenshot"}}
    items = [message("user", "task"), reasoning(1), call("function_call", "c1"), hosted,
             output("function_call", "c1"), reasoning(5), call("function_call", "c2"),
             message("assistant", "and a note"), output("function_call", "c2"), reasoning(9),
             call("function_call", "c3"), output("function_call", "c3"), message("user", "go on")]
    assert [span.positions for span in responses_spans(items)] == [(9, 10, 11)]
    with pytest.raises(BlockStructureError, match="used twice"):  # the kept block's call id still counts
        responses_spans(items + [call("function_call", "c1"), output("function_call", "c1")])


def test_an_item_whose_type_is_a_list_does_not_stop_a_session():
    """A client's item with an unhashable ``type`` raised TypeError where the session's call ids were gathered: the
    request went out unchanged with a traceback logged."""
    items = [message("user", "task")]
    for b in range(30):
        items += [reasoning(b), call("function_call", f"c{b}"), output("function_call", f"c{b}")]
    items.append({"type": ["odd"], "content": "x"})
    result = gk.GEM("core", encoder="hash", token_counter=None).compress(items, session_id="s")
    assert result.stats.action == "reselected" and result.stats.removed_blocks
