"""The hooks' shared compressor (`gemkernels.integrations.session_compressor`), which every framework hook calls:
like `GEM.compress`, it never raises for bad input."""

from __future__ import annotations

import pytest

from gemkernels.integrations.session_compressor import SessionCompressor, model_thinking
from gemkernels.testing.histories import synthetic_history


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def circular() -> dict:
    message = {"role": "user", "content": "task"}
    message["self"] = message
    return message


@pytest.mark.parametrize("task", [
    {"role": "user", "content": nested(5000)},
    circular(),
    {"role": "user", "content": "task", 1: "a key of another type"},
], ids=["nested-past-the-parsers-depth", "circular", "mixed-key-types"])
def test_a_session_without_a_name_and_an_odd_first_message_goes_out_as_sent(task):
    """Without a session id the lock is named by the first two messages' JSON, which raised TypeError, ValueError
    or RecursionError into the agent (through LiteLLM, the call never went out)."""
    history = synthetic_history(20)
    messages = [history[0], task, *history[2:]]
    out = SessionCompressor("paper", encoder="hash").compress(messages)
    assert out.messages == messages and out.stats.action == "passthrough"


@pytest.mark.parametrize("model, request_fields, mode", [
    ("anthropic/claude-sonnet-4-5", {}, "api"),
    ("bedrock/us.anthropic.claude-opus-4-1-v1:0", {}, "api"),
    ("claude-fable-5-1", {"thinking": {"block_binding": {"prefix_mismatch_behavior": "drop_block"}}}, "drop"),
    ("gpt-5", {"thinking": {"block_binding": {"prefix_mismatch_behavior": "drop_block"}}}, "content"),
    (None, {}, "content"),
])
def test_a_claude_model_binds_its_calls_history(model, request_fields, mode):
    """The LiteLLM and LangChain hooks: a call to a Claude model goes to Anthropic's API, whose next response may
    think after what it was sent (`GEM.compress`'s ``thinking="api"``)."""
    assert model_thinking(model, request_fields) == mode
    messages = synthetic_history(40)
    stats = SessionCompressor("core", encoder="hash").compress(messages, thinking=mode).stats
    assert (stats.reason.startswith("thinking_bound")) == (mode == "api")
