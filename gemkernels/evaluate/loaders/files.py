"""Which files a path names, and a file's content: one JSON document, JSON Lines with unreadable lines counted, or
the text of a markdown file (Aider's history)."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemkernels.evaluate.loaders.cline import API_HISTORY, TASK_METADATA, UI_MESSAGES

RUN_SUFFIXES = (".json", ".jsonl", ".traj")
#: Aider's chat history (``--chat-history-file`` renames it; a file named on the command line is read whatever its
#: name): markdown, read as text.
AIDER_HISTORY = ".aider.chat.history.md"
#: Folders a scan does not enter: other programs' files (packages, version control, caches), never an agent's logs.
NOT_LOGS = frozenset({"node_modules", ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "site-packages",
                      ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
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
    """Files named by ``paths`` in order, without repeats; a folder of OpenHands SDK events and a Cline task folder
    count as one file; paths that name nothing come back as errors."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: dict[Path, None] = {}
    errors = []
    for item in items:
        text = os.path.expanduser(os.fspath(item))  # a quoted ~ the shell left as it was
        matches = [Path(text)] if Path(text).exists() else [Path(p) for p in sorted(glob.glob(text, recursive=True))]
        if not matches:
            errors.append((text, "no such file, directory or glob match"))
        for match in matches:
            files.update(dict.fromkeys(run_sources(match) if match.is_dir() else [source_of(match)]))
    return list(files), errors


def run_sources(folder: Path) -> list[Path]:
    """The run files under ``folder`` (recursive: *.json, *.jsonl, *.traj, Aider histories), each event folder and
    Cline task folder as one entry; metadata beside runs is left out (an SDK conversation's ``base_state.json``, the
    ``logs.json`` of the user's prompts beside Gemini CLI's ``chats/``)."""
    found: list[Path] = []
    for path in sorted(walk_files(folder)):
        if path.suffix not in RUN_SUFFIXES and not path.name.endswith(AIDER_HISTORY):
            continue
        if (path.name == "base_state.json" and is_event_folder(path.parent / "events")) or (
                path.name == "logs.json" and (path.parent / "chats").is_dir()):
            continue
        if is_task_folder(path.parent):  # the API history, its UI log, its metadata, Cline's other task files
            path = path.parent
        found.append(path.parent if EVENT_FILE.fullmatch(path.name) and is_event_folder(path.parent) else path)
    return list(dict.fromkeys(found))


def walk_files(folder: Path) -> Iterable[Path]:
    """Every regular file under ``folder``, outside the folders no agent writes its logs in (`NOT_LOGS`: installed
    packages, version control, caches), which are not entered."""
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if name not in NOT_LOGS]
        paths = (Path(root) / name for name in files)
        yield from (path for path in paths if path.is_file())  # not a FIFO, a socket or a dead link


def source_of(path: Path) -> Path:
    """The run source a named file belongs to: a Cline task's API history is its task folder."""
    return path.parent if path.name == API_HISTORY else path


def is_task_folder(folder: Path) -> bool:
    """Whether ``folder`` is a Cline task folder (it holds the API history)."""
    return (folder / API_HISTORY).is_file()


def is_event_folder(folder: Path) -> bool:
    """Whether ``folder`` holds OpenHands SDK event files (``event-<n>-<id>.json``)."""
    return any(EVENT_FILE.fullmatch(p.name) for p in folder.glob("event-*.json"))


def run_stem(path: Path) -> str:
    """The file name without its run suffixes (``x.traj.json`` -> ``x``); an SDK conversation's ``events/`` folder
    is named by the conversation's folder."""
    if path.name == "events" and path.is_dir():
        return path.parent.name
    if path.name.endswith(AIDER_HISTORY):
        return path.name[:-len(AIDER_HISTORY)] or path.resolve().parent.name
    name = path.name
    while Path(name).suffix in RUN_SUFFIXES and Path(name).stem:
        name = Path(name).stem
    return name


def read_document(path: Path) -> Document:
    """The file as one JSON document, else (and a one-line ``.jsonl`` file) as JSON Lines: every line that holds a
    JSON object or array, the others counted as skipped; ``ValueError`` naming the file when it is empty or no line is
    readable. A byte order mark is skipped. A markdown file: its text. An event folder: its events in order,
    unreadable event files counted as skipped; a Cline task folder, `read_task_folder`."""
    if path.is_dir():
        return read_task_folder(path) if is_task_folder(path) else read_event_folder(path)
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # -sig: a byte order mark is not content
    if path.suffix == ".md":
        return Document(text)
    if not text.strip():
        raise ValueError(f"{path.name} is empty")
    lines, whole = [line for line in text.splitlines() if line.strip()], None
    if path.suffix != ".jsonl" or len(lines) > 1:  # one line of JSON Lines is a list of one record
        try:
            return Document(json.loads(text))
        except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than the parser goes
            whole = err
    values, skipped = [], 0
    for line in lines:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, (dict, list)):
            values.append(value)
        else:
            skipped += 1
    if not values:
        raise ValueError(f"{path.name} is not JSON ({whole})" if whole else
                         f"{path.name}: no line holds a JSON object or array")
    return Document(values, skipped)


def read_task_folder(folder: Path) -> Document:
    """A Cline task folder: its files' JSON by name (the API history must be readable; an unreadable UI log or
    metadata file is counted as skipped and left out)."""
    data: dict[str, Any] = {API_HISTORY: json.loads((folder / API_HISTORY).read_text(encoding="utf-8",
                                                                                      errors="replace"))}
    skipped = 0
    for name in (UI_MESSAGES, TASK_METADATA):
        if (folder / name).is_file():
            try:
                data[name] = json.loads((folder / name).read_text(encoding="utf-8", errors="replace"))
            except json.JSONDecodeError:
                skipped += 1
    return Document(data, skipped)


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
