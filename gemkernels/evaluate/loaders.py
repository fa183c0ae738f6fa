"""Recorded agent runs as OpenAI chat-completions message lists, for replay and evaluation.

The format is detected from content: plain OpenAI messages (a JSON list, an object with
``messages``, or JSONL with one message per line), ``[timestamp, message]`` pairs,
``mini-swe-agent-1``, SWE-agent ``.traj`` (``history`` with or without native tool calls,
or ``trajectory`` only) and tau-bench result lists (one run per element). Text-only agents
are converted to tool calls: an assistant turn with one command and a user turn right
after it become one ``bash`` call (id ``call_0000``, ``call_0001``, ...) and its ``tool``
result; other turns keep their role and content. Every returned run parses with
`parse_history`.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemkernels.compress.blocks import content_text, is_tool_result_message, parse_history

RUN_SUFFIXES = (".json", ".jsonl", ".traj")
# mini-swe-agent 1.x's ``action_regex``: its turns count as an action only with exactly one match.
BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class Run:
    """One recorded run: messages `parse_history` accepts, the opening task text (None if absent), its source."""

    name: str
    format: str
    messages: Messages
    goal: str | None
    path: str


def load_run(path: str | os.PathLike[str]) -> Run:
    """The run in ``path``; ``ValueError`` if the file holds no run or several (use `read_runs`)."""
    runs = read_runs(path)
    if len(runs) != 1:
        raise ValueError(f"{path} holds {len(runs)} runs; read them with read_runs or load_runs")
    return runs[0]


def read_runs(path: str | os.PathLike[str]) -> list[Run]:
    """Every run in one file (a tau-bench file holds many), each validated with `parse_history`."""
    path = Path(path)
    stem = run_stem(path)
    runs = []
    for name, fmt, messages, goal in convert(read_json(path), stem):
        try:
            parse_history(messages)
        except ValueError as err:
            raise type(err)(f"run {name}: {err}") from err
        runs.append(Run(name, fmt, messages, goal, str(path)))
    return runs


def load_runs(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
              ) -> tuple[list[Run], list[tuple[str, str]]]:
    """Runs from files, directories (recursive: *.json, *.jsonl, *.traj) and globs; bad inputs as (path, error)."""
    runs: list[Run] = []
    files, errors = expand_paths(paths)
    for file in files:
        try:
            runs.extend(read_runs(file))
        except Exception as err:  # one bad file must not stop the others; it is reported instead
            errors.append((str(file), f"{type(err).__name__}: {err}"))
    return runs, errors


def checkpoints(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Positions of the assistant turns: each is one model call, and ``messages[:pos]`` is the request it answered."""
    return [i for i, message in enumerate(messages) if message.get("role") == "assistant"]


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                 ) -> tuple[list[Path], list[tuple[str, str]]]:
    """Files named by ``paths`` in order, without repeats; paths that name nothing come back as errors."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: dict[Path, None] = {}
    errors = []
    for item in items:
        text = os.fspath(item)
        matches = [Path(text)] if Path(text).exists() else [Path(p) for p in sorted(glob.glob(text, recursive=True))]
        if not matches:
            errors.append((text, "no such file, directory or glob match"))
        for match in matches:
            if match.is_dir():
                files.update(dict.fromkeys(sorted(p for p in match.rglob("*")
                                                  if p.is_file() and p.suffix in RUN_SUFFIXES)))
            else:
                files[match] = None
    return list(files), errors


def run_stem(path: Path) -> str:
    """The file name without its run suffixes (``x.traj.json`` -> ``x``)."""
    name = path.name
    while Path(name).suffix in RUN_SUFFIXES and Path(name).stem:
        name = Path(name).stem
    return name


def read_json(path: Path) -> Any:
    """The file as one JSON document, or as JSON Lines (a list of the lines' values) when it is not one."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise whole from None


def convert(data: Any, stem: str) -> list[tuple[str, str, Messages, str | None]]:
    """(name, format, messages, goal) for each run in a parsed file; ``ValueError`` when no format fits."""
    if isinstance(data, dict) and "role" in data:
        data = [data]
    if isinstance(data, dict):
        if "trajectory_format" in data:
            if data["trajectory_format"] != "mini-swe-agent-1":
                raise ValueError(f"unsupported trajectory_format {data['trajectory_format']!r}")
            messages = from_mini_swe_agent(checked(data.get("messages"), "messages"))
            return [(stem, "mini-swe-agent-1", messages, opening_task(messages))]
        if data.get("history"):
            messages, goal = from_swe_agent_history(checked(data["history"], "history"), data.get("trajectory") or [])
            return [(stem, "swe-agent", messages, goal)]
        if data.get("trajectory"):
            return [(stem, "swe-agent-trajectory", from_swe_agent_trajectory(data["trajectory"]), None)]
        if "messages" in data:
            messages = unique_call_ids(checked(data["messages"], "messages"))
            return [(stem, "openai", messages, opening_task(messages))]
        raise ValueError("an object without messages, history or trajectory: not a known run format")
    if not isinstance(data, list) or not data:
        raise ValueError("neither a run object nor a non-empty list")
    if all(isinstance(item, dict) and "traj" in item for item in data):
        runs = []
        for item in data:
            messages = unique_call_ids(checked(item["traj"], f"task {item.get('task_id')} traj"))
            name = f"{stem}/task-{item.get('task_id')}-trial-{item.get('trial', 0)}"
            runs.append((name, "tau-bench", messages, opening_task(messages)))
        return runs
    if all(isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict) for item in data):
        messages = unique_call_ids(checked([item[1] for item in data], "[timestamp, message] pairs"))
        return [(stem, "openai-timestamped", messages, opening_task(messages))]
    messages = unique_call_ids(checked(data, "messages"))
    return [(stem, "openai", messages, opening_task(messages))]


