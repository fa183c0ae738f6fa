"""Help text from docstrings: what ``gem <command> --help`` prints as a command's description."""

from __future__ import annotations


def description(doc: str | None) -> str:
    """The first paragraph of ``doc`` as one line, without reStructuredText's double backticks."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split()).replace("``", "")
