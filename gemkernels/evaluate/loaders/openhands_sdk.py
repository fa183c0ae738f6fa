"""OpenHands V1 (software-agent-sdk) conversations: a folder of ``event-<n>-<id>.json`` files, or the same events as
JSON Lines, as OpenAI chat runs.

A ``SystemPromptEvent`` is the system message, a ``MessageEvent`` its ``llm_message``; the ``ActionEvent`` s of one
model response (one ``llm_response_id``) are one assistant message with their ``tool_call`` s, answered by the
``ObservationEvent`` / ``AgentErrorEvent`` / ``UserRejectObservation`` with the same ``tool_call_id``. Usage per
call: the growth of the ``stats`` state update's ``accumulated_token_usage`` recorded before it. A
``Condensation`` marks a compaction (its summary, where it has one, becomes a user message).
"""

from __future__ import annotations

from typing import Any

from gemkernels.evaluate.loaders.model import opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import metrics_usage

RESULT_KINDS = frozenset({"ObservationEvent", "AgentErrorEvent", "UserRejectObservation"})
CONDENSATION_KINDS = frozenset({"Condensation", "CondensationSummaryEvent"})


def is_sdk_events(data: Any) -> bool:
    """A list of SDK events: objects with a ``kind`` among the event classes."""
    return isinstance(data, list) and bool(data) and all(isinstance(e, dict) for e in data) and any(
        e.get("kind") in ("MessageEvent", "ActionEvent", "SystemPromptEvent") for e in data)


def read_sdk_events(events: list[dict[str, Any]], stem: str) -> list[Draft]:
    draft = Draft(stem, "openhands-sdk", [], None)
    messages = draft.messages
    responses: dict[Any, dict[str, Any]] = {}  # llm_response_id -> its assistant message
    accumulated, unbilled, pending = None, None, None  # usage recorded, not yet given to a call; a compaction
    for event in events:
        kind, added = event.get("kind"), None
        if kind == "ConversationStateUpdateEvent" and event.get("key") == "stats":
            now = total_usage(event.get("value"))
            if now is not None:
                grown = metrics_usage(now, accumulated)
                unbilled, accumulated = grown if unbilled is None else unbilled + grown, now
            continue
        if kind == "SystemPromptEvent":
            added = {"role": "system", "content": text((event.get("system_prompt") or {}).get("text"))}
        elif kind == "MessageEvent" and isinstance(event.get("llm_message"), dict):
            message = event["llm_message"]
            added = {"role": message.get("role", "user"), "content": text(message.get("content"))}
            if message.get("reasoning_content"):
                added["reasoning_content"] = message["reasoning_content"]
        elif kind == "ActionEvent" and isinstance(event.get("tool_call"), dict):
            call = event["tool_call"]
            tool_call = {"id": call.get("id") or event.get("tool_call_id"), "type": "function",
                         "function": {"name": call.get("name") or event.get("tool_name"),
                                      "arguments": call.get("arguments") or "{}"}}
            response = event.get("llm_response_id")
            if response is not None and response in responses and messages and messages[-1] is responses[response]:
                responses[response]["tool_calls"].append(tool_call)
            else:
                added = responses[response] = {"role": "assistant", "content": text(event.get("thought")),
                                               "tool_calls": [tool_call]}
                if event.get("reasoning_content"):
                    added["reasoning_content"] = event["reasoning_content"]
        elif kind in RESULT_KINDS:
            result = event.get("observation") if isinstance(event.get("observation"), dict) else {}
            body = result.get("content") if result else event.get("error") or event.get("rejection_reason")
            added = {"role": "tool", "tool_call_id": event.get("tool_call_id"), "content": text(body)}
        elif kind in CONDENSATION_KINDS:
            pending = "condensation"
            if isinstance(event.get("summary"), str) and event["summary"]:
                added = {"role": "user", "content": event["summary"]}
        if added is None:
            continue
        messages.append(added)
        if added.get("role") == "assistant" and unbilled is not None:
            draft.usage[id(added)], unbilled = unbilled, None
        if pending:
            draft.compactions[id(added)], pending = pending, None
    draft.trailing_compaction = pending
    draft.goal = opening_task(messages)
    return [draft]


def total_usage(value: Any) -> dict[str, Any] | None:
    """The accumulated token usage summed over the LLMs of a ``stats`` update (None: it has none)."""
    metrics = value.get("usage_to_metrics") if isinstance(value, dict) else None
    if not isinstance(metrics, dict):
        return None
    usages = [m.get("accumulated_token_usage") for m in metrics.values() if isinstance(m, dict)]
    usages = [u for u in usages if isinstance(u, dict)]
    keys = ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens")
    return {k: sum(u.get(k) or 0 for u in usages) for k in keys} if usages else None


def text(content: Any) -> str:
    """The text of SDK content: a string, or the ``text`` of each part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


FORMATS = (Format("openhands-sdk", is_sdk_events, read_sdk_events),)
