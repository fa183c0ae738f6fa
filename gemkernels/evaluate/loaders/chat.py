"""Plain message lists: OpenAI chat (a JSON list, ``{"messages": [...]}``, JSON Lines, ``[timestamp, message]``
pairs), Anthropic Messages, OpenAI Responses item lists, and tau-bench result lists (one run per element).

Also the conversions text-only agents share: an assistant turn with one command and a user turn right after it
become one ``bash`` call (ids ``call_0000``, ``call_0001``, ...) and its ``tool`` result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gemkernels.compress.responses_items import RESPONSES_TYPES, is_responses_input
from gemkernels.evaluate.loaders.model import RESPONSE_OUTPUT_TYPES, Messages, api_format, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format

#: The item types a Responses ``input`` may hold (a typed object of any other type is no message).
ITEM_TYPES = RESPONSES_TYPES | RESPONSE_OUTPUT_TYPES | {
    "message", "computer_call", "computer_call_output", "file_search_call", "code_interpreter_call", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "mcp_call", "tool_search_output"}


def is_message(value: Any) -> bool:
    """A chat message (an object with a string role) or a Responses item (an object whose type is in
    `ITEM_TYPES`)."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    return isinstance(value.get("role"), str) or isinstance(kind, str) and kind in ITEM_TYPES


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
    """Copies of ``messages`` where a call id (an OpenAI tool call's or an Anthropic tool_use's) reused after its
    earlier call was answered gets a fresh ``<id>-<n>``, and so does the result that answers it.

    Recorders reuse ids (tau-bench, SWE-agent replays, Claude Code); the pairing stays unambiguous because each use
    is answered before the next. A reuse while the earlier call is still open is left alone for `parse_history` to
    reject. Each id's next n is kept (names the log itself uses are skipped), so no name is tried twice.
    """
    taken = {call["id"] for m in messages for call in calls_in(m) if isinstance(call.get("id"), str)}
    following: dict[str, int] = {}  # recorded id used before -> the first n its next reuse may take
    unanswered: dict[str, str] = {}  # recorded id -> id it now has, until its result is seen
    out: Messages = []
    for message in messages:
        message = dict(message)
        role, calls, content = message.get("role"), message.get("tool_calls"), message.get("content")
        if role == "assistant":
            if isinstance(calls, list):
                message["tool_calls"] = [dict(call) if isinstance(call, dict) else call for call in calls]
            if isinstance(content, list):
                message["content"] = [dict(part) if is_tool_use(part) else part for part in content]
            for call in calls_in(message):
                old = call.get("id")
                if not isinstance(old, str) or old in unanswered:
                    continue
                if old in following:
                    n = following[old]
                    while f"{old}-{n}" in taken:
                        n += 1
                    call["id"] = f"{old}-{n}"
                    taken.add(call["id"])
                    following[old] = n + 1
                else:
                    following[old] = 2
                unanswered[old] = call["id"]
        elif role == "tool" and isinstance(message.get("tool_call_id"), str) and message["tool_call_id"] in unanswered:
            message["tool_call_id"] = unanswered.pop(message["tool_call_id"])
        elif role == "user" and isinstance(content, list):
            message["content"] = [{**part, "tool_use_id": unanswered.pop(part["tool_use_id"])}
                                  if answers(part, unanswered) else part for part in content]
        out.append(message)
    return out


def is_tool_use(part: Any) -> bool:
    """An Anthropic ``tool_use`` content block."""
    return isinstance(part, dict) and part.get("type") == "tool_use"


def answers(part: Any, calls: dict[str, str]) -> bool:
    """Whether ``part`` is an Anthropic ``tool_result`` block answering one of ``calls`` (keyed by tool_use id)."""
    return isinstance(part, dict) and part.get("type") == "tool_result" and isinstance(part.get("tool_use_id"), str) \
        and part["tool_use_id"] in calls


def calls_in(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's tool calls: its OpenAI ``tool_calls`` and its Anthropic ``tool_use`` content blocks."""
    calls, content = message.get("tool_calls"), message.get("content")
    return ([call for call in calls if isinstance(call, dict)] if isinstance(calls, list) else []) + (
        [part for part in content if is_tool_use(part)] if isinstance(content, list) else [])


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
