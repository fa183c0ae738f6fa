"""Readers of the agents' own logs: Claude Code, Codex CLI, mini-swe-agent 1.1, on hand-written fixtures and on the
real sessions in ../shared/data/logs (skipped where absent).

Each run is checked against its log read independently here: the tool calls it records (block counts, next actions
in order), every call paired or explicitly unanswered, the billed usage equal to the log's own sums, sub-agents
linked, compactions found, broken lines skipped and counted.
"""

import argparse
import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, LOGS, needs_extra

from gemkernels.cli import analyze as analyze_cli
from gemkernels.cli import online as online_cli
from gemkernels.cli import replay as replay_cli
from gemkernels.compress.blocks import content_text, parse_history
from gemkernels.evaluate.loaders import (
    UNANSWERED,
    Compaction,
    Usage,
    final_block,
    known_formats,
    load_run,
    load_runs,
    read_runs,
)

CLAUDE = FIXTURES / "claude-code" / "-home-dev-tinycalc"
SESSION = "5b7e2d0c-1111-4a2b-9c3d-000000000001"
OLDER = "9c0d4e1f-2222-4b3c-8d4e-000000000002"
CODEX = FIXTURES / "codex" / "sessions"
ROLLOUT = CODEX / "2025" / "11" / "14" / "rollout-2025-11-14T10-00-00-0199aaaa-1111-7222-8333-000000000001.jsonl"
OLD_ROLLOUT = CODEX / "rollout-2025-05-02-0199bbbb-2222-4333-8444-000000000002.json"


def log_lines(path):
    """The readable JSON objects of a JSON Lines file, and how many lines were not readable."""
    records, broken = [], 0
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            broken += 1
    return records, broken


def call_ids_in_blocks(run):
    """Per block of the run's messages, its call ids, then the final turn's."""
    return [list(span.call_ids) for span in parse_history(run.messages).spans]


def placeholder_ids(messages):
    """The call ids answered by an `UNANSWERED` placeholder: OpenAI tool messages, Anthropic tool_result parts,
    Responses output items."""
    found = []
    for m in messages:
        if m.get("content") == UNANSWERED or m.get("output") == UNANSWERED:
            found.append(m.get("tool_call_id") or m.get("call_id"))
        found += [p["tool_use_id"] for p in m.get("content") if isinstance(p, dict) and p.get("content") == UNANSWERED
                  ] if isinstance(m.get("content"), list) else []
    return found


def check_pairing(run, log_calls):
    """The run's calls are the log's, in order; each is in a block with its result or a placeholder, or final."""
    actions = [a.call_id for call in run.calls for a in call.actions]
    assert actions == log_calls, run.name
    history = parse_history(run.messages)
    in_blocks = [x for ids in call_ids_in_blocks(run) for x in ids]
    final = [a.call_id for a in run.calls[-1].actions] if run.final else []
    assert in_blocks + final == log_calls, run.name  # block counts equal the calls the log records
    assert sum(len(b.actions) for b in history.blocks) == len(in_blocks)
    assert placeholder_ids(run.messages) == list(run.unanswered), run.name
    if run.final:
        assert run.calls[-1].position == len(run.messages) and final_block(run).actions
        assert not set(final) & set(run.unanswered)


# --------------------------------------------------------------------------- Claude Code

def claude_records(run):
    """The log records of the chain ``run`` was read from (its session, or one sub-agent)."""
    records, _ = log_lines(run.path)
    if run.parent is None:
        return [r for r in records if not r.get("isSidechain")]
    sidechain = [r for r in records if r.get("isSidechain")]
    agent = run.id.rsplit("/agent-", 1)[-1]
    mine = [r for r in sidechain if r.get("agentId") == agent]
    return mine or sidechain


def claude_log_calls(records):
    """The tool_use ids of the model's records, in order, once each (API errors and synthetic records are not)."""
    ids = []
    for r in records:
        message = r.get("message") if r.get("type") == "assistant" else None
        if not isinstance(message, dict) or r.get("isApiErrorMessage") or message.get("model") == "<synthetic>":
            continue
        ids += [p["id"] for p in message.get("content") or [] if isinstance(p, dict) and p.get("type") == "tool_use"
                and p["id"] not in ids]
    return ids


