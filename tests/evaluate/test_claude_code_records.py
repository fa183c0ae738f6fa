"""Claude Code records the reader must not be thrown by: a response's content blocks written again (streaming
repeats, resumed sessions), tool_use ids reused across responses, long sub-agent chains without ``agentId``; and
JSON lists of ``{"type": ...}`` objects that are no Responses input, refused as an unknown format.

Fixtures are small records written here; the real sessions in ../shared/data/logs are used where present.
"""

import json
import time

import pytest
from helpers import FIXTURES, LOGS

from gemkernels.evaluate.loaders import Usage, read_runs
from gemkernels.evaluate.loaders.chat import unique_call_ids
from gemkernels.evaluate.loaders.claude_code import sidechains

SESSION = "0c1d2e3f-0000-4000-8000-000000000001"


def record(kind, uuid, parent, message, **extra):
    """One Claude Code record of ``kind`` (``user`` / ``assistant``) holding ``message``."""
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": SESSION, "isSidechain": False,
            "timestamp": "2025-11-20T10:00:00.000Z", "cwd": "/home/dev/calc", "message": message, **extra}


def prompt(uuid, parent, text):
    return record("user", uuid, parent, {"role": "user", "content": text})


def reply(uuid, parent, response, block, output=1):
    """An assistant record of response ``response`` with one content block, billed ``output`` tokens so far."""
    return record("assistant", uuid, parent, {
        "id": response, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [block],
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0,
                  "output_tokens": output}})


def result(uuid, parent, call_id, text):
    return record("user", uuid, parent, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_id, "content": text}]})


def text(value):
    return {"type": "text", "text": value}


def bash(call_id, command):
    return {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": command}}


def read(tmp_path, records, name="session.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return read_runs(path)


def actions(run):
    return [[(a.call_id, a.name) for a in call.actions] for call in run.calls]


def test_a_tool_use_written_again_is_one_call(tmp_path):
    run, = read(tmp_path, [
        prompt("u1", None, "Run the tests."),
        reply("a1", "u1", "msg_1", text("Running them."), 1),
        reply("a2", "a1", "msg_1", bash("toolu_1", "pytest"), 5),
        reply("a3", "a2", "msg_1", bash("toolu_1", "pytest"), 5),  # the same block again, a new uuid
        result("u2", "a3", "toolu_1", "3 passed"),
        reply("a4", "u2", "msg_1", bash("toolu_1", "pytest"), 7),  # and again after its result
        reply("a5", "a4", "msg_2", text("All 3 pass."), 6),
    ])
    assert actions(run) == [[("toolu_1", "Bash")], []]
    assert run.messages[1]["content"] == [text("Running them."), bash("toolu_1", "pytest")]
    assert run.messages[2]["content"][0]["tool_use_id"] == "toolu_1" and len(run.messages) == 4
    assert run.calls[0].usage == Usage(3, 100, 0, 7)  # the response's last record bills it
    assert run.unanswered == () and run.orphans == 0 and run.final == ()


def test_a_text_written_again_is_not_doubled(tmp_path):
    run, = read(tmp_path, [
        prompt("u1", None, "What does calc do?"),
        reply("a1", "u1", "msg_1", {"type": "thinking", "thinking": "Read it.", "signature": "sig"}),
        reply("a2", "a1", "msg_1", text("It adds numbers.")),
        reply("a3", "a2", "msg_1", text("It adds numbers.")),
        reply("a4", "a3", "msg_1", text("And subtracts them.")),
    ])
    assert [p.get("text") or p.get("thinking") for p in run.messages[1]["content"]] == [
        "Read it.", "It adds numbers.", "And subtracts them."]


def test_a_response_written_again_later_adds_nothing(tmp_path):
    first = [prompt("u1", None, "Run the tests."), reply("a1", "u1", "msg_1", bash("toolu_1", "pytest")),
             result("u2", "a1", "toolu_1", "3 passed"), reply("a2", "u2", "msg_2", text("All pass.")),
             prompt("u3", "a2", "Thanks.")]
    again = [reply("b1", "u3", "msg_1", bash("toolu_1", "pytest")), reply("b2", "b1", "msg_2", text("All pass."))]
    run, = read(tmp_path, [*first, *again, reply("a3", "b2", "msg_3", text("Welcome."))])
    assert actions(run) == [[("toolu_1", "Bash")], [], []]
    assert [m["role"] for m in run.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]


def test_reused_tool_use_ids_are_renamed_after_their_answer(tmp_path):
    run, = read(tmp_path, [
        prompt("u1", None, "Run the tests twice."),
        reply("a1", "u1", "msg_1", bash("toolu_1", "pytest")),
        result("u2", "a1", "toolu_1", "3 passed"),
        reply("a2", "u2", "msg_2", bash("toolu_1", "pytest -x")),  # a new response, the id used again
        result("u3", "a2", "toolu_1", "3 passed"),
        reply("a3", "u3", "msg_3", text("Both pass.")),
    ])
    assert actions(run) == [[("toolu_1", "Bash")], [("toolu_1-2", "Bash")], []]
    assert [run.messages[i]["content"][0]["tool_use_id"] for i in (2, 4)] == ["toolu_1", "toolu_1-2"]
    assert run.unanswered == () and run.orphans == 0


def test_unique_call_ids_renames_anthropic_tool_use_and_leaves_its_input_alone():
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": [text("a"), bash("t1", "ls")]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
                {"role": "assistant", "content": [bash("t1", "ls -a"), bash("t1-2", "pwd")]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "y"},
                                             {"type": "tool_result", "tool_use_id": "t1-2", "content": "z"}]}]
    before = json.loads(json.dumps(messages))
    out = unique_call_ids(messages)
    assert [p["id"] for p in out[3]["content"]] == ["t1-3", "t1-2"]  # t1-2 is taken by the log itself
    assert [p["tool_use_id"] for p in out[4]["content"]] == ["t1-3", "t1-2"]
    assert out[1] == messages[1] and messages == before


