"""Anthropic thinking comes back as the API checks it: the current tool loop's thinking blocks are always sent, and
(``thinking_bound``) every thinking block sees the same messages before it as when the model wrote it."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels import GEM
from gemkernels.compress.blocks import carries_thinking, parse_history, thinking_marks
from gemkernels.compress.config import resolve_config
from gemkernels.compress.encoders import HashEncoder

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


def test_thinking_marks_find_the_loop_and_the_last_thinking():
    h = one_loop(6, thinking_every=4)  # thinking at calls 0 and 4: messages 1 and 9
    assert thinking_marks(h) == (1, 10)
    h += [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
          {"role": "user", "content": "Now the docs."}]
    assert thinking_marks(h) == (len(h), 10)
    assert thinking_marks([{"role": "user", "content": "hi"}]) == (1, 0)


def test_current_loop_thinking_blocks_survive_the_ceiling():
    """A ceiling that drops blocks down to the newest one leaves every thinking block of the loop in place (the API
    answers 400 when the last assistant turn lost its thinking); old code dropped them."""
    h = one_loop(30, thinking_every=3)
    out = gem(max_forward_tokens=50, thinking_bound=False).compress(h).messages
    kept = {id(m) for m in out}
    thinking = [m for m in h if m["role"] == "assistant" and carries_thinking(m)]
    assert all(id(m) in kept for m in thinking)
    assert len(out) < len(h)  # the blocks without thinking went
    parse_history(out)


def test_blocks_after_a_plain_user_turn_no_longer_pin_their_thinking():
    h = one_loop(30, thinking_every=3)
    h += [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
          {"role": "user", "content": "Now the docs."}]
    out = gem(thinking_bound=False).compress(h).messages
    assert len(out) < len(h)
    assert any(carries_thinking(m) and all(m is not o for o in out) for m in h)  # an earlier turn's thinking went


def test_bound_thinking_keeps_every_block_before_it_on_the_first_compression():
    h = one_loop(40, thinking_every=20)  # the last thinking at call 20
    _, end = thinking_marks(h)
    result = gem().compress(h)
    out_ids = {id(m) for m in result.messages}
    assert all(id(m) in out_ids for m in h[:end])
    assert result.stats.removed_blocks and min(result.stats.removed_blocks) >= 20  # after the thinking: free
    unbound = gem(thinking_bound=False).compress(h)
    assert min(unbound.stats.removed_blocks) < 20


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), think=st.lists(st.booleans(), min_size=40, max_size=40),
       user_turns=st.sets(st.integers(1, 39), max_size=4), preset=st.sampled_from(["core", "cache-aware"]))
def test_every_thinking_block_sees_the_prefix_it_was_written_after(seed, think, user_turns, preset):
    """A session where the model answers each forwarded request: the messages forwarded before each of its thinking
    messages, in every later request, are those it was written after (preserved thinking's prefix check); the
    current loop's thinking messages are all sent."""
    rng = np.random.default_rng(seed)
    compressor = GEM(resolve_config(preset, min_blocks=4, k=3), encoder=HashEncoder(64), token_counter=None)
    h = [{"role": "user", "content": "Fix the failing tests."}]
    seen_before: dict[int, list[int]] = {}  # a thinking message -> the ids forwarded before it when it was written
    for step in range(40):
        out = compressor.compress(list(h), session_id="s").messages
        ids = [id(m) for m in out]
        for message_id, prefix in seen_before.items():
            if message_id in ids:
                assert ids[:ids.index(message_id)] == prefix
            else:
                assert False, "a thinking message was removed"
        loop, _ = thinking_marks(h)
        assert all(id(m) in ids for m in h[loop:] if carries_thinking(m))
        if step in user_turns:
            h += [{"role": "assistant", "content": [{"type": "text", "text": f"Checkpoint {step}."}]},
                  {"role": "user", "content": f"Go on with part {step}."}]
            continue
        answer = assistant(step, rng, think[step])
        if think[step]:
            seen_before[id(answer)] = ids
        h += [answer, result(step, rng)]
