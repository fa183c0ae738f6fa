"""Cache breakpoints of removed messages move to the nearest kept one before them (at most four in a request, never
onto a thinking part, the caller's objects untouched), and the body is the client's bytes with only that message
rewritten."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.serve.body import forwarded_body, parse_body, without_elements
from gemkernels.serve.cache_marks import moved_marks

MARK = {"type": "ephemeral"}


#: Anthropic histories compress here as for a model without preserved thinking (test_routes covers the default).
UNBOUND = ("thinking_bound=False",)


def text(t: str, mark: bool = False) -> dict:
    return {"type": "text", "text": t, **({"cache_control": MARK} if mark else {})}


def test_a_removed_breakpoint_moves_to_the_nearest_kept_message_before_it():
    messages = [{"role": "user", "content": "task"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                  text("plan")]},
                {"role": "user", "content": [text("old result", mark=True)]},
                {"role": "assistant", "content": [text("next")]}]
    before = copy.deepcopy(messages)
    moved = moved_marks({}, messages, [2])
    assert list(moved) == [1] and moved[1]["content"][1]["cache_control"] == MARK
    assert moved[1]["content"][0] == messages[1]["content"][0]  # the thinking part is untouched, unmarked
    assert messages == before  # a copy: the caller's objects are not changed
    assert moved_marks({}, messages, [1, 2])[0]["content"] == [text("task", mark=True)]  # a string becomes a part
    only_thinking = [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
                     messages[2]]
    assert moved_marks({}, only_thinking, [1]) == {}
    already = [{"role": "user", "content": [text("marked", mark=True)]}, messages[2]]
    assert moved_marks({}, already, [1]) == {}  # its prefix is marked already
    assert moved_marks({}, [messages[2], messages[3]], [0]) == {}  # nothing kept before it


def test_at_most_four_breakpoints_counting_system_and_tools():
    messages = [{"role": "user", "content": [text(f"m{i}")]} for i in range(6)]
    for p in (1, 3, 5):
        messages[p] = {"role": "user", "content": [text(f"m{p}", mark=True)]}
    body = {"system": [text("sys", mark=True)], "tools": [{"name": "t", "cache_control": MARK}]}
    assert list(moved_marks(body, messages, [1, 3, 5])) == [0, 2]  # 2 outside + 2 moved: the third would be a fifth
    assert len(moved_marks({}, messages, [1, 3, 5])) == 3


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.integers() | st.text(max_size=5), max_size=3),
                min_size=1, max_size=12), st.data())
def test_cut_and_rewritten_bodies_keep_every_other_byte(items, data):
    raw = (b'{"x" : 1e400,\n "messages":[ ' + b" ,  ".join(json.dumps(i).encode() for i in items) + b' ], "y": []}')
    parsed, layout = parse_body(raw, "messages")
    removed = sorted(data.draw(st.sets(st.integers(0, len(items) - 1))))
    kept = [p for p in range(len(items)) if p not in removed]
    rewritten = {p: json.dumps({"new": p}).encode() for p in data.draw(st.sets(st.sampled_from(kept)))} if kept else {}
    out = without_elements(raw, layout, removed, rewritten)
    expected = [{"new": p} if p in rewritten else items[p] for p in kept]
    assert json.loads(out.replace(b"1e400", b"1"))["messages"] == expected
    assert out.startswith(b'{"x" : 1e400,\n "messages":[') and out.endswith(b'], "y": []}')
    if removed and kept:  # rewriting an element that is also cut is refused
        assert forwarded_body(raw, layout, parsed["messages"], [parsed["messages"][p] for p in kept],
                              {removed[0]: b"{}"}) is None


@pytest.mark.parametrize("surrogate", [False, True], ids=["text", "lone-surrogates"])
def test_through_the_proxy_only_the_moved_to_message_is_rewritten(surrogate):
    """With a lone surrogate in every text too: the rewritten message goes out as ASCII-escaped JSON (UTF-8 cannot
    carry it; its encoding raised)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gemkernels.serve.app import create_app
    from gemkernels.serve.config import ServerConfig
    from gemkernels.testing.histories import synthetic_anthropic_history

    history = synthetic_anthropic_history(60, seed=31)
    marked = 2 * 20  # an old tool result the client marked (a breakpoint it set long ago)
    history[marked]["content"][0]["cache_control"] = MARK
    if surrogate:
        history = [with_surrogates(message) for message in history]
    sent: list[bytes] = []
    app = create_app(ServerConfig(upstream="http://upstream", encoder="hash", preset="core", encode_budget=30.0,
                                  overrides=UNBOUND),
                     transport=httpx.MockTransport(lambda r: sent.append(r.content) or httpx.Response(200, json={})))
    raw = json.dumps({"model": "claude", "messages": history}).encode()
    with TestClient(app) as client:
        client.post("/v1/messages", content=raw, headers={"x-api-key": "k"})
    forwarded = json.loads(sent[-1])["messages"]
    positions, at = [], 0  # where each forwarded message was in the request (breakpoints aside)
    for message in forwarded:
        while unmarked(history[at]) != unmarked(message):
            at += 1
        positions.append(at)
        at += 1
    assert marked not in positions, "the test needs the marked block to be removed"
    changed = [j for j, m in enumerate(forwarded) if json.dumps(m).encode() != json.dumps(history[positions[j]])
               .encode()]
    assert len(changed) == 1  # every other kept message as the client sent it
    target = changed[0]
    assert positions[target] == max(p for p in positions if p < marked)  # the nearest kept one before
    assert forwarded[target]["content"][-1]["cache_control"] == MARK
    assert sum(json.dumps(m).count("cache_control") for m in forwarded) == 1


