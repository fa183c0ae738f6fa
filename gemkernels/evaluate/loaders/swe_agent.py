"""SWE-agent ``.traj`` files of every version: ``history`` with native tool calls, ``history`` whose actions are
text (``action`` per turn, or ``trajectory[k]["action"]``), or only ``trajectory`` steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gemkernels.compress.blocks import content_text
from gemkernels.evaluate.loaders.chat import bash_call, checked, unique_call_ids, with_tool_calls
from gemkernels.evaluate.loaders.model import Messages
from gemkernels.evaluate.loaders.settle import Draft, Format


def is_history(data: Any) -> bool:
    """An object whose ``history`` is a non-empty list of messages with roles."""
    history = data.get("history") if isinstance(data, dict) else None
    return isinstance(history, list) and bool(history) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in history)


def is_trajectory(data: Any) -> bool:
    """An object whose ``trajectory`` is a non-empty list of ``{thought, action, observation}`` steps."""
    steps = data.get("trajectory") if isinstance(data, dict) else None
    return isinstance(steps, list) and bool(steps) and all(isinstance(s, dict) and "action" in s for s in steps)


def read_history(data: dict[str, Any], stem: str) -> list[Draft]:
    messages, goal = from_swe_agent_history(checked(data["history"], "history"), data.get("trajectory") or [])
    return [Draft(stem, "swe-agent", messages, goal)]


def read_trajectory(data: dict[str, Any], stem: str) -> list[Draft]:
    return [Draft(stem, "swe-agent-trajectory", from_swe_agent_trajectory(data["trajectory"]), None)]


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


FORMATS = (Format("swe-agent", is_history, read_history),
           Format("swe-agent-trajectory", is_trajectory, read_trajectory))
