"""Which session a request belongs to: the agent's own session headers and body fields, per agent (a sub-agent or
a side request under the same name is a session of its own)."""

from __future__ import annotations

import json

import pytest

from gemkernels.compress.sessions import request_session

SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000  # a JSON string nested past json.loads' depth
BODY = {"system": SYSTEM, "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "user_abc_account_1_session_2"}}


def name(session: str | None) -> str | None:
    return None if session is None else session.rsplit("#", 1)[0]


@pytest.mark.parametrize("headers, body, expected", [
    ({"x-gem-session": "g", "x-claude-code-session-id": "c"}, BODY, "g"),
    ({"x-claude-code-session-id": "c", "session_id": "x"}, BODY, "c"),
    ({"session_id": "codex-1"}, {"prompt_cache_key": "k"}, "codex-1"),
    ({"session-id": "codex-2"}, {}, "codex-2"),
    ({}, {"prompt_cache_key": "k", "user": "u"}, "k"),
    ({}, {"user": "u", "metadata": {"user_id": "m"}}, "u"),
    ({}, BODY, "user_abc_account_1_session_2"),
    ({}, {"metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s-9"})}}, "s-9"),
    ({}, {"metadata": {"user_id": "{not json"}}, "{not json"),
    ({}, {"metadata": {"user_id": DEEP}}, DEEP),  # nested past the parser's depth: RecursionError escaped
    ({}, {"user": "", "prompt_cache_key": 3, "metadata": {"user_id": 5}}, None),
    ({"x-gem-session": ""}, {}, None),
])
def test_the_session_is_named_by_the_agents_own_fields(headers, body, expected):
    assert name(request_session(body, headers)) == expected
    if expected is not None:
        assert request_session(body, headers) == request_session(body, headers)  # deterministic


def test_another_agent_under_the_same_name_is_another_session():
    headers = {"x-claude-code-session-id": "c"}
    main = request_session(BODY, headers)
    title = request_session({**BODY, "system": "Generate a short title for this conversation."}, headers)
    sub_agent = request_session({**BODY, "system": [{"type": "text", "text": "You are a search agent."}]}, headers)
    assert len({main, title, sub_agent}) == 3 and {name(main), name(title), name(sub_agent)} == {"c"}
    moved = [{"type": "text", "text": "You are Claude Code."}]  # the breakpoint moved: the same agent
    assert request_session({**BODY, "system": moved}, headers) == main
    chat = {"messages": [{"role": "system", "content": "agent A"}, {"role": "user", "content": "x"}], "user": "u"}
    other = {"messages": [{"role": "system", "content": "agent B"}, {"role": "user", "content": "x"}], "user": "u"}
    assert request_session(chat) != request_session(other)
    responses = {"instructions": "codex rules", "input": [{"type": "message", "role": "developer",
                                                           "content": [{"type": "input_text", "text": "d"}]}]}
    assert request_session(responses, {"session_id": "s"}) != request_session(
        {**responses, "instructions": "compact this conversation"}, {"session_id": "s"})


def test_a_dry_run_forwards_what_the_request_would_and_leaves_the_session_as_it_was():
    import gemkernels as gk
    from gemkernels.testing.histories import synthetic_history

    gem = gk.GEM("paper", encoder="hash", token_counter=None)
    messages = synthetic_history(60, seed=3)
    first = gem.compress(messages[:-10], session_id="s")
    state = gem.store.get("s")
    cached = dict(state.block_cache)
    dry = gem.compress(messages, session_id="s", save=False)
    assert gem.store.get("s") is state and state.block_cache == cached  # nothing saved, nothing added
    real = gem.compress(messages, session_id="s")
    assert dry.messages == real.messages and dry.stats.removed_blocks == real.stats.removed_blocks
    assert first.stats.action == "reselected" and gem.store.get("s") is not state


def test_claude_codes_billing_header_does_not_make_every_request_a_new_session():
    """Claude Code (2.1.x) opens ``system`` with ``x-anthropic-billing-header: cc_version=...; cch=...;``, whose
    hashes change from request to request: hashed with the instructions, every request was a session of its own,
    so GEM never appended (a rewrite each call, or no compression at all under cache-aware)."""
    headers = {"x-claude-code-session-id": "c"}

    def body(cch: str, joined: bool = False) -> dict:
        header = f"x-anthropic-billing-header: cc_version=2.1.37.{cch[:3]}; cc_entrypoint=cli; cch={cch};"
        system = ([{"type": "text", "text": header + "\nYou are Claude Code."}] if joined else
                  [{"type": "text", "text": header}, *SYSTEM])
        return {**BODY, "system": system}

    main = request_session(BODY, headers)
    assert request_session(body("fa690"), headers) == request_session(body("0aaa9"), headers) == main
    assert request_session(body("36ee5", joined=True), headers) == main
    assert request_session({**body("fa690"), "system": [body("fa690")["system"][0], {"type": "text",
                                                                                       "text": "A sub-agent."}]},
                           headers) != main
