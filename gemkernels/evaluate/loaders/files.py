"""Which files a path names, and a file's content: one JSON document, or JSON Lines with unreadable lines counted."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_SUFFIXES = (".json", ".jsonl", ".traj")
#: One event of an OpenHands SDK conversation folder (``events/event-00000-<id>.json``).
EVENT_FILE = re.compile(r"event-\d+-[\w-]+\.json")


@dataclass(frozen=True)
class Document:
    """A file's content: one JSON value (JSON Lines: the list of the lines' objects), and how many lines were
    skipped as unreadable."""

    data: Any
    skipped: int = 0


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                 ) -> tuple[list[Path], list[tuple[str, str]]]:
    """Files named by ``paths`` in order, without repeats; a folder of OpenHands SDK events counts as one file;
    paths that name nothing come back as errors."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: dict[Path, None] = {}
    errors = []
    for item in items:
        text = os.fspath(item)
        matches = [Path(text)] if Path(text).exists() else [Path(p) for p in sorted(glob.glob(text, recursive=True))]
        if not matches:
            errors.append((text, "no such file, directory or glob match"))
        for match in matches:
            files.update(dict.fromkeys(run_sources(match) if match.is_dir() else [match]))
    return list(files), errors


def run_sources(folder: Path) -> list[Path]:
    """The run files under ``folder`` (recursive: *.json, *.jsonl, *.traj), each event folder as one entry (the
    ``base_state.json`` beside an SDK conversation's ``events/`` is its metadata, not a run)."""
    found: list[Path] = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in RUN_SUFFIXES:
            continue
        if path.name == "base_state.json" and is_event_folder(path.parent / "events"):
            continue
        found.append(path.parent if EVENT_FILE.fullmatch(path.name) and is_event_folder(path.parent) else path)
    return list(dict.fromkeys(found))


def is_event_folder(folder: Path) -> bool:
    """Whether ``folder`` holds OpenHands SDK event files (``event-<n>-<id>.json``)."""
    return any(EVENT_FILE.fullmatch(p.name) for p in folder.glob("event-*.json"))


def run_stem(path: Path) -> str:
    """The file name without its run suffixes (``x.traj.json`` -> ``x``); an SDK conversation's ``events/`` folder
    is named by the conversation's folder."""
    if path.name == "events" and path.is_dir():
        return path.parent.name
    name = path.name
    while Path(name).suffix in RUN_SUFFIXES and Path(name).stem:
        name = Path(name).stem
    return name


def read_document(path: Path) -> Document:
    """The file as one JSON document, else as JSON Lines: every line that holds a JSON object or array, the others
    counted as skipped; the document's own error when no line is readable. An event folder: its events in order,
    unreadable event files counted as skipped."""
    if path.is_dir():
        return read_event_folder(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        return Document(json.loads(text))
    except json.JSONDecodeError as whole:
        values, skipped = [], 0
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, (dict, list)):
                values.append(value)
            else:
                skipped += 1
        if not values:
            raise whole from None
        return Document(values, skipped)


def read_event_folder(folder: Path) -> Document:
    """The ``event-<n>-<id>.json`` files of ``folder`` in their order, as a list; ``ValueError`` when there are
    none."""
    files = sorted((p for p in folder.glob("event-*.json") if EVENT_FILE.fullmatch(p.name)),
                   key=lambda p: int(p.name.split("-")[1]))
    if not files:
        raise ValueError(f"{folder} is a folder without event files")
    events, skipped = [], 0
    for file in files:
        try:
            events.append(json.loads(file.read_text(encoding="utf-8", errors="replace")))
        except json.JSONDecodeError:
            skipped += 1
    return Document(events, skipped)
