"""Codex CLI rollouts (``~/.codex/sessions/**/rollout-*.jsonl``; the mid-2025 JSON Lines of a bare ``{id, timestamp}``
header, ``record_type`` state lines and the items unwrapped; the older ``{"session", "items"}`` JSON) as Responses API
``input`` runs.

The ``response_item`` payloads are the input as Codex sent it: messages, ``function_call`` / ``custom_tool_call`` /
``local_shell_call`` / ``tool_search_call`` and their outputs (by ``call_id``; a ``function_call_output`` answering a
``local_shell_call``, as Codex recorded one, is read as the ``local_shell_call_output`` it stands for), reasoning (its
encrypted content kept opaque); the ``event_msg`` records repeat them and are not replayed, except ``token_count``:
each new cumulative total is one call's billed usage (``last_token_usage``; ``input_tokens`` counts the cached ones),
and the first output item after it begins a new call even where the items alone would not show it (a lost output).
``compacted`` records (and ``compaction`` items) mark the agent's own rewrites; a ``compacted`` summary becomes a user
message. The shell tool's names across versions (``container.exec``, ``shell``, ``local_shell``, ``shell_command``,
``exec_command``) are one next-action name, ``shell``. A call's time is its first item's record ``timestamp``; the
project is the ``session_meta`` (or header) ``cwd``.
"""

from __future__ import annotations

from typing import Any

from gemkernels.compress.responses_items import RESPONSES_TYPES
from gemkernels.evaluate.loaders.chat import ITEM_TYPES
from gemkernels.evaluate.loaders.model import Usage, ends_response, is_output_item, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import codex_usage

#: Codex's shell tool as its versions named it -> the next-action name.
TOOL_NAMES = {"container.exec": "shell", "local_shell": "shell", "shell_command": "shell", "exec_command": "shell"}
#: Rollout items that are Codex's own bookkeeping, never sent to the model.
NOT_SENT = frozenset({"ghost_snapshot"})
ROLLOUT_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def is_rollout(data: Any) -> bool:
    """JSON Lines of ``{timestamp, type, payload}`` records of Codex's types, or a bare header and unwrapped items
    (`is_bare_rollout`), or ``{"session", "items"}``."""
    if isinstance(data, dict):
        return isinstance(data.get("session"), dict) and isinstance(data.get("items"), list)
    return isinstance(data, list) and (is_bare_rollout(data) or any(
        isinstance(r, dict) and r.get("type") in ROLLOUT_TYPES and isinstance(r.get("payload"), dict) for r in data))


def is_bare_rollout(data: list[Any]) -> bool:
    """The mid-2025 form: a header with a string ``id`` and ``timestamp`` (no ``type`` or ``role``), then only
    Codex's ``record_type`` lines and Responses items with no envelope (`ITEM_TYPES`), among them a ``record_type``
    line or an item only the Responses API has (a list of plain messages is no rollout)."""
    header = data[0] if data else None
    if not (isinstance(header, dict) and isinstance(header.get("id"), str) and isinstance(header.get("timestamp"), str)
            and "type" not in header and "role" not in header and len(data) > 1):
        return False
    kinds = [r.get("type") if isinstance(r, dict) and "payload" not in r else None for r in data[1:]]
    return all("record_type" in r or (type(kind) is str and kind in ITEM_TYPES) for r, kind in zip(data[1:], kinds)) \
        and any("record_type" in r or kind in RESPONSES_TYPES for r, kind in zip(data[1:], kinds))


def rollout_records(data: Any) -> list[dict[str, Any]]:
    """The rollout as ``{type, payload}`` records: an older form's session header as ``session_meta``, its items as
    ``response_item`` s (its ``record_type`` lines left out)."""
    if isinstance(data, dict):
        header, items = data["session"], data["items"]
    elif is_bare_rollout(data):
        header, items = data[0], [r for r in data[1:] if "record_type" not in r]
    else:
        return [r for r in data if isinstance(r, dict) and isinstance(r.get("payload"), dict)]
    return [{"type": "session_meta", "payload": header},
            *({"type": "response_item", "payload": item} for item in items if isinstance(item, dict))]