def test_many_reuses_of_one_id_are_renamed_in_linear_time():
    """20,000 uses of one id: each reuse's n follows the last one's (searching from 2 again takes minutes)."""
    messages = [{"role": "user", "content": "go"}]
    for call_id in ["t1"] * 20_000 + ["t1-3"]:  # t1-3 is a name the log itself uses
        messages += [{"role": "assistant", "content": [bash(call_id, "ls")]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "x"}]}]
    start = time.perf_counter()
    out = unique_call_ids(messages)
    assert time.perf_counter() - start < 5
    ids = ["t1", "t1-2", *(f"t1-{n}" for n in range(4, 20_002)), "t1-3"]
    assert [m["content"][0]["id"] for m in out[1::2]] == ids
    assert [m["content"][0]["tool_use_id"] for m in out[2::2]] == ids


def test_sub_agents_of_a_reused_task_id_link_to_their_own_call(tmp_path):
    def task(uuid, parent, response, job):
        return reply(uuid, parent, response, {"type": "tool_use", "id": "toolu_T", "name": "Task",
                                              "input": {"prompt": job, "subagent_type": "general-purpose"}})

    def agent(name, job):
        return [prompt(f"{name}-u", None, job) | {"isSidechain": True, "agentId": name},
                reply(f"{name}-a", f"{name}-u", f"msg_{name}", text("Done.")) | {"isSidechain": True, "agentId": name}]

    main, *children = read(tmp_path, [
        prompt("u1", None, "Review both modules."),
        task("a1", "u1", "msg_1", "Review calc.py."),
        result("u2", "a1", "toolu_T", "calc.py is fine.") | {"toolUseResult": {"agentId": "A1"}},
        task("a2", "u2", "msg_2", "Review io.py."),  # a new response, the Task id used again
        result("u3", "a2", "toolu_T", "io.py is fine.") | {"toolUseResult": {"agentId": "A2"}},
        reply("a3", "u3", "msg_3", text("Both are fine.")),
        *agent("A1", "Review calc.py."), *agent("A2", "Review io.py."),
    ])
    assert actions(main) == [[("toolu_T", "Task")], [("toolu_T-2", "Task")], []]
    assert [(link.call_id, link.child) for link in main.spawned] == [
        ("toolu_T", f"{SESSION}/agent-A1"), ("toolu_T-2", f"{SESSION}/agent-A2")]
    assert [(run.id, run.parent, run.parent_call) for run in children] == [
        (f"{SESSION}/agent-A1", SESSION, "toolu_T"), (f"{SESSION}/agent-A2", SESSION, "toolu_T-2")]


