"""Aider histories stripped of their trailing whitespace, long runs of ``> `` lines and padded entries; OpenHands V0
actions whose model responses share an id: on small inline logs (expected values worked out by hand) and on the real
Aider histories in ../shared/data/logs (skipped where absent)."""

import json
import time

import pytest
from helpers import FIXTURES, LOGS
from test_log_readers import check_pairing

from gemkernels.evaluate.loaders import Usage, read_runs

# --------------------------------------------------------------------------- Aider

#: What Aider says after the blocks that failed to match.
MUST_MATCH = ("The SEARCH section must exactly match an existing block of lines including all white space, comments, "
              "indentation, docstrings, etc")
#: A session as Aider writes it: each of its lines ends in two spaces, a markdown line break (``<br>`` here).
HISTORY = """
# aider chat started at 2025-11-14 09:30:00

> /usr/local/bin/aider --model sonnet<br>
> Aider v0.86.1<br>
> Main model: anthropic/claude-sonnet-4-5-20250929 with diff edit format<br>

#### Make `-3` parse in calc.py.<br>
#### <br>
#### And say so in README.md.<br>

calc.py
```python
<<<<<<< SEARCH
    return number()
=======
    return -factor() if peek() == '-' else number()
>>>>>>> REPLACE
```

README.md
```markdown
<<<<<<< SEARCH
Binary only.
=======
Unary minus works.
>>>>>>> REPLACE
```

> Tokens: 2.4k sent, 2.1k cache write, 38 received. Cost: $0.0087 message, $0.0087 session.<br>
> Applied edit to calc.py<br>
> The LLM did not conform to the edit format.
https://aider.chat/docs/troubleshooting/edit-errors.html<br>
> # 1 SEARCH/REPLACE block failed to match!

## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in README.md
<<<<<<< SEARCH
Binary only.
=======
Unary minus works.
>>>>>>> REPLACE

<must match>

# The other 1 SEARCH/REPLACE block were applied successfully.
Don't re-send them.
Just reply with fixed versions of the block above that failed to match.<br>
><br>

README.md
```markdown
<<<<<<< SEARCH
Binary operators only.
=======
Unary minus works.
>>>>>>> REPLACE
```

> Tokens: 3.1k sent, 2.2k cache hit, 40 received. Cost: $0.0041 message, $0.01 session.<br>
> # 1 SEARCH/REPLACE block failed to match!

## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in README.md
<<<<<<< SEARCH
Binary operators only.
=======
Unary minus works.
>>>>>>> REPLACE

<must match><br>

The file says it otherwise; run the tests first:

```bash
python -m pytest -q
```

> Tokens: 3.6k sent, 3.1k cache hit, 25 received. Cost: $0.0030 message, $0.01 session.<br>
> python -m pytest -q<br>
> Run shell command? (Y)es/(N)o/(D)on't ask again [Yes]: y<br>
> Running python -m pytest -q<br>
> Add command output to the chat? (Y)es/(N)o/(D)on't ask again [Yes]: y<br>
> Added 3 lines of output to the chat.<br>

#### /run python -c "import calc"<br>
> Add 0.1k tokens of command output to the chat? (Y)es/(N)o [Yes]: y<br>
> Added 1 line of output to the chat.<br>
""".replace("<br>", "  ").replace("<must match>", MUST_MATCH)


def stripped(text):
    """The text with every line's trailing whitespace removed, as editors and git hooks do."""
    return "\n".join(line.rstrip() for line in text.split("\n"))


def history_file(tmp_path, text):
    path = tmp_path / "calc" / ".aider.chat.history.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_aider_history_stripped_of_its_line_breaks_reads_as_the_same_run(tmp_path):
    path = history_file(tmp_path, HISTORY)
    runs = read_runs(path)
    (run,) = runs
    # by hand: three replies, each Tokens line its usage; Aider's reports and the user's /run between them
    assert [[(a.name, json.loads(a.arguments)) for a in c.actions] for c in run.calls] == [
        [("edit", {"path": "calc.py"}), ("edit", {"path": "README.md"})],
        [("edit", {"path": "README.md"})],
        [("bash", {"command": "python -m pytest -q"})]]
    assert [c.usage for c in run.calls] == [Usage(300, 0, 2100, 38), Usage(900, 2200, 0, 40),
                                            Usage(500, 3100, 0, 25)]
    assert run.goal == "Make `-3` parse in calc.py.\n\nAnd say so in README.md."
    users = [m["content"] for m in run.messages if m["role"] == "user"]
    assert users[1].startswith("# 1 SEARCH/REPLACE block failed to match!") and users[1].endswith(
        "Just reply with fixed versions of the block above that failed to match.")  # the report, whole
    assert users[2].startswith("# 1 SEARCH/REPLACE block failed to match!") and users[2].endswith("docstrings, etc")
    assert users[3].startswith("I ran this command:\n\npython -c \"import calc\"")
    assert run.messages[-3]["content"].startswith("The file says it otherwise")  # the report ended before it
    check_pairing(run, [f"aider_{n:04d}" for n in range(4)])

    history_file(tmp_path, stripped(HISTORY))
    assert read_runs(path) == runs