def claude_log_usage(records):
    """The log's own usage sums: each response (``message.id``) once, with the usage of its last record."""
    last = {}
    for r in records:
        message = r.get("message") if r.get("type") == "assistant" else None
        if isinstance(message, dict) and isinstance(message.get("usage"), dict) and not r.get("isApiErrorMessage") \
                and message.get("model") != "<synthetic>":
            last[message.get("id")] = message["usage"]
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
    return Usage(*(sum(u.get(k, 0) for u in last.values()) for k in keys)) if last else None


def check_claude_run(run):
    records = claude_records(run)
    assert run.format == "claude-code" and run.api == "anthropic"
    check_pairing(run, claude_log_calls(records))
    assert run.usage == claude_log_usage(records), run.name
    assert run.skipped == log_lines(run.path)[1]
    boundaries = sum(r.get("subtype") == "compact_boundary" for r in records)
    assert sum(c.kind == "compact_boundary" for c in run.compactions) == boundaries
    for compaction in run.compactions:
        if compaction.kind == "compact_boundary":
            summary = content_text(run.messages[compaction.position]["content"])
            assert "continued from a previous conversation" in summary


def test_claude_code_merges_each_response_and_its_results():
    runs = {run.name: run for run in read_runs(CLAUDE / f"{SESSION}.jsonl")}
    run = runs[SESSION]
    assert [[a.name for a in call.actions] for call in run.calls] == [
        ["Read", "Grep"], ["Edit"], [], ["Task"], ["Edit"], ["Bash"]]
    first = run.messages[1]
    assert [p["type"] for p in first["content"]] == ["thinking", "text", "tool_use", "tool_use"]  # 4 records, 1 call
    assert [p["tool_use_id"] for p in run.messages[2]["content"]] == ["toolu_01", "toolu_02"]  # 2 records, 1 answer
    assert run.calls[0].usage == Usage(4, 0, 5210, 96)  # the last record's usage: output grows while streaming
    assert run.calls[0].model == "claude-sonnet-4-5-20250929"
    assert not any("API Error" in content_text(m["content"]) for m in run.messages)  # a synthetic record
    assert run.unanswered == ("toolu_03",) and run.orphans == 1 and run.skipped == 2  # two redacted lines
    assert run.final[0]["content"][0]["id"] == "toolu_07"  # the session ends on a call without a result
    assert run.compactions == (Compaction(8, "compact_boundary"),)
    assert run.messages[8].get("content").startswith("This session is being continued")
    assert run.goal.startswith("Fix the unary minus bug") and run.id == SESSION
    check_claude_run(run)


def test_claude_code_sub_agents_are_runs_linked_to_their_call():
    runs, errors = load_runs(FIXTURES / "claude-code")  # the whole tree, as ~/.claude/projects
    assert errors == []
    by_name = {run.name: run for run in runs}
    agent = by_name["agent-a1b2c3d"]  # <session>/subagents/agent-a1b2c3d.jsonl
    assert agent.parent == SESSION and agent.parent_call == "toolu_05" and agent.id == f"{SESSION}/agent-a1b2c3d"
    assert agent.goal.startswith("Review the diff") and [c.model for c in agent.calls] == [
        "claude-haiku-4-5-20251001"] * 2
    inline = [run for run in runs if run.parent == OLDER]  # an older session: the sub-agent inline, no agentId
    assert len(inline) == 1 and inline[0].parent_call == "toolu_21" and inline[0].name.startswith(f"{OLDER}/sidechain-")
    older = by_name[OLDER]
    assert [[a.name for a in c.actions] for c in older.calls] == [["Task"], ["Edit"], ["Bash"], []]
    assert older.compactions == (Compaction(5, "summary"),)  # the summary of an earlier leaf, not the title line
    assert older.messages[5]["content"].startswith("Thanks.")
    for run in runs:
        check_claude_run(run)
    alone = load_run(CLAUDE / SESSION / "subagents" / "agent-a1b2c3d.jsonl")
    assert alone.parent == SESSION and alone.parent_call is None  # the parent's file was not read


