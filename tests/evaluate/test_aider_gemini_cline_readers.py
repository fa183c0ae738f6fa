"""Readers of Aider's markdown history, Gemini CLI chats and checkpoints, and Cline task folders, on hand-written
fixtures (expected values worked out by hand from the fixture text) and on the real Aider histories in
../shared/data/logs (skipped where absent), each checked against its log read independently here."""

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, LOGS
from test_log_readers import check_pairing

from gemkernels.compress.blocks import parse_history
from gemkernels.evaluate.loaders import UNANSWERED, Compaction, Usage, load_run, load_runs, read_runs

AIDER = FIXTURES / "aider" / "tinycalc" / ".aider.chat.history.md"
GEMINI = FIXTURES / "gemini"
SESSION = next(GEMINI.rglob("session-2025-11-14T09-30-4d2c7a10.jsonl"))
LEGACY = next(GEMINI.rglob("session-2025-09-01T10-00-9e8f7a6b.json"))
CHECKPOINT = next(GEMINI.rglob("checkpoint-unary.json"))
CLINE = FIXTURES / "cline" / "tasks"
XML_TASK, NATIVE_TASK = CLINE / "1731577800000", CLINE / "1763112000000"


def tool_results(run):
    """call id -> the result text of each OpenAI tool message."""
    return {m["tool_call_id"]: m["content"] for m in run.messages if m["role"] == "tool"}


# --------------------------------------------------------------------------- Aider

def test_aider_sessions_are_runs_with_edits_and_commands_as_calls():
    runs = read_runs(AIDER)
    assert [run.name for run in runs] == ["tinycalc/2025-11-14T09:30:00", "tinycalc/2025-11-15T18:02:11"]  # the third
    first, second = runs  # session has no model reply
    assert first.format == "aider" and first.api == "openai" and first.goal.startswith("Fix the unary minus bug")
    assert [[(a.name, json.loads(a.arguments)) for a in c.actions] for c in first.calls] == [
        [],
        [("edit", {"path": "tinycalc/parser.py"}), ("bash", {"command": "python -m pytest -q"})],
        [("edit", {"path": "tinycalc/parser.py"}), ("edit", {"path": "tinycalc/README.md"})],
        [("edit", {"path": "tinycalc/README.md"})],
        [],
        [("bash", {"command": "git push origin main"})]]
    check_pairing(first, [f"aider_{n:04d}" for n in range(6)])
    results = tool_results(first)
    assert results["aider_0000"] == "Applied edit to tinycalc/parser.py"
    assert results["aider_0001"] == "Running python -m pytest -q\n[3 lines of output added to the chat; not in the log]"
    assert results["aider_0003"].startswith("The LLM did not conform to the edit format.")  # the README block failed
    assert results["aider_0005"] == "[not run: the user declined]"
    users = [m["content"] for m in first.messages if m["role"] == "user"]
    assert users[1].startswith("I added these files to the chat: tinycalc/parser.py")  # Aider's own follow-up
    assert users[2].startswith("I ran this command:\n\npython -c") and "1 line" in users[2]  # the user's /run
    assert users[4].startswith("# 1 SEARCH/REPLACE block failed to match!")  # the reflected edit error
    assert "/tokens" not in " ".join(users) and "Approximate context window" not in " ".join(users)
    clear = first.compactions[0]
    assert first.compactions == (Compaction(clear.position, "clear"),)
    assert first.messages[clear.position]["content"] == ("Explain what tinycalc/parser.py does, briefly.\n\n"
                                                         "One paragraph.")
    # each Tokens line, by hand: sent counts the cache's reads and writes
    assert [c.usage for c in first.calls] == [
        Usage(300, 0, 2100, 38), Usage(900, 2200, 0, 120), Usage(500, 3100, 0, 95), Usage(500, 3500, 0, 60),
        Usage(900, 2000, 0, 52), Usage(200, 2800, 0, 21)]
    assert first.usage == Usage(19000 - 13600 - 2100, 13600, 2100, 386)
    assert {c.model for c in first.calls} == {"anthropic/claude-sonnet-4-5-20250929"}
    assert {c.time for c in first.calls} == {"2025-11-14T09:30:00"}
    # the second session ends on an edit Aider never reported on (the user interrupted it): its final call
    assert second.final and second.calls[-1].position == len(second.messages) and second.unanswered == ()
    assert second.calls[0].model == "gpt-4.1" and second.usage == Usage(812, 0, 0, 45)
    assert all(m["content"] != "/add tinycalc/calc.py" for m in second.messages)


def test_aider_histories_in_a_tree_are_found_by_name(tmp_path):
    shutil.copytree(FIXTURES / "aider", tmp_path / "projects")
    (tmp_path / "projects" / "tinycalc" / "README.md").write_text("# not a history\n")
    runs, errors = load_runs(tmp_path / "projects")
    assert errors == [] and len(runs) == 2  # README.md is not read; the history is named by its folder


