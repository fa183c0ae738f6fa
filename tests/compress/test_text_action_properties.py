"""The text-action parse on generated histories: observations, human turns, rejected and malformed turns mixed."""

import pytest
from helpers import same_role_pairs

from gemkernels.compress.blocks import parse_history, reconstruct

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

COMMANDS = st.sampled_from(["ls -la", "cat calc.py", "python -m pytest -q", "sed -i 's/a/b/' calc.py", "grep -n x y"])
ASSISTANT_KINDS = {  # kind -> content, given a command
    "action": lambda c: f"THOUGHT: go.\n\n```bash\n{c}\n```",
    "two": lambda c: f"```bash\n{c}\n```\n```bash\nls\n```",
    "plain": lambda c: f"I would run {c} but I am done.",
    "malformed": lambda c: f"```bash {c}```",
    "ok": lambda c: "Ok.",
}
USER_KINDS = {
    "observation": lambda c: f"<returncode>{len(c) % 3}</returncode>\n<output>\n{c}: ok\n</output>",
    "rejected": lambda c: "Please always provide EXACTLY ONE action in triple backticks, found 2 actions.",
    "human": lambda c: f"Please also look at {c.split()[-1]}.",
    "malformed": lambda c: f"<returncode>{c}</returncode>",
    "aider_output": lambda c: f"Output from {c}\n{c}: ok\n",
}
OBSERVATIONS = {"observation", "rejected", "aider_output"}
#: The turns one agent writes: mini-swe-agent's, Aider's (its shell suggestions are fenced bash blocks too).
FAMILIES = {"mini-swe-agent": {"action", "two", "plain", "malformed", "observation", "rejected", "human"},
            "aider": {"action", "plain", "ok", "malformed", "human", "aider_output"}}


@st.composite
def histories(draw, alternating=True, family=None):
    """system, a task (any user text, an observation's included), then turns of ``family`` (None: any); each
    message's ``kind`` says what it is."""
    kinds = FAMILIES.get(family)
    of_role = {role: sorted(k for k in table if kinds is None or k in kinds)
               for role, table in (("assistant", ASSISTANT_KINDS), ("user", USER_KINDS))}

    def turn(role, kind):
        command = draw(COMMANDS)
        return {"role": role, "content": (ASSISTANT_KINDS if role == "assistant" else USER_KINDS)[kind](command),
                "kind": kind}

    messages = [{"role": "system", "content": "agent", "kind": "system"},
                turn("user", draw(st.sampled_from(sorted(USER_KINDS))))]
    for _ in range(draw(st.integers(0, 14))):
        roles = ("assistant", "user") if alternating else (draw(st.sampled_from(["assistant", "user"])),)
        messages += [turn(role, draw(st.sampled_from(of_role[role]))) for role in roles]
    return messages


@settings(max_examples=300, deadline=None)
@given(histories(alternating=False))
def test_blocks_are_observation_pairs_and_never_hold_the_task_or_a_human_turn(messages):
    history = parse_history(messages)
    spans = history.spans
    assert all(a.positions[1] < b.positions[0] for a, b in zip(spans, spans[1:]))
    assert 1 not in history.block_positions  # the task
    for span in spans:
        first, second = (messages[p] for p in span.positions)
        assert span.positions[1] == span.positions[0] + 1 and {first["role"], second["role"]} == {"assistant", "user"}
        observation = first if first["role"] == "user" else second
        assert observation["kind"] in OBSERVATIONS
        if first["role"] == "user":
            assert second["kind"] == "ok"  # Aider: an output and its acknowledgement
    assert [s.key for s in spans] == [f"text:{b}" for b in range(len(spans))]
    for end in range(len(messages)):  # a shorter request has the same first blocks: keys hold as a history grows
        assert parse_history(messages[:end]).spans == tuple(s for s in spans if s.positions[-1] < end)


@settings(max_examples=200, deadline=None)
@given(histories(family="mini-swe-agent"))
def test_every_mini_swe_agent_observation_pair_is_found(messages):
    expected = [(i, i + 1) for i in range(2, len(messages), 2)
                if messages[i + 1]["kind"] == "rejected"
                or messages[i + 1]["kind"] == "observation" and messages[i]["kind"] in ("action", "two")]
    assert [span.positions for span in parse_history(messages).spans] == expected


@settings(max_examples=300, deadline=None)
@given(st.data(), st.booleans(), st.sampled_from([None, *FAMILIES]))
def test_dropping_blocks_keeps_alternation_and_the_kept_blocks(data, alternating, family):
    messages = data.draw(histories(alternating=alternating, family=family))
    history = parse_history(messages)
    kept = data.draw(st.sets(st.integers(0, max(len(history.spans) - 1, 0))))
    out = reconstruct(history, kept)
    assert same_role_pairs(out) <= same_role_pairs(messages)
    if alternating:
        assert same_role_pairs(out) == 0
    if alternating and family:  # one agent's history: its kept blocks are the output's blocks
        position = {id(m): i for i, m in enumerate(messages)}
        assert [tuple(position[id(out[p])] for p in s.positions) for s in parse_history(out).spans] == [
            s.positions for b, s in enumerate(history.spans) if b in kept]
