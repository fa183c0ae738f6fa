"""Text-action blocks (mini-swe-agent, SWE-agent, Aider, a user pattern): the profiles, the parse and GEM on them.

The fixtures in ``tests/fixtures/text_actions/`` are hand-written sessions in each agent's own format (suffix
``.text-actions``, so the run loaders and the evaluation suites do not take them for runs). The replay tests also
walk every text-mode run in ``../shared/data/trajectories/`` and skip without it.
"""

import json

import pytest
from helpers import FIXTURES, TRAJECTORIES, same_role_pairs

from gemkernels import GEM
from gemkernels.compress.blocks import TEXT_ACTIONS, parse_history
from gemkernels.compress.config import GEMConfig, with_overrides
from gemkernels.compress.evidence import block_features
from gemkernels.compress.text_actions import text_action_profiles

TEXT_FIXTURES = FIXTURES / "text_actions"
API_ROLES = ("system", "user", "assistant")


def api_messages(data: dict) -> list[dict]:
    """The messages an agent sends, from its trajectory (``messages`` or SWE-agent's ``history``): role and content."""
    return [{"role": m["role"], "content": m["content"]} for m in data.get("messages") or data["history"]
            if m["role"] in API_ROLES]


def fixture(name: str) -> list[dict]:
    return api_messages(json.loads((TEXT_FIXTURES / f"{name}.text-actions").read_text()))


def text_mode_runs() -> list[tuple[str, list[dict]]]:
    """(family/name, messages) of every development run that writes its actions as text."""
    runs = []
    for path in sorted(TRAJECTORIES.glob("mini-swe-agent/*.json")) + sorted(TRAJECTORIES.glob("swe-agent/*.traj")):
        data = json.loads(path.read_text())
        turns = data.get("messages") or data.get("history") or []
        if any(m.get("tool_calls") or m.get("tool_call_ids") or m.get("tool_call_id") for m in turns):
            continue  # native function calling: tool-call blocks
        runs.append((f"{path.parent.name}/{path.name}", api_messages(data)))
    return runs


def action(command, fence="bash"):
    return {"role": "assistant", "content": f"THOUGHT: next step.\n\n```{fence}\n{command}\n```"}


def user(text):
    return {"role": "user", "content": text}


def returncode(code, output="done\n"):
    return user(f"<returncode>{code}</returncode>\n<output>\n{output}</output>")


SYSTEM, TASK = {"role": "system", "content": "You are a shell agent."}, user("Fix the bug in calc.py.")


# --- The case: a 78-message mini-swe-agent text-mode history had 0 complete blocks ----------------------------

def test_a_78_message_mini_swe_agent_history_has_its_blocks():
    messages = fixture("mini_swe_agent_1")
    assert len(messages) == 78
    history = parse_history(messages)
    # every assistant turn answered by an observation (the last one, the submission, is answered by the diff)
    assert history.format == TEXT_ACTIONS and len(history.spans) == 37
    assert [span.positions for span in history.spans] == [(p, p + 1) for p in range(2, 76, 2)]
    stats = GEM("paper", encoder="hash", token_counter=None).compress(messages[:76]).stats
    assert stats.blocks == 37 and stats.action == "reselected"


# --- Profiles ------------------------------------------------------------------------------------------------------

def test_mini_swe_agent_blocks_read_commands_and_observations():
    messages = [SYSTEM, TASK, action("sed -i 's/-/+/' calc.py"), returncode(0, ""),
                action("python calc.py"), returncode(1, "Traceback (most recent call last):\nValueError: bad\n")]
    blocks = parse_history(messages).blocks
    assert [b.positions for b in blocks] == [(2, 3), (4, 5)] and [b.key for b in blocks] == ["text:0", "text:1"]
    assert blocks[0].actions[0].name == "bash"
    assert json.loads(blocks[0].actions[0].arguments) == {"command": "sed -i 's/-/+/' calc.py"}
    assert blocks[1].observations == (messages[5]["content"],) and blocks[1].text == messages[4]["content"]
    edit, error = (block_features(b) for b in blocks)
    assert edit.edited_paths == ("calc.py",) and not edit.is_error  # shell-write and error evidence fire
    assert error.is_error and not blocks[1].failed  # the exit status stays in the text for the error rule