@pytest.mark.skipif(not (LOGS / "claude-code").is_dir(), reason="shared/data/logs/claude-code is not present")
def test_claude_code_real_sessions():
    runs, errors = load_runs(LOGS / "claude-code")
    assert errors == [] and len(runs) == len(list((LOGS / "claude-code").glob("*.jsonl")))
    for run in runs:
        check_claude_run(run)
    assert sum(run.skipped for run in runs) > 0  # redacted lines
    linked = [run for run in runs if run.parent is not None]
    assert linked and all(run.parent_call for run in linked)
    parents = {run.id: run for run in runs}
    for run in linked:
        assert run.parent_call in {a.call_id for c in parents[run.parent].calls for a in c.actions}
    assert any(run.compactions for run in runs)


# --------------------------------------------------------------------------- Codex

def codex_log(path):
    """The call ids of a rollout's response items in order, and the usage the log sums: the last cumulative total
    of each stretch (a resumed session starts its totals again)."""
    records, _ = log_lines(path)
    calls = [r["payload"]["call_id"] for r in records if r.get("type") == "response_item"
             and r["payload"].get("type") in ("function_call", "custom_tool_call", "local_shell_call")]
    totals, last = [], None
    for r in records:
        info = r.get("payload", {}).get("info") if r.get("type") == "event_msg" else None
        if isinstance(info, dict):
            if last is not None and info["total_token_usage"]["input_tokens"] < last["input_tokens"]:
                totals.append(last)
            last = info["total_token_usage"]
    totals += [last] if last else []
    sent, cached, output = (sum(t[k] for t in totals) for k in ("input_tokens", "cached_input_tokens", "output_tokens"))
    return calls, (Usage(sent - cached, cached, 0, output) if totals else None)


def check_codex_run(run):
    calls, usage = codex_log(run.path)
    assert run.format == "codex" and run.api == "responses"
    check_pairing(run, calls)
    assert run.usage == usage and run.skipped == log_lines(run.path)[1]


def test_codex_rollout_as_a_responses_input():
    run = load_run(ROLLOUT)
    assert run.id == "0199aaaa-1111-7222-8333-000000000001" and run.goal.startswith("Fix the unary minus bug")
    assert [[a.name for a in c.actions] for c in run.calls] == [
        ["shell"], ["shell", "shell"], ["apply_patch"], ["shell"], [], ["shell"]]
    assert [run.messages[c.position]["type"] for c in run.calls[:-1]] == [
        "reasoning", "function_call", "reasoning", "function_call", "message"]
    assert run.calls[1].usage == Usage(204, 4096, 0, 88)  # input_tokens count the cached ones
    assert {c.model for c in run.calls} == {"gpt-5-codex"}
    assert [item["call_id"] for item in run.final] == ["call_c6"]  # the turn was aborted before its output
    assert run.compactions == (Compaction(15, "compacted"),) and run.messages[15]["role"] == "user"
    assert run.skipped == 1 and run.unanswered == ()
    history = parse_history(run.messages)
    assert history.format == "responses" and len(history.spans) == 4
    assert history.blocks[0].reasoning == "**Looking at the repository**"  # reasoning goes with its call
    check_codex_run(run)


def test_codex_usage_of_a_call_without_items_goes_to_the_next_call(tmp_path):
    records = ROLLOUT.read_text().splitlines()
    counts = [i for i, line in enumerate(records) if '"last_token_usage"' in line]
    extra = json.loads(records[counts[0]])  # a count of its own, before the second call: a turn that wrote nothing
    info = extra["payload"]["info"]
    info["last_token_usage"] = {"input_tokens": 500, "cached_input_tokens": 0, "output_tokens": 9}
    info["total_token_usage"] = {"input_tokens": -1}  # a new total
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(records[:counts[2]] + [json.dumps(extra)] + records[counts[2]:]) + "\n")
    run, plain = load_run(path), load_run(ROLLOUT)
    assert [c.usage for c in run.calls][2:] == [c.usage for c in plain.calls][2:]
    assert run.calls[1].usage == plain.calls[1].usage + Usage(500, 0, 0, 9)  # counted with the call after it
    assert run.usage == plain.usage + Usage(500, 0, 0, 9)