TOKENS_LINE = re.compile(r"^> Tokens: ([\d.]+k?) sent(?:, ([\d.]+k?) cache write)?(?:, ([\d.]+k?) cache hit)?, "
                         r"([\d.]+k?) received", re.M)


def aider_count(text):
    return 0 if not text else int(round(float(text.rstrip("k")) * (1000 if text.endswith("k") else 1)))


@pytest.mark.skipif(not (LOGS / "aider").is_dir(), reason="shared/data/logs/aider is not present")
def test_aider_real_histories():
    for path in sorted((LOGS / "aider").glob("*.md")):
        text = path.read_text()
        runs = read_runs(path)
        assert len(runs) <= text.count("\n# aider chat started at ")
        calls = [c for run in runs for c in run.calls]
        lines = TOKENS_LINE.findall(text)
        assert sum(c.usage is not None for c in calls) == len(lines), path.name  # one call per Tokens line
        sent, write, hit, out = (sum(aider_count(line[i]) for line in lines) for i in range(4))
        total = sum((run.usage for run in runs if run.usage), Usage())
        assert total == Usage(sent - hit - write, hit, write, out), path.name  # the log's own sums
        results = [r for run in runs for r in tool_results(run).values()]
        assert sum(r.startswith("Applied edit to ") for r in results) == text.count("\n> Applied edit to ")
        bash = [a for c in calls for a in c.actions if a.name == "bash"]
        assert len(bash) == len(re.findall(r"^> Run shell commands?\?", text, re.M))
        for run in runs:
            check_pairing(run, [a.call_id for c in run.calls for a in c.actions])
            assert all(m["role"] != "assistant" or m["content"].strip() not in ("Ok", "Ok.") for m in run.messages)


# --------------------------------------------------------------------------- Gemini CLI

def test_gemini_cli_session_jsonl():
    run = load_run(SESSION)
    assert run.format == "gemini-cli" and run.id == "4d2c7a10-5b6e-4f3a-9c8d-000000000001" and run.skipped == 1
    assert run.project.startswith("3f9a0c2d") and run.goal.startswith("Fix the unary minus bug")
    assert [[a.call_id for a in c.actions] for c in run.calls] == [
        ["read_file-1"], ["replace-2", "run_shell_command-3"], [], ["run_shell_command-4"]]
    check_pairing(run, ["read_file-1", "replace-2", "run_shell_command-3", "run_shell_command-4"])
    results = tool_results(run)
    assert results["read_file-1"].startswith("def factor(self):")  # the later version of the message has it
    assert results["run_shell_command-3"] == "3 passed in 0.02s"
    assert [c.model for c in run.calls] == ["gemini-2.5-pro"] * 3 + ["gemini-2.5-flash"]
    assert [m["tool_calls"][0]["id"] for m in run.final] == ["run_shell_command-4"]  # no result: it ends there
    texts = [m["content"] for m in run.messages]
    assert "Which approach?" not in texts and "Tips: use /help" not in texts  # rewound; the CLI's own info
    # by hand: input counts the cached tokens, tool-use prompt tokens are input, thoughts are output
    assert [c.usage for c in run.calls] == [Usage(5210, 0, 0, 128), Usage(1504, 4096, 0, 152), Usage(787, 5120, 0, 20),
                                            Usage(1800, 0, 0, 30)]
    assert run.usage == Usage(9301, 9216, 0, 330)
    compaction = run.compactions[0]
    assert compaction.kind == "compression" and texts[compaction.position].startswith("<state_snapshot>")
    assert [m["content"] for m in run.request(len(run.messages))] == [
        texts[compaction.position], "Also support 2 * -3, and compress the history first."]
    assert run.calls[-1].time == "2025-11-15T08:00:00.000Z"


def test_gemini_cli_legacy_session_and_checkpoint():
    runs, errors = load_runs(GEMINI)  # the tree: logs.json (the user's prompts) is not a run
    assert errors == [] and len(runs) == 3
    legacy = load_run(LEGACY)
    assert [m["role"] for m in legacy.messages] == ["user", "assistant", "tool", "assistant"]  # the error is the CLI's
    assert legacy.usage == Usage(3000 + 3100 - 2048, 2048, 0, 25 + 10 + 12) and legacy.project.startswith("7c1d")
    checkpoint = load_run(CHECKPOINT)
    assert [[a.name for a in c.actions] for c in checkpoint.calls] == [["read_file"], ["run_shell_command",
                                                                                       "read_file"], []]
    results = tool_results(checkpoint)  # answered by name, in order, whatever order the responses come in
    assert results == {"gemini_0000": "def factor(self): ...", "gemini_0001": "pytest: not found",
                       "gemini_0002": "# tinycalc"}
    assert checkpoint.usage is None and checkpoint.unanswered == ()


