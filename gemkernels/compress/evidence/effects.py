"""`Effects`: what an agent's actions may have changed or read (paths written, sources, programs run)."""


from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

#: A URL in an action's arguments or command line.
URL = re.compile(r"\b(?:https?|ftp)://[^\s'\"<>()\[\]{}]+")


@dataclass
class Effects:
    """What actions did: paths written, sources read, programs run (the last one per action last)."""

    edits: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    programs: list[str] = field(default_factory=list)

    def add(self, other: Effects) -> None:
        self.edits += other.edits
        self.sources += other.sources
        self.programs += other.programs




def unique(items: Any) -> tuple[str, ...]:
    """Items in first-seen order, normalised, without duplicates or empties."""
    out: dict[str, None] = {}
    for item in items:
        path = normalise_path(item)
        if path:
            out[path] = None
    return tuple(out)


def normalise_path(path: str) -> str | None:
    """A comparable path (``./a//b`` -> ``a/b``); None for nothing, stdout/stdin and /dev files. URLs and
    search ids are kept as they are."""
    path = path.strip()
    if not path or path == "-" or path.startswith("/dev/") or path.startswith("&"):
        return None
    if "://" in path or path.startswith(("search:", "<")) or ":" in path.split("/")[0]:
        return path
    return posixpath.normpath(path)