@pytest.mark.parametrize("assistant, observation", [
    ("```mswea_bash_command\nls\n```", "<returncode>0</returncode>\n<output>\na.py\n</output>"),
    ("<mswea_bash_command>ls</mswea_bash_command>", "<exception>TimeoutError</exception>\n<returncode>-1</returncode>"),
    ("```bash\nsleep 99\n```", "The last command <command>sleep 99</command> timed out and has been killed."),
    ("```bash\nls\n```", "<returncode>0</returncode>\n<warning>\nThe output of your last command was too long."),
])
def test_mini_swe_agent_versions_and_templates(assistant, observation):
    blocks = parse_history([SYSTEM, TASK, {"role": "assistant", "content": assistant}, user(observation)]).blocks
    assert len(blocks) == 1 and blocks[0].actions and not blocks[0].failed


def test_a_rejected_turn_is_a_failed_block_without_actions():
    two = {"role": "assistant", "content": "```bash\nls\n```\n\n```bash\ncat x.py\n```"}
    none = {"role": "assistant", "content": "I will now run the tests."}
    rejected = user("Please always provide EXACTLY ONE action in triple backticks, found 2 actions.")
    blocks = parse_history([SYSTEM, TASK, two, rejected, none, user(rejected["content"].replace("2", "0"))]).blocks
    assert [(b.positions, b.actions, b.failed) for b in blocks] == [((2, 3), (), True), ((4, 5), (), True)]
    assert block_features(blocks[0]).is_error


@pytest.mark.parametrize("observation", [
    "<returncode>zero</returncode>\n<output>\n</output>", "<returncode>0", "returncode: 0\n<output>\nx\n</output>",
    "Here is what I got: <returncode>0</returncode>", "<output>\nx\n</output>", "Please also run the tests.",
])
def test_malformed_observations_and_human_turns_are_not_blocks(observation):
    history = parse_history([SYSTEM, TASK, action("ls"), user(observation)])
    assert history.spans == () and history.format == "openai"


def test_the_task_and_human_instructions_stay_and_are_the_goal():
    task = returncode(0, "this task text looks like an observation")
    messages = [SYSTEM, action("ls"), task, action("ls"), returncode(0), user("Now also update the docs."),
                action("cat README.md"), returncode(0)]
    history = parse_history(messages)
    assert [span.positions for span in history.spans] == [(3, 4), (6, 7)]
    assert history.task_text() == "Now also update the docs." and history.task_text("first") == task["content"]


def test_swe_agent_last_fenced_block_is_the_command_and_viewer_commands_are_their_own_tools():
    prompt = "\n(Open file: /repo/calc.py)\n(Current directory: /repo)\nbash-$"
    inline = {"role": "assistant", "content": "The file has ```python x = 1``` in it.\n```\nopen calc.py\n```"}
    two = {"role": "assistant", "content": "First:\n```\nls\n```\nThen:\n```bash\nedit 1:1\nx = 2\nend_of_edit\n```"}
    xml = {"role": "assistant", "content": "DISCUSSION\nRun it.\n<command>\npython calc.py\n</command>"}
    messages = [SYSTEM, TASK, inline, user("[File: /repo/calc.py (1 lines total)]\n1:x = 1" + prompt),
                two, user("[File: /repo/calc.py (1 lines total)]\n1:x = 2\nFile updated." + prompt),
                xml, user("OBSERVATION:\n2"), action("rm tmp.py", fence=""),
                user("Your command ran successfully and did not produce any output."),
                action("ls", fence=""), user("Old environment output: (12 lines omitted)")]
    blocks = parse_history(messages).blocks
    assert len(blocks) == 5 and all(b.positions == (p, p + 1) for b, p in zip(blocks, range(2, 12, 2)))
    assert [[(a.name, json.loads(a.arguments)["command"]) for a in b.actions] for b in blocks[:3]] == [
        [("open", "open calc.py")], [("edit", "edit 1:1\nx = 2\nend_of_edit")], [("bash", "python calc.py")]]
    assert block_features(blocks[1]).edited_paths == ("/repo/calc.py",)  # the editor's path, from its reply