def read_rollout(data: Any, stem: str) -> list[Draft]:
    """One run: the Responses items in order, each call's usage and model, the compactions and the first prompt."""
    records = rollout_records(data)
    session = next((r["payload"].get("id") for r in records if r.get("type") == "session_meta"), None)
    draft = Draft(stem, "codex", [], None, id=session if isinstance(session, str) else stem, rename=TOOL_NAMES)
    items = draft.messages
    starts: list[tuple[int, dict[str, Any]]] = []  # (record number, first item) of each call
    usages: list[tuple[int, Usage]] = []  # (record number, usage) of each new cumulative total
    shell_calls: set[str] = set()  # the call ids of the local shell calls so far
    model, total, pending, counted = None, None, None, False
    for number, record in enumerate(records):
        kind, payload = record.get("type"), record["payload"]
        if kind == "turn_context" and isinstance(payload.get("model"), str):
            model = payload["model"]
        elif kind == "session_meta" and isinstance(payload.get("cwd"), str):
            draft.project = payload["cwd"]
        elif kind == "compacted":
            pending = "compacted"
            if isinstance(payload.get("message"), str) and payload["message"]:
                summary = {"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": payload["message"]}]}
                draft.compactions[id(summary)], pending = pending, None
                items.append(summary)
        elif kind == "event_msg" and payload.get("type") == "user_message" and draft.goal is None:
            draft.goal = payload.get("message") if isinstance(payload.get("message"), str) else None
        elif kind == "event_msg" and payload.get("type") == "token_count" and isinstance(payload.get("info"), dict):
            info = payload["info"]
            if info.get("total_token_usage") != total and isinstance(info.get("last_token_usage"), dict):
                total, counted = info.get("total_token_usage"), True
                usages.append((number, codex_usage(info["last_token_usage"])))
        elif kind == "response_item" and payload.get("type") not in NOT_SENT:
            payload = shell_output(payload, shell_calls)
            if payload.get("type") == "local_shell_call" and isinstance(payload.get("call_id"), str):
                shell_calls.add(payload["call_id"])
            if payload.get("type") == "compaction":
                pending = "compaction"
            if pending:
                draft.compactions[id(payload)], pending = pending, None
            if is_output_item(payload) and (counted or not (items and is_output_item(items[-1]))
                                            or ends_response(items[-1], payload)):
                starts.append((number, payload))
                draft.starts.add(id(payload))  # the log's own boundary: after a new count, a new call
                counted = False
                if model:
                    draft.models[id(payload)] = model
                if isinstance(record.get("timestamp"), str):
                    draft.times[id(payload)] = record["timestamp"]
            items.append(payload)
    draft.trailing_compaction = pending
    draft.goal = draft.goal or opening_task(items)
    for item, usage in attribute(starts, usages):
        draft.usage[id(item)] = usage
    return [draft]


def shell_output(item: dict[str, Any], shell_calls: set[str]) -> dict[str, Any]:
    """A ``function_call_output`` answering one of ``shell_calls`` (Codex recorded a local shell call's output so)
    as a new ``local_shell_call_output`` item; any other item as it is."""
    if item.get("type") == "function_call_output" and item.get("call_id") in shell_calls:
        return {**item, "type": "local_shell_call_output"}
    return item


def attribute(starts: list[tuple[int, dict[str, Any]]], usages: list[tuple[int, Usage]]
              ) -> list[tuple[dict[str, Any], Usage]]:
    """Each usage with its call: in order when the counts agree, else each with the first call recorded after it
    (Codex writes a call's count just before its items; a count of a turn that wrote no item joins the next call's)
    and a count after the last call with that call."""
    if len(starts) == len(usages):
        return [(item, usage) for (_, item), (_, usage) in zip(starts, usages)]
    paired: dict[int, Usage] = {}
    for number, usage in usages:
        i = next((i for i, (at, _) in enumerate(starts) if at > number), len(starts) - 1)
        if i >= 0:
            paired[i] = paired.get(i, Usage()) + usage
    return [(starts[i][1], paired[i]) for i in sorted(paired)]


FORMATS = (Format("codex", is_rollout, read_rollout),)
