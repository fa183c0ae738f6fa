"""Codex rollouts in the forms its versions wrote: a local shell call answered by a ``function_call_output``, the
tool search items (``tool_search_call`` / ``tool_search_output``, run by Codex or by the API), and the mid-2025
codex-rs JSON Lines (a bare ``{id, timestamp}`` header, ``record_type: state`` lines, the Responses items
unwrapped). Each fixture is a few records written here; the real rollouts in ../shared/data/logs are read by
test_log_readers.py."""

import copy
import json
from pathlib import Path

import pytest
from helpers import LOGS

from gemkernels.compress.blocks import parse_history
from gemkernels.evaluate.loaders import Usage, load_run, load_runs
from gemkernels.evaluate.loaders.codex import is_rollout, read_rollout

SESSION = "0199cccc-3333-7444-8555-000000000003"


def write(tmp_path, records, name="rollout.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def envelope(*items, model="gpt-5-codex"):
    """``{timestamp, type, payload}`` records: the session, its model, then each item (a Responses item, or a
    token count given as ``(input, cached, output)``)."""
    records = [{"timestamp": "2025-11-20T10:00:00.000Z", "type": "session_meta",
                "payload": {"id": SESSION, "cwd": "/home/dev/tinycalc", "originator": "codex_cli_rs"}},
               {"timestamp": "2025-11-20T10:00:01.000Z", "type": "turn_context", "payload": {"model": model}}]
    total = 0
    for n, item in enumerate(items):
        stamp = f"2025-11-20T10:01:{n:02d}.000Z"
        if isinstance(item, tuple):
            total += item[0]
            last = {"input_tokens": item[0], "cached_input_tokens": item[1], "output_tokens": item[2]}
            records.append({"timestamp": stamp, "type": "event_msg", "payload": {
                "type": "token_count", "info": {"total_token_usage": {"input_tokens": total},
                                                "last_token_usage": last}}})
        else:
            records.append({"timestamp": stamp, "type": "response_item", "payload": item})
    return records


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text):
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def shell_output(call_id, text, code=0):
    return {"type": "function_call_output", "call_id": call_id,
            "output": json.dumps({"output": text, "metadata": {"exit_code": code}})}


LOCAL_SHELL = {"type": "local_shell_call", "call_id": "call_ls1", "status": "completed",
               "action": {"type": "exec", "command": ["ls"], "timeout_ms": None, "working_directory": None,
                          "env": None, "user": None}}


# --------------------------------------------------------------------------- local shell calls

def test_a_local_shell_call_answered_by_a_function_call_output_reads(tmp_path):
    records = envelope(user("List the files."), (100, 0, 10), LOCAL_SHELL, shell_output("call_ls1", "a.py\n"),
                       (130, 100, 5), assistant("One file: a.py."))
    run = load_run(write(tmp_path, records))
    assert [item["type"] for item in run.messages] == [
        "message", "local_shell_call", "local_shell_call_output", "message"]
    assert run.messages[2]["output"] == records[5]["payload"]["output"]  # the output as recorded
    assert [[a.name for a in c.actions] for c in run.calls] == [["shell"], []]
    assert [c.usage for c in run.calls] == [Usage(100, 0, 0, 10), Usage(30, 100, 0, 5)]
    history = parse_history(run.messages)
    assert [span.call_ids for span in history.spans] == [("call_ls1",)]
    assert history.blocks[0].observations == ("a.py\n",) and run.unanswered == ()


def test_the_local_shell_output_is_a_new_item_and_the_records_are_unchanged():
    records = envelope(user("List the files."), LOCAL_SHELL, shell_output("call_ls1", "a.py\n"),
                       {"type": "function_call", "name": "shell", "call_id": "call_f1", "arguments": "{}"},
                       shell_output("call_f1", "ok"))
    before = copy.deepcopy(records)
    items = read_rollout(records, "rollout")[0].messages
    assert records == before
    assert [item["type"] for item in items] == [
        "message", "local_shell_call", "local_shell_call_output", "function_call", "function_call_output"]
    assert items[4] is records[6]["payload"]  # the output of a function call is the record's own


def test_the_early_json_rollout_reads_its_local_shell_outputs(tmp_path):
    data = {"session": {"id": SESSION, "timestamp": "2025-05-09T10:00:00.000Z"},
            "items": [user("List the files."), LOCAL_SHELL, shell_output("call_ls1", "a.py\n"), assistant("a.py")]}
    path = tmp_path / "rollout-2025-05-09.json"
    path.write_text(json.dumps(data))
    run = load_run(path)
    assert run.format == "codex" and run.messages[2]["type"] == "local_shell_call_output"
    assert [span.call_ids for span in parse_history(run.messages).spans] == [("call_ls1",)]


# --------------------------------------------------------------------------- tool search

SEARCH_ARGUMENTS = {"query": "calendar create", "limit": 5}
FOUND = [{"type": "function", "name": "mcp__calendar__create_event", "defer_loading": True,
          "parameters": {"type": "object", "properties": {}}}]


