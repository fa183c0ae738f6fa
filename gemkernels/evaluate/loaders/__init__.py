"""Recorded agent runs in the agents' own formats, read into one run model (`Run`), for replay and evaluation.

A format is recognised by its structure, never by a version string, so an unknown version of a known format is read when
its structure matches; a file that fits no format is refused with the list of formats there are readers for. One module
per format: `claude_code` (Claude Code transcripts), `codex` (Codex CLI rollouts), `openhands` and `openhands_sdk`,
`mini_swe_agent` (text actions and native tool calls), `swe_agent` (every ``.traj`` form), `aider` (markdown chat
histories), `gemini_cli` (chats and checkpoints), `cline` (task folders), `chat` (plain OpenAI chat, Anthropic Messages
and Responses item lists, ``[timestamp, message]`` pairs, tau-bench). Unreadable JSON lines are skipped and counted
(``Run.skipped``); every returned run parses with `parse_history` (`settle`: each call paired with its result or
explicitly unanswered; a run ending on a call without a result ends there, that call ``Run.final``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from gemkernels.evaluate.loaders.files import RUN_SUFFIXES, expand_paths, read_document, run_stem, source_of
from gemkernels.evaluate.loaders.mini_swe_agent import BASH_BLOCK
from gemkernels.evaluate.loaders.model import (
    Call,
    Compaction,
    Link,
    Messages,
    NextAction,
    Run,
    Usage,
    checkpoints,
    opening_task,
)
from gemkernels.evaluate.loaders.registry import FORMATS, convert, known_formats
from gemkernels.evaluate.loaders.settle import UNANSWERED, build, final_block

__all__ = ["BASH_BLOCK", "FORMATS", "PATHS_HELP", "RUN_SUFFIXES", "UNANSWERED", "Call", "Compaction", "Link",
           "Messages", "NextAction", "Run", "Usage", "checkpoints", "convert", "expand_paths", "final_block",
           "known_formats", "link_runs", "load_run", "load_runs", "opening_task", "read_runs", "run_stem",
           "skipped_lines", "SUBAGENTS", "SUBAGENTS_HELP"]

#: Which runs of sub-agents (a run with a ``parent``) `load_runs` keeps.
SUBAGENTS = ("include", "exclude", "only")
SUBAGENTS_HELP = "sub-agents' runs: include them (default), exclude them, or replay only them"
#: What the replay commands take as input.
PATHS_HELP = ("recorded runs or agent logs: files, folder trees (~/.claude/projects, ~/.codex/sessions) or globs, "
              "in any format these readers know: " + known_formats())


def load_run(path: str | os.PathLike[str]) -> Run:
    """The run in ``path``; ``ValueError`` if the file holds no run or several (use `read_runs`)."""
    runs = read_runs(path)
    if len(runs) != 1:
        raise ValueError(f"{path} holds {len(runs)} runs; read them with read_runs or load_runs")
    return runs[0]


def read_runs(path: str | os.PathLike[str]) -> list[Run]:
    """Every run in one file (a tau-bench file, a Claude Code session with sub-agents or an Aider history holds
    several; a Cline task's history is read with its folder), each validated with `parse_history`, sub-agents linked
    to their calls (`link_runs`)."""
    path = source_of(Path(path))
    document = read_document(path)
    return link_runs([build(draft, str(path), document.skipped) for draft in convert(document.data, run_stem(path))])


def load_runs(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], subagents: str = "include",
              progress: Callable[[list[Path]], Iterable[Path]] | None = None
              ) -> tuple[list[Run], list[tuple[str, str]]]:
    """Runs from files, directories (recursive: *.json, *.jsonl, *.traj, Aider histories) and globs, sub-agents
    linked across files (``subagents``: ``include`` them, ``exclude`` them, or keep ``only`` them); bad inputs as
    (path, error). ``progress`` wraps the list of files as they are read (a progress bar)."""
    if subagents not in SUBAGENTS:
        raise ValueError(f"subagents must be one of {', '.join(SUBAGENTS)}, got {subagents!r}")
    runs: list[Run] = []
    files, errors = expand_paths(paths)
    for file in progress(files) if progress else files:
        try:
            runs.extend(read_runs(file))
        except Exception as err:  # one bad file must not stop the others; it is reported instead
            errors.append((str(file), f"{type(err).__name__}: {err}"))
    linked = link_runs(runs)
    if subagents != "include":
        linked = [run for run in linked if (run.parent is None) == (subagents == "exclude")]
    return linked, errors


def skipped_lines(runs: Sequence[Run]) -> dict[str, int]:
    """The unreadable lines skipped in each file the runs came from (files without any left out)."""
    return {run.path: run.skipped for run in runs if run.skipped}


def link_runs(runs: Sequence[Run]) -> list[Run]:
    """``runs`` with each sub-agent's ``parent_call`` filled in from its parent's `Link` s: by the child's id, else
    by its prompt (the child's goal); runs whose parent is not among ``runs`` stay as they are."""
    links = {}
    for run in runs:
        if run.id is not None and run.spawned:
            links.setdefault(run.id, []).extend(run.spawned)
    taken: set[str] = set()
    out = []
    for run in runs:
        candidates = links.get(run.parent or "", []) if run.parent_call is None else []
        link = next((x for x in candidates if x.child == run.id), None) or next(
            (x for x in candidates if x.child is None and x.prompt and x.prompt == run.goal
             and x.call_id not in taken), None)
        if link is not None:
            taken.add(link.call_id)
            run = replace(run, parent_call=link.call_id)
        out.append(run)
    return out
