"""`GEM.compress` over generated sessions of every format: requests that grow, trim blocks or plain messages, edit
an earlier message, insert odd messages (None content, unknown parts, a system message mid-way, a new goal), reuse
the last block's ids, and dry runs in between. Every output is the input minus whole blocks, the input is left
as it was, the guard holds, a resumed parse forwards what a whole parse does, a dry run changes nothing, and
sessions sharing a store (other tenants, ids that hold the key's separator) never affect each other."""

import copy
import json

import pytest

from gemkernels import GEM, GEMConfig
from gemkernels.compress.blocks import BlockStructureError, parse_history
from gemkernels.compress.encoders import HashEncoder
from gemkernels.compress.evidence import EvidenceConfig
from gemkernels.compress.gem import THINKING_BOUND
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history, synthetic_responses_input

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_resume import body_of  # noqa: E402


def text_history(num_blocks: int, seed: int = 0) -> list[dict]:
    """A mini-swe-agent history: system, task, then ``num_blocks`` bash turns and their observations."""
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for i in range(num_blocks):
        messages += [{"role": "assistant", "content": f"THOUGHT: go.\n\n```bash\nls {i} {seed}\n```"},
                     {"role": "user", "content": f"<returncode>{i % 2}</returncode>\n<output>\n{'z' * (i * 37 % 300)}"
                                                 "\n</output>"}]
    return messages


MAKERS = {"text": text_history, "openai": synthetic_history, "anthropic": synthetic_anthropic_history,
          "responses": synthetic_responses_input}
#: Anthropic histories compress under all but the first (``thinking_bound`` forwards them whole).
CONFIGS = [GEMConfig(min_blocks=3, k=2, delta=0.5, evidence=EvidenceConfig(recent=1)),
           GEMConfig(min_blocks=3, k=2, delta=1.0, thinking_bound=False),
           GEMConfig(min_blocks=3, k=3, delta=1.0, ranking="router", keep_recent_size=True, rewrite_above_blocks=6,
                     repay_factor=0.5, thinking_bound=False),
           GEMConfig(min_blocks=3, k=3, delta=1.0, keep_recent_size=True, rewrite_above_blocks=5,
                     max_forward_tokens=2000, thinking_bound=False)]


