"""Shell command lines read for their effects: the files they may write (redirects, editors, ``sed -i``, patches,
``git``), the sources they read and the programs they run; heredocs and Python fed to an interpreter included."""


from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from gemkernels.compress.evidence.effects import URL, Effects
from gemkernels.compress.evidence.python_writes import python_writes

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
FD_DUP = re.compile(r"(?:(?<!\d)\d+)?[<>]&(?:\d+|-)")  # a digit run tried once, from its start (not at each digit)
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