def with_surrogates(value):
    """``value`` with a lone surrogate after every string under a ``text`` or ``content`` key."""
    if isinstance(value, dict):
        return {k: v + " \ud800" if k in ("text", "content") and isinstance(v, str) else with_surrogates(v)
                for k, v in value.items()}
    return [with_surrogates(v) for v in value] if isinstance(value, list) else value


def unmarked(message: dict) -> str:
    """A message's JSON without its parts' breakpoints."""
    content = message["content"]
    if isinstance(content, list):
        content = [{k: v for k, v in part.items() if k != "cache_control"} for part in content]
    return json.dumps({**message, "content": content})


def test_a_message_json_cannot_write_back_keeps_its_bytes_and_gets_no_breakpoint():
    """A kept message holding ``1e400`` (read as inf) was rewritten with ``Infinity``, which is not JSON: the
    proxy turned a valid request into one the API refuses. It now stays as sent, the breakpoint not moved."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gemkernels.serve.app import create_app
    from gemkernels.serve.config import ServerConfig
    from gemkernels.testing.histories import synthetic_anthropic_history

    history = synthetic_anthropic_history(60, seed=31)
    marked = 2 * 20
    history[marked]["content"][0]["cache_control"] = MARK
    for message in history[1:]:
        message["content"][-1]["size"] = 12345
    raw = json.dumps({"model": "claude", "messages": history}).encode().replace(b"12345", b"1e400")
    sent: list[bytes] = []
    app = create_app(ServerConfig(upstream="http://upstream", encoder="hash", preset="core", encode_budget=30.0,
                                  overrides=UNBOUND),
                     transport=httpx.MockTransport(lambda r: sent.append(r.content) or httpx.Response(200, json={})))
    with TestClient(app) as client:
        client.post("/v1/messages", content=raw, headers={"x-api-key": "k"})

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    forwarded = json.loads(sent[-1], parse_constant=refuse)["messages"]
    assert len(forwarded) < len(history) and b"1e400" in sent[-1]
    kept = [p for p, message in enumerate(json.loads(raw)["messages"]) if message in forwarded]
    removed = [p for p in range(len(history)) if p not in kept]
    assert marked in removed and sent[-1] == without_elements(raw, parse_body(raw, "messages")[1], removed)