def block_of(fmt: str, call_id: str, text: str) -> list[dict]:
    """One call and its result in ``fmt``."""
    if fmt == "text":
        return [{"role": "assistant", "content": f"```bash\n{text}\n```"},
                {"role": "user", "content": f"<returncode>0</returncode>\n{text * 3}"}]
    if fmt == "openai":
        return [{"role": "assistant", "content": text, "tool_calls": [{"id": call_id, "type": "function", "function": {
                    "name": "bash", "arguments": json.dumps({"command": text})}}]},
                {"role": "tool", "tool_call_id": call_id, "content": text * 3}]
    if fmt == "anthropic":
        return [{"role": "assistant", "content": [{"type": "text", "text": text}, {
                    "type": "tool_use", "id": call_id, "name": "bash", "input": {"command": text}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text * 3}]}]
    return [{"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]},
            {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": json.dumps({"command": text})},
            {"type": "function_call_output", "call_id": call_id, "output": text * 3}]


def odd_message(fmt: str, draw) -> dict:
    options = [{"role": "assistant", "content": None},
               {"role": "user", "content": [{"type": "image", "source": {"data": "x"}}, {"type": "weird"}]},
               {"role": "system", "content": "mid-way system " + draw(st.text(max_size=5))},
               {"role": "user", "content": "new goal " + draw(st.text(max_size=5))},
               {"role": "assistant", "content": [{"type": "text", "text": "plain"}], "extra": [1, 2]},
               {"role": "assistant", "content": "notes " * 2000}]
    if fmt == "responses":
        options += [{"type": "message", "role": "user", "content": "m"}, {"type": "unknown_item", "x": 1},
                    {"type": "reasoning", "summary": []}, {"type": "compaction", "encrypted_content": "zz"}]
    return draw(st.sampled_from(options))


def parsed(messages: list) -> object:
    try:
        return parse_history(messages)
    except BlockStructureError:
        return None


@st.composite
def sessions(draw) -> list[tuple[str, bool]]:
    """A session's requests, each (its JSON, whether it is a dry run)."""
    fmt = draw(st.sampled_from(sorted(MAKERS)))
    history = MAKERS[fmt](draw(st.integers(3, 8)), seed=draw(st.integers(0, 5)))
    requests, added = [], 0
    for op in draw(st.lists(st.sampled_from(["extend", "extend", "extend", "odd", "trim_block", "trim_plain",
                                              "shrink", "edit", "dry", "same", "reuse_ids"]), min_size=2, max_size=8)):
        now = parsed(history)
        if op == "extend":
            for _ in range(draw(st.integers(1, 3))):
                added += 1
                history = history + block_of(fmt, f"n{added}", draw(st.sampled_from(["ls", "cat a.py", "x" * 50])))
        elif op == "odd":
            at = draw(st.integers(0, len(history)))
            history = history[:at] + [odd_message(fmt, draw)] + history[at:]
        elif op == "trim_block" and now is not None and now.spans:
            drop = set(draw(st.sampled_from(now.spans)).positions)
            history = [m for i, m in enumerate(history) if i not in drop]
        elif op in ("trim_plain", "shrink") and now is not None and now.other_positions:
            p = (draw(st.sampled_from(now.other_positions)) if op == "trim_plain" else
                 max(now.other_positions, key=lambda p: len(json.dumps(history[p]))))
            history = history[:p] + history[p + 1:]
        elif op == "edit" and history:
            history = copy.deepcopy(history)
            message = history[draw(st.integers(0, len(history) - 1))]
            if isinstance(message.get("content"), str):
                message["content"] += "!"
            elif "output" in message:
                message["output"] = f"{message['output']}!"
        elif op == "reuse_ids" and now is not None and now.spans:  # this request only: it passes through
            requests.append((json.dumps(history + [copy.deepcopy(history[p]) for p in now.spans[-1].positions]),
                             False))
            continue
        requests.append((json.dumps(history), op == "dry"))
    return requests


def check_output(messages: list, result, delta: float) -> None:
    """The input's own objects in order, minus whole blocks; it parses again; the guard holds."""
    if result.stats.action == "passthrough" or result.stats.reason == THINKING_BOUND:  # as sent, parsed or not
        assert result.messages is messages
        return
    position = {id(m): i for i, m in enumerate(messages)}
    kept = [position[id(m)] for m in result.messages]
    assert kept == sorted(set(kept))
    removed = set(range(len(messages))) - set(kept)
    spans = parse_history(messages).spans
    assert removed == {p for s in spans if set(s.positions) <= removed for p in s.positions}
    parse_history(result.messages)
    stats = result.stats
    if "max_forward_tokens" not in stats.reason:
        assert stats.chars_after >= (1 - delta) * stats.chars_before


def positions(messages: list, out: list) -> list[int]:
    position = {id(m): i for i, m in enumerate(messages)}
    return [position[id(m)] for m in out]


def outcome(messages: list, result) -> tuple:
    stats = result.stats
    return positions(messages, result.messages), stats.action, stats.reason, stats.removed_blocks


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sessions(), st.sampled_from(CONFIGS), st.booleans())
def test_each_request_keeps_the_contract_whether_it_resumes_or_not(requests, config, body_bytes):
    """Three GEMs see the session: one resumes its parses (on the body's bytes or marshalled messages), one parses
    each request whole, one never gets the dry runs; all forward the same."""
    resuming, whole, undisturbed = (GEM(config, encoder=HashEncoder(32), token_counter=None) for _ in range(3))
    for text, dry in requests:
        mine, theirs, third = (json.loads(text) for _ in range(3))
        before = copy.deepcopy(mine)
        got = resuming.compress(mine, session_id="s", save=not dry, message_bytes=body_of(mine) if body_bytes else None)
        assert mine == before
        check_output(mine, got, config.delta)
        for _, state in whole.store._items.values():  # forget the parse: only the selection state stays
            object.__setattr__(state, "parsed", None)
        assert outcome(mine, got) == outcome(theirs, whole.compress(theirs, session_id="s", save=not dry))
        if not dry:
            assert outcome(mine, got) == outcome(third, undisturbed.compress(third, session_id="s"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sessions(), sessions(), st.sampled_from(CONFIGS), st.lists(st.booleans(), min_size=16, max_size=16),
       st.sampled_from([(("t1", "s"), ("t2", "s")), ((None, "x\x1fs"), ("x", "s")), (("t", "a"), ("t", "b"))]))
def test_sessions_sharing_a_store_never_affect_each_other(one, two, config, turns, names):
    """Two sessions' requests interleaved on one GEM forward what each does on a GEM of its own."""
    shared = GEM(config, encoder=HashEncoder(32), token_counter=None)
    alone = [GEM(config, encoder=HashEncoder(32), token_counter=None) for _ in range(2)]
    queues = [list(one), list(two)]
    for turn in turns:
        k = int(turn) if queues[int(turn)] else 1 - int(turn)
        if not queues[k]:
            break
        text, dry = queues[k].pop(0)
        (tenant, session), mine, theirs = names[k], json.loads(text), json.loads(text)
        got = shared.compress(mine, session_id=session, tenant=tenant, save=not dry)
        want = alone[k].compress(theirs, session_id=session, tenant=tenant, save=not dry)
        assert outcome(mine, got) == outcome(theirs, want)
