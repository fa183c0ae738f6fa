"""Resuming the last request's parse (`gemkernels.compress.resume`): on generated histories of every format, with
ids reused, results orphaned, reasoning left open and prefixes changed, a resumed parse is the whole parse or
refuses; and GEM forwards the same request whether it resumed or not."""

import copy
import json

import pytest

from gemkernels import GEM
from gemkernels.compress.blocks import BlockStructureError, parse_history
from gemkernels.compress.config import resolve_config
from gemkernels.compress.encoders import HashEncoder
from gemkernels.compress.identity import local_digest, responses_said, said
from gemkernels.compress.resume import Marshalled, resume
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history, synthetic_responses_input

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_text_action_properties import histories as text_histories  # noqa: E402

IDS = st.sampled_from(["call_0", "call_1", "call_2", "a", "b", "c"])  # few, the base's among them: ids are reused


#: ``paper`` for a model without preserved thinking: Anthropic histories compress (and resume) as the others do.
UNBOUND = resolve_config("paper", thinking_bound=False)


def identify(fmt, messages, spans):
    what = responses_said if fmt == "responses" else said
    return tuple(local_digest(what(messages, span)) for span in spans)


def thinking_message(draw) -> dict:
    """An assistant message that carries signed thinking, in one of the forms chat histories hold it."""
    return draw(st.sampled_from([
        {"role": "assistant", "content": "t",
         "thinking_blocks": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
        {"role": "assistant", "content": "t", "reasoning_details": [{"type": "reasoning.text", "signature": "s"}]},
        {"role": "assistant", "content": [{"type": "reasoning", "reasoning": "x", "extras": {"signature": "s"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}]))


def openai_piece(draw):
    kind = draw(st.sampled_from(["call", "call", "result", "result", "user", "assistant", "bad", "thinking"]))
    if kind == "thinking":
        return thinking_message(draw)
    if kind == "call":
        ids = draw(st.lists(IDS, min_size=1, max_size=2))
        return {"role": "assistant", "content": draw(st.text(max_size=3)),
                "tool_calls": [{"id": i, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
                               for i in ids]}
    if kind == "result":
        return {"role": "tool", "tool_call_id": draw(IDS), "content": draw(st.text(max_size=3))}
    if kind == "bad":
        return draw(st.sampled_from([{"role": "tool", "tool_call_id": 7, "content": ""}, {"content": "no role"},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]))
    return {"role": kind, "content": draw(st.text(max_size=3))}


def anthropic_piece(draw):
    kind = draw(st.sampled_from(["use", "use", "result", "result", "user", "assistant"]))
    if kind == "use":
        ids = draw(st.lists(IDS, min_size=1, max_size=2))
        return {"role": "assistant", "content": [{"type": "text", "text": "t"},
                                                 *({"type": "tool_use", "id": i, "name": "bash", "input": {}}
                                                   for i in ids)]}
    if kind == "result":
        ids = draw(st.lists(IDS, min_size=1, max_size=2))
        extra = [{"type": "text", "text": "also"}] if draw(st.booleans()) else []
        return {"role": "user", "content": [*({"type": "tool_result", "tool_use_id": i, "content": "ok"}
                                              for i in ids), *extra]}
    return {"role": kind, "content": [{"type": "text", "text": draw(st.text(max_size=3))}]}


def responses_piece(draw):
    kind = draw(st.sampled_from(["call", "call", "output", "output", "reasoning", "reasoning", "message"]))
    if kind == "call":
        role = {"role": "assistant"} if draw(st.booleans()) else {}  # a role on a call: still a Responses item
        return {"type": "function_call", "call_id": draw(IDS), "name": "shell", "arguments": "{}", **role}
    if kind == "output":
        return {"type": "function_call_output", "call_id": draw(IDS), "output": draw(st.text(max_size=3))}
    if kind == "reasoning":
        return {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}]}
    return {"type": "message", "role": draw(st.sampled_from(["user", "assistant"])), "content": "m"}


PIECES = {"openai": openai_piece, "anthropic": anthropic_piece, "responses": responses_piece}


@st.composite
def extended_histories(draw):
    """(the last request, this request): a well-formed history of one format, then pieces added (of that format
    or, sometimes, another), and sometimes a message of the last request changed."""
    fmt = draw(st.sampled_from(sorted(PIECES)))
    base = {"openai": synthetic_history, "anthropic": synthetic_anthropic_history,
            "responses": synthetic_responses_input}[fmt](draw(st.integers(1, 4)), seed=draw(st.integers(0, 3)))
    last = base + [PIECES[fmt](draw) for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2])))]
    other = draw(st.sampled_from([fmt, fmt, fmt, *sorted(PIECES)]))
    added = []
    for _ in range(draw(st.integers(0, 3))):  # a call and its result, or any one piece
        if other == "openai" and draw(st.booleans()):
            call = draw(IDS)
            added += [{"role": "assistant", "content": "", "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call, "content": "ok"}]
        elif other == "responses" and draw(st.booleans()):
            call = draw(IDS)
            added += [{"type": "function_call", "call_id": call, "name": "shell", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": call, "output": "ok"}]
        else:
            added.append(PIECES[other](draw))
    now = copy.deepcopy(last) + added
    if draw(st.integers(0, 4)) == 0 and last:
        at = draw(st.integers(0, len(last) - 1))
        now[at] = {**now[at], "content": "changed"}
    return last, now


def whole(messages):
    try:
        return parse_history(messages)
    except BlockStructureError:
        return None


@settings(max_examples=600, deadline=None)
@given(extended_histories())
def test_a_resumed_parse_is_the_whole_parse_or_refuses(pair):
    last, now = pair
    before = whole(last)
    if before is None:  # a request that does not parse leaves nothing to resume
        return
    parsed = Marshalled(last).parsed(before, identify(before.format, last, before.spans), None)
    now_copy = json.loads(json.dumps(now))  # other objects, equal values: what the next request of a proxy holds
    resumed = resume(parsed, now_copy, Marshalled(now_copy), identify) if parsed is not None else None
    expected = whole(now_copy)
    if resumed is None:
        return
    history, keys, call_ids = resumed
    assert expected is not None, "resumed a history the whole parse refuses"
    assert (history.format, history.spans, tuple(history.roles)) == \
        (expected.format, expected.spans, tuple(expected.roles))
    assert keys == identify(expected.format, now_copy, expected.spans)
    assert history.carries_thinking == expected.carries_thinking  # read from the tail only


def test_a_grown_history_resumes_and_a_changed_one_does_not():
    messages = synthetic_history(40, seed=3)
    first = parse_history(messages[:60])
    parsed = Marshalled(messages[:60]).parsed(first, identify("openai", messages, first.spans), None)
    grown = json.loads(json.dumps(messages))
    assert resume(parsed, grown, Marshalled(grown), identify) is not None
    grown[10]["content"] += "!"
    assert resume(parsed, grown, Marshalled(grown), identify) is None
    assert resume(parsed, messages[:50], Marshalled(messages[:50]), identify) is None  # shorter than the last


@pytest.mark.parametrize("make", [synthetic_history, synthetic_anthropic_history, synthetic_responses_input])
def test_gem_forwards_the_same_whether_it_resumes_or_not(make):
    """Every request of a growing session, compressed by a GEM that resumes (a session id) and one that parses
    whole (its own store, no resumable state): the same forwarded messages and stats."""
    messages = make(90, seed=5)
    resuming, whole_parse = (GEM(UNBOUND, encoder=HashEncoder(64), token_counter=None) for _ in range(2))
    for end in range(40, len(messages) + 1, 7):
        request = json.loads(json.dumps(messages[:end]))
        got = resuming.compress(request, session_id="s")
        for state in whole_parse.store._items.values():  # forget the parse: only the selection state stays
            object.__setattr__(state[1], "parsed", None)
        want = whole_parse.compress(json.loads(json.dumps(messages[:end])), session_id="s")
        assert got.messages == want.messages
        assert (got.stats.action, got.stats.removed_blocks, got.stats.chars_after) == \
            (want.stats.action, want.stats.removed_blocks, want.stats.chars_after)
    assert resuming.store.get("s").parsed is not None


def test_values_that_do_not_marshal_parse_whole():
    class Text(str):
        pass

    messages = synthetic_history(30, seed=1)
    messages[5] = {**messages[5], "content": Text("a str subclass")}
    gem = GEM("paper", encoder=HashEncoder(64), token_counter=None)
    first = gem.compress(messages, session_id="s")
    assert first.stats.action == "reselected" and gem.store.get("s").parsed is None
    assert gem.compress(messages, session_id="s").messages == first.messages


def test_added_items_that_make_it_a_responses_input_parse_whole():
    """A chat history whose added messages carry a Responses item type (a call that also has a role) is a
    Responses input as a whole: the added part alone would parse as chat."""
    messages = synthetic_history(20, seed=2)
    first = parse_history(messages)
    parsed = Marshalled(messages).parsed(first, identify("openai", messages, first.spans), None)
    now = messages + [{"type": "function_call", "role": "assistant", "call_id": "z", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "role": "user", "call_id": "z", "output": "ok"}]
    assert parse_history(now).format == "responses"
    assert resume(parsed, now, Marshalled(now), identify) is None


def body_of(messages, separator=", "):
    """A request body as a client writes it, and each message's ``[start, end)`` in its bytes."""
    head, elements, parts = b'{"model": "m", "messages": [', [], []
    at = len(head)
    for i, message in enumerate(messages):
        text = json.dumps(message, ensure_ascii=False).encode()
        elements.append((at, at + len(text)))
        parts.append(text)
        at += len(text) + len(separator.encode())
    return head + separator.encode().join(parts) + b"]}", elements


def test_a_proxy_resumes_on_the_body_bytes_and_refuses_a_rewritten_message():
    messages = synthetic_anthropic_history(40, seed=4)
    gem = GEM(UNBOUND, encoder=HashEncoder(64), token_counter=None)
    first = messages[:51]
    gem.compress(json.loads(json.dumps(first)), session_id="s", message_bytes=body_of(first))
    assert gem.store.get("s").parsed.nbytes == body_of(first)[1][-1][1] - body_of(first)[1][0][0]
    calls = []
    import gemkernels.compress.gem as gem_module

    real = gem_module.parse_history
    gem_module.parse_history = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        grown = json.loads(json.dumps(messages))
        got = gem.compress(grown, session_id="s", message_bytes=body_of(messages))
        assert calls == []  # resumed: the whole history was not parsed
        respaced = json.loads(json.dumps(messages))  # equal values, other bytes (another separator): parsed whole
        again = gem.compress(respaced, session_id="s", message_bytes=body_of(messages, separator=",\n"))
        assert calls == [1]
    finally:
        gem_module.parse_history = real
    fresh = GEM(UNBOUND, encoder=HashEncoder(64), token_counter=None)
    fresh.compress(json.loads(json.dumps(first)), session_id="s")
    want = fresh.compress(json.loads(json.dumps(messages)), session_id="s")
    assert got.messages == want.messages and again.messages == want.messages


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_text_action_scan_goes_on_where_the_last_stopped(data):
    """mini-swe-agent and Aider turns (observations, rejections, human turns, malformed ones, out of order): from
    every earlier request of the history, the resumed parse is the whole parse, and it does resume."""
    messages = data.draw(text_histories(alternating=data.draw(st.booleans())))
    expected = whole(messages)
    resumed_any = False
    for end in range(2, len(messages)):
        before = whole(messages[:end])
        if before is None:
            continue
        parsed = Marshalled(messages[:end]).parsed(before, identify(before.format, messages, before.spans), None)
        now = json.loads(json.dumps(messages))
        resumed = resume(parsed, now, Marshalled(now), identify)
        if resumed is None:
            continue
        resumed_any |= before.format == "text-actions"
        history, keys, _ = resumed
        assert expected is not None
        assert (history.format, history.spans, keys) == \
            (expected.format, expected.spans, identify(expected.format, now, expected.spans))
    first_block = expected.spans[0].positions[0] if expected is not None and expected.spans else len(messages)
    if expected is not None and expected.format == "text-actions" and first_block < len(messages) - 3:
        assert resumed_any


def test_tool_calls_added_to_a_text_action_history_parse_whole():
    """A text-action history is one without tool calls: added calls make the whole an OpenAI history."""
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for i in range(6):
        messages += [{"role": "assistant", "content": f"THOUGHT: go.\n\n```bash\nls {i}\n```"},
                     {"role": "user", "content": f"<returncode>0</returncode>\n<output>\nls {i}: ok\n</output>"}]
    first = parse_history(messages)
    assert first.format == "text-actions"
    parsed = Marshalled(messages).parsed(first, identify(first.format, messages, first.spans), None)
    now = messages + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t", "content": "ok"}]
    assert parse_history(now).format == "openai"
    assert resume(parsed, now, Marshalled(now), identify) is None
    grown = messages + messages[-2:]
    history, _, _ = resume(parsed, grown, Marshalled(grown), identify)
    assert history.spans == parse_history(grown).spans


def test_a_parse_with_unknown_roles_or_a_text_body_is_not_kept():
    """What a kept parse holds is bounded: roles are the known few (a Responses item's role can be any value,
    a megabyte string included), call ids are counted by their length; a body that is not bytes is not read."""
    items = synthetic_responses_input(20, seed=1)
    gem = GEM("paper", encoder=HashEncoder(64), token_counter=None)
    gem.compress(items, session_id="s")
    kept = gem.store.get("s").parsed
    assert kept is not None and kept.held_bytes >= sum(map(len, kept.call_ids))
    items[0] = {**items[0], "role": "r" * 100_000}
    gem.compress(items, session_id="t")
    assert gem.store.get("t").parsed is None
    messages = synthetic_history(30, seed=1)
    body, elements = body_of(messages)
    result = gem.compress(messages, session_id="u", message_bytes=(body.decode(), elements))
    assert result.stats.action == "reselected" and gem.store.get("u").parsed is None


@pytest.mark.parametrize("between", [True, False])
def test_reasoning_left_pending_behind_an_output_is_not_resumed_past(between):
    """A Responses reasoning item after the last call, with only that call's output after it, belongs to the next
    call's block: a parse that resumed after it gave that block another identity than the whole parse (CI's
    hypothesis run found it; only a reasoning item in the last place was treated as an open end)."""
    head = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "function_call", "call_id": "a", "name": "shell", "arguments": '{"command": "ls"}'}]
    thinking = {"type": "reasoning", "summary": []}
    answer = {"type": "function_call_output", "call_id": "a", "output": "x.py"}
    last = head + ([thinking, answer] if between else [answer, thinking])
    now = last + [{"type": "function_call", "call_id": "b", "name": "shell", "arguments": '{"command": "cat x.py"}'},
                  {"type": "function_call_output", "call_id": "b", "output": "print(1)"}]
    before = parse_history(last)
    parsed = Marshalled(last).parsed(before, identify(before.format, last, before.spans), None)
    assert parsed.open_end
    now_copy = json.loads(json.dumps(now))
    assert resume(parsed, now_copy, Marshalled(now_copy), identify) is None  # the whole parse says where it goes
    expected = parse_history(now_copy)
    assert expected.spans[-1].positions[0] == (2 if between else 3)  # the pending reasoning joined call b's block


THINKING_FORMS = [
    lambda m: {**m, "thinking_blocks": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
    lambda m: {**m, "reasoning_details": [{"type": "reasoning.text", "text": "x", "signature": "s"}]},
    lambda m: {**m, "content": [{"type": "reasoning", "reasoning": "x", "extras": {"signature": "s"}},
                                {"type": "text", "text": m["content"]}]},
]


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8), st.data())
def test_a_resumed_parse_reads_the_thinking_of_its_added_messages_only_and_says_what_a_whole_parse_says(n, data):
    """Chat histories whose calls carry signed thinking (LiteLLM, OpenRouter, LangChain v1 forms) in the last
    request's blocks, the added ones, both or neither: the resumed parse, which reads only the added messages,
    says `carries_thinking` as the whole parse does."""
    blocks = data.draw(st.integers(1, n - 1), label="blocks of the last request")
    thinking = data.draw(st.sets(st.integers(0, n - 1)), label="blocks whose call thinks")
    form = data.draw(st.sampled_from(THINKING_FORMS), label="form")
    messages = synthetic_history(n, seed=data.draw(st.integers(0, 3)))
    start = len(messages) - 2 * n
    for b in thinking:
        messages[start + 2 * b] = form(messages[start + 2 * b])
    last = messages[:start + 2 * blocks]
    before = parse_history(last)
    parsed = Marshalled(last).parsed(before, identify(before.format, last, before.spans), None)
    now = json.loads(json.dumps(messages))
    history, _, _ = resume(parsed, now, Marshalled(now), identify)
    assert history.carries_thinking == parse_history(now).carries_thinking == bool(thinking)
