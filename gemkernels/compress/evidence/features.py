"""`block_features`: what the evidence rules need from one block (paths it may have changed, whether it records
an error, the sources it read), read once from its tool calls and observations."""


from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gemkernels.compress.blocks import Action, Block, json_object
from gemkernels.compress.evidence.effects import URL, Effects, unique
from gemkernels.compress.evidence.errors import has_output, is_error_output
from gemkernels.compress.evidence.python_writes import python_writes
from gemkernels.compress.evidence.shell import CONTENT_PROGRAMS, QUIET_PROGRAMS, diff_targets, shell_effects


@dataclass(frozen=True)
class BlockFeatures:
    """What the rules need from one block: paths it may have changed, error flag, sources read."""

    edited_paths: tuple[str, ...] = ()
    is_error: bool = False
    sources: tuple[str, ...] = ()
    is_source: bool = False

    @property
    def is_edit(self) -> bool:
        return bool(self.edited_paths)



def block_features(block: Block) -> BlockFeatures:
    """Features of one block, computed once; never raises on odd text."""
    observations = block.observations
    per_action = []
    for i, action in enumerate(block.actions):
        paired = observations[i] if len(observations) == len(block.actions) else "\n".join(observations)
        per_action.append(action_effects(action, paired))
    edits = unique(p for e in per_action for p in e.edits)
    sources = unique(s for e in per_action for s in e.sources)
    programs = [p for e in per_action for p in e.programs]
    content = bool(programs) and all(p in CONTENT_PROGRAMS for p in programs)
    quiet = bool(per_action) and all(e.programs and e.programs[-1] in QUIET_PROGRAMS for e in per_action)
    error = block.failed or any(is_error_output(text, content, quiet) for text in observations)
    return BlockFeatures(edited_paths=edits, is_error=error, sources=sources,
                         is_source=bool(sources) and not error and any(has_output(t) for t in observations))



# Tools
# Tool families, matched on the snake_case name at word starts ("WebFetch" -> "web_fetch").
SHELL_TOOL = re.compile(r"(?:^|_)(?:bash|shell|terminal|exec|execute|command|cmd|console|sh|zsh|run)(?:_|$)")
PYTHON_TOOL = re.compile(r"(?:^|_)(?:python|ipython|jupyter|code_interpreter|execute_code|run_code)")
EDIT_TOOL = re.compile(r"(?:^|_)(?:write|edit|create|insert|replace|append|delete|remove|rename|move|save|overwrite)")
SOURCE_TOOL = re.compile(r"(?:^|_)(?:read|view|open|cat|show|get|list|fetch|browse|search|web|url|http|navigate|"
                         r"visit|scrape|crawl|lookup|retrieve|query|find|grep|glob|download|goto|click)")
EDITOR_EDITS = {"create", "str_replace", "insert", "undo_edit", "write", "append", "edit", "delete", "rename"}
PATH_KEYS = ("path", "file_path", "filepath", "filename", "file_name", "file", "target_file", "notebook_path",
             "old_path", "new_path", "source_path", "destination_path")
URL_KEYS = ("url", "uri", "href", "link")
QUERY_KEYS = ("query", "q", "search_query", "search_term", "search", "pattern", "keywords", "term", "regex")
FILE_HEADER = re.compile(r"^\[File: ([^\s\]]+)|\(Open file: ([^\s)]+)\)", re.M)


def action_effects(action: Action, observation: str) -> Effects:
    """Effects of one tool call, by tool family: shell, Python, editor, patch, edit, read/search/fetch, other."""
    name = re.sub(r"[^a-z0-9]+", "_", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", action.name).lower()).strip("_")
    args = json_object(action.arguments)
    texts = [v for v in (args or {}).values() if isinstance(v, str)]
    command = first_value(args, ("command", "cmd", "script")) if args is not None else action.arguments
    if SHELL_TOOL.search(name) and command is not None:
        return shell_effects(command)
    if PYTHON_TOOL.search(name):
        code = first_value(args, ("code", "source", "script", "input")) if args is not None else action.arguments
        return Effects(edits=python_writes(code or ""), programs=["python"])
    paths = [v for v in (first_value(args, (k,)) for k in PATH_KEYS) if v]
    if args and isinstance(args.get("command"), str) and re.search(r"edit|file", name):
        if args["command"] == "view":
            return Effects(sources=paths, programs=["editor"])
        if args["command"] in EDITOR_EDITS:
            return Effects(edits=paths or header_paths(observation), programs=["editor"])
    if "patch" in name:
        targets = diff_targets("\n".join(texts) if args is not None else action.arguments)
        return Effects(edits=targets or paths, programs=["apply_patch"])
    if EDIT_TOOL.search(name):
        return Effects(edits=paths or header_paths(observation), programs=["editor"])
    urls = URL.findall("\n".join(texts) if args is not None else action.arguments)
    if SOURCE_TOOL.search(name):
        return Effects(sources=tool_source(name, args, paths, urls), programs=["read"])
    return Effects(sources=urls, programs=[name])


def first_value(args: dict[str, Any] | None, keys: Sequence[str]) -> str | None:
    """The first non-empty string among ``args[key]`` (an argv list is joined into one command line)."""
    for key in keys:
        value = (args or {}).get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = shlex.join(value)
        if isinstance(value, str) and value.strip():
            return value
    return None


def header_paths(observation: str) -> list[str]:
    """The file an editor without a path argument changed, from its ``[File: path`` / ``(Open file: path)`` reply."""
    match = FILE_HEADER.search(observation)
    return [match.group(1) or match.group(2)] if match else []


def tool_source(name: str, args: dict[str, Any] | None, paths: list[str], urls: list[str]) -> list[str]:
    """Source ids of a read/search/fetch tool: its URLs, else ``search:<query>``, else its paths, else the call."""
    url = first_value(args, URL_KEYS)
    query = first_value(args, QUERY_KEYS)
    found = ([url] if url else []) + urls or ([f"search:{query}"] if query else paths)
    if found or args is None:
        return found
    return [f"{name}:{json.dumps(args, sort_keys=True, ensure_ascii=False)}" if args else name]
