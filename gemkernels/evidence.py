"""Evidence protection (DESIGN.md §2 stage 4; paper §5.2 and appendix B.2): the blocks GEM must keep.

`block_features` reads one block once (the caller caches it by ``block.key``): the paths it may
have changed, whether it records an error, and the sources it read. Each rule is a small pure
function over those features and the block embeddings that returns block indices in priority
order; `protect` runs them all and the caller unions the picks. The detectors are cheap cues,
not a model of the environment: a detected write is a *possible* change, not proof that it
happened, and an error that ages out of the window is not thereby resolved (paper §5.2).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .arrays import to_numpy
from .blocks import Action, Block
from .ragged import index_mask

RULES = ("recent", "goal", "state", "error", "source", "initial")


@dataclass(frozen=True)
class EvidenceConfig:
    """Protection limits; defaults are the paper's Table B.1.

    Table B.1 gives no count for source protection, only its activation (source-like blocks
    >= half of the history). ``source=4`` matches the recent window, so source protection can
    reach past the last four blocks (which often read the same files), while the worst-case
    protected union (4 + 1 + 3 + 2 + 4 = 14) stays below the core capacity K = 16, so the
    defaults never force the core to grow and always leave room for geometric completion.
    """

    recent: int = 4
    goal: int = 1
    state: int = 3
    error: int = 2
    error_window: int = 8
    source_fraction: float = 0.5
    source: int = 4
    initial: int = 0

    def __post_init__(self) -> None:
        for name in ("recent", "goal", "state", "error", "error_window", "source", "initial"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not 0.0 <= self.source_fraction <= 1.0:
            raise ValueError(f"source_fraction must lie in [0, 1], got {self.source_fraction!r}")


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


# --------------------------------------------------------------------------- rules


def recent_blocks(num_blocks: int, count: int) -> list[int]:
    """The last ``count`` blocks, most recent first."""
    return list(range(num_blocks - 1, max(num_blocks - count, 0) - 1, -1))


def initial_blocks(num_blocks: int, count: int) -> list[int]:
    """The first ``count`` blocks, in order."""
    return list(range(min(count, num_blocks)))


def goal_blocks(embeddings: Any, task_embedding: Any, eligible: Any, count: int) -> list[int]:
    """The ``count`` eligible blocks most similar to the task (dot product; ties: more recent first).

    None without a task embedding."""
    if task_embedding is None or count <= 0:
        return []
    x = to_numpy(embeddings)
    candidates = np.flatnonzero(index_mask(eligible, x.shape[0], "eligible", True))
    scores = (x @ np.asarray(to_numpy(task_embedding), dtype=x.dtype))[candidates].astype(np.float64)
    return [int(candidates[i]) for i in rank(scores, candidates)[:count]]


def state_blocks(features: Sequence[BlockFeatures], embeddings: Any, state_query: Any, count: int) -> list[int]:
    """Up to ``count`` change records: each edited path is represented by its latest change, paths ranked by
    that record's similarity to ``state_query`` (the caller's L2-normalised view of the task and recent blocks;
    ties, or no query: more recent first); one block per pick."""
    latest: dict[str, int] = {}
    for index, feature in enumerate(features):
        for path in feature.edited_paths:
            latest[path] = index
    records = np.array(sorted(set(latest.values())), dtype=np.int64)
    if count <= 0 or records.size == 0:
        return []
    if state_query is None:
        scores = np.zeros(records.size)
    else:
        x = np.asarray(to_numpy(embeddings), dtype=np.float64)
        scores = x[records] @ np.asarray(to_numpy(state_query), dtype=np.float64)
    return [int(records[i]) for i in rank(scores, records)[:count]]


def error_blocks(features: Sequence[BlockFeatures], window: int, count: int) -> list[int]:
    """Up to ``count`` error blocks among the last ``window`` blocks, most recent first."""
    n = len(features)
    picks = [i for i in range(n - 1, max(n - window, 0) - 1, -1) if features[i].is_error]
    return picks[:count]


def source_blocks(features: Sequence[BlockFeatures], fraction: float, count: int) -> list[int]:
    """When source-like blocks are >= ``fraction`` of all blocks: the latest block of each distinct source,
    most recent first, up to ``count``; else none."""
    n = len(features)
    if n == 0 or count <= 0 or sum(f.is_source for f in features) < fraction * n:
        return []
    seen: set[str] = set()
    picks = []
    for i in range(n - 1, -1, -1):
        if features[i].is_source and not seen.issuperset(features[i].sources):
            picks.append(i)
            seen.update(features[i].sources)
            if len(picks) == count:
                break
    return picks


def protect(features: Sequence[BlockFeatures], embeddings: Any, task_embedding: Any, state_query: Any,
            eligible: Any, config: EvidenceConfig | None = None) -> dict[str, list[int]]:
    """Every rule's picks by rule name (keys: `RULES`); the caller unions them. Inputs are not modified."""
    cfg = config or EvidenceConfig()
    n = len(features)
    x = to_numpy(embeddings)
    if x.shape[0] != n:
        raise ValueError(f"{x.shape[0]} embeddings for {n} blocks")
    return {
        "recent": recent_blocks(n, cfg.recent),
        "goal": goal_blocks(x, task_embedding, eligible, cfg.goal),
        "state": state_blocks(features, x, state_query, cfg.state),
        "error": error_blocks(features, cfg.error_window, cfg.error),
        "source": source_blocks(features, cfg.source_fraction, cfg.source),
        "initial": initial_blocks(n, cfg.initial),
    }