def checked(messages: Any, what: str) -> list[dict[str, Any]]:
    """``messages`` if it is a non-empty list of objects with a string role, else ``ValueError``."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{what} must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{what}[{i}] is not a message object with a role")
    return messages


def unique_call_ids(messages: Sequence[dict[str, Any]]) -> Messages:
    """Copies of ``messages`` where a call id reused after its earlier call was answered gets a fresh ``<id>-<n>``.

    Recorders reuse ids (tau-bench, SWE-agent replays); the pairing stays unambiguous because each use is answered
    before the next. A reuse while the earlier call is still open is left alone for `parse_history` to reject.
    """
    taken = {call.get("id") for m in messages for call in m.get("tool_calls") or [] if isinstance(call, dict)}
    used: set[str] = set()
    unanswered: dict[str, str] = {}  # recorded id -> id it now has, until its tool message is seen
    out: Messages = []
    for message in messages:
        message = dict(message)
        calls = message.get("tool_calls")
        if message["role"] == "assistant" and isinstance(calls, list):
            message["tool_calls"] = [dict(call) if isinstance(call, dict) else call for call in calls]
            for call in message["tool_calls"]:
                old = call.get("id") if isinstance(call, dict) else None
                if not isinstance(old, str) or old in unanswered:
                    continue
                if old in used:
                    n = 2
                    while f"{old}-{n}" in taken:
                        n += 1
                    call["id"] = f"{old}-{n}"
                    taken.add(call["id"])
                used.add(old)
                unanswered[old] = call["id"]
        elif message["role"] == "tool" and message.get("tool_call_id") in unanswered:
            message["tool_call_id"] = unanswered.pop(message["tool_call_id"])
        out.append(message)
    return out


def opening_task(messages: Sequence[dict[str, Any]]) -> str | None:
    """Text of the first user message that is not a tool result (None if there is none)."""
    for message in messages:
        if message["role"] == "user" and not is_tool_result_message(message):
            return content_text(message.get("content"))
    return None


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    """One OpenAI ``bash`` tool call with ``{"command": command}`` as its arguments."""
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command}, ensure_ascii=False)}}


def with_tool_calls(messages: Sequence[dict[str, Any]], commands: Sequence[str | None]) -> Messages:
    """Assistant turn i with ``commands[i]`` and a user turn right after it become a bash call and its tool result."""
    out: Messages = []
    answer, calls = None, 0
    for i, message in enumerate(messages):
        turn = {"role": message["role"], "content": message.get("content")}
        if answer is not None:
            out.append({"role": "tool", "tool_call_id": answer, "content": turn["content"]})
            answer = None
        elif (commands[i] is not None and message["role"] == "assistant"
              and i + 1 < len(messages) and messages[i + 1]["role"] == "user"):
            answer, calls = f"call_{calls:04d}", calls + 1
            out.append({**turn, "tool_calls": [bash_call(answer, commands[i])]})
        else:
            out.append(turn)
    return out


def from_mini_swe_agent(messages: Sequence[dict[str, Any]]) -> Messages:
    """mini-swe-agent-1 messages with each single-``bash``-block turn as a tool call (``extra`` is dropped)."""
    commands = []
    for message in messages:
        found = BASH_BLOCK.findall(content_text(message.get("content"))) if message["role"] == "assistant" else []
        commands.append(found[0] if len(found) == 1 else None)
    return with_tool_calls(messages, commands)


def from_swe_agent_history(history: Sequence[dict[str, Any]], trajectory: Sequence[Any]
                           ) -> tuple[Messages, str | None]:
    """SWE-agent ``history`` as OpenAI messages, and its task (the first user turn that is not a demonstration).

    Native function calling keeps its ``tool_calls`` and ids (``tool_call_ids`` -> ``tool_call_id``); otherwise each
    assistant turn's ``action`` (or, when the turns lack it, ``trajectory[k]["action"]``) becomes a bash call.
    """
    goal = next((content_text(m.get("content")) for m in history if m["role"] == "user" and not m.get("is_demo")), None)
    if any(m.get("tool_calls") or m.get("tool_call_ids") or m.get("tool_call_id") for m in history):
        out: Messages = []
        for i, message in enumerate(history):
            turn = {"role": message["role"], "content": message.get("content")}
            if message.get("tool_calls"):
                turn["tool_calls"] = message["tool_calls"]
            ids = [message["tool_call_id"]] if message.get("tool_call_id") else message.get("tool_call_ids")
            if ids:
                if not isinstance(ids, list) or len(ids) != 1:
                    raise ValueError(f"history[{i}] answers {ids!r}: one tool message must answer exactly one call")
                turn["tool_call_id"] = ids[0]
            out.append(turn)
        return unique_call_ids(out), goal
    assistant = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    actions = [history[i].get("action") for i in assistant]
    if any(a is None for a in actions) and len(trajectory) == len(assistant):
        actions = [step.get("action") if isinstance(step, dict) else None for step in trajectory]
    commands: list[str | None] = [None] * len(history)
    for i, action in zip(assistant, actions):
        commands[i] = action if isinstance(action, str) and action.strip() else None
    return with_tool_calls(history, commands), goal


def from_swe_agent_trajectory(trajectory: Sequence[Any]) -> Messages:
    """Each ``{thought, action, observation}`` step as an assistant bash call (content: the thought) and its result."""
    out: Messages = []
    for k, step in enumerate(trajectory):
        if not isinstance(step, dict) or not isinstance(step.get("action"), str):
            raise ValueError(f"trajectory[{k}] has no action")
        call_id = f"call_{k:04d}"
        out.append({"role": "assistant", "content": step.get("thought") or "",
                    "tool_calls": [bash_call(call_id, step["action"])]})
        out.append({"role": "tool", "tool_call_id": call_id, "content": step.get("observation") or ""})
    return out