def test_sidechain_roots_are_found_in_linear_time(tmp_path):
    """20,000 chained sidechain records without ``agentId`` (each record's root found once, not walked again)."""
    records, parent = [], None
    for i in range(20_000):
        records.append(record("assistant", f"s{i}", parent, {
            "id": f"msg_{i}", "role": "assistant", "model": "claude-haiku-4-5", "content": [text(f"step {i}")]})
            if i % 2 else prompt(f"s{i}", parent, f"step {i}"))
        records[-1]["isSidechain"] = True
        parent = f"s{i}"
    start = time.perf_counter()
    run, = read(tmp_path, records)
    assert time.perf_counter() - start < 5 and len(run.messages) == 20_000
    assert run.name == "session" and run.id == f"{SESSION}/sidechain-s0"


class Counted(str):
    """A uuid that counts how often it is hashed (each dict or set lookup)."""

    hashes = 0

    def __hash__(self):
        Counted.hashes += 1
        return str.__hash__(self)


def test_sidechain_roots_take_a_bounded_number_of_lookups():
    records, parent = [], None
    for i in range(2_000):
        records.append({"uuid": Counted(f"s{i}"), "parentUuid": parent, "isSidechain": True})
        parent = records[-1]["uuid"]
    records.append({"uuid": Counted("t0"), "parentUuid": "elsewhere", "isSidechain": True})  # a second chain
    Counted.hashes = 0
    groups = sidechains(records)
    assert Counted.hashes < 20 * len(records)  # walking every record's chain again takes about 2,000,000
    assert {key: len(group) for key, group in groups.items()} == {"sidechain-s0": 2_000, "sidechain-t0": 1}


def test_a_parent_cycle_is_one_sidechain():
    records = [{"uuid": "a", "parentUuid": "b", "isSidechain": True},
               {"uuid": "b", "parentUuid": "a", "isSidechain": True},
               {"uuid": "c", "parentUuid": "b", "isSidechain": True}]
    assert [len(group) for group in sidechains(records).values()] == [3]


def test_a_list_of_typed_objects_that_are_no_responses_items_is_refused(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps([{"type": "say", "text": "hi"}]))
    with pytest.raises(ValueError, match="not a known run format; known: codex, claude-code, .*responses"):
        read_runs(tmp_path / "notes.json")
    (tmp_path / "items.json").write_text(json.dumps([
        {"type": "message", "role": "user", "content": "hi"}, {"type": "web_search_call", "id": "ws_1"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "docs", "tools": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}]))
    assert read_runs(tmp_path / "items.json")[0].format == "responses"  # hosted and MCP items are items


def sessions():
    """The Claude Code sessions to read: the fixtures' and, where present, the real ones in ../shared."""
    paths = sorted((FIXTURES / "claude-code").rglob("*.jsonl"))
    return paths + (sorted((LOGS / "claude-code").glob("*.jsonl")) if (LOGS / "claude-code").is_dir() else [])


@pytest.mark.parametrize("path", sessions(), ids=lambda p: p.name)
def test_each_assistant_record_written_twice_reads_as_once(tmp_path, path):
    """Every assistant record repeated right after itself (a new uuid) reads as the session itself."""
    lines = path.read_text().splitlines(keepends=True)
    doubled = []
    for line in lines:
        doubled.append(line)
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and data.get("type") == "assistant":
            doubled.append(json.dumps({**data, "uuid": f"{data.get('uuid')}-again"}) + "\n")
    (tmp_path / path.name).write_text("".join(doubled))
    for run, again in zip(read_runs(path), read_runs(tmp_path / path.name), strict=True):
        assert (again.messages, again.final, again.calls) == (run.messages, run.final, run.calls), run.name
