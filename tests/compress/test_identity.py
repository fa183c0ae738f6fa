"""Block identities (`gemkernels.compress.identity`): stable ones the same in every process, both kinds blind to
prompt-cache breakpoints at any depth and different whenever what a block says differs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.compress.blocks import Span, parse_history
from gemkernels.compress.identity import encode_into, frozen, local_digest, responses_said, said, stable_digest
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history, synthetic_responses_input

IDENTITIES = """
import json, sys
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.identity import said, stable_digest
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history
for messages in (synthetic_history(12, seed=4), synthetic_anthropic_history(12, seed=4)):
    history = parse_history(messages)
    print(json.dumps([stable_digest(said(history.messages, span)) for span in history.spans]))
"""


def block_identity(messages, span, digest=stable_digest) -> str:
    return digest(said(messages, span))


def test_every_process_computes_the_same_stable_identities():
    """Replicas sharing a store compare identities across processes: Python's salted hash() would differ."""
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", IDENTITIES], capture_output=True, text=True, env=env,
                              check=True)
        outputs.add(done.stdout)
    assert len(outputs) == 1
    here = []
    for messages in (synthetic_history(12, seed=4), synthetic_anthropic_history(12, seed=4)):
        history = parse_history(messages)
        here.append(json.dumps([stable_digest(said(history.messages, span)) for span in history.spans]))
    assert outputs == {"\n".join(here) + "\n"}


@pytest.mark.parametrize("digest", [stable_digest, local_digest])
def test_cache_breakpoints_at_any_depth_leave_the_identity_alone(digest):
    messages = synthetic_anthropic_history(6, seed=1)
    history = parse_history(messages)
    before = [block_identity(messages, span, digest) for span in history.spans]
    marked = json.loads(json.dumps(messages))
    for message in marked[1:]:
        for part in message["content"]:
            part["cache_control"] = {"type": "ephemeral"}
            if part["type"] == "tool_result":
                part["content"] = [{"type": "text", "text": part["content"], "cache_control": {"type": "ephemeral"}}]
    unmarked = json.loads(json.dumps(messages))
    for message in unmarked[1:]:
        for part in message["content"]:
            if part["type"] == "tool_result":
                part["content"] = [{"type": "text", "text": part["content"]}]
    assert [block_identity(marked, span, digest) for span in history.spans] == \
        [block_identity(unmarked, span, digest) for span in history.spans] != before  # a text part: not a string


@pytest.mark.parametrize("digest", [stable_digest, local_digest])
def test_a_changed_output_or_argument_is_a_new_block(digest):
    messages = synthetic_history(3, seed=2)
    history = parse_history(messages)
    span = history.spans[1]
    base = block_identity(messages, span, digest)
    changed = json.loads(json.dumps(messages))
    changed[span.positions[1]]["content"] += " "
    assert block_identity(changed, span, digest) != base
    changed = json.loads(json.dumps(messages))
    changed[span.positions[0]]["tool_calls"][0]["function"]["arguments"] = "{}"
    assert block_identity(changed, span, digest) != base
    assert block_identity(json.loads(json.dumps(messages)), span, digest) == base  # equal, not the same objects
    items = synthetic_responses_input(3, seed=2)
    spans = parse_history(items).spans
    assert len({digest(responses_said(items, s)) for s in spans}) == len(spans)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)


def encoded(value) -> str:
    out: list[str] = []
    encode_into(out, frozen(value))
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(a=json_values, b=json_values)
def test_two_values_encode_alike_only_when_they_are_equal(a, b):
    """Without cache_control keys, the stable encoding is injective on JSON values (texts escaped and ended,
    containers bracketed, numbers tagged), so equal digests mean equal blocks up to a SHA-256 collision."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "cache_control"}
        return [strip(v) for v in value] if isinstance(value, list) else value

    a, b = strip(a), strip(b)
    same_json = json.dumps(a) == json.dumps(b)  # key order counts, as the client sent it
    assert (encoded(a) == encoded(b)) == same_json


def test_identity_includes_the_call_ids():
    messages = synthetic_history(2, seed=3)
    history = parse_history(messages)
    span = history.spans[0]
    for digest in (stable_digest, local_digest):
        assert block_identity(messages, span, digest) != block_identity(messages, Span(span.positions, ("other",)),
                                                                        digest)