def test_aider_command_outputs_and_their_acknowledgement_are_blocks():
    messages = [SYSTEM, TASK, {"role": "assistant", "content": "Run:\n```bash\npytest -q\n```"},
                user("Output from pytest -q\n1 failed, 2 passed\n\n\nOutput from git status\n M calc.py\n"),
                {"role": "assistant", "content": "Ok"}, user("fix the failing test"),
                {"role": "assistant", "content": "calc.py\n```python\n<<<<<<< SEARCH\n=======\n>>>>>>> REPLACE\n```"},
                user("I ran this command:\n\npytest -q\n\nAnd got this output:\n\n3 passed\n"),
                {"role": "assistant", "content": "Ok."},
                user("I ran this command:\n\npytest -q\n\nAnd got this output:\n\n3 passed\n"),
                {"role": "assistant", "content": "Good, everything passes now."}]
    blocks = parse_history(messages).blocks
    assert [b.positions for b in blocks] == [(3, 4), (7, 8)]  # the last output asks for a reply: an instruction
    assert [json.loads(a.arguments)["command"] for a in blocks[0].actions] == ["pytest -q", "git status"]
    assert blocks[0].text == "Ok" and blocks[0].observations == (messages[3]["content"],)
    assert block_features(blocks[0]).is_error and [a.name for a in blocks[1].actions] == ["bash"]


