"""Gemini CLI chats (``~/.gemini/tmp/<project hash>/chats/session-*.json`` and ``.jsonl``) and ``/chat save``
checkpoints (``checkpoint-<tag>.json``) as OpenAI chat runs.

A session file is one JSON record (``{sessionId, projectHash, messages}``, the older form) or JSON Lines: a metadata
record, message records (a message written again with the same ``id`` replaces the earlier one: its tool results and
token counts arrive later), ``{"$set": {...}}`` updates and ``{"$rewindTo": id}`` (the messages from that one on are
dropped, as the CLI drops them). A ``user`` message is the user's turn; a ``gemini`` message is one model call: its text
and ``toolCalls`` (``id``, ``name``, ``args``), answered by each call's recorded ``result`` (its ``functionResponse``
output); a call without a result is unanswered. ``info`` / ``error`` / ``warning`` messages are the CLI's own and are
not sent; neither are ``thoughts`` (summaries). Usage from ``tokens``: ``input`` (the prompt, counting the ``cached``
tokens) and ``tool`` (tool-use prompt) as input, ``output`` and ``thoughts`` as output. A ``$set`` of the whole message
list that drops messages (the CLI compressing its history) is a compaction at the summary it adds (`rewritten`). A
checkpoint is the Gemini API history itself: ``{role: user | model, parts}`` with ``functionCall`` and
``functionResponse`` parts (no usage). The project is the session's ``projectHash``.
"""

from __future__ import annotations

import json
from typing import Any

from gemkernels.evaluate.loaders.model import Messages, Usage, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import tokens as count

MESSAGE_TYPES = frozenset({"user", "gemini", "info", "error", "warning"})


def is_message_record(record: Any) -> bool:
    """A Gemini CLI message record: an ``id`` and a ``type`` among the CLI's message types."""
    return isinstance(record, dict) and isinstance(record.get("id"), str) and record.get("type") in MESSAGE_TYPES


def is_gemini_session(data: Any) -> bool:
    """``{sessionId, projectHash, messages}``, or JSON Lines of a metadata record and message records."""
    if isinstance(data, dict):
        return isinstance(data.get("sessionId"), str) and isinstance(data.get("messages"), list) and (
            "projectHash" in data or any(is_message_record(m) for m in data["messages"]))
    return isinstance(data, list) and any(isinstance(r, dict) and isinstance(r.get("sessionId"), str)
                                          and isinstance(r.get("projectHash"), str) for r in data) and any(
        is_message_record(r) for r in data)


def session_messages(records: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]], set[str]]:
    """The session's metadata, its message records in order (latest version of each), and the ids of the messages
    after which a ``$set`` of the message list dropped earlier ones (a compaction)."""
    meta: dict[str, Any] = {}
    current: dict[str, dict[str, Any]] = {}
    compacted: set[str] = set()
    for record in records:
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("$rewindTo"), str):
            ids = list(current)
            cut = ids.index(record["$rewindTo"]) if record["$rewindTo"] in current else 0
            for key in ids[cut:]:
                del current[key]
        elif is_message_record(record):
            current[record["id"]] = {**current.get(record["id"], {}), **record}
        elif isinstance(record.get("$set"), dict):
            update = record["$set"]
            meta.update({k: v for k, v in update.items() if k != "messages"})
            listed = [m for m in update.get("messages") or [] if is_message_record(m)]
            if listed and set(current) - {m["id"] for m in listed}:
                current = rewritten(current, listed, compacted)
        elif isinstance(record.get("sessionId"), str):
            meta.update(record)
    return meta, list(current.values()), compacted


def rewritten(current: dict[str, dict[str, Any]], listed: list[dict[str, Any]], compacted: set[str]
              ) -> dict[str, dict[str, Any]]:
    """The session after a ``$set`` of a message list that drops some of ``current``: the user messages it adds
    (the summary; its synthetic model acknowledgement is not a model call and is left out) go before the kept
    messages that follow them in the list when no model call comes after those, else at the end; the first added
    one is put in ``compacted``. Kept messages keep the content they were sent with."""
    new = [m for m in listed if m["id"] not in current and m["type"] == "user"]
    if not new:
        return current
    compacted.add(new[0]["id"])
    after = listed[listed.index(new[0]) + 1:]
    anchor = next((m["id"] for m in after if m["id"] in current), None)
    order = list(current)
    at = order.index(anchor) if anchor is not None else len(order)
    if any(current[key]["type"] == "gemini" for key in order[at:]):
        at = len(order)
    keys = order[:at] + [m["id"] for m in new] + order[at:]
    added = {m["id"]: m for m in new}
    return {key: current.get(key) or added[key] for key in keys}


