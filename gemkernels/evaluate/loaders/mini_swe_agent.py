"""mini-swe-agent trajectories (``{"messages", "info", "trajectory_format"}``), told apart by structure.

Text actions (1.x, and 2.x text-based configs): an assistant turn with exactly one command block and the user turn
right after it become one ``bash`` call and its result (format ``mini-swe-agent-1``). Native tool calls (2.x,
``mini-swe-agent-1.1``): the messages as the agent sent them (without its ``extra`` field). The ``exit`` message
that ends a 2.x run is not part of any request and is left out. Usage per call from ``extra.response.usage``.
"""

from __future__ import annotations

from typing import Any

from gemkernels.compress.blocks import content_text
from gemkernels.compress.text_actions import MINI_SWE_AGENT
from gemkernels.evaluate.loaders.chat import checked, with_tool_calls
from gemkernels.evaluate.loaders.model import Messages, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import openai_usage

#: mini-swe-agent's ``action_regex``: 1.x ```bash blocks, 2.x text-based ```mswea_bash_command blocks or tags; a turn
#: counts as an action only with exactly one match.
BASH_BLOCK = MINI_SWE_AGENT.action


def is_mini_swe_agent(data: Any) -> bool:
    """An object with a ``messages`` list and mini-swe-agent's ``info`` or ``trajectory_format``."""
    return (isinstance(data, dict) and isinstance(data.get("messages"), list)
            and (isinstance(data.get("info"), dict) or isinstance(data.get("trajectory_format"), str)))


def read_mini_swe_agent(data: dict[str, Any], stem: str) -> list[Draft]:
    recorded = [m for m in checked(data["messages"], "messages") if m.get("role") != "exit"]
    if any(m.get("tool_calls") or m.get("role") == "tool" for m in recorded):
        messages: Messages = [{k: v for k, v in m.items() if k != "extra"} for m in recorded]
        fmt = "mini-swe-agent-1.1"
    else:
        messages, fmt = from_mini_swe_agent(recorded), "mini-swe-agent-1"
    draft = Draft(stem, fmt, messages, opening_task(messages))
    for source, message in zip(recorded, messages):
        response = (source.get("extra") or {}).get("response") if isinstance(source.get("extra"), dict) else None
        if source.get("role") == "assistant" and isinstance(response, dict):
            if isinstance(response.get("usage"), dict):
                draft.usage[id(message)] = openai_usage(response["usage"])
            if isinstance(response.get("model"), str):
                draft.models[id(message)] = response["model"]
    return [draft]


def from_mini_swe_agent(messages: list[dict[str, Any]]) -> Messages:
    """Text-action messages with each single-command turn as a bash call (``extra`` is dropped)."""
    commands = []
    for message in messages:
        found = MINI_SWE_AGENT.commands(content_text(message.get("content"))) if message["role"] == "assistant" else ()
        commands.append(found[0] if len(found) == 1 else None)
    return with_tool_calls(messages, commands)


FORMATS = (Format("mini-swe-agent-1, mini-swe-agent-1.1", is_mini_swe_agent, read_mini_swe_agent),)
