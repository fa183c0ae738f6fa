"""Properties of the log readers on generated sessions (hypothesis): one abstract session written as a Claude Code
transcript, a Codex rollout and a mini-swe-agent 2.x trajectory reads back as the calls, results, unanswered calls,
final turn, broken lines and usage it was written with; and re-reading a reader's own normalised output (its
messages and final turn as a plain list) gives the same run."""

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.compress.blocks import parse_history
from gemkernels.evaluate.loaders import Usage, load_run

ANSWERED, MISSING, BROKEN = "answered", "missing", "broken"


@dataclass(frozen=True)
class Step:
    """One model call: whether it writes text, its tool calls' fates, and whether a user prompt follows it."""

    text: bool
    calls: tuple[str, ...]
    prompt_after: bool


steps = st.lists(st.builds(Step, st.booleans(), st.lists(st.sampled_from([ANSWERED, ANSWERED, MISSING, BROKEN]),
                                                         max_size=3).map(tuple), st.booleans()),
                 min_size=1, max_size=7)


def call_id(k: int, j: int) -> str:
    return f"call_{k}_{j}"


def is_final(session: list[Step], k: int) -> bool:
    """The last step, when any of its calls has no result: the run ends on it."""
    return k == len(session) - 1 and any(fate != ANSWERED for fate in session[k].calls)


def expected_unanswered(session: list[Step]) -> list[str]:
    return [call_id(k, j) for k, step in enumerate(session) if not is_final(session, k)
            for j, fate in enumerate(step.calls) if fate != ANSWERED]


def needs_prompt(session: list[Step], k: int) -> bool:
    """A user prompt after step k: asked for, or after a text reply that does not end the session (agents wait
    for the user then)."""
    return k + 1 < len(session) and (session[k].prompt_after or not session[k].calls)


# --------------------------------------------------------------------------- writers

def claude_code(session: list[Step]) -> tuple[str, Usage]:
    """The session as Claude Code records: one record per content block, results as user records."""
    lines, total = [], Usage()
    def record(kind, message, **extra):
        lines.append(json.dumps({"type": kind, "uuid": f"u{len(lines)}", "sessionId": "s", "isSidechain": False,
                                 "message": message, **extra}))
    record("user", {"role": "user", "content": "Do the task."})
    for k, step in enumerate(session):
        blocks = ([{"type": "text", "text": f"step {k}"}] if step.text or not step.calls else []) + [
            {"type": "tool_use", "id": call_id(k, j), "name": "Bash", "input": {"command": f"echo {k} {j}"}}
            for j in range(len(step.calls))]
        for n, block in enumerate(blocks):
            record("assistant", {"id": f"msg_{k}", "role": "assistant", "model": "claude-test", "content": [block],
                                 "usage": {"input_tokens": k + 1, "cache_read_input_tokens": 10 * k,
                                           "cache_creation_input_tokens": 3, "output_tokens": 5 * (n + 1)}})
        total += Usage(k + 1, 10 * k, 3, 5 * len(blocks))
        for j, fate in enumerate(step.calls):
            result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id(k, j),
                                                   "content": f"out {k} {j}"}]}
            if fate == ANSWERED:
                record("user", result)
            elif fate == BROKEN:
                lines.append(json.dumps({"type": "user", "message": result})[:40] + " To: [REDACTED]")
        if needs_prompt(session, k):
            record("user", {"role": "user", "content": f"prompt {k}"})
    return "\n".join(lines) + "\n", total


def codex(session: list[Step]) -> tuple[str, Usage]:
    """The session as a Codex rollout: a cumulative token count before each call's items, outputs by call id."""
    lines, total = [], Usage()
    def record(kind, payload):
        lines.append(json.dumps({"timestamp": "t", "type": kind, "payload": payload}))
    def message(role, text):
        record("response_item", {"type": "message", "role": role,
                                 "content": [{"type": "output_text" if role == "assistant" else "input_text",
                                              "text": text}]})
    record("session_meta", {"id": "s"})
    message("user", "Do the task.")
    for k, step in enumerate(session):
        total += Usage(k + 1, 10 * k, 0, 7)
        count = {"type": "token_count", "info": {"last_token_usage": {
            "input_tokens": 10 * k + k + 1, "cached_input_tokens": 10 * k, "output_tokens": 7},
            "total_token_usage": {"input_tokens": total.input + total.cache_read, "output_tokens": total.output}}}
        record("event_msg", count)
        record("event_msg", count)
        if step.text or not step.calls:
            message("assistant", f"step {k}")
        for j in range(len(step.calls)):
            record("response_item", {"type": "function_call", "name": "shell", "call_id": call_id(k, j),
                                     "arguments": json.dumps({"command": ["bash", "-lc", f"echo {k} {j}"]})})
        for j, fate in enumerate(step.calls):
            if fate == ANSWERED:
                record("response_item", {"type": "function_call_output", "call_id": call_id(k, j), "output": "ok"})
            elif fate == BROKEN:
                lines.append('{"timestamp": "t", "type": "response_item", "payload": {"type": "function_call_out')
        if needs_prompt(session, k):
            message("user", f"prompt {k}")
    return "\n".join(lines) + "\n", total