def evidence_picks(features: Sequence[BlockFeatures], embeddings: np.ndarray, task_embedding: Any,
                   config: EvidenceConfig) -> dict[str, list[int]]:
    """`protect` over every block with GEM's state query: the normalised sum of the recent window's mean
    embedding and the task embedding."""
    recent = embeddings[-config.recent:] if config.recent else embeddings[-1:]
    query = recent.mean(axis=0) + (task_embedding if task_embedding is not None else 0)
    norm = float(np.linalg.norm(query))
    state_query = query / norm if norm > 0 else None
    return protect(features, embeddings, task_embedding, state_query, np.ones(len(features), dtype=bool), config)


def rank(scores: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Positions ordered by score, highest first; equal scores: larger index (more recent) first."""
    return np.lexsort((-np.asarray(indices), -np.asarray(scores)))


# --------------------------------------------------------------------------- block features


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


# --------------------------------------------------------------------------- tools

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
URL = re.compile(r"\b(?:https?|ftp)://[^\s'\"<>()\[\]{}]+")
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


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None when it is not one (a raw command, a non-JSON body)."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


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


# --------------------------------------------------------------------------- shell

CONTENT_PROGRAMS = {
    "cat", "head", "tail", "less", "more", "nl", "sed", "grep", "egrep", "fgrep", "rg", "ag", "awk", "ls", "find",
    "wc", "tree", "file", "stat", "pwd", "echo", "printf", "diff", "cmp", "sort", "uniq", "cut", "tr", "which",
    "cd", "true", "mkdir", "touch", "rm", "rmdir", "cp", "mv", "tee", "chmod", "git add", "git diff", "git log",
    "git show", "git status", "git blame", "git grep", "git checkout", "git restore", "git apply", "read", "editor",
}  # programs that print file content or nothing: only their exit status (or first line) tells an error
QUIET_PROGRAMS = {"grep", "egrep", "fgrep", "rg", "ag", "diff", "cmp", "test", "[", "[[", "git grep", "git diff"}
READERS = {"cat", "head", "tail", "less", "more", "nl", "bat", "tac"}
UNLINKERS = {"rm", "rmdir", "unlink", "touch"}
GIT_READS = {"diff", "log", "show", "status", "blame", "grep"}
WRAPPERS = {"sudo", "env", "time", "nohup", "command", "exec", "nice", "stdbuf", "timeout", "builtin",
            "do", "then", "else", "elif", "if", "while", "until", "!", "{"}  # words before the program
PUNCTUATION = set(";&|<>()\n")
HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(['\"]?)([A-Za-z_][\w.-]*)\2")
FD_DUP = re.compile(r"\d*[<>]&(?:\d+|-)")
FD_NUMBER = re.compile(r"(?<![\w$])\d+(?=>)")
PYTHON = re.compile(r"^(?:python|pypy)[\d.]*$|^ipython3?$")


@dataclass
class Command:
    """One simple command: its words, redirections ``(op, target)`` and heredoc bodies."""

    words: list[str] = field(default_factory=list)
    redirects: list[tuple[str, str]] = field(default_factory=list)
    heredocs: list[str] = field(default_factory=list)


def shell_effects(command: str, depth: int = 0) -> Effects:
    """Writes, reads and programs of a shell command line (pipelines, redirections, heredocs, ``bash -c``)."""
    effects = Effects()
    for pipeline in parse_shell(command):
        piped_body = next((body for cmd in pipeline for body in cmd.heredocs), None)
        for cmd in pipeline:
            effects.add(command_effects(cmd, piped_body, depth))
    return effects


def parse_shell(command: str) -> list[list[Command]]:
    """Pipelines of simple commands; heredoc bodies are cut out first and attached to their command."""
    text, bodies = split_heredocs(command)
    text = FD_NUMBER.sub("", FD_DUP.sub(" ", text.replace("\\\n", " ")))
    pipelines: list[list[Command]] = [[Command()]]
    tokens = iter(shell_tokens(text))
    for token, operator in tokens:
        if not operator:
            pipelines[-1][-1].words.append(token)
        elif "<" in token or ">" in token:
            target = next(tokens, ("", False))[0]
            number = target[1:] if token.endswith("<<") and target.startswith("@") else ""
            if number.isdigit() and int(number) < len(bodies):
                pipelines[-1][-1].heredocs.append(bodies[int(number)])
            else:
                pipelines[-1][-1].redirects.append((token, target))
        elif token.replace("\n", "") in ("|", "|&"):
            pipelines[-1].append(Command())
        else:
            pipelines.append([Command()])
    return [[c for c in p if c.words or c.redirects] for p in pipelines if any(c.words or c.redirects for c in p)]


def split_heredocs(command: str) -> tuple[str, list[str]]:
    """The command with each heredoc body removed (its marker becomes ``<< @N``) and the bodies, in order."""
    lines = command.split("\n")
    out: list[str] = []
    bodies: list[str] = []
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        delimiters = [m.group(3) for m in HEREDOC.finditer(line)]
        numbers = iter(range(len(bodies), len(bodies) + len(delimiters)))
        out.append(HEREDOC.sub(lambda _: f" << @{next(numbers)} ", line))
        for delimiter in delimiters:
            body = []
            while i < len(lines) and lines[i].strip() != delimiter:
                body.append(lines[i])
                i += 1
            i += 1
            bodies.append("\n".join(body))
    return "\n".join(out), bodies


def shell_tokens(text: str) -> list[tuple[str, bool]]:
    """Shell words, quotes and escapes resolved, as ``(word, False)``; unquoted operator runs (``&&``, ``|``,
    ``>>``, newlines) as ``(run, True)``; ``#`` comments dropped. Unclosed quotes run to the end."""
    tokens: list[tuple[str, bool]] = []
    word: list[str] | None = None  # None between words; [] starts one (so '' is a word)
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char in " \t\r" or char in PUNCTUATION or (char == "#" and word is None):
            if word is not None:
                tokens.append(("".join(word), False))
                word = None
            j = i + 1
            if char == "#":
                j = text.find("\n", i) if text.find("\n", i) >= 0 else n
            elif char in PUNCTUATION:
                while j < n and text[j] in PUNCTUATION:
                    j += 1
                tokens.append((text[i:j], True))
            i = j
            continue
        word = [] if word is None else word
        if char == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            word.append(text[i + 1:end])
            i = end + 1
        elif char == '"':
            i += 1
            while i < n and text[i] != '"':
                escaped = text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`'
                word.append(text[i + 1] if escaped else text[i])
                i += 2 if escaped else 1
            i += 1
        else:
            escaped = char == "\\" and i + 1 < n
            word.append(text[i + 1] if escaped else char)
            i += 2 if escaped else 1
    if word is not None:
        tokens.append(("".join(word), False))
    return tokens


def strip_wrappers(words: list[str]) -> list[str]:
    """The words from the program on: leading ``VAR=value``, ``sudo``/``env``/``timeout 10`` and the like dropped."""
    i, after_wrapper = 0, False
    while i < len(words):
        word = words[i]
        skippable = word.startswith("-") or re.fullmatch(r"\d+(\.\d+)?[smhd]?", word)  # options, durations
        if re.match(r"[A-Za-z_]\w*=", word) or (after_wrapper and skippable):
            i += 1
        elif posixpath.basename(word) in WRAPPERS:
            i, after_wrapper = i + 1, True
        else:
            break
    return words[i:]


def operands(args: list[str], takes_value: set[str] = frozenset()) -> list[str]:
    """Non-option arguments; options in ``takes_value`` consume the next word; all words after ``--``."""
    out: list[str] = []
    i, only = 0, False
    while i < len(args):
        arg, i = args[i], i + 1
        if only or arg == "-" or not arg.startswith("-"):
            out.append(arg)
        elif arg == "--":
            only = True
        elif arg in takes_value:
            i += 1
    return out


def option_values(args: list[str], names: set[str]) -> list[str]:
    """Values of the options ``names`` (``-o x`` and ``--output=x``)."""
    values = [b for a, b in zip(args, args[1:]) if a in names]
    return values + [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in names and "=" in a]


def command_effects(cmd: Command, piped_body: str | None, depth: int) -> Effects:
    """Effects of one simple command: its output redirections, then what its program does."""
    edits = [target for op, target in cmd.redirects if ">" in op]
    if cmd.heredocs and any(t.endswith(".py") for t in edits):
        edits += python_writes(cmd.heredocs[0])  # a script written here is usually run next: its targets may change
    words = strip_wrappers(cmd.words)
    if not words:
        return Effects(edits=edits)
    program, args = posixpath.basename(words[0]), words[1:]
    stdin = cmd.heredocs[0] if cmd.heredocs else piped_body
    effects = program_effects(program, args, cmd, stdin, depth)
    effects.edits = edits + effects.edits
    return effects


def program_effects(program: str, args: list[str], cmd: Command, stdin: str | None, depth: int) -> Effects:
    """Writes and reads of one program invocation; ``programs`` names it (``git <sub>`` for git)."""
    found = Effects(programs=[program])
    if program in READERS:
        found.sources = operands(args, {"-n", "-c", "--lines", "--bytes"} if program in ("head", "tail") else set())
    elif program == "nl":
        found.sources = operands(args, {"-b", "-v", "-i", "-w", "-s", "-n", "-l", "-d"})
    elif program == "sed":
        return sed_effects(args)
    elif program in ("grep", "egrep", "fgrep", "rg", "ag"):
        found.sources = grep_sources(program, args)
    elif program in ("awk", "gawk"):
        files = operands(args, {"-F", "-v", "-f"})
        found.sources = files if "-f" in args else files[1:]
    elif program in ("diff", "cmp"):
        found.sources = operands(args, {"-U", "-C", "-x", "-X", "-I", "--label"})
    elif program in ("curl", "wget"):
        found.sources = URL.findall(" ".join(args))
        found.edits = option_values(args, {"-o", "--output"} if program == "curl" else {"-O", "--output-document"})
    elif program == "tee":
        found.edits = operands(args)
    elif program == "mv":
        found.edits = operands(args, {"-t", "--target-directory", "-S", "--suffix"}) + option_values(args, {"-t"})
    elif program == "cp":
        found.edits = option_values(args, {"-t", "--target-directory"}) or operands(args, {"-S", "--suffix"})[-1:]
    elif program in UNLINKERS:
        found.edits = operands(args, {"-d", "-t", "-r", "--date", "--reference"} if program == "touch" else set())
    elif program == "perl":
        found.edits = perl_edits(args)
    elif program == "patch":
        found.edits = patch_edits(args, cmd, stdin)
    elif program == "apply_patch":
        found.edits = diff_targets(stdin or "\n".join(args))
    elif program == "git":
        return git_effects(args, stdin)
    elif PYTHON.match(program):
        found.edits = python_command_writes(args, stdin)
        found.programs = ["python"]
    elif program in ("bash", "sh", "zsh") and depth < 3:
        flags = {a for a in args if re.fullmatch(r"-[a-z]*c", a)}  # -c, -lc
        script = next(iter(option_values(args, flags)), None) or (stdin if not operands(args) else None)
        return shell_effects(script, depth + 1) if script else found
    return found


def sed_effects(args: list[str]) -> Effects:
    """``sed -i`` edits its files; any other sed with file operands reads them."""
    files = operands(args, {"-e", "-f", "--expression", "--file", "-l"})
    if not any(a in ("-e", "-f") or a.startswith(("--expression", "--file")) for a in args):
        files = files[1:]  # the first operand is the script
    in_place = any(re.match(r"--in-place|-[a-zA-Z]*i", a) for a in args)
    return Effects(edits=files, programs=["sed"]) if in_place else Effects(sources=files, programs=["sed"])


def grep_sources(program: str, args: list[str]) -> list[str]:
    """Files grep reads; a recursive search is the source ``search:<pattern>``; stdin is no source."""
    files = operands(args, {"-e", "-f", "-A", "-B", "-C", "-m", "-d", "-D", "-g", "-t", "-T", "--include",
                            "--exclude", "--exclude-dir", "--glob", "--type", "--regexp", "--file", "--max-count"})
    patterns = option_values(args, {"-e", "--regexp"})
    if not patterns and files:
        patterns = [files.pop(0)]
    recursive = program in ("rg", "ag") or any(
        a in ("--recursive", "--dereference-recursive") or re.match(r"-[a-zA-Z]*[rR]", a) for a in args)
    if recursive and patterns:
        return [f"search:{patterns[0]}"]
    return files


def perl_edits(args: list[str]) -> list[str]:
    """Files of ``perl -i`` (``-pi -e script files``); none without ``-i``."""
    if not any(re.match(r"-[a-zA-Z]*i", a) for a in args if not a.startswith("--")):
        return []
    files = operands(args, {"-e", "-E", "-I", "-M"})
    return files if any(a in ("-e", "-E") for a in args) else files[1:]


def patch_edits(args: list[str], cmd: Command, stdin: str | None) -> list[str]:
    """Files ``patch`` changes: diff headers of an inline patch, the named file or ``-o``; else the patch file
    stands for its unknown targets."""
    if "--dry-run" in args:
        return []
    named = operands(args, {"-i", "--input", "-o", "--output", "-d", "--directory", "-p", "-D", "-F", "-r", "-B",
                            "-V", "-z", "-Y"})[:1]
    found = (diff_targets(stdin) if stdin else []) + named + option_values(args, {"-o", "--output"})
    patch_files = option_values(args, {"-i", "--input"}) + [t for op, t in cmd.redirects if op == "<"]
    return found or patch_files or ["<patch>"]


def git_effects(args: list[str], stdin: str | None) -> Effects:
    """``git apply`` / ``checkout`` / ``restore`` change files; ``diff``/``log``/``show``/``status``... are sources."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("-C", "-c", "--git-dir", "--work-tree") else 1
    if i >= len(args):
        return Effects(programs=["git"])
    sub, rest = args[i], args[i + 1:]
    found = Effects(programs=[f"git {sub}"])
    if sub in GIT_READS:
        found.sources = ["git:" + " ".join([sub, *rest])]
    elif sub == "apply" and ("--apply" in rest or not {"--check", "--stat", "--numstat", "--summary"} & set(rest)):
        found.edits = (diff_targets(stdin) if stdin else []) or operands(rest, {"-p", "-C", "--directory"})
    elif sub == "checkout" and not {"-b", "-B", "--orphan"} & set(rest):
        paths = rest[rest.index("--") + 1:] if "--" in rest else [a for a in operands(rest) if re.search(r"[./]", a)]
        found.edits = paths
    elif sub == "restore" and ("--worktree" in rest or "-W" in rest or not {"--staged", "-S"} & set(rest)):
        found.edits = operands(rest, {"-s", "--source"})
    return found


def python_command_writes(args: list[str], stdin: str | None) -> list[str]:
    """Writes of ``python -c code`` or of Python fed on stdin (``python - <<EOF``, ``cat <<EOF | python``)."""
    code = option_values(args, {"-c"})
    if code:
        return python_writes(code[0])
    scripts = operands(args, {"-c", "-m", "-W", "-X"})
    if "-m" in args or (scripts and scripts[0] != "-") or not stdin:
        return []
    return python_writes(stdin)


DIFF_PAIR = re.compile(r"^--- (\S+)[^\n]*\n\+\+\+ (\S+)", re.M)
PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)


def diff_targets(text: str) -> list[str]:
    """Paths a unified diff (``--- a/x`` / ``+++ b/x``) or an ``apply_patch`` envelope changes."""
    found = []
    for match in DIFF_PAIR.finditer(text):
        found += [re.sub(r"^[ab]/", "", p) for p in match.groups() if p != "/dev/null"]
    for match in PATCH_FILE.finditer(text):
        found.append(match.group(1) or match.group(2))
    return found


# --------------------------------------------------------------------------- python

PY_CALL = re.compile(r"(?<![\w])(open|write_text|write_bytes|touch|unlink|rmdir|remove|removedirs|rename|replace|"
                     r"renames|copy|copy2|copyfile|copytree|move|rmtree|save|savez|savez_compressed|savetxt|"
                     r"savefig|to_csv|to_json|to_excel|to_parquet|to_pickle)\(")
PY_ASSIGN = re.compile(r"(?:^|;)[ \t]*([A-Za-z_]\w*)[ \t]*=(?!=)[ \t]*([^;\n]+?)[ \t]*(?=;|$)", re.M)
PY_STRING = re.compile(r"([rRbBuUfF]{0,2})(['\"])((?:\\.|(?!\2).)*)\2", re.S)
WRITE_MODE = re.compile(r"[wax+]")


def python_writes(code: str) -> list[str]:
    """Paths Python code may change: ``open(p, "w"/"a"/"x"/"+")``, ``Path.write_text``, ``shutil``/``os`` file
    operations, ``savefig``/``to_csv``/``np.save``. Literal and simply assigned paths are resolved; others
    are kept as ``<expression>``."""
    assigns = {m.group(1): m.group(2) for m in PY_ASSIGN.finditer(code)}
    found = []
    for match in PY_CALL.finditer(code):
        name = match.group(1)
        head = receiver(code, match.start() - 1) if code[match.start() - 1:match.start()] == "." else ""
        args = call_arguments(code, match.end())
        for expr in written_arguments(name, head, args):
            found.append(resolve(expr, assigns) or f"<{' '.join(expr.split())[:80]}>")
    return found


MODULE_WRITES = {  # (module, function) -> the positional arguments that name written paths
    **{("os", f): slice(0, 1) for f in ("remove", "unlink", "rmdir", "removedirs")},
    **{("os", f): slice(0, 2) for f in ("rename", "replace", "renames")},
    **{("shutil", f): slice(1, 2) for f in ("copy", "copy2", "copyfile", "copytree")},
    ("shutil", "move"): slice(0, 2), ("shutil", "rmtree"): slice(0, 1), ("torch", "save"): slice(1, 2),
    **{(m, f): slice(0, 1) for m in ("np", "numpy") for f in ("save", "savez", "savez_compressed", "savetxt")},
}
MODULES = {"", "os", "shutil", "np", "numpy", "torch", "io", "codecs", "builtins"}
PATH_METHODS = {"write_text", "write_bytes", "touch", "unlink", "rmdir"}  # pathlib: the receiver is the path
SAVE_METHODS = {"savefig", "to_csv", "to_json", "to_excel", "to_parquet", "to_pickle"}  # first argument


def written_arguments(name: str, head: str, args: list[str]) -> list[str]:
    """The expressions a call ``head.name(args)`` writes to (``head`` is '' for a plain function call)."""
    positional = [a for a in args if not re.match(r"[A-Za-z_]\w*\s*=(?!=)", a)]
    keyword = dict(re.match(r"([A-Za-z_]\w*)\s*=(?!=)\s*(.*)", a, re.S).groups() for a in args if a not in positional)
    if name == "open" and head in ("", "io", "codecs", "builtins"):
        return positional[:1] if writes(positional[1] if len(positional) > 1 else keyword.get("mode", "")) else []
    if name == "open" and head not in MODULES:
        return [head] if writes(positional[0] if positional else keyword.get("mode", "")) else []
    if (head, name) in MODULE_WRITES:
        return positional[MODULE_WRITES[head, name]]
    if name in PATH_METHODS and head not in MODULES:
        return [head]
    return positional[:1] if name in SAVE_METHODS and head else []


def writes(mode: str) -> bool:
    """Whether a Python ``open`` mode literal (``'w'``, ``"a+"``, ``'xb'``) opens for writing."""
    literal = PY_STRING.fullmatch(mode.strip())
    return bool(literal and re.fullmatch(r"[rwaxbtU+]+", literal.group(3)) and WRITE_MODE.search(literal.group(3)))


def call_arguments(code: str, start: int, separator: str = ",") -> list[str]:
    """Top-level ``separator``-separated arguments from ``start`` to the unmatched ``)`` (or the end)."""
    args, depth, quote, begin, i = [], 0, "", start, start
    while i < len(code):
        char = code[i]
        if quote:
            if char == "\\":
                i += 1
            elif code.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif char in "'\"":
            quote = code[i:i + 3] if code[i:i + 3] in ("'''", '"""') else char
            i += len(quote) - 1
        elif char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char == ")" or (char == separator and depth == 0):
            args.append(code[begin:i].strip())
            begin = i + 1
            if char == ")":
                return [a for a in args if a]
        i += 1
    args.append(code[begin:].strip())
    return [a for a in args if a]


def receiver(code: str, dot: int) -> str:
    """The expression before ``code[dot] == "."``: names, dots and bracketed groups (``Path("a").x``)."""
    j = dot
    while j > 0:
        char = code[j - 1]
        if char in ")]":
            depth, j = 0, j - 1
            while j >= 0:
                depth += code[j] in ")]"
                depth -= code[j] in "(["
                if depth == 0:
                    break
                j -= 1
        elif char.isalnum() or char in "_.":
            j -= 1
        else:
            break
    return code[max(j, 0):dot].strip()


def resolve(expr: str, assigns: dict[str, str], depth: int = 0) -> str | None:
    """The path a Python expression names: a literal, ``Path(...)``, ``os.path.join(...)``, ``a / b``, or a
    name assigned one of these; None when it is not that simple."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and receiver(expr + ".", len(expr)) == expr:
        expr = expr[1:-1].strip()
    string = PY_STRING.fullmatch(expr)
    if string:
        prefix, _, value = string.groups()
        return None if "f" in prefix.lower() and "{" in value else value
    wrapped = re.fullmatch(r"(?:pathlib\.)?(?:Path|PurePath|PosixPath)\((.*)\)|os\.path\.(?:join|abspath|realpath|"
                           r"normpath|expanduser)\((.*)\)", expr, re.S)
    parts = call_arguments(expr, expr.index("(") + 1) if wrapped else call_arguments(expr, 0, "/")
    if wrapped or len(parts) > 1:
        resolved = [resolve(p, assigns, depth + 1) for p in parts]
        return "/".join(resolved) if resolved and all(resolved) else None
    if re.fullmatch(r"[A-Za-z_]\w*", expr) and expr in assigns and depth < 4:
        return resolve(assigns[expr], assigns, depth + 1)
    return None


# --------------------------------------------------------------------------- errors

RETURNCODE_TAG = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
EXIT_TEXT = re.compile(r"\b(?:return ?code|exit(?:ed with)? (?:code|status)|exit_code)\s*[:=]?\s*(-?\d+)\b", re.I)
ERROR_TEXT = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\b[A-Z]\w*(?:Error|Exception): \S"  # "ValueError: bad", "caught TypeError: x", not "except KeyError:"
    r"|(?<![\w/.\-])(?:error|Error|ERROR|fatal|FATAL|failed|Failed):"  # "error: x", not "errors=0", ".../error_log"
    r"|(?<![\w/.\-'\"])(?:ERROR|FAILED)(?![\w/.\-'\"])"  # pytest/unittest/logging, not logging.ERROR
    r"|\b(?:AssertionError|SyntaxError|IndentationError)\b"
    r"|\b[1-9]\d* (?:failed|errors?)\b"  # "2 failed, 5 passed", "1 error in 0.2s"
    r"|command not found|No such file or directory|Permission denied|Segmentation fault|\bcore dumped\b"
    r"|\btimed out\b|\bTimeout(?:Error|Expired)\b",
    re.M)
FIRST_LINE_ERROR = re.compile(
    r"^(?:[\w./-]+: )*(?:error|Error|ERROR|fatal)\b|^Traceback \(most recent call last\)|No such file or directory"
    r"|command not found|Permission denied|does not exist|No replacement was performed|did not appear verbatim")
OUTPUT_WRAPPER = re.compile(r"<returncode>\s*-?\d+\s*</returncode>|</?output>")


def exit_status(text: str) -> int | None:
    """The exit status an observation reports (``<returncode>N</returncode>``, ``exit code N``, ...), else None.

    Only the first and last 200 characters are read: harnesses report the status there, file content
    in between may mention exit codes."""
    edges = text if len(text) <= 400 else text[:200] + "\n" + text[-200:]
    match = RETURNCODE_TAG.search(edges) or EXIT_TEXT.search(edges)
    return int(match.group(1)) if match else None


def is_error_output(text: str, content: bool, quiet: bool) -> bool:
    """Whether one observation records an error.

    A non-zero exit status is an error, except status 1 of grep/diff-like commands (``quiet``: nothing
    found). Output that is file or page content (``content``) is not searched for error words: only its
    status, or its first line when no status is reported. Other output is searched for tracebacks,
    failing tests, ``error:`` and shell failures."""
    status = exit_status(text)
    if status not in (None, 0) and not (status == 1 and quiet):
        return True
    if content:
        return status is None and bool(FIRST_LINE_ERROR.search(first_line(text)))
    return bool(ERROR_TEXT.search(OUTPUT_WRAPPER.sub("", text)))


def first_line(text: str) -> str:
    """The first non-blank line of an observation, harness tags removed."""
    return next((line.strip() for line in OUTPUT_WRAPPER.sub("", text).splitlines() if line.strip()), "")


def has_output(text: str) -> bool:
    """Whether an observation carries anything beyond the harness tags."""
    return bool(OUTPUT_WRAPPER.sub("", text).strip())
