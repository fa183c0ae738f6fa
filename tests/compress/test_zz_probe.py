import copy, json
import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from gemkernels import GEM, GEMConfig
from gemkernels.compress.blocks import BlockStructureError, parse_history
from gemkernels.compress.encoders import HashEncoder
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history, synthetic_responses_input

def text_history(n, seed=0):
    h = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for i in range(n):
        h += [{"role": "assistant", "content": f"THOUGHT: go.\n\n```bash\nls {i} {seed}\n```"},
              {"role": "user", "content": f"<returncode>{i % 2}</returncode>\n<output>\nls {i}: ok {'z' * (i * 37 % 300)}\n</output>"}]
    return h


MAKERS = {"text": text_history, "openai": synthetic_history, "anthropic": synthetic_anthropic_history, "responses": synthetic_responses_input}


def block_pair(fmt, call_id, text):
    if fmt == "text":
        return [{"role": "assistant", "content": f"```bash\n{text}\n```"},
                {"role": "user", "content": f"<returncode>0</returncode>\n{text * 3}"}]
    if fmt == "openai":
        return [{"role": "assistant", "content": text, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": text})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": text * 3}]
    if fmt == "anthropic":
        return [{"role": "assistant", "content": [{"type": "text", "text": text},
                                                  {"type": "tool_use", "id": call_id, "name": "bash", "input": {"command": text}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text * 3}]}]
    return [{"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]},
            {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": json.dumps({"command": text})},
            {"type": "function_call_output", "call_id": call_id, "output": text * 3}]


def odd_piece(fmt, draw):
    options = [
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "image", "source": {"data": "x"}}, {"type": "weird"}]},
        {"role": "system", "content": "mid-way system " + draw(st.text(max_size=5))},
        {"role": "user", "content": "new goal " + draw(st.text(max_size=5))},
        {"role": "assistant", "content": [{"type": "text", "text": "plain"}], "extra": [1, 2]},
        {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {"role": "assistant", "content": "big " * 3000},
    ]
    if fmt == "responses":
        options += [{"type": "message", "role": "user", "content": "m"}, {"type": "unknown_item", "x": 1},
                    {"type": "reasoning", "summary": []}, {"type": "compaction", "encrypted_content": "zz"}]
    return draw(st.sampled_from(options))


@st.composite
def sessions(draw):
    fmt = draw(st.sampled_from(sorted(MAKERS)))
    base = MAKERS[fmt](draw(st.integers(3, 8)), seed=draw(st.integers(0, 5)))
    ops = draw(st.lists(st.sampled_from(["extend", "extend", "extend", "odd", "trim_block", "trim_plain", "edit",
                                         "dry", "same", "dup_block", "shrink_big"]), min_size=2, max_size=8))
    requests = []
    history = copy.deepcopy(base)
    counter = 0
    for op in ops:
        dry = False
        if op == "extend":
            for _ in range(draw(st.integers(1, 3))):
                counter += 1
                history = history + block_pair(fmt, f"n{counter}", draw(st.sampled_from(["ls", "cat a.py", "pytest", "x" * 50])))
        elif op == "odd":
            at = draw(st.integers(0, len(history)))
            history = history[:at] + [odd_piece(fmt, draw)] + history[at:]
        elif op == "trim_block":
            spans = parse_ok(history)
            if spans:
                span = draw(st.sampled_from(spans))
                drop = set(span.positions)
                history = [m for i, m in enumerate(history) if i not in drop]
        elif op == "trim_plain":
            parsed = parse_ok_h(history)
            if parsed is not None and parsed.other_positions:
                p = draw(st.sampled_from(parsed.other_positions))
                history = history[:p] + history[p + 1:]
        elif op == "edit":
            at = draw(st.integers(0, len(history) - 1))
            history = copy.deepcopy(history)
            m = history[at]
            if isinstance(m.get("content"), str):
                m["content"] += "!"
            elif isinstance(m.get("content"), list) and m["content"] and isinstance(m["content"][-1], dict):
                m["content"][-1] = {**m["content"][-1], "content": "elided"} if "content" in m["content"][-1] else m["content"][-1]
            elif "output" in m:
                m["output"] = str(m["output"]) + "!"
        elif op == "shrink_big":
            parsed = parse_ok_h(history)
            if parsed is not None and parsed.other_positions:
                p = max(parsed.other_positions, key=lambda p: len(json.dumps(history[p])))
                history = history[:p] + history[p + 1:]
        elif op == "dry":
            dry = True
        elif op == "dup_block":  # the last block again, its ids reused
            spans = parse_ok(history)
            if spans:
                requests.append((json.dumps(history + [copy.deepcopy(history[p]) for p in spans[-1].positions]), dry))
                continue
        requests.append((json.dumps(history), dry))
    return fmt, requests