def test_aider_fixture_history_stripped_reads_as_the_same_runs(tmp_path):
    path = tmp_path / "tinycalc" / ".aider.chat.history.md"
    path.parent.mkdir()
    text = (FIXTURES / "aider" / "tinycalc" / ".aider.chat.history.md").read_text()
    path.write_text(text)
    runs = read_runs(path)
    path.write_text(stripped(text))
    assert read_runs(path) == runs and len(runs) == 2


def without_trailing_whitespace(value):
    """Strings (in lists and dicts) without their lines' trailing whitespace: a reply's own is lost by stripping."""
    if isinstance(value, str):
        return stripped(value)
    if isinstance(value, dict):
        return {key: without_trailing_whitespace(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_trailing_whitespace(item) for item in value]
    return value


@pytest.mark.skipif(not (LOGS / "aider").is_dir(), reason="shared/data/logs/aider is not present")
def test_aider_real_histories_stripped_read_as_the_same_runs(tmp_path):
    for source in sorted((LOGS / "aider").glob("*.md")):
        text = source.read_text()
        path = history_file(tmp_path, text)
        runs = read_runs(path)
        path.write_text(stripped(text))
        again = read_runs(path)
        assert [r.name for r in again] == [r.name for r in runs], source.name
        for run, other in zip(runs, again):
            assert without_trailing_whitespace(other.messages) == without_trailing_whitespace(run.messages), run.name
            assert [c.usage for c in other.calls] == [c.usage for c in run.calls], run.name
            assert other.compactions == run.compactions, run.name


def test_aider_entry_with_a_padded_first_line_runs_to_its_line_break(tmp_path):
    """Aider pads a multi-line shell command's first line with spaces; the entry still ends on its last line."""
    text = """
# aider chat started at 2025-11-14 09:30:00

> Aider v0.86.1<br>

#### Scaffold dist/.<br>

```bash
mkdir -p dist
touch dist/a.js
```

> Tokens: 1.2k sent, 30 received.<br>
> mkdir -p dist                                     <br>
touch dist/a.js<br>
> Run shell commands? (Y)es/(N)o/(D)on't ask again [Yes]: y<br>
> Running mkdir -p dist<br>
> Running touch dist/a.js<br>
""".replace("<br>", "  ")
    (run,) = read_runs(history_file(tmp_path, text))
    assert [m["role"] for m in run.messages] == ["user", "assistant", "tool"]  # no reply made of Aider's line
    assert [json.loads(a.arguments) for c in run.calls for a in c.actions] == [
        {"command": "mkdir -p dist\ntouch dist/a.js"}]
    assert run.messages[-1]["content"] == "Running mkdir -p dist\nRunning touch dist/a.js"


@pytest.mark.parametrize("quoted", ["> a quoted line", "> # 1 SEARCH/REPLACE block failed to match!"])
def test_aider_long_runs_of_quoted_lines_read_in_linear_time(tmp_path, quoted):
    """15,000 ``> `` lines that end no entry (a reply quoting text; reports that never end): each line used to scan
    to the end of the run, many seconds; well under one now."""
    lines = 15_000
    text = ("\n# aider chat started at 2025-11-14 09:30:00\n\n> Aider v0.86.1  \n\n#### Quote it.  \n\n"
            + "\n".join([quoted] * lines) + "\n\nDone.\n")
    path = history_file(tmp_path, text)
    start = time.perf_counter()
    (run,) = read_runs(path)
    assert time.perf_counter() - start < 1.0
    assert run.messages[-1]["content"].count(quoted) == lines  # reply text, as before


# --------------------------------------------------------------------------- OpenHands

def action(event_id, call_id, response_id, command, usage=(100, 10), calls=None):
    """An OpenHands V0 ``run`` action of a function-calling model response (its tool calls: ``calls``, else this
    action's alone)."""
    tool_calls = [{"id": c, "type": "function", "function": {"name": "execute_bash", "arguments": json.dumps(
        {"command": command})}} for c in calls or [call_id]]
    return {"id": event_id, "source": "agent", "message": command, "action": "run",
            "args": {"command": command, "thought": ""},
            "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": call_id, "model_response": {
                "id": response_id, "model": "gpt-4o", "object": "chat.completion", "choices": [{
                    "index": 0, "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": "", "tool_calls": tool_calls}}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}}}


