"""Properties of the Aider, Gemini CLI and Cline readers on generated sessions (hypothesis): one abstract session
(`test_reader_properties.Step`) written in each format reads back as the calls, results, unanswered calls, final
turn, broken lines and usage it was written with; re-reading a reader's own normalised output gives the same run."""

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from test_reader_properties import ANSWERED, BROKEN, Step, call_id, is_final, needs_prompt, steps

from gemkernels.compress.blocks import parse_history
from gemkernels.evaluate.loaders import Usage, load_run, read_runs

T = "  "  # Aider ends its user and tool lines with two spaces


def gemini(session: list[Step]) -> tuple[dict[str, str], Usage, int]:
    """A Gemini CLI JSONL session: each call's result arrives in a later version of its message (one per result);
    a broken call's version is a cut line, so its result is lost."""
    lines = [json.dumps({"sessionId": "s", "projectHash": "p", "startTime": "t", "lastUpdated": "t"}),
             json.dumps({"id": "u", "timestamp": "t", "type": "user", "content": [{"text": "Do the task."}]})]
    total = Usage()
    for k, step in enumerate(session):
        calls = [{"id": call_id(k, j), "name": "run_shell_command", "args": {"command": f"echo {k} {j}"},
                  "status": "success", "timestamp": "t"} for j in range(len(step.calls))]
        message = {"id": f"g{k}", "timestamp": f"2025-11-14T10:{k:02d}:00Z", "type": "gemini",
                   "content": f"step {k}" if step.text else "", "toolCalls": calls, "model": "gemini-2.5-pro",
                   "tokens": {"input": 11 * k + 1, "cached": 10 * k, "output": 5, "thoughts": 2, "total": 0}}
        total += Usage(k + 1, 10 * k, 0, 7)
        lines.append(json.dumps(message))
        for j, fate in enumerate(step.calls):
            if fate == BROKEN:
                lines.append(json.dumps(message)[:50])
            elif fate == ANSWERED:
                calls[j]["result"] = [{"functionResponse": {"id": call_id(k, j), "name": "run_shell_command",
                                                            "response": {"output": f"out {k} {j}"}}}]
                lines.append(json.dumps(message))
        if needs_prompt(session, k):
            lines.append(json.dumps({"id": f"p{k}", "timestamp": "t", "type": "user", "content": f"prompt {k}"}))
    return {"session-x.jsonl": "\n".join(lines) + "\n"}, total, sum(s.calls.count(BROKEN) for s in session)


def cline(session: list[Step]) -> tuple[dict[str, str], Usage, int]:
    """A Cline task folder with native tool calls: results beside the environment details in the next user
    message; a broken call's request failed once and was retried (both billed)."""
    env = {"type": "text", "text": "<environment_details>\n# Current Working Directory (/w)\n</environment_details>"}
    api = [{"role": "user", "content": [{"type": "text", "text": "<task>\nDo the task.\n</task>"}, env]}]
    ui, total = [], Usage()
    for k, step in enumerate(session):
        for retry in range(1 + step.calls.count(BROKEN)):
            tokens = (k + 1, 7, 3, 10 * k) if retry == 0 else (1, 0, 0, 0)
            ui.append({"ts": 1_700_000_000_000 + k, "type": "say", "say": "api_req_started",
                       "conversationHistoryIndex": len(api) - 1, "text": json.dumps(dict(zip(
                           ("tokensIn", "tokensOut", "cacheWrites", "cacheReads"), tokens)))})
            total += Usage(tokens[0], tokens[3], tokens[2], tokens[1])
        api.append({"role": "assistant", "content": ([{"type": "text", "text": f"step {k}"}] if step.text else []) + [
            {"type": "tool_use", "id": call_id(k, j), "name": "execute_command", "input": {"command": f"echo {k}"}}
            for j in range(len(step.calls))] or [{"type": "text", "text": ""}]})
        results = [{"type": "tool_result", "tool_use_id": call_id(k, j), "content": f"out {k} {j}"}
                   for j, fate in enumerate(step.calls) if fate == ANSWERED]
        if step.calls or k + 1 < len(session):
            api.append({"role": "user", "content": [*results, env] if step.calls else [
                {"type": "text", "text": f"prompt {k}"}, env]})
    return {"api_conversation_history.json": json.dumps(api), "ui_messages.json": json.dumps(ui)}, total, 0