def mini_swe_agent(session: list[Step]) -> tuple[str, Usage]:
    """The session as a mini-swe-agent 2.x trajectory with native tool calls, ending with its exit message."""
    messages, total = [{"role": "system", "content": "s"}, {"role": "user", "content": "Do the task."}], Usage()
    for k, step in enumerate(session):
        calls = [{"id": call_id(k, j), "type": "function",
                  "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {k} {j}"})}}
                 for j in range(len(step.calls))]
        usage = {"prompt_tokens": 11 * k + 1, "completion_tokens": 7,
                 "prompt_tokens_details": {"cached_tokens": 10 * k}}
        total += Usage(k + 1, 10 * k, 0, 7)
        messages.append({"role": "assistant", "content": f"step {k}" if step.text else "",
                         **({"tool_calls": calls} if calls else {}), "extra": {"response": {"usage": usage}}})
        messages += [{"role": "tool", "tool_call_id": call_id(k, j), "content": f"out {k} {j}"}
                     for j, fate in enumerate(step.calls) if fate == ANSWERED]
        if needs_prompt(session, k):
            messages.append({"role": "user", "content": f"prompt {k}"})
    messages.append({"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}})
    return json.dumps({"info": {}, "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}), total


WRITERS = {"claude-code": (claude_code, ".jsonl"), "codex": (codex, ".jsonl"),
           "mini-swe-agent-1.1": (mini_swe_agent, ".traj.json")}


# --------------------------------------------------------------------------- properties

def read(text: str, suffix: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"run{suffix}"
        path.write_text(text)
        return load_run(path)


@settings(max_examples=60, deadline=None)
@given(session=steps, fmt=st.sampled_from(sorted(WRITERS)))
def test_a_written_session_reads_back_as_written(session, fmt):
    write, suffix = WRITERS[fmt]
    text, usage = write(session)
    run = read(text, suffix)
    assert run.format == (fmt if any(step.calls for step in session) or fmt != "mini-swe-agent-1.1"
                          else "mini-swe-agent-1")  # by structure, a run without tool calls has text actions
    assert [[a.call_id for a in c.actions] for c in run.calls] == [
        [call_id(k, j) for j in range(len(step.calls))] for k, step in enumerate(session)]
    final = is_final(session, len(session) - 1)
    assert bool(run.final) == final and (run.calls[-1].position == len(run.messages)) == final
    assert list(run.unanswered) == expected_unanswered(session)
    assert run.skipped == (0 if fmt == "mini-swe-agent-1.1" else sum(s.calls.count(BROKEN) for s in session))
    blocks = parse_history(run.messages).spans
    assert len(blocks) == sum(bool(step.calls) for k, step in enumerate(session) if not is_final(session, k))
    assert [x for span in blocks for x in span.call_ids] == [
        call_id(k, j) for k, step in enumerate(session) if not is_final(session, k) for j in range(len(step.calls))]
    assert run.usage == usage


@settings(max_examples=60, deadline=None)
@given(session=steps, fmt=st.sampled_from(sorted(WRITERS)))
def test_rereading_the_normalised_output_gives_the_same_run(session, fmt):
    write, suffix = WRITERS[fmt]
    run = read(write(session)[0], suffix)
    again = read(json.dumps([*run.messages, *run.final]), ".json")  # plain Anthropic / Responses / OpenAI list
    assert again.format == run.api
    assert again.messages == run.messages and again.final == run.final and again.unanswered == ()
    assert [(c.position, c.actions) for c in again.calls] == [(c.position, c.actions) for c in run.calls]
