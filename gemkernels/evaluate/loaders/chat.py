"""Plain message lists: OpenAI chat (a JSON list, ``{"messages": [...]}``, JSON Lines, ``[timestamp, message]``
pairs), Anthropic Messages, OpenAI Responses item lists, and tau-bench result lists (one run per element).

Also the conversions text-only agents share: an assistant turn with one command and a user turn right after it
become one ``bash`` call (ids ``call_0000``, ``call_0001``, ...) and its ``tool`` result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gemkernels.compress.responses_items import is_responses_input
from gemkernels.evaluate.loaders.model import Messages, api_format, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format


def is_message(value: Any) -> bool:
    """A chat message (an object with a string role) or a Responses item (an object with a string type)."""
    return isinstance(value, dict) and (isinstance(value.get("role"), str) or isinstance(value.get("type"), str))


def checked(messages: Any, what: str) -> list[dict[str, Any]]:
    """``messages`` if it is a non-empty list of messages (or Responses items), else ``ValueError``."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{what} must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not is_message(message):
            raise ValueError(f"{what}[{i}] is not a message object with a role")
    return messages


def message_list(messages: Sequence[dict[str, Any]], stem: str, what: str) -> Draft:
    """A plain list as one run, named by its API format: ``openai``, ``anthropic`` or ``responses``."""
    messages = checked(list(messages), what)
    if not is_responses_input(messages):
        messages = unique_call_ids(messages)
    return Draft(stem, api_format(messages), messages, opening_task(messages))


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
        if message.get("role") == "assistant" and isinstance(calls, list):
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
        elif message.get("role") == "tool" and message.get("tool_call_id") in unanswered:
            message["tool_call_id"] = unanswered.pop(message["tool_call_id"])
        out.append(message)
    return out


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


def is_message_list(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(is_message(item) for item in data)


def is_messages_object(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("messages"), list)


def is_tau_bench(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(item, dict) and "traj" in item for item in data)


def is_timestamped(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(
        isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict) for item in data)


def read_tau_bench(data: list[dict[str, Any]], stem: str) -> list[Draft]:
    drafts = []
    for item in data:
        draft = message_list(item["traj"], f"{stem}/task-{item.get('task_id')}-trial-{item.get('trial', 0)}",
                             f"task {item.get('task_id')} traj")
        draft.format = "tau-bench"
        drafts.append(draft)
    return drafts


def read_timestamped(data: list[list[Any]], stem: str) -> list[Draft]:
    draft = message_list([item[1] for item in data], stem, "[timestamp, message] pairs")
    draft.format = "openai-timestamped"
    return [draft]


FORMATS = (
    Format("tau-bench", is_tau_bench, read_tau_bench),
    Format("openai-timestamped", is_timestamped, read_timestamped),
    Format("openai, anthropic, responses", is_messages_object,
           lambda data, stem: [message_list(data["messages"], stem, "messages")]),
    Format("openai, anthropic, responses", is_message_list,
           lambda data, stem: [message_list(data, stem, "messages")]),
    Format("openai, anthropic, responses", lambda data: isinstance(data, dict) and isinstance(data.get("role"), str),
           lambda data, stem: [message_list([data], stem, "messages")]),
)
