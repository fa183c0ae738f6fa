"""Anthropic prompt-cache breakpoints (``cache_control``) when compression removes the message that carried one:
the breakpoint moves to the nearest kept message before it, so the request's stable prefix stays marked.

A request holds at most `MAX_BREAKPOINTS` breakpoints (the API's limit), counting those of ``system`` and
``tools``; a breakpoint moves only onto a message that has none, onto its last content part that may carry one
(not ``thinking`` or ``redacted_thinking``); a string content becomes one text part. The moved-to message is a
copy: the caller's objects are never changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_BREAKPOINTS = 4
#: Content parts that cannot carry a breakpoint.
UNMARKABLE = ("thinking", "redacted_thinking")


def marks_in(parts: Any) -> list[Any]:
    """The ``cache_control`` values of a list of parts (a message's content, ``system``, ``tools``)."""
    if not isinstance(parts, list):
        return []
    return [part["cache_control"] for part in parts if isinstance(part, dict) and part.get("cache_control")]


def moved_marks(body: Mapping[str, Any], messages: Sequence[Any], removed: Sequence[int]) -> dict[int, dict]:
    """Position -> a copy of the kept message there with a breakpoint of a removed message added (module doc)."""
    gone = set(removed)
    count = len(marks_in(body.get("system"))) + len(marks_in(body.get("tools"))) + sum(
        len(marks_in(m.get("content"))) for p, m in enumerate(messages) if p not in gone and isinstance(m, dict))
    moved: dict[int, dict] = {}
    for p in sorted(gone):
        marks = marks_in(messages[p].get("content")) if isinstance(messages[p], dict) else []
        target = max((q for q in range(p) if q not in gone), default=None)
        if not marks or target is None or count >= MAX_BREAKPOINTS or target in moved:
            continue
        message = messages[target]
        if not isinstance(message, dict) or marks_in(message.get("content")):
            continue  # already marked: its prefix is cached as it is
        marked = with_mark(message, marks[-1])
        if marked is not None:
            moved[target] = marked
            count += 1
    return moved


def with_mark(message: dict, mark: Any) -> dict | None:
    """A copy of ``message`` whose last markable content part carries ``mark``; None when none can."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content, "cache_control": mark}]}
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        part = content[i]
        if isinstance(part, dict) and part.get("type") not in UNMARKABLE:
            return {**message, "content": [*content[:i], {**part, "cache_control": mark}, *content[i + 1:]]}
    return None