def aider(session: list[Step]) -> tuple[dict[str, str], Usage, int]:
    """An Aider history: an answered call is a SEARCH/REPLACE edit Aider applied, a missing one an edit it never
    reported on, a broken one a shell command it ran (calls: the edits, then the commands)."""
    out = ["\n# aider chat started at 2025-11-14 10:00:00\n\n", f"> Main model: gpt-4.1 with diff edit format{T}\n",
           f"\n#### Do the task.{T}\n"]
    total = Usage()
    for k, step in enumerate(session):
        reply = [f"step {k}"] + [f"f{k}_{j}.py\n```python\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n```"
                                 for j, fate in enumerate(step.calls) if fate != BROKEN]
        reply += [f"```bash\necho {k} {j}\n```" for j, fate in enumerate(step.calls) if fate == BROKEN]
        out.append("\n" + "\n\n".join(reply) + "\n\n")
        out.append(f"> Tokens: {11 * k + 1} sent, {10 * k} cache hit, 7 received. Cost: $0.01 message.{T}\n")
        total += Usage(k + 1, 10 * k, 0, 7)
        out += [f"> Applied edit to f{k}_{j}.py{T}\n" for j, fate in enumerate(step.calls) if fate == ANSWERED]
        for j, fate in enumerate(step.calls):
            if fate == BROKEN:
                out += [f"> echo {k} {j}{T}\n", f"> Run shell command? (Y)es/(N)o/(D)on't ask again [Yes]: y{T}\n",
                        f"> Running echo {k} {j}{T}\n", f"> Added 1 line of output to the chat.{T}\n"]
        if needs_prompt(session, k):
            out.append(f"\n#### prompt {k}{T}\n")
    return {"x.aider.chat.history.md": "".join(out)}, total, 0


def aider_ids(session: list[Step]) -> list[list[str]]:
    """The calls the Aider reader gives each step: the edits, then the commands, numbered through the run."""
    made, ids = 0, []
    for step in session:
        order = [j for j, f in enumerate(step.calls) if f != BROKEN] + [j for j, f in enumerate(step.calls)
                                                                         if f == BROKEN]
        ids.append([f"aider_{made + n:04d}" for n in range(len(order))])
        made += len(order)
    return ids


def aider_fates(session: list[Step]) -> list[list[str]]:
    """Each step's call fates in the Aider reader's order (a shell command it ran is answered)."""
    return [[f for f in s.calls if f != BROKEN] + [ANSWERED] * s.calls.count(BROKEN) for s in session]


WRITERS = {"gemini-cli": gemini, "cline": cline, "aider": aider}


def read(files: dict[str, str]):
    with tempfile.TemporaryDirectory() as folder:
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
        target = Path(folder) if "api_conversation_history.json" in files else Path(folder) / next(iter(files))
        runs = read_runs(target)
    assert len(runs) == 1
    return runs[0]


@settings(max_examples=60, deadline=None)
@given(session=steps, fmt=st.sampled_from(sorted(WRITERS)))
def test_a_written_session_reads_back_as_written(session, fmt):
    files, usage, broken = WRITERS[fmt](session)
    run = read(files)
    ids = aider_ids(session) if fmt == "aider" else [[call_id(k, j) for j in range(len(s.calls))]
                                                     for k, s in enumerate(session)]
    fates = aider_fates(session) if fmt == "aider" else [list(s.calls) for s in session]
    assert run.format == fmt
    assert [[a.call_id for a in c.actions] for c in run.calls] == ids
    final = any(f != ANSWERED for f in fates[-1])
    assert bool(run.final) == final and (run.calls[-1].position == len(run.messages)) == final
    assert list(run.unanswered) == [x for k in range(len(session)) if k < len(session) - 1 or not final
                                    for x, f in zip(ids[k], fates[k]) if f != ANSWERED]
    assert run.skipped == broken and run.usage == usage
    blocks = parse_history(run.messages).spans
    assert [x for span in blocks for x in span.call_ids] == [x for k in range(len(session))
                                                             if k < len(session) - 1 or not final for x in ids[k]]
    if fmt != "aider":  # Aider runs the broken ones' commands: they are answered
        assert final == is_final(session, len(session) - 1)


@settings(max_examples=60, deadline=None)
@given(session=steps, fmt=st.sampled_from(sorted(WRITERS)))
def test_rereading_the_normalised_output_gives_the_same_run(session, fmt):
    run = read(WRITERS[fmt](session)[0])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "plain.json"
        path.write_text(json.dumps([*run.messages, *run.final]))
        again = load_run(path)  # a plain OpenAI list; Cline's, by its <task>, is Cline's again
    assert again.format == ("cline" if fmt == "cline" else run.api)
    assert again.messages == run.messages and again.final == run.final and again.unanswered == ()
    assert [(c.position, c.actions) for c in again.calls] == [(c.position, c.actions) for c in run.calls]