def test_a_history_with_tool_calls_keeps_its_tool_call_blocks():
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    messages = [SYSTEM, TASK, action("ls"), returncode(0), {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    history = parse_history(messages)
    assert history.format == "openai" and [s.positions for s in history.spans] == [(4, 5)]
    forced = parse_history(messages[:4], format=TEXT_ACTIONS)
    assert forced.format == TEXT_ACTIONS and len(forced.spans) == 1
    assert parse_history(messages[:4], text_actions=()).spans == ()


# --- Configuration -------------------------------------------------------------------------------------------------

def test_profiles_are_chosen_by_config_and_overrides():
    messages = fixture("mini_swe_agent_1")[:76]
    assert GEM(with_overrides("paper", ["text_actions=off"]), encoder="hash").compress(messages).stats.blocks == 0
    only_aider = GEM(with_overrides("paper", ["text_actions=aider"]), encoder="hash")
    assert only_aider.compress(messages).stats.blocks == 0
    both = GEM(with_overrides("paper", ["text_actions=aider,mini-swe-agent"]), encoder="hash")
    assert both.compress(messages).stats.blocks == 37
    own = [SYSTEM, TASK] + [m for k in range(20) for m in (
        {"role": "assistant", "content": f"I will call <cmd>step {k}</cmd>."}, user(f"RESULT: {k}"))]
    pattern = with_overrides("paper", ["text_actions=pattern", "text_action_regex=<cmd>(.*?)</cmd>",
                                       "text_observation_regex=^RESULT:"])
    stats = GEM(pattern, encoder="hash").compress(own).stats
    assert stats.blocks == 20 and stats.action == "reselected"
    history = parse_history(own, text_actions=text_action_profiles("pattern", "<cmd>(.*?)</cmd>", "^RESULT:"))
    assert json.loads(history.blocks[3].actions[0].arguments) == {"command": "step 3"}
    assert parse_history(own).spans == ()  # not one of the built-in profiles


@pytest.mark.parametrize("fields, problem", [
    ({"text_actions": "openhands"}, "unknown text-action profile"),
    ({"text_actions": "pattern"}, "go together"),
    ({"text_actions": "aider", "text_action_regex": "x", "text_observation_regex": "y"}, "go together"),
    ({"text_action_regex": "(unclosed", "text_observation_regex": "y"}, "text-action pattern"),
    ({"text_action_regex": "<cmd>(.*)</cmd>"}, "needs both"),
])
def test_bad_text_action_settings_are_refused(fields, problem):
    with pytest.raises(ValueError, match=problem):
        GEMConfig(**fields)


# --- GEM on whole sessions: the fixtures and every text-mode development run ---------------------------------------

def check_forwarded(request, out, history, recent, where):
    """The invariants of one compressed request (``recent``: how many newest blocks GEM's recency rule keeps);
    returns how many blocks it dropped."""
    position = {id(m): i for i, m in enumerate(request)}
    kept = [position[id(m)] for m in out]  # the caller's own objects
    assert kept == sorted(set(kept)), f"{where}: order changed or a message repeated"
    dropped = set(range(len(request))) - set(kept)
    removed = [s for s in history.spans if set(s.positions) <= dropped]
    assert dropped == {p for s in removed for p in s.positions}, f"{where}: not whole (action, observation) pairs"
    assert same_role_pairs(out) <= same_role_pairs(request), f"{where}: two turns of one role joined"
    first_user = next(i for i, m in enumerate(request) if m["role"] == "user")
    must_stay = {i for i, m in enumerate(request) if m["role"] == "system"} | {first_user} | {
        i for i, m in enumerate(request) if m["role"] == "user" and i not in history.block_positions}
    assert must_stay <= set(kept), f"{where}: the system prompt, the task or a human turn was dropped"
    assert all(set(s.positions) <= set(kept) for s in history.spans[-recent:]), f"{where}: a newest block dropped"
    again = parse_history(out).spans
    assert [tuple(kept[p] for p in s.positions) for s in again] == [
        s.positions for s in history.spans if s not in removed], f"{where}: the output's blocks are not the kept ones"
    return len(removed)


def replay(name, messages, preset, every=3):
    """Requests as the agent sent them (``messages[:pos]`` before each assistant turn, every ``every``-th and the
    last) through one GEM session; returns (the stats of the last request, the blocks dropped in all)."""
    gem = GEM(preset, encoder="hash", token_counter=None)
    steps = [pos for pos, m in enumerate(messages) if m["role"] == "assistant"]
    dropped = 0
    stats = None
    for pos in steps[::every] + steps[-1:]:
        request = messages[:pos]
        history = parse_history(request)
        result = gem.compress(request, session_id=name)
        stats = result.stats
        where = f"{name} [{preset}] messages[:{pos}] ({stats.action}: {stats.reason})"
        assert stats.blocks == len(history.spans), where
        if len(history.spans) < gem.config.min_blocks:
            assert result.messages is request and stats.action == "unchanged", where
            continue
        assert history.format == TEXT_ACTIONS and stats.action in ("reselected", "appended"), where
        dropped += check_forwarded(request, result.messages, history, gem.config.evidence.recent, where)
    return stats, dropped


@pytest.mark.parametrize("name", ["mini_swe_agent_1", "mini_swe_agent_1_1", "swe_agent", "aider"])
@pytest.mark.parametrize("preset", ["paper", "core"])
def test_gem_on_hand_written_sessions(name, preset):
    messages = fixture(name)
    stats, dropped = replay(name, messages, preset, every=1)
    assert stats.blocks >= 16 and stats.action in ("reselected", "appended")
    if preset == "core":
        assert dropped and stats.chars_after < 0.9 * stats.chars_before


def test_every_assistant_turn_of_the_development_runs_is_a_block():
    runs = text_mode_runs() if TRAJECTORIES.is_dir() else pytest.skip(f"no development runs at {TRAJECTORIES}")
    assert {name.split("/")[0] for name, _ in runs} == {"mini-swe-agent", "swe-agent"}
    for name, messages in runs:
        for pos in [p for p, m in enumerate(messages) if m["role"] == "assistant"]:
            answered = sum(m["role"] == "assistant" for m in messages[:pos])
            assert len(parse_history(messages[:pos]).spans) == answered, f"{name} messages[:{pos}]"


@pytest.mark.parametrize("preset", ["paper", "core"])
def test_gem_on_the_text_mode_development_runs(preset):
    if not TRAJECTORIES.is_dir():
        pytest.skip(f"no development runs at {TRAJECTORIES}")
    dropped = sum(replay(name, messages, preset)[1] for name, messages in text_mode_runs())
    assert dropped > 0
