"""Anthropic thinking comes back as the API checks it: the current tool loop's thinking blocks are always sent, and
(``thinking_bound``, models with preserved thinking) a history whose thinking may be bound to its prefix goes out
whole, whatever the session's state, so no fallback path can send a prefix the model did not write after."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels import GEM
from gemkernels.compress.blocks import carries_thinking, loop_start, parse_history
from gemkernels.compress.config import resolve_config
from gemkernels.compress.encoders import HashEncoder
from gemkernels.compress.gem import THINKING_BOUND

WORDS = ["parser", "config", "cache", "router", "socket", "schema", "token", "kernel", "worker", "index"]


def assistant(step, rng, thinking):
    topic = WORDS[int(rng.integers(len(WORDS)))]
    content = [{"type": "thinking", "thinking": f"look at {topic} {step}", "signature": f"sig{step}"}] \
        if thinking else []
    content += [{"type": "text", "text": f"Step {step}: {topic}"},
                {"type": "tool_use", "id": f"toolu_{step}", "name": "bash", "input": {"command": f"grep {topic}"}}]
    return {"role": "assistant", "content": content}


def result(step, rng):
    body = " ".join(f"{WORDS[int(v) % 10]}{int(v)}" for v in rng.integers(0, 400, size=int(rng.integers(5, 300))))
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": body}]}


def gem(**overrides):
    return GEM(resolve_config("core", min_blocks=4, k=3, **overrides), encoder=HashEncoder(64), token_counter=None)


def one_loop(blocks, thinking_every, seed=0):
    """A task, then one long tool loop (no user turn since), thinking on every ``thinking_every``-th call."""
    rng = np.random.default_rng(seed)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    for step in range(blocks):
        h += [assistant(step, rng, step % thinking_every == 0), result(step, rng)]
    return h


def test_the_loop_starts_after_the_last_plain_user_turn():
    h = one_loop(6, thinking_every=4)
    assert loop_start(h) == 1
    h += [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
          {"role": "user", "content": "Now the docs."}]
    assert loop_start(h) == len(h)
    assert loop_start([{"role": "assistant", "content": "hi"}]) == 0


def test_current_loop_thinking_blocks_survive_the_ceiling():
    """A ceiling that drops blocks down to the newest one leaves every thinking block of the loop in place (the API
    answers 400 when the last assistant turn lost its thinking), and drops the others to fit (old code dropped the
    thinking ones too)."""
    h = one_loop(30, thinking_every=3)
    result = gem(max_forward_tokens=50, thinking_bound=False).compress(h)
    kept = {id(m) for m in result.messages}
    thinking = [m for m in h if m["role"] == "assistant" and carries_thinking(m)]
    assert all(id(m) in kept for m in thinking)
    assert len(result.messages) == 1 + 2 * len(thinking) + 2  # the task, the thinking blocks, the newest block
    assert result.stats.protected["thinking"] == list(range(0, 30, 3))
    parse_history(result.messages)


def test_blocks_after_a_plain_user_turn_no_longer_pin_their_thinking():
    h = one_loop(30, thinking_every=3)
    h += [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
          {"role": "user", "content": "Now the docs."}]
    out = gem(thinking_bound=False).compress(h).messages
    assert len(out) < len(h)
    assert any(carries_thinking(m) and all(m is not o for o in out) for m in h)  # an earlier turn's thinking went


@pytest.mark.parametrize("thinking_every", [1, 7, 1000])
def test_bound_thinking_forwards_an_anthropic_history_whole(thinking_every):
    """Even with no thinking yet (a model with preserved thinking may think in the next response, bound to what it
    was sent), and without any session state."""
    h = one_loop(40, thinking_every=thinking_every)
    result = gem().compress(h, session_id="s")
    assert result.messages is h and result.stats.action == "unchanged" and result.stats.reason == THINKING_BOUND
    unbound = gem().compress(h, session_id="s", unbound_thinking=True).stats  # drop_block: compressed
    assert bool(unbound.removed_blocks) == (thinking_every > 1)  # every block of the one loop thinks: all pinned
    assert gem(thinking_bound=False).compress(h).stats.removed_blocks == unbound.removed_blocks


def test_litellm_thinking_blocks_bind_a_chat_history():
    """LiteLLM carries Anthropic thinking as an assistant message's ``thinking_blocks`` in the OpenAI chat form."""
    rng = np.random.default_rng(1)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    for step in range(30):
        message = {"role": "assistant", "content": f"Step {step}", "tool_calls": [
            {"id": f"c{step}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
        if step % 3 == 0:
            message["thinking_blocks"] = [{"type": "thinking", "thinking": f"plan {step}", "signature": "s"}]
        output = result(step, rng)["content"][0]["content"]
        h += [message, {"role": "tool", "tool_call_id": f"c{step}", "content": output}]
    assert gem().compress(h).stats.reason == THINKING_BOUND
    out = gem(thinking_bound=False, max_forward_tokens=50).compress(h).messages
    assert all(any(m is o for o in out) for m in h if m.get("thinking_blocks"))
    plain = [{k: v for k, v in m.items() if k != "thinking_blocks"} for m in h]
    assert gem().compress(plain).stats.removed_blocks  # no thinking: compressed as before


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), think=st.lists(st.booleans(), min_size=40, max_size=40),
       user_turns=st.sets(st.integers(1, 39), max_size=4), preset=st.sampled_from(["core", "cache-aware"]),
       bound=st.booleans())
def test_a_thinking_session_never_loses_what_the_api_checks(seed, think, user_turns, preset, bound):
    """A session where the model answers each forwarded request: bound, every request goes out whole; unbound, the
    current loop's thinking messages are all sent and the history still parses."""
    rng = np.random.default_rng(seed)
    compressor = GEM(resolve_config(preset, min_blocks=4, k=3, thinking_bound=bound), encoder=HashEncoder(64),
                     token_counter=None)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    for step in range(40):
        out = compressor.compress(list(h), session_id="s").messages
        ids = {id(m) for m in out}
        if bound:
            assert len(out) == len(h)
        assert all(id(m) in ids for m in h[loop_start(h):] if carries_thinking(m))
        parse_history(out)
        if step in user_turns:
            h += [{"role": "assistant", "content": [{"type": "text", "text": f"Checkpoint {step}."}]},
                  {"role": "user", "content": f"Go on with part {step}."}]
            continue
        h += [assistant(step, rng, think[step]), result(step, rng)]


def test_a_text_action_history_with_thinking_parts_is_bound_too():
    """A mini-swe-agent history sent to Anthropic (no tool_use parts: text actions) whose assistant turns carry
    thinking parts: its turns are removable blocks, and the thinking is bound all the same (old code cut it)."""
    h = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Fix the tests."}]
    for step in range(30):
        h += [{"role": "assistant", "content": [
                  {"type": "thinking", "thinking": f"step {step}", "signature": f"s{step}"},
                  {"type": "text", "text": f"Look.\n```bash\ngrep -rn word{step} src\n```"}]},
              {"role": "user", "content": f"<returncode>0</returncode>\n<output>\nsrc/m{step}.py: word{step}\n"
                                          f"{'x' * (40 * step)}\n</output>"}]
    assert parse_history(h).format == "text-actions" and len(parse_history(h).spans) == 30
    result = gem().compress(h)
    assert result.messages is h and result.stats.reason == THINKING_BOUND
    assert gem(thinking_bound=False).compress(h).stats.removed_blocks


def test_a_bound_anthropic_history_is_not_even_parsed(monkeypatch):
    """Forwarded whole, it costs no parse (a Claude Code request of 600 messages paid a whole parse for nothing)."""
    import gemkernels.compress.gem as gem_module

    def refuse(*args, **kwargs):
        raise AssertionError("parsed")

    h = one_loop(40, thinking_every=1)
    monkeypatch.setattr(gem_module, "parse_history", refuse)
    assert gem().compress(h, session_id="s").stats.reason == THINKING_BOUND