def parse_ok_h(history):
    try:
        return parse_history(history)
    except BlockStructureError:
        return None


def parse_ok(history):
    h = parse_ok_h(history)
    return list(h.spans) if h is not None else []


def check_output(messages, result, delta):
    out = result.messages
    if result.stats.action == "passthrough":
        assert out is messages
        return
    position = {id(m): i for i, m in enumerate(messages)}
    kept = [position[id(m)] for m in out]
    assert kept == sorted(set(kept))
    history = parse_history(messages)
    removed = set(range(len(messages))) - set(kept)
    spans_removed = [s for s in history.spans if set(s.positions) <= removed]
    assert removed == {p for s in spans_removed for p in s.positions}
    assert all(set(s.positions) <= removed or not (set(s.positions) & removed) for s in history.spans)
    parse_history(out)
    st_ = result.stats
    if "max_forward" in st_.reason: return
    assert st_.chars_after >= (1 - delta) * st_.chars_before - 1e-9, (st_.action, st_.reason, st_.chars_after, st_.chars_before)


ACTIONS = {}
CONFIGS = [GEMConfig(min_blocks=3, k=2, delta=0.5, evidence=GEMConfig().evidence.__class__(recent=1)),
           GEMConfig(min_blocks=3, k=2, delta=1.0),
           GEMConfig(min_blocks=3, k=3, delta=1.0, ranking="router", keep_recent_size=True, rewrite_above_blocks=6, repay_factor=0.5),
           GEMConfig(min_blocks=3, k=3, delta=1.0, keep_recent_size=True, rewrite_above_blocks=5, max_forward_tokens=2000)]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions(), st.sampled_from(range(len(CONFIGS))))
def test_probe(session, ci):
    fmt, requests = session
    cfg = CONFIGS[ci]
    resuming, whole, no_dry = (GEM(cfg, encoder=HashEncoder(32), token_counter=None) for _ in range(3))
    for text, dry in requests:
        a, b, c = (json.loads(text) for _ in range(3))
        before = copy.deepcopy(a)
        from test_resume import body_of
        got = resuming.compress(a, session_id="s", save=not dry, message_bytes=body_of(a) if ci % 2 else None)
        assert a == before
        check_output(a, got, cfg.delta)
        ACTIONS[got.stats.action] = ACTIONS.get(got.stats.action, 0) + 1
        if got.stats.action == "passthrough": ACTIONS[got.stats.reason[:40]] = ACTIONS.get(got.stats.reason[:40], 0) + 1
        for state in whole.store._items.values():
            object.__setattr__(state[1], "parsed", None)
        want = whole.compress(b, session_id="s", save=not dry)
        pos = lambda msgs, out: [next(i for i, m in enumerate(msgs) if m is o) for o in out]
        assert pos(a, got.messages) == pos(b, want.messages), (got.stats.reason, want.stats.reason)
        assert (got.stats.action, got.stats.removed_blocks, got.stats.reason) == (want.stats.action, want.stats.removed_blocks, want.stats.reason)
        if not dry:
            ref = no_dry.compress(c, session_id="s")
            assert pos(a, got.messages) == pos(c, ref.messages)
            assert (got.stats.action, got.stats.removed_blocks, got.stats.reason) == (ref.stats.action, ref.stats.removed_blocks, ref.stats.reason)


def test_zz_report():
    print(ACTIONS)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions(), sessions(), st.sampled_from(range(len(CONFIGS))), st.lists(st.booleans(), min_size=16, max_size=16),
       st.sampled_from([("t1", "t2", "s", "s"), (None, "x", "x\x1fs", "s"), ("t", "t", "a", "b")]))
def test_isolation(one, two, ci, order, names):
    cfg = CONFIGS[ci]
    shared = GEM(cfg, encoder=HashEncoder(32), token_counter=None)
    alone = [GEM(cfg, encoder=HashEncoder(32), token_counter=None) for _ in range(2)]
    queues = [list(one[1]), list(two[1])]
    t = [(names[0], names[2]), (names[1], names[3])]
    for pick in order:
        k = int(pick)
        if not queues[k]:
            k = 1 - k
            if not queues[k]:
                break
        text, dry = queues[k].pop(0)
        a, b = json.loads(text), json.loads(text)
        got = shared.compress(a, session_id=t[k][1], tenant=t[k][0], save=not dry)
        want = alone[k].compress(b, session_id=t[k][1], tenant=t[k][0], save=not dry)
        assert (got.stats.action, got.stats.removed_blocks, got.stats.reason) == (want.stats.action, want.stats.removed_blocks, want.stats.reason)
