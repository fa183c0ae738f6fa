"""Loaders: each recorded-run format from a tiny fixture cut from a real run, conversion invariants, batch loading.

Fixtures under tests/fixtures/ are cut from shared/data/trajectories/ (long texts shortened, ``[...]`` marks a cut);
the agent-log fixtures (test_log_readers.py) are written from the formats' observed structure. The last test reads
that folder itself when it is present.
"""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from helpers import FIXTURES, TRAJECTORIES, call_ids

from gemkernels.compress.blocks import BlockStructureError, parse_history
from gemkernels.evaluate.loaders import BASH_BLOCK, Run, checkpoints, load_run, load_runs, read_runs

REAL = TRAJECTORIES

# file -> (format, runs in it, blocks per run)
EXPECTED = {
    "mini_swe_agent.traj.json": ("mini-swe-agent-1", [4]),
    "mini_swe_agent_1_1.traj.json": ("mini-swe-agent-1.1", [3]),
    "swe_agent_fc.traj": ("swe-agent", [5]),
    "swe_agent_legacy.traj": ("swe-agent", [2]),
    "swe_agent_trajectory.traj": ("swe-agent-trajectory", [3]),
    "tau_bench.json": ("tau-bench", [3, 3]),
    "openai_messages.json": ("openai", [3]),
    "openai_lines.jsonl": ("openai", [3]),
    "timestamped.json": ("openai-timestamped", [3]),
}


def raw(name):
    return json.loads((FIXTURES / name).read_text())


def assert_well_formed(messages):
    """Parses, call ids unique, and each tool message answers the call right before it."""
    history = parse_history(messages)
    ids = call_ids(messages)
    assert len(ids) == len(set(ids))
    for block in history.blocks:
        assert block.positions == tuple(range(block.start, block.start + len(block.positions)))
    return history


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_converts_to_parseable_openai_messages(name):
    fmt, blocks = EXPECTED[name]
    runs = read_runs(FIXTURES / name)
    assert [run.format for run in runs] == [fmt] * len(blocks)
    assert [len(assert_well_formed(run.messages).blocks) for run in runs] == blocks
    assert all(run.path == str(FIXTURES / name) for run in runs)
    with pytest.raises(AttributeError):
        runs[0].name = "changed"


def test_mini_swe_agent_single_block_turns_become_bash_calls():
    source = raw("mini_swe_agent.traj.json")["messages"]
    run = load_run(FIXTURES / "mini_swe_agent.traj.json")
    assert run.name == "mini_swe_agent" and run.goal.startswith("<pr_description>")
    singles = [m for m in source if m["role"] == "assistant" and len(BASH_BLOCK.findall(m["content"])) == 1]
    assert len(parse_history(run.messages).blocks) == len(singles) == 4
    assert [m["content"] for m in run.messages] == [m["content"] for m in source]
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in run.messages)  # extra dropped
    calls = [m for m in run.messages if m.get("tool_calls")]
    assert [c["tool_calls"][0]["id"] for c in calls] == ["call_0000", "call_0001", "call_0002", "call_0003"]
    assert json.loads(calls[1]["tool_calls"][0]["function"]["arguments"]) == {
        "command": 'find . -name "axis.py" -o -name "category.py"'}
    two_blocks = run.messages[6]
    assert "tool_calls" not in two_blocks and run.messages[7]["role"] == "user"  # format error stays a plain turn
    assert run.messages[9] == {"role": "tool", "tool_call_id": "call_0002", "content": source[9]["content"]}


def test_mini_swe_agent_turns_without_one_block_or_answer_stay_plain(tmp_path):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "thinking, no command"}, {"role": "user", "content": "format error"},
                {"role": "assistant", "content": "THOUGHT: go\n\n```bash\nls\n```"}, {"role": "user", "content": "a b"},
                {"role": "assistant", "content": "```bash\nexit\n```"}]
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps({"messages": messages, "trajectory_format": "mini-swe-agent-1"}))
    run = load_run(path)
    assert [m["role"] for m in run.messages] == ["system", "user", "assistant", "user",
                                                 "assistant", "tool", "assistant"]
    assert "tool_calls" not in run.messages[2] and "tool_calls" not in run.messages[6]  # last turn has no answer
    assert checkpoints(run.messages) == [2, 4, 6]


def test_swe_agent_native_calls_keep_ids_and_reused_ids_are_renamed():
    source = raw("swe_agent_fc.traj")["history"]
    run = load_run(FIXTURES / "swe_agent_fc.traj")
    assert run.goal.startswith("We're currently solving the following issue")
    assert call_ids(run.messages) == [m["tool_calls"][0]["id"] for m in source if m.get("tool_calls")][:3] + [
        "call_5iDdbOYybq7L19vqXmR0DPaU-2", "call_submit"]
    assert run.messages[9]["tool_call_id"] == "call_5iDdbOYybq7L19vqXmR0DPaU-2"
    assert source[8]["tool_calls"][0]["id"] == "call_5iDdbOYybq7L19vqXmR0DPaU"  # the loaded data is not mutated
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in run.messages)


