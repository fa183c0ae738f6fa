"""A block's text for the encoder (DESIGN.md §2.2): reasoning, text, actions and observations under markers.

Only this text is shortened (head and tail kept); forwarded messages are never touched.
"""

from __future__ import annotations

from gemkernels.compress.blocks import Block

MAX_CHARS = 12_000
ELLIPSIS = "\n[...]\n"


def block_text(block: Block, max_chars: int = MAX_CHARS) -> str:
    """The block's representation text, cut to ``max_chars`` keeping its start and end."""
    sections = []
    if block.reasoning:
        sections.append(f"ASSISTANT_REASONING:\n{block.reasoning}")
    if block.text:
        sections.append(f"ASSISTANT_TEXT:\n{block.text}")
    sections += [f"ACTION: {action.name}\n{action.arguments}" for action in block.actions]
    sections += [f"OBSERVATION:\n{observation}" for observation in block.observations]
    return truncate_middle("\n\n".join(sections), max_chars)


def truncate_middle(text: str, max_chars: int) -> str:
    """``text`` if it fits, else its head and tail around an ellipsis, ``max_chars`` in all."""
    if len(text) <= max_chars:
        return text
    keep = max_chars - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head):]