def observation(event_id, cause, call_id, content):
    return {"id": event_id, "source": "agent", "cause": cause, "observation": "run", "content": content,
            "message": content, "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": call_id}}


def events_run(tmp_path, events):
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(events))
    (run,) = read_runs(path)
    return run


START = [{"id": 0, "source": "agent", "action": "system", "args": {"content": "You are OpenHands agent."}},
         {"id": 1, "source": "user", "action": "message", "args": {"content": "Fix calc.py."}}]


@pytest.mark.parametrize("response_id", ["", "resp-fixed"])
def test_openhands_back_to_back_responses_sharing_an_id_are_each_a_call(tmp_path, response_id):
    """Responses with an empty id, or a server that gives every response one id: the next response's action names a
    call the open message does not have, so it gives its own (it used to join the first one and be dropped, its
    result an orphan)."""
    run = events_run(tmp_path, START + [
        action(2, "call_a", response_id, "ls", usage=(100, 10)), observation(3, 2, "call_a", "calc.py"),
        action(4, "call_b", response_id, "cat calc.py", usage=(150, 12)), observation(5, 4, "call_b", "x = 1")])
    assert [[a.call_id for a in c.actions] for c in run.calls] == [["call_a"], ["call_b"]]
    assert [json.loads(a.arguments) for c in run.calls for a in c.actions] == [{"command": "ls"},
                                                                              {"command": "cat calc.py"}]
    check_pairing(run, ["call_a", "call_b"])
    assert run.orphans == 0 and run.usage == Usage(250, 0, 0, 22)  # each response billed once


def test_openhands_response_id_reused_after_other_messages_is_a_new_call(tmp_path):
    run = events_run(tmp_path, START + [
        action(2, "call_a", "resp-1", "ls"), observation(3, 2, "call_a", "calc.py"),
        {"id": 4, "source": "user", "action": "message", "args": {"content": "Now the tests."}},
        action(5, "call_b", "resp-1", "pytest"), observation(6, 5, "call_b", "1 passed")])
    assert [[a.call_id for a in c.actions] for c in run.calls] == [["call_a"], ["call_b"]]
    check_pairing(run, ["call_a", "call_b"])


def test_openhands_actions_of_one_response_still_share_its_call(tmp_path):
    """The actions of one response follow one another with their observations between: one assistant message, with
    an id or (without one) with equal responses."""
    for response_id in ("resp-2", ""):
        both = ["call_a", "call_b"]
        run = events_run(tmp_path, START + [
            action(2, "call_a", response_id, "ls", calls=both), observation(3, 2, "call_a", "calc.py"),
            action(4, "call_b", response_id, "ls", calls=both), observation(5, 4, "call_b", "calc.py")])
        assert [[a.call_id for a in c.actions] for c in run.calls] == [both], repr(response_id)
        check_pairing(run, both)
        assert run.usage == Usage(100, 0, 0, 10)


@pytest.mark.parametrize(("between", "text"), [
    ({"id": 4, "source": "user", "action": "message", "args": {"content": "Also the README."}}, "Also the README."),
    ({"id": 4, "source": "agent", "observation": "error", "content": "agent error"}, "agent error")])
def test_openhands_response_interrupted_between_its_actions_is_still_one_call(tmp_path, between, text):
    """A user message or an observation with no cause between two actions of one response: one assistant message,
    each call with its own result, the interruption after them (it used to repeat the turn, call_b a placeholder)."""
    for response_id in ("resp-2", ""):
        both = ["call_a", "call_b"]
        run = events_run(tmp_path, START + [
            action(2, "call_a", response_id, "ls", calls=both), observation(3, 2, "call_a", "calc.py"), between,
            action(5, "call_b", response_id, "ls", calls=both), observation(6, 5, "call_b", "README.md")])
        assert [[a.call_id for a in c.actions] for c in run.calls] == [both], repr(response_id)
        check_pairing(run, both)
        assert run.unanswered == () and run.orphans == 0 and not run.final
        assert [(m["role"], m["content"]) for m in run.messages[3:]] == [
            ("tool", "calc.py"), ("tool", "README.md"), ("user", text)]
        assert run.usage == Usage(100, 0, 0, 10)
