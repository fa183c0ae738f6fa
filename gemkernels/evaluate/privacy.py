"""Names and paths from the logs in reports only when asked: by default a run, its file and its project are named
by a short stable hash (``run-3f9a0c2d1e``), the same for the same name in every report and on every machine."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gemkernels.evaluate.loaders import Run, run_stem

SHOW_PATHS_HELP = "name runs, files and projects as the logs do (default: by a short hash of the name)"


def pseudonym(kind: str, text: str) -> str:
    """``<kind>-<10 hex digits of the SHA-256 of text>``."""
    return f"{kind}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def anonymised(run: Run) -> Run:
    """``run`` with its name, id, parent, file and project replaced by their pseudonyms (links stay linked: the
    same id gets the same pseudonym)."""
    def hashed(kind: str, text: str | None) -> str | None:
        return None if text is None else pseudonym(kind, text)
    return replace(run, name=pseudonym("run", run.name), id=hashed("run", run.id), parent=hashed("run", run.parent),
                   path=pseudonym("file", run.path), project=pseudonym("project", run.workspace))


def private_runs(runs: Sequence[Run], show_paths: bool) -> list[Run]:
    """The runs as reports may name them: as they are with ``show_paths``, else `anonymised`."""
    return list(runs) if show_paths else [anonymised(run) for run in runs]


def private_errors(errors: Sequence[tuple[str, str]], show_paths: bool, typed: Sequence[str] = ()
                   ) -> list[tuple[str, str]]:
    """(path, error) pairs as reports may print them: without ``show_paths`` the path is its pseudonym, and in the
    message too (as are the file's name and the run name made from it), except a path the user ``typed`` (a
    command line's: a mistyped one is named as typed)."""
    if show_paths:
        return list(errors)
    out = []
    for path, error in errors:
        if path in typed:
            out.append((path, error))
            continue
        hidden = pseudonym("file", path)
        for text in (path, Path(path).name, run_stem(Path(path))):
            error = error.replace(text, hidden) if text else error
        out.append((hidden, error))
    return out


def private_paths(paths: Sequence[str], show_paths: bool) -> list[str]:
    """The command line's input paths as reports may list them."""
    return list(paths) if show_paths else [pseudonym("input", str(path)) for path in paths]