def test_a_tool_search_run_by_codex_is_a_call_of_its_own(tmp_path):
    search = {"type": "tool_search_call", "call_id": "call_ts1", "status": "completed", "execution": "client",
              "arguments": SEARCH_ARGUMENTS}
    found = {"type": "tool_search_output", "call_id": "call_ts1", "status": "completed", "execution": "client",
             "tools": FOUND}
    create = {"type": "function_call", "name": "mcp__calendar__create_event", "call_id": "call_f1",
              "arguments": '{"title": "Review"}'}
    records = envelope(user("Book the review."), (100, 0, 7), search, found, (150, 100, 9), create,
                       {"type": "function_call_output", "call_id": "call_f1", "output": "created"},
                       (170, 150, 4), assistant("Booked."))
    run = load_run(write(tmp_path, records))
    assert [c.position for c in run.calls] == [1, 3, 5]  # the search, the call it found, the reply
    assert [[(a.call_id, a.name, a.arguments) for a in c.actions] for c in run.calls] == [
        [("call_ts1", "tool_search", json.dumps(SEARCH_ARGUMENTS))],
        [("call_f1", "mcp__calendar__create_event", '{"title": "Review"}')], []]
    assert [c.usage for c in run.calls] == [Usage(100, 0, 0, 7), Usage(50, 100, 0, 9), Usage(20, 150, 0, 4)]
    assert [c.time for c in run.calls] == ["2025-11-20T10:01:02.000Z", "2025-11-20T10:01:05.000Z",
                                           "2025-11-20T10:01:08.000Z"]
    assert [span.call_ids for span in parse_history(run.messages).spans] == [("call_f1",)]


def test_a_tool_search_run_by_the_api_belongs_to_the_response_that_made_it(tmp_path):
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}
    search = {"type": "tool_search_call", "call_id": None, "status": "completed", "execution": "server",
              "arguments": SEARCH_ARGUMENTS}
    found = {"type": "tool_search_output", "call_id": None, "status": "completed", "execution": "server",
             "tools": FOUND}
    create = {"type": "function_call", "name": "mcp__calendar__create_event", "call_id": "call_f1",
              "arguments": "{}"}
    records = envelope(user("Book the review."), (100, 0, 7), reasoning, search, found, create,
                       {"type": "function_call_output", "call_id": "call_f1", "output": "created"},
                       (170, 150, 4), assistant("Booked."))
    run = load_run(write(tmp_path, records))
    assert [c.position for c in run.calls] == [1, 6]  # one response: reasoning, the hosted search, its call
    assert [[a.name for a in c.actions] for c in run.calls] == [["mcp__calendar__create_event"], []]
    assert [c.usage for c in run.calls] == [Usage(100, 0, 0, 7), Usage(20, 150, 0, 4)]


# --------------------------------------------------------------------------- mid-2025 JSON Lines

HEADER = {"id": SESSION, "timestamp": "2025-07-15T09:00:00.000Z", "instructions": None,
          "git": {"commit_hash": "4f2a9e1", "branch": "main", "repository_url": "https://example.com/tinycalc.git"}}


def bare_rollout(header=HEADER):
    return [header, {"record_type": "state"}, user("What does tinycalc/parser.py do?"),
            {"type": "function_call", "name": "shell", "call_id": "call_1",
             "arguments": json.dumps({"command": ["cat", "tinycalc/parser.py"]})},
            {"record_type": "state"}, shell_output("call_1", "def parse(text): ..."),
            assistant("It parses arithmetic expressions."), {"record_type": "state"}]


def test_a_mid_2025_rollout_reads_from_its_bare_header_and_unwrapped_items(tmp_path):
    run = load_run(write(tmp_path, bare_rollout()))
    assert run.format == "codex" and run.id == SESSION and run.project is None
    assert run.goal == "What does tinycalc/parser.py do?"
    assert [item["type"] for item in run.messages] == ["message", "function_call", "function_call_output", "message"]
    assert [[a.name for a in c.actions] for c in run.calls] == [["shell"], []]
    assert [span.call_ids for span in parse_history(run.messages).spans] == [("call_1",)]


def test_a_mid_2025_header_names_the_project_where_it_has_a_cwd(tmp_path):
    header = {**HEADER, "cwd": "/home/dev/tinycalc", "originator": "codex_cli_rs", "cli_version": "0.20.0"}
    run = load_run(write(tmp_path, bare_rollout(header)))
    assert run.id == SESSION and run.project == "/home/dev/tinycalc"


def test_a_mid_2025_rollout_is_recognised_by_its_structure_alone():
    assert is_rollout(bare_rollout())
    assert is_rollout([HEADER, {"record_type": "state"}])  # a session that wrote no item yet
    assert not is_rollout([HEADER])
    # other formats' lists whose first record has an id and a time: OpenHands SDK events, chat messages
    events = [{"id": "e1", "timestamp": "2025-07-15T09:00:00", "kind": "MessageEvent", "source": "user"},
              {"id": "e2", "timestamp": "2025-07-15T09:00:01", "kind": "ActionEvent", "source": "agent"}]
    assert not is_rollout(events)
    messages = [{"id": "m1", "timestamp": "2025-07-15T09:00:00", "role": "user", "content": "hi"},
                {"type": "message", "role": "assistant", "content": "hello"}]
    assert not is_rollout(messages)
    assert not is_rollout([{**HEADER, "type": "message"}, user("hi")])
    # an export with a header and typed records of its own: plain messages, or types no API has (read as Codex once)
    assert not is_rollout([HEADER, {"type": "message", "role": "user", "content": "hi"},
                           {"type": "message", "role": "assistant", "content": "hello"}])
    assert not is_rollout([HEADER, {"type": "say", "text": "hi"}, {"type": "function_call", "call_id": "c"}])


@pytest.mark.skipif(not LOGS.is_dir(), reason="shared/data/logs is not present")
def test_no_other_shared_log_reads_as_codex_and_every_codex_log_does():
    runs, errors = load_runs(LOGS)
    assert errors == []
    for run in runs:
        folder = Path(run.path).relative_to(LOGS).parts[0]
        assert (run.format == "codex") == (folder in ("codex", "responses-items")), run.path
