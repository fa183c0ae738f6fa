"""Which reader a parsed file goes to: the first format whose structure it has (never a version string)."""

from __future__ import annotations

from typing import Any

from gemkernels.evaluate.loaders import (
    aider,
    chat,
    claude_code,
    cline,
    codex,
    gemini_cli,
    mini_swe_agent,
    openhands,
    openhands_sdk,
    swe_agent,
)
from gemkernels.evaluate.loaders.settle import Draft, Format

#: In the order they are tried: the agent logs first, the plain message lists last.
FORMATS: tuple[Format, ...] = (*codex.FORMATS, *claude_code.FORMATS, *openhands_sdk.FORMATS, *openhands.FORMATS,
                               *mini_swe_agent.FORMATS, *swe_agent.FORMATS, *aider.FORMATS, *gemini_cli.FORMATS,
                               *cline.FORMATS, *chat.FORMATS)


def known_formats() -> str:
    """The names of the formats there are readers for, comma-separated."""
    return ", ".join(dict.fromkeys(name for fmt in FORMATS for name in fmt.name.split(", ")))


def convert(data: Any, stem: str) -> list[Draft]:
    """The drafts of the runs in a parsed file; ``ValueError`` listing the known formats when none fits."""
    for fmt in FORMATS:
        if fmt.matches(data):
            return fmt.read(data, stem)
    raise ValueError(f"not a known run format; known: {known_formats()}")
