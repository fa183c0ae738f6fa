"""OpenHands V0 trajectories (a list of events) and evaluation records (``output.jsonl``: ``{"history": events,
"instruction", "metrics", ...}`` per line) as OpenAI chat runs.

With function calling, an action's ``tool_call_metadata.model_response`` is the model's whole response. An action
joins the open assistant message when it is of the same response (the same non-empty id, or without an id equal
responses) and its ``tool_call_id`` is one of that message's calls no earlier action claimed; any other action gives its
own (every tool call of its response). User messages and observations between leave the message open (its later
results go before them); the agent's other messages and a condensation close it. An observation answers the call named
by its ``tool_call_metadata.tool_call_id`` (else the action its ``cause`` names). Usage per call: the growth of
``llm_metrics.accumulated_token_usage`` where the log has it (the log's own sums), else the response's ``usage``.
Older trajectories without ids are action / observation pairs, each action one call named after it (``run`` ->
``execute_bash``, ``run_ipython`` -> ``execute_ipython_cell``). A ``condensation`` action marks a compaction.
"""

from __future__ import annotations

import json
from typing import Any

from gemkernels.evaluate.loaders.model import Messages, Usage, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import metrics_usage, openai_usage

#: Events that are OpenHands' own bookkeeping, never sent to the model.
NOT_SENT = frozenset({"recall", "change_agent_state", "agent_state_changed", "null", "pause", "resume"})
#: Legacy actions -> the tool they stand for, and the event field that is its argument.
LEGACY_TOOLS = {"run": ("execute_bash", "command"), "run_ipython": ("execute_ipython_cell", "code"),
                "browse": ("browser", "url"), "read": ("str_replace_editor", "path"), "write": ("str_replace_editor",
                                                                                              "path")}


def is_event(value: Any) -> bool:
    return isinstance(value, dict) and ("action" in value or "observation" in value) and "role" not in value


def is_events(data: Any) -> bool:
    """A list of OpenHands events (each with an ``action`` or an ``observation``)."""
    return isinstance(data, list) and bool(data) and all(is_event(e) for e in data)


def is_record(value: Any) -> bool:
    """An evaluation record: its ``history`` a list of events."""
    return isinstance(value, dict) and is_events(value.get("history"))


def is_records(data: Any) -> bool:
    return is_record(data) or (isinstance(data, list) and bool(data) and all(is_record(r) for r in data))


def read_records(data: Any, stem: str) -> list[Draft]:
    """One run per evaluation record (named ``<file>/<instance id>`` when the file holds several)."""
    records = [data] if isinstance(data, dict) else data
    drafts = []
    for n, record in enumerate(records):
        label = record.get("instance_id") or n
        draft = read_events(record["history"], stem if len(records) == 1 else f"{stem}/{label}")[0]
        instruction = record.get("instruction")
        draft.goal = instruction if isinstance(instruction, str) and instruction else draft.goal
        draft.id = str(label) if record.get("instance_id") else draft.id
        drafts.append(draft)
    return drafts