def test_codex_renames_its_shell_tool_across_versions():
    run = load_run(OLD_ROLLOUT)  # the early JSON rollout: {"session", "items"}, the tool named container.exec
    assert run.format == "codex" and run.messages[2]["name"] == "container.exec"  # the input stays as sent
    assert [[a.name for a in c.actions] for c in run.calls] == [["shell"], []]
    assert run.usage is None and run.goal == "What does tinycalc/parser.py do?"


@pytest.mark.skipif(not (LOGS / "codex").is_dir(), reason="shared/data/logs/codex is not present")
def test_codex_real_rollouts():
    runs, errors = load_runs([LOGS / "codex", LOGS / "responses-items"])
    assert errors == [] and {run.format for run in runs} == {"codex"}
    for run in runs:
        if run.path.endswith(".jsonl"):
            check_codex_run(run)
    assert sum(len(parse_history(r.messages).spans) for r in runs) == sum(len(codex_log(r.path)[0]) for r in runs
                                                                          if r.path.endswith(".jsonl"))


# --------------------------------------------------------------------------- OpenHands

def openhands_log(record):
    """The tool call ids of an OpenHands V0 history (each response's calls once, in order), and its own usage sum
    (``metrics.accumulated_token_usage``; None without one)."""
    calls, seen = [], set()
    for event in record["history"]:
        response = (event.get("tool_call_metadata") or {}).get("model_response") if "action" in event else None
        if isinstance(response, dict) and response.get("id") not in seen:
            seen.add(response.get("id"))
            calls += [c["id"] for c in response["choices"][0]["message"].get("tool_calls") or []]
    total = (record.get("metrics") or {}).get("accumulated_token_usage")
    usage = None if not total else Usage(
        total["prompt_tokens"] - total["cache_read_tokens"] - total["cache_write_tokens"], total["cache_read_tokens"],
        total["cache_write_tokens"], total["completion_tokens"])
    return calls, usage


def test_openhands_evaluation_records():
    runs = read_runs(FIXTURES / "openhands" / "output.jsonl")  # one run per line
    assert [run.name for run in runs] == ["output/tinycalc-1", "output/tinycalc-2"]
    records = [json.loads(line) for line in (FIXTURES / "openhands" / "output.jsonl").read_text().splitlines()]
    for run, record in zip(runs, records):
        calls, usage = openhands_log(record)
        check_pairing(run, calls)
        assert run.usage == usage and run.goal == record["instruction"] and run.id == record["instance_id"]
        assert [m["role"] for m in run.messages[:2]] == ["system", "user"]  # recall events are not sent
        assert [a.name for a in run.calls[0].actions] == ["execute_bash", "str_replace_editor"]  # one response
        assert run.final[0]["tool_calls"][0]["function"]["name"] == "finish"
    assert runs[1].compactions == (Compaction(5, "condensation"),)
    assert runs[1].messages[5] == {"role": "user", "content": "Summary: the parser lacks unary minus."}


def test_openhands_legacy_pairs_and_sdk_event_folders():
    legacy = load_run(FIXTURES / "openhands" / "resolver_output.json")
    assert [[a.name for a in c.actions] for c in legacy.calls] == [["execute_bash"], ["execute_ipython_cell"],
                                                                  ["finish"]]
    assert legacy.goal == "Please add an MIT LICENSE file." and legacy.final
    runs, errors = load_runs(FIXTURES / "openhands-sdk")  # base_state.json is the conversation's metadata
    assert errors == [] and len(runs) == 1
    sdk = runs[0]
    assert sdk.name == "3f2a9c1e0b7d4e55a6c8d9e0f1a2b3c4" and sdk.format == "openhands-sdk" and sdk.skipped == 1
    assert [[a.call_id for a in c.actions] for c in sdk.calls] == [["toolu_v1"], ["toolu_v2", "toolu_v3"], []]
    assert sdk.usage == Usage(11000 - 6300, 6300, 0, 230)  # the last stats update: the log's own sums
    assert sdk.compactions == (Compaction(7, "condensation"),) and sdk.final == ()