def test_swe_agent_legacy_history_uses_actions_and_skips_the_demo_for_the_goal(tmp_path):
    data = raw("swe_agent_legacy.traj")
    run = load_run(FIXTURES / "swe_agent_legacy.traj")
    assert run.messages[1]["role"] == "user" and "demonstration" in run.messages[1]["content"]
    assert run.goal.startswith("We're currently solving the following issue")
    commands = [json.loads(m["tool_calls"][0]["function"]["arguments"])["command"]
                for m in run.messages if m.get("tool_calls")]
    assert commands == [m["action"] for m in data["history"] if m["role"] == "assistant"][:2]
    assert "tool_calls" not in run.messages[-1]  # the final submit has no observation in history
    for message in data["history"]:
        message.pop("action", None)
    path = tmp_path / "no_actions.traj"
    path.write_text(json.dumps(data))
    assert load_run(path).messages == run.messages  # actions taken from trajectory[k] instead


def test_swe_agent_trajectory_only_steps_become_blocks():
    steps = raw("swe_agent_trajectory.traj")["trajectory"]
    run = load_run(FIXTURES / "swe_agent_trajectory.traj")
    assert run.goal is None
    history = parse_history(run.messages)
    assert [b.text for b in history.blocks] == [s["thought"] for s in steps]
    assert [b.observations for b in history.blocks] == [(s["observation"],) for s in steps]
    assert [json.loads(b.actions[0].arguments)["command"] for b in history.blocks] == [s["action"] for s in steps]


def test_tau_bench_file_holds_one_run_per_element():
    runs = read_runs(FIXTURES / "tau_bench.json")
    assert [r.name for r in runs] == ["tau_bench/task-0-trial-0", "tau_bench/task-2-trial-0"]
    assert runs[0].goal.startswith("Hi! I'm looking to book a flight")
    assert call_ids(runs[0].messages)[-1] == "call_HGn16KZh9oNCruxsMJ4gYXan-2"
    with pytest.raises(ValueError, match="holds 2 runs"):
        load_run(FIXTURES / "tau_bench.json")


def test_plain_openai_forms_agree_and_keep_part_lists(tmp_path):
    messages = raw("openai_messages.json")
    for name in ("openai_lines.jsonl", "timestamped.json"):
        assert load_run(FIXTURES / name).messages == messages
    messages[0]["content"] = [{"type": "text", "text": messages[0]["content"]}]
    (tmp_path / "object.json").write_text(json.dumps({"messages": messages}))
    run = load_run(tmp_path / "object.json")
    assert run.messages == messages and run.format == "openai"


def test_reused_id_while_still_open_is_rejected(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "tool", "tool_call_id": "c1", "content": "y"}]
    (tmp_path / "dup.json").write_text(json.dumps(messages))
    with pytest.raises(BlockStructureError, match="used twice"):
        load_run(tmp_path / "dup.json")


def test_load_runs_reports_bad_files_and_loads_the_rest(tmp_path):
    (tmp_path / "nested").mkdir()
    shutil.copy(FIXTURES / "tau_bench.json", tmp_path / "nested" / "tau.json")
    shutil.copy(FIXTURES / "swe_agent_fc.traj", tmp_path / "fc.traj")
    (tmp_path / "broken.json").write_text('{"messages": [')
    (tmp_path / "unknown.jsonl").write_text('{"foo": 1}\n')
    (tmp_path / "notes.md").write_text("not a run")
    runs, errors = load_runs([tmp_path, tmp_path / "missing.json"])
    assert sorted(r.name for r in runs) == ["fc", "tau/task-0-trial-0", "tau/task-2-trial-0"]
    assert sorted(Path(p).name for p, _ in errors) == ["broken.json", "missing.json", "unknown.jsonl"]
    assert all(isinstance(run, Run) for run in runs)
    by_glob, none = load_runs(str(tmp_path / "**" / "*.traj"))
    assert [r.name for r in by_glob] == ["fc"] and none == []


def test_checkpoints_are_the_assistant_turns():
    run = read_runs(FIXTURES / "tau_bench.json")[0]
    positions = checkpoints(run.messages)
    assert positions == [i for i, m in enumerate(run.messages) if m["role"] == "assistant"]
    assert positions == [2, 4, 6, 8, 10, 12]
    for pos in positions:
        assert_well_formed(run.messages[:pos])  # every replayed request is itself a valid history


@pytest.mark.skipif(not REAL.is_dir(), reason="shared/data/trajectories is not present")
def test_every_real_run_converts_and_parses():
    runs, errors = load_runs(REAL)
    assert errors == []
    assert set(Counter(Path(r.path).parent.name for r in runs)) == {"mini-swe-agent", "swe-agent", "tau-bench"}
    for run in runs:
        history = assert_well_formed(run.messages)
        if run.format == "mini-swe-agent-1":
            source = json.loads(Path(run.path).read_text())["messages"]
            singles = sum(m["role"] == "assistant" and len(BASH_BLOCK.findall(m["content"])) == 1 for m in source)
            assert len(history.blocks) == singles, run.name