def read_gemini_session(data: Any, stem: str) -> list[Draft]:
    """One run: the user and gemini messages as OpenAI chat, each gemini message's usage, model and time."""
    if isinstance(data, dict):
        meta, records, compacted = data, [m for m in data["messages"] if is_message_record(m)], set()
    else:
        meta, records, compacted = session_messages(data)
    draft = Draft(stem, "gemini-cli", [], None, id=meta.get("sessionId") or stem)
    draft.project = meta.get("projectHash") if isinstance(meta.get("projectHash"), str) else None
    messages = draft.messages
    for record in records:
        first = len(messages)
        if record["type"] == "user":
            messages.append({"role": "user", "content": parts_text(record.get("content"))})
        elif record["type"] == "gemini":
            assistant: dict[str, Any] = {"role": "assistant", "content": parts_text(record.get("content"))}
            calls = [c for c in record.get("toolCalls") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)]
            if calls:
                assistant["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": str(c.get("name", "")), "arguments": json.dumps(c.get("args") or {}, ensure_ascii=False)}}
                    for c in calls]
            messages.append(assistant)
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": parts_text(c["result"])}
                            for c in calls if c.get("result") is not None)
            if isinstance(record.get("tokens"), dict):
                draft.usage[id(assistant)] = gemini_usage(record["tokens"])
            if isinstance(record.get("model"), str):
                draft.models[id(assistant)] = record["model"]
            if isinstance(record.get("timestamp"), str):
                draft.times[id(assistant)] = record["timestamp"]
        if record["id"] in compacted and len(messages) > first:
            draft.compactions[id(messages[first])] = "compression"
    draft.goal = opening_task(messages)
    return [draft]


def gemini_usage(tokens: dict[str, Any]) -> Usage:
    """A message's ``tokens``: the prompt counts the cached tokens; tool-use prompt tokens are input, thoughts
    output."""
    cached = count(tokens, "cached")
    return Usage(max(count(tokens, "input") - cached, 0) + count(tokens, "tool"), cached, 0,
                 count(tokens, "output") + count(tokens, "thoughts"))


def parts_text(content: Any) -> str:
    """The text a Gemini ``PartListUnion`` carries: text parts, and each ``functionResponse``'s output (its
    ``output`` or ``error`` field, else the response as JSON)."""
    if isinstance(content, str):
        return content
    items = content if isinstance(content, list) else [content]
    texts = []
    for part in items:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("functionResponse"), dict):
            response = part["functionResponse"].get("response")
            value = response.get("output", response.get("error")) if isinstance(response, dict) else response
            texts.append(value if isinstance(value, str) else json.dumps(response, ensure_ascii=False))
    return "\n".join(texts)


def is_checkpoint(data: Any) -> bool:
    """A saved Gemini API history: ``{role: user | model, parts: [...]}`` contents (or ``{"history": [...]}``)."""
    history = data.get("history") if isinstance(data, dict) else data
    return isinstance(history, list) and bool(history) and all(
        isinstance(c, dict) and c.get("role") in ("user", "model") and isinstance(c.get("parts"), list)
        for c in history)


def read_checkpoint(data: Any, stem: str) -> list[Draft]:
    """One run from the contents: model turns with their ``functionCall`` s, the ``functionResponse`` s that answer
    them (by id, else by name in order) as tool messages, text parts as they are."""
    history = data.get("history") if isinstance(data, dict) else data
    messages: Messages = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not yet answered
    made = 0
    for content in history:
        texts = [p["text"] for p in content["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if content["role"] == "model":
            calls = []
            for part in content["parts"]:
                call = part.get("functionCall") if isinstance(part, dict) else None
                if isinstance(call, dict):
                    call_id = call.get("id") if isinstance(call.get("id"), str) else f"gemini_{made:04d}"
                    made += 1
                    calls.append({"id": call_id, "type": "function", "function": {
                        "name": str(call.get("name", "")),
                        "arguments": json.dumps(call.get("args") or {}, ensure_ascii=False)}})
                    open_calls.append((call_id, str(call.get("name", ""))))
            messages.append({"role": "assistant", "content": "\n".join(texts),
                             **({"tool_calls": calls} if calls else {})})
            continue
        for part in content["parts"]:
            response = part.get("functionResponse") if isinstance(part, dict) else None
            if isinstance(response, dict):
                call_id = answered(open_calls, response)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": parts_text([part])})
        if texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    return [Draft(stem, "gemini-cli", messages, opening_task(messages))]


def answered(open_calls: list[tuple[str, str]], response: dict[str, Any]) -> str:
    """The id of the open call a ``functionResponse`` answers (its own id, else the first open call of its name),
    taken off ``open_calls``; a response to no open call keeps its own id (an orphan, dropped when settled)."""
    wanted = response.get("id")
    for i, (call_id, name) in enumerate(open_calls):
        if call_id == wanted or (not isinstance(wanted, str) and name == response.get("name")):
            del open_calls[i]
            return call_id
    return str(wanted or f"orphan-{response.get('name')}")


FORMATS = (Format("gemini-cli", is_gemini_session, read_gemini_session),
           Format("gemini-cli", is_checkpoint, read_checkpoint))