def sdk_events(path):
    """The events of an SDK conversation: its folder's event files in order, or its JSON Lines."""
    if path.is_dir():
        return [json.loads(p.read_text()) for p in sorted(path.glob("event-*.json"))]
    return log_lines(path)[0]


@pytest.mark.skipif(not (LOGS / "openhands").is_dir(), reason="shared/data/logs/openhands is not present")
def test_openhands_real_records_and_trajectories():
    runs, errors = load_runs([LOGS / "openhands", LOGS / "openhands-sdk"])
    assert errors == [] and {run.format for run in runs} == {"openhands", "openhands-sdk"}
    for run in runs:
        data = json.loads(Path(run.path).read_text()) if Path(run.path).is_file() and run.path.endswith(".json") \
            else None
        record = {"history": data} if isinstance(data, list) else data  # a trajectory, or an evaluation record
        if isinstance(record, dict) and any("id" in e for e in record["history"]):
            calls, usage = openhands_log(record)
            check_pairing(run, calls)
            assert usage is None or run.usage == usage, run.name
        elif run.format == "openhands-sdk":
            events = sdk_events(Path(run.path))
            check_pairing(run, [e["tool_call"]["id"] for e in events if e.get("kind") == "ActionEvent"])
            stats = [e["value"]["usage_to_metrics"] for e in events if e.get("key") == "stats"]
            if stats:
                total = {k: sum(m["accumulated_token_usage"][k] for m in stats[-1].values())
                         for k in ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens")}
                assert run.usage == Usage(total["prompt_tokens"] - total["cache_read_tokens"] - total[
                    "cache_write_tokens"], total["cache_read_tokens"], total["cache_write_tokens"],
                                          total["completion_tokens"])


# --------------------------------------------------------------------------- mini-swe-agent 2.x

def test_mini_swe_agent_native_tool_calls_end_on_the_submitted_call():
    source = json.loads((FIXTURES / "mini_swe_agent_1_1.traj.json").read_text())
    run = load_run(FIXTURES / "mini_swe_agent_1_1.traj.json")
    assert run.format == "mini-swe-agent-1.1" and run.api == "openai"
    assert all("extra" not in m for m in run.messages) and all(m["role"] != "exit" for m in run.messages)
    assert len(run.calls) == source["info"]["model_stats"]["api_calls"]
    recorded = [call["id"] for m in source["messages"] for call in m.get("tool_calls") or []]
    check_pairing(run, recorded)
    assert [c["id"] for c in run.final[0]["tool_calls"]] == ["call_m5"]  # answered by the exit message only
    assert run.calls[1].actions == () and run.calls[2].usage == Usage(120, 1280, 0, 90)
    assert run.usage.output == sum(m["extra"]["response"]["usage"]["completion_tokens"]
                                   for m in source["messages"] if m["role"] == "assistant")


def test_mini_swe_agent_text_based_2x_runs_read_as_text_actions():
    path = FIXTURES / "text_actions" / "mini_swe_agent_1_1.text-actions"  # trajectory_format 1.1, text commands
    run = read_runs(path)[0]
    source = json.loads(path.read_text())["messages"]
    assert run.format == "mini-swe-agent-1" and source[-1]["role"] == "exit"
    assert len(run.messages) == len(source) - 1 and run.final == ()
    assert len(parse_history(run.messages).spans) == sum(bool(c.actions) for c in run.calls) > 10


def test_a_plain_conversion_ending_on_a_call_ends_there(tmp_path):
    source = json.loads((FIXTURES / "mini_swe_agent_1_1.traj.json").read_text())["messages"]
    plain = [{k: v for k, v in m.items() if k != "extra"} for m in source if m["role"] != "exit"]
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    run = load_run(tmp_path / "plain.json")
    assert run.format == "openai" and run.messages == plain[:-1] and run.final == (plain[-1],)


# --------------------------------------------------------------------------- recognition by structure

def test_unknown_versions_are_read_by_structure_and_other_files_refused(tmp_path):
    data = json.loads((FIXTURES / "mini_swe_agent_1_1.traj.json").read_text())
    data["trajectory_format"] = "mini-swe-agent-7"
    (tmp_path / "future.traj.json").write_text(json.dumps(data))
    assert load_run(tmp_path / "future.traj.json").format == "mini-swe-agent-1.1"
    (tmp_path / "other.json").write_text(json.dumps({"trajectory_format": "mini-swe-agent-1.1", "steps": []}))
    with pytest.raises(ValueError, match="not a known run format; known: codex, claude-code, openhands-sdk, "):
        load_run(tmp_path / "other.json")
    assert "tau-bench" in known_formats() and "anthropic" in known_formats()


def test_broken_lines_are_skipped_and_counted(tmp_path):
    lines = ROLLOUT.read_text().splitlines()
    broken = tmp_path / "rollout.jsonl"
    broken.write_text("\n".join(lines[:8] + ["{not json", "[1, 2"] + lines[8:]) + "\n")
    run = load_run(broken)
    assert run.skipped == 3 and run.messages == load_run(ROLLOUT).messages
    shutil.copy(CLAUDE / f"{SESSION}.jsonl", tmp_path / "session.jsonl")
    with (tmp_path / "session.jsonl").open("a") as f:
        f.write("\x00garbage\n")
    assert read_runs(tmp_path / "session.jsonl")[0].skipped == 3


# --------------------------------------------------------------------------- the commands, end to end

LOG_TREES = [str(FIXTURES / "claude-code"), str(FIXTURES / "codex")]


def command(module, argv):
    parser = argparse.ArgumentParser(prog="gem")
    module.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_gem_online_reads_log_trees(tmp_path, capsys):
    needs_extra("replay")
    out = tmp_path / "out"
    assert command(online_cli, ["online", *LOG_TREES, "--encoder", "hash", "--policies", "window,gem-cache-aware",
                                "--window", "2", "--out", str(out), "--show-paths"]) == 0
    err = capsys.readouterr().err
    assert "skipped 2 unreadable lines" in err and "skipped 1 unreadable line" in err
    data = json.loads((out / "online.json").read_text())
    runs, _ = load_runs(LOG_TREES)
    assert sorted(r["name"] for r in data["runs"]) == sorted(run.name for run in runs)  # sub-agents included
    assert {"claude-code", "codex"} <= set(data["pooled"])
    assert data["pooled"]["all"]["full"]["calls"] == sum(len(run.calls) for run in runs)  # final calls included


def test_gem_replay_reads_log_trees(tmp_path):
    needs_extra("replay")
    out = tmp_path / "out"
    assert command(replay_cli, ["replay", *LOG_TREES, "--encoder", "hash", "--k", "2", "--min-blocks", "2",
                                "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet",
                                "--show-paths"]) == 0
    summary = json.loads((out / "replay.json").read_text())
    # the Claude Code session (4 blocks, then its final call) and the Codex rollout (likewise): K = 2 < t = 3, 4
    assert summary["runs"] == 2 and summary["checkpoints"] == 4
    assert set(summary["per_run"]["gem"]) == {SESSION, ROLLOUT.name.removesuffix(".jsonl")}


def test_gem_analyze_reads_log_trees(tmp_path):
    needs_extra("replay")
    out = tmp_path / "out"
    assert command(analyze_cli, ["analyze", *LOG_TREES, str(FIXTURES / "mini_swe_agent_1_1.traj.json"),
                                 "--encoder", "hash", "--min-blocks", "2", "--out", str(out),
                                 "--cache-dir", str(tmp_path / "cache"), "--quiet"]) == 0
    summary = json.loads((out / "analysis.json").read_text())
    assert summary["runs"] == 4 and (out / "analysis.md").read_text().startswith("#")  # more than 2 blocks


def test_subagent_runs_are_included_excluded_or_alone_on_request():
    from gemkernels.evaluate.loaders import load_runs

    tree = FIXTURES / "claude-code"
    every, _ = load_runs(tree)
    main, _ = load_runs(tree, "exclude")
    subs, _ = load_runs(tree, "only")
    assert subs and main and len(main) + len(subs) == len(every)
    assert all(run.parent is None for run in main) and all(run.parent is not None for run in subs)
    with pytest.raises(ValueError, match="subagents must be one of"):
        load_runs(tree, "some")