# --------------------------------------------------------------------------- Cline

def ui_usage(folder):
    """The task's own usage sums: every api_req_started record of its UI log."""
    total = Usage()
    for record in json.loads((folder / "ui_messages.json").read_text()):
        if isinstance(record, dict) and record.get("say") == "api_req_started":
            info = json.loads(record["text"])
            total += Usage(info["tokensIn"], info["cacheReads"], info["cacheWrites"], info["tokensOut"])
    return total


def test_cline_xml_tool_calls_become_tool_use_blocks():
    runs, errors = load_runs(CLINE)  # a task folder is one run: its UI log and metadata are not runs
    assert errors == [] and sorted(run.name for run in runs) == ["1731577800000", "1763112000000"]
    run = load_run(XML_TASK / "api_conversation_history.json")  # the history names its task folder
    assert run.format == "cline" and run.api == "anthropic"
    assert run.goal == "Fix the unary minus bug in tinycalc/parser.py: -3 + 4 should be 1."
    assert [[a.name for a in c.actions] for c in run.calls] == [
        ["read_file"], ["replace_in_file"], ["execute_command"], [], ["attempt_completion"], ["replace_in_file"]]
    check_pairing(run, [f"cline_{n:04d}" for n in range(5)])
    assert json.loads(run.calls[0].actions[0].arguments) == {"path": "tinycalc/parser.py"}
    (answer,) = run.messages[2]["content"]  # the result alone: the call and its result are a block
    assert answer["tool_use_id"] == "cline_0000" and answer["content"][0]["text"].startswith("def factor")
    assert run.messages[3]["content"][0]["text"].startswith("<environment_details>")  # the rest of Cline's message
    assert len(parse_history(run.messages).spans) == 4
    assert run.unanswered == ("cline_0002",)  # the task was interrupted before the command ran
    assert run.messages[4]["content"][0]["text"].startswith("<replace_in_file>")  # the text as Cline sent it
    assert run.usage == ui_usage(XML_TASK)
    assert run.calls[2].usage == Usage(3 + 5, 9750, 300, 45)  # a failed request and its retry, one call
    assert [c.model for c in run.calls] == ["claude-3-7-sonnet-20250219"] * 3 + ["claude-sonnet-4-20250514"] * 3
    (truncation,) = run.compactions
    assert (truncation.kind, truncation.keep) == ("truncation", 1)
    request = run.request(run.calls[4].position)  # the first request after Cline cut messages 1-2 out
    assert request[0] is run.messages[0] and request[1] is run.messages[truncation.resume]
    assert len(request) == 1 + run.calls[4].position - truncation.resume
    assert run.request(run.calls[3].position) == run.messages[:run.calls[3].position]  # before it: everything


def test_cline_native_tool_calls_and_message_metrics():
    run = load_run(NATIVE_TASK)
    assert all(set(m) == {"role", "content"} for m in run.messages)  # Cline's own fields are not sent
    check_pairing(run, ["toolu_c1", "toolu_c2"])
    assert [c.model for c in run.calls] == ["gpt-5-codex"] * 2
    assert run.usage == Usage(8100 + 8400 - 7936, 7936, 0, 95)  # metrics.tokens: the prompt counts the cached


def test_cline_broken_ui_log_is_skipped_and_counted(tmp_path):
    shutil.copytree(XML_TASK, tmp_path / "task")
    (tmp_path / "task" / "ui_messages.json").write_text('[{"ts": 1, "type": "say", "say": "api_req_sta')
    (tmp_path / "task" / "context_history.json").write_text("[]")  # Cline's other task files are not runs
    runs, errors = load_runs(tmp_path)
    assert errors == [] and len(runs) == 1
    run = load_run(tmp_path / "task")
    assert run.skipped == 1 and run.usage is None
    assert [c.actions for c in run.calls] == [c.actions for c in load_run(XML_TASK).calls]
    bare = tmp_path / "history.json"  # the history alone, renamed: still Cline's by its <task>
    shutil.copy(XML_TASK / "api_conversation_history.json", bare)
    assert load_run(bare).format == "cline" and UNANSWERED in json.dumps(load_run(bare).messages)


def test_every_new_reader_gives_blocks_parse_history_accepts():
    for path in (AIDER, SESSION, LEGACY, CHECKPOINT, XML_TASK, NATIVE_TASK):
        for run in read_runs(path) if Path(path).is_file() else [load_run(path)]:
            history = parse_history(run.messages)
            assert [x for span in history.spans for x in span.call_ids] + [
                a.call_id for a in (run.calls[-1].actions if run.final else ())] == [
                a.call_id for c in run.calls for a in c.actions], run.name
