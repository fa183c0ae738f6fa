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
    unbound = gem().compress(h, session_id="s", thinking="drop").stats  # drop_block: compressed
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


def test_a_request_to_anthropics_api_is_bound_before_it_thinks():
    """``thinking="api"`` (the proxy's /v1/messages, an Anthropic client): bound whatever the history holds, since its
    next response may think after what it was sent; a text-action history without thinking was cut before (and, once
    it thought, sent whole: a prefix the model did not write after)."""
    h = [{"role": "user", "content": "Fix the tests."}]
    for step in range(30):
        h += [{"role": "assistant", "content": f"Look.\n```bash\ngrep -rn word{step} src\n```"},
              {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{'x' * (40 * step)}\n</output>"}]
    assert gem().compress(h).stats.removed_blocks  # as its content shows: nothing binds it
    result = gem().compress(h, thinking="api")
    assert result.messages is h and result.stats.reason == THINKING_BOUND and result.stats.session_id
    assert gem(thinking_bound=False).compress(h, thinking="api").stats.removed_blocks
    with pytest.raises(ValueError, match="thinking must be one of"):
        gem().compress(h, thinking="maybe")


@pytest.mark.parametrize("form", ["reasoning_details", "langchain_reasoning", "langchain_non_standard"])
def test_other_forms_of_signed_thinking_bind_a_chat_history(form):
    """OpenRouter's ``reasoning_details`` and LangChain's v1 content blocks carry Anthropic's signed thinking too."""
    rng = np.random.default_rng(2)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    for step in range(30):
        message = {"role": "assistant", "content": [{"type": "text", "text": f"Step {step}"}], "tool_calls": [
            {"id": f"c{step}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
        if step == 3:
            if form == "reasoning_details":
                message["reasoning_details"] = [{"type": "reasoning.text", "text": "plan", "signature": "s"}]
            elif form == "langchain_reasoning":
                message["content"].insert(0, {"type": "reasoning", "reasoning": "plan", "extras": {"signature": "s"}})
            else:
                message["content"].insert(0, {"type": "non_standard", "value": {"type": "redacted_thinking",
                                                                                "data": "x"}})
        output = result(step, rng)["content"][0]["content"]
        h += [message, {"role": "tool", "tool_call_id": f"c{step}", "content": output}]
    assert gem().compress(h).stats.reason == THINKING_BOUND
    plain_reasoning = [dict(m) for m in h]
    plain_reasoning[7] = {**h[7], "content": [{"type": "reasoning", "reasoning": "plan"}], "reasoning_details": []}
    assert form == "reasoning_details" or gem().compress(plain_reasoning).stats.removed_blocks  # unsigned: not bound


@pytest.mark.parametrize("deferred", [False, True])
def test_a_saved_set_without_a_now_pinned_block_gets_it_back(deferred):
    """Unbound: the first request removes thinking blocks of a finished loop; the client then rewinds past the user turn
    that ended it, so they are the current loop again. Appending to the saved set (and the encoding budget's deferred
    path, which appends too) must put them back (the deferred path did not)."""
    from gemkernels.compress.encoders import EncodingDeferred

    class Deferring(HashEncoder):
        defer = False

        def encode(self, texts):
            if self.defer and texts:
                raise EncodingDeferred("over budget")
            return super().encode(texts)

    rng = np.random.default_rng(0)
    blocks = [[assistant(step, rng, step % 3 == 0), result(step, rng)] for step in range(32)]
    task = [{"role": "user", "content": "Fix the failing tests."}]
    turn = [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
            {"role": "user", "content": "Now the docs."}]
    encoder = Deferring(64)
    compressor = GEM(resolve_config("cache-aware", min_blocks=4, k=3, rewrite_above_blocks=20, repay_factor=None,
                                    thinking_bound=False), encoder=encoder, token_counter=None)
    first = compressor.compress(task + sum(blocks[:30], []) + turn + blocks[30], session_id="s")
    assert any(b % 3 == 0 for b in first.stats.removed_blocks)  # thinking blocks of the finished loop went
    rewound = task + sum(blocks[:30], []) + blocks[30] + blocks[31]
    encoder.defer = deferred
    second = compressor.compress(rewound, session_id="s")
    assert second.stats.action == "appended"
    kept = {id(m) for m in second.messages}
    assert all(id(m) in kept for m in rewound if carries_thinking(m))


def test_a_resumed_parse_is_not_read_again_for_its_format(monkeypatch):
    """A session's next request resumes its parse, which knows the format: the whole history is not scanned again
    to find out whether it is an Anthropic one (a pass over every message on each request)."""
    import gemkernels.compress.gem as gem_module

    calls = []
    real = gem_module.is_anthropic_messages
    monkeypatch.setattr(gem_module, "is_anthropic_messages", lambda messages: calls.append(1) or real(messages))
    rng = np.random.default_rng(3)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    for step in range(30):
        h += [{"role": "assistant", "content": f"Step {step}", "tool_calls": [
            {"id": f"c{step}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": result(step, rng)["content"][0]["content"]}]
    compressor = gem()
    compressor.compress(h[:-2], session_id="s")
    assert calls == [1]
    assert compressor.compress(h, session_id="s").stats.action in ("appended", "reselected")
    assert calls == [1]