def read_events(events: list[dict[str, Any]], stem: str) -> list[Draft]:
    """One run: the events as the messages OpenHands sent (see the module docstring)."""
    if not any("id" in e for e in events):
        return [legacy(events, stem)]
    draft = Draft(stem, "openhands", [], None)
    messages = draft.messages
    group: dict[str, Any] = {}  # the model response of the open assistant message
    owned: set[Any] = set()  # the open message's call ids (none once it is closed)
    unclaimed: set[Any] = set()  # those no action has claimed yet
    end = 0  # where the open message's next result goes: after its earlier results
    calls: dict[Any, str] = {}  # action event id -> its tool call id
    accumulated = None  # the last llm_metrics.accumulated_token_usage seen
    pending = None
    for event in events:
        metadata = event.get("tool_call_metadata") if isinstance(event.get("tool_call_metadata"), dict) else {}
        added, billed, opened = None, None, False
        if "action" in event:
            kind = event["action"]
            response = metadata.get("model_response") if isinstance(metadata.get("model_response"), dict) else None
            if kind == "condensation":
                pending = "condensation"
                owned, unclaimed = set(), set()
                summary = (event.get("args") or {}).get("summary")
                added = {"role": "user", "content": summary} if isinstance(summary, str) and summary else None
            elif response is not None:
                call_id = calls[event.get("id")] = metadata.get("tool_call_id")
                if call_id not in unclaimed or not same_response(response, group):
                    added = billed = assistant_message(response)
                    group, opened = response, True
                    owned = {call["id"] for call in added.get("tool_calls", [])}
                    unclaimed = set(owned)
                    usage = response.get("usage")
                    draft.usage[id(added)] = openai_usage(usage) if isinstance(usage, dict) else Usage()
                    if isinstance(response.get("model"), str):
                        draft.models[id(added)] = response["model"]
                unclaimed.discard(call_id)
            elif kind == "system":
                added = {"role": "system", "content": text_of(event)}
            elif kind == "message":
                added = {"role": "user" if event.get("source") == "user" else "assistant", "content": text_of(event)}
                billed = added if added["role"] == "assistant" else None
        elif event.get("observation") not in NOT_SENT:
            call_id = metadata.get("tool_call_id") or calls.get(event.get("cause"))
            content = event.get("content") if isinstance(event.get("content"), str) else text_of(event)
            added = {"role": "tool", "tool_call_id": call_id, "content": content} if call_id else {
                "role": "user", "content": content}
        if billed is not None and isinstance(event.get("llm_metrics"), dict):
            now = event["llm_metrics"].get("accumulated_token_usage")
            if isinstance(now, dict):
                draft.usage[id(billed)] = metrics_usage(now, accumulated)
                accumulated = now
        if added is not None:
            if added["role"] == "tool" and added["tool_call_id"] in owned:
                messages.insert(end, added)
                end += 1
            else:
                messages.append(added)
                if opened:
                    end = len(messages)
                elif added["role"] in ("assistant", "system"):
                    owned, unclaimed = set(), set()
            if pending:
                draft.compactions[id(added)], pending = pending, None
    draft.trailing_compaction = pending
    draft.goal = opening_task(messages)
    return [draft]


def same_response(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two actions' model responses are one: the same non-empty id, or without one, equal."""
    key = one.get("id")
    return key == other.get("id") and ((isinstance(key, str) and key != "") or one == other)


def assistant_message(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a recorded chat-completions response (content and tool calls)."""
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else {}
    out: dict[str, Any] = {"role": "assistant", "content": (message or {}).get("content")}
    calls = [{"id": c.get("id"), "type": "function", "function": c.get("function")}
             for c in (message or {}).get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        out["tool_calls"] = calls
    return out


def text_of(event: dict[str, Any]) -> str:
    """An event's text: ``args.content``, else its ``content``, else its ``message``."""
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    for value in (args.get("content"), event.get("content"), event.get("message")):
        if isinstance(value, str):
            return value
    return ""


def legacy(events: list[dict[str, Any]], stem: str) -> Draft:
    """Action / observation pairs without ids: the first message is the task, each other action one call."""
    messages: Messages = []
    open_call = None
    for n, event in enumerate(events):
        kind = event.get("action")
        if kind == "message":
            messages.append({"role": "user" if not messages else "assistant", "content": text_of(event)})
            open_call = None
        elif kind is not None:
            name, field = LEGACY_TOOLS.get(kind, (kind, None))
            arguments = {field: event.get(field)} if field else {
                k: v for k, v in event.items() if k not in ("action", "thought", "action_risk", "is_confirmed",
                                                            "keep_prompt", "kernel_init_code")}
            open_call = f"call_{n:04d}"
            messages.append({"role": "assistant", "content": event.get("thought") or "", "tool_calls": [
                {"id": open_call, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]})
        elif event.get("observation") not in NOT_SENT:
            messages.append({"role": "tool", "tool_call_id": open_call, "content": text_of(event)} if open_call
                            else {"role": "user", "content": text_of(event)})
            open_call = None
    return Draft(stem, "openhands", messages, opening_task(messages))


FORMATS = (Format("openhands", is_records, read_records),
           Format("openhands", is_events, read_events))
