"""A block's text for the encoder (DESIGN.md §2 stage 2): reasoning, text, actions and observations under markers.

Only this text is shortened (head and tail kept); forwarded messages are never touched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .blocks import Block

MAX_CHARS = 12_000
ELLIPSIS = "\n[...]\n"


def content_text(content: Any) -> str:
    """Plain text of a message ``content``: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def block_text(messages: Sequence[dict[str, Any]], block: Block, max_chars: int = MAX_CHARS) -> str:
    """The block's representation text, cut to ``max_chars`` keeping its start and end."""
    assistant = messages[block.start]
    sections = []
    reasoning = assistant.get("reasoning_content") or assistant.get("reasoning")
    if reasoning:
        sections.append(f"ASSISTANT_REASONING:\n{content_text(reasoning)}")
    text = content_text(assistant.get("content"))
    if text:
        sections.append(f"ASSISTANT_TEXT:\n{text}")
    for call in assistant.get("tool_calls") or ():
        function = call.get("function") or {}
        sections.append(f"ACTION: {function.get('name', '')}\n{content_text(function.get('arguments'))}")
    for position in block.positions[1:]:
        sections.append(f"OBSERVATION:\n{content_text(messages[position].get('content'))}")
    return truncate_middle("\n\n".join(sections), max_chars)


def truncate_middle(text: str, max_chars: int) -> str:
    """``text`` if it fits, else its head and tail around an ellipsis, ``max_chars`` in all."""
    if len(text) <= max_chars:
        return text
    keep = max_chars - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head):]
