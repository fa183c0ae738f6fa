"""Interaction blocks of an OpenAI chat-completions history (DESIGN.md §2 stage 1).

A removable block is one assistant message with ``tool_calls`` plus every ``tool`` message
answering them (matched by id). Everything else (system/task prefix, plain messages,
incomplete blocks) is kept. Blocks refer to the caller's messages by position; nothing
is copied or changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class BlockStructureError(ValueError):
    """The history cannot be split safely (duplicate or unmatched tool-call ids); forward it unchanged."""


@dataclass(frozen=True)
class Block:
    """One removable block: the assistant message at ``start`` and its tool results, by message position."""

    positions: tuple[int, ...]

    @property
    def start(self) -> int:
        return self.positions[0]


def split_blocks(messages: Sequence[dict[str, Any]]) -> list[Block]:
    """Removable blocks in order; raises `BlockStructureError` when tool-call ids are duplicated or unmatched."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise BlockStructureError(f"messages must be a list, got {type(messages).__name__}")
    owner: dict[str, int] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BlockStructureError(f"message {i} is {type(message).__name__}, not an object")
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    raise BlockStructureError(f"message {i} has a tool call without an id")
                if call_id in owner:
                    raise BlockStructureError(f"tool call id {call_id!r} is used twice (messages {owner[call_id]} "
                                              f"and {i})")
                owner[call_id] = i

    results: dict[int, list[int]] = {i: [] for i in set(owner.values())}
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        if call_id not in owner:
            raise BlockStructureError(f"tool message {i} answers unknown call id {call_id!r}")
        if call_id in answered:
            raise BlockStructureError(f"tool call id {call_id!r} is answered twice")
        if i < owner[call_id]:
            raise BlockStructureError(f"tool message {i} comes before its call (message {owner[call_id]})")
        answered.add(call_id)
        results[owner[call_id]].append(i)
    missing = sorted(set(owner) - answered)
    if missing:
        raise BlockStructureError(f"tool call {missing[0]!r} (message {owner[missing[0]]}) has no result")
    return [Block((start, *results[start])) for start in sorted(results)]
