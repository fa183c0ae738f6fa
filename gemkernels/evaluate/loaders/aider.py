"""Aider chat histories (``.aider.chat.history.md``) as OpenAI chat runs, one run per ``# aider chat started at``.

Aider writes markdown: ``#### `` lines are the user's input, ``> `` lines (each entry ending in two spaces) its own
output, everything else the model's replies. Its actions are text, so the replies are given tool calls the way the
text-action conversions do: each file a reply edits (the files of its SEARCH/REPLACE blocks, and those Aider reports as
``Applied edit to``) is one ``edit`` call, and each group of shell commands Aider offers to run (``Run shell command?``)
one ``bash`` call, answered by what Aider reported (``Applied edit to``, ``Running``, the output it added to the chat,
which the history does not keep, or the edit errors); a call Aider reported nothing for is left unanswered. Shell output
the user added with ``/run``, ``/test`` or ``!`` is the user message Aider sends (``I ran this command``, the output not
kept); other in-chat commands are not sent and are left out, and Aider's ``Ok.`` after an added output is not a model
call. Each ``Tokens:`` line is its reply's usage: Aider's rounded counts (``sent`` counting the cache's reads and
writes). ``/clear`` and ``/reset`` are compactions. A reply that follows another with only Aider's output between
answers a message Aider made itself (an edit error, the architect's plan, the files the user added when the reply named
them): it is the user message between them. The session's start time is every call's time. A session stripped of its
trailing whitespace (editors and git hooks do that) is read by its layout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gemkernels.evaluate.loaders.model import Messages, Usage, opening_task
from gemkernels.evaluate.loaders.settle import Draft, Format
from gemkernels.evaluate.loaders.usage import prompt_usage

SESSION = re.compile(r"^# aider chat started at (\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)\s*$", re.M)
TOKENS = re.compile(r"^Tokens: ([\d.]+k?) sent(?:, ([\d.]+k?) cache write)?(?:, ([\d.]+k?) cache hit)?, "
                    r"([\d.]+k?) received\.")
MODEL = re.compile(r"^(?:Main )?[Mm]odel: (\S+) with ")
ANSWER = re.compile(r"\[[^\]]*\]: (\S*)\s*$")  # the user's answer at the end of a confirmation prompt
SEARCH = "<<<<<<< SEARCH"
#: Aider's reports that run over several paragraphs (a failed SEARCH/REPLACE block quotes the block).
MULTI_PARAGRAPH = re.compile(r"# \d+ SEARCH/REPLACE blocks? failed to match")
#: The line that closes such a report, and the one that closes it four lines on when other blocks did apply.
CLOSING, CLOSING_AFTER_APPLIED = "The SEARCH section must exactly match ", "Just reply with fixed versions of the "
#: In-chat commands whose argument Aider sends as a user message; those whose output it may add; history resets.
SENDS_TEXT = frozenset({"ask", "code", "architect", "context"})
RUNS = frozenset({"run", "test"})
CLEARS = frozenset({"clear", "reset"})
RUN_OUTPUT = "I ran this command:\n\n{command}\n\nAnd got this output:\n\n[{lines}: the output is not in the log]\n"
NOT_RUN = "[not run: the user declined]"
ADDED_FILES = "I added these files to the chat: {files}\nLet me know if there are others we should add."


@dataclass
class Shell:
    """One group of shell commands Aider offered to run after a reply: what it ran, the lines of output it added to
    the chat (None: none), whether the user declined."""

    command: str
    declined: bool
    ran: list[str] = field(default_factory=list)
    lines: str | None = None


@dataclass
class Reply:
    """One model reply of a session and what Aider reported about it."""

    text: str
    usage: Usage | None = None
    applied: list[str] = field(default_factory=list)  # files Aider applied an edit to
    failed: list[str] = field(default_factory=list)  # its reports of edits that did not apply
    shell: list[Shell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # its other output after the reply
    added: list[str] = field(default_factory=list)  # files the user added to the chat when the reply named them

    def follow_up(self) -> str:
        """The message Aider sent after this reply on its own: the files added to the chat, else its edit errors,
        else its other output."""
        if self.added:
            return ADDED_FILES.format(files=", ".join(self.added))
        errors = [entry for entry in self.failed if MULTI_PARAGRAPH.match(entry)] or self.failed
        return "\n".join(errors or self.notes) or "[Aider's own message, not in the log]"


def is_aider_history(data: Any) -> bool:
    """Aider's markdown: a text with ``# aider chat started at`` lines."""
    return isinstance(data, str) and SESSION.search(data) is not None


def read_aider_history(text: str, stem: str) -> list[Draft]:
    """One run per session that has a model reply, named ``<stem>/<start time>``."""
    heads = list(SESSION.finditer(text))
    drafts: list[Draft] = []
    names: set[str] = set()
    for head, after in zip(heads, heads[1:] + [None]):
        started = f"{head.group(1)}T{head.group(2)}"
        name = f"{stem}/{started}"
        while name in names:
            name += "+"
        draft = session_draft(text[head.end():after.start() if after else len(text)], name, started)
        if draft is not None:
            names.add(name)
            drafts.append(draft)
    return drafts


def entries(text: str) -> Iterator[tuple[str, str]]:
    """The session's pieces in order: ``("user", input)``, ``("tool", one output entry, without trailing
    whitespace)``, ``("text", a line of a reply)``. Aider ends its lines with two spaces; a session without any had
    them stripped, and its ``#### `` lines are all input (see `output_ends` for ``> `` lines)."""
    lines = text.split("\n")
    marked = any(line.endswith("  ") for line in lines)
    ends = output_ends(lines, marked)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("####") and line[4:5] in (" ", "") and (line.endswith("  ") or not marked):
            user = []
            while i < len(lines) and lines[i].startswith("####") and (lines[i].endswith("  ") or not marked):
                user.append(lines[i][5:].rstrip())
                i += 1
            yield "user", "\n".join("" if part == "<blank>" else part for part in user)
            continue
        if i in ends:
            yield "tool", "\n".join(part.rstrip() for part in lines[i:ends[i] + 1])[2:].rstrip()
            i = ends[i] + 1
            continue
        yield "text", line
        i += 1


def is_output(line: str) -> bool:
    """A line that starts an entry of Aider's output: ``> `` (``>`` alone for an empty one)."""
    return line.startswith("> ") or line.rstrip() == ">"


def output_ends(lines: list[str], marked: bool) -> dict[int, int]:
    """The last line of each ``> `` entry, by its first: the first line followed by a blank line, Aider's next line or
    the end, else the first at all; in a ``marked`` session one ending in two spaces, before any blank line unless the
    entry is a report over several paragraphs (else it is reply text). A stripped session's report runs to its closing
    line if one comes before Aider's next line."""
    n = len(lines)
    ends: dict[int, int] = {}
    brk = weak = blank = aider = closing = n  # the next line that ends an entry, can end one, blank, Aider's, closing
    for j in range(n - 1, -1, -1):
        line = lines[j]
        if line.endswith("  ") or not marked:
            weak = j
            if j + 1 == n or not lines[j + 1].strip() or aider == j + 1:
                brk = j
        if not line.strip():
            blank = j
        paragraphs = is_output(line) and MULTI_PARAGRAPH.match(line[2:]) is not None
        if paragraphs and not marked and closing < aider:
            after = closing + 4 < aider and lines[closing + 4].startswith(CLOSING_AFTER_APPLIED)
            ends[j] = closing + 4 if after else closing
        elif is_output(line):
            end = next((k for k in (brk, weak) if k < n and (k <= blank or paragraphs)), None)
            if end is not None:
                ends[j] = end
        if is_output(line) or line.startswith("####"):
            aider = j
        if line.startswith(CLOSING):
            closing = j
    return ends


def in_chat_command(value: str) -> tuple[str | None, str]:
    """An input's in-chat command (``!cmd`` is ``/run cmd``) and its argument; (None, "") for a message."""
    if value.startswith("!"):
        return "run", value[1:].strip()
    found = re.match(r"/([a-z][\w-]*)(?:[ \t]+|$)", value)
    return (found.group(1), value[found.end():].strip()) if found else (None, "")


def count(text: str | None) -> int:
    """Aider's rounded token count: ``812``, ``3.2k``, ``16k``."""
    if not text:
        return 0
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(float(text))


def session_draft(text: str, name: str, started: str) -> Draft | None:
    """The run of one session (None: the model never replied in it)."""
    turns: list[Reply | dict[str, Any]] = []  # replies and user messages, in order
    reply: list[str] = []  # lines of the reply being read
    last: Reply | None = None  # the latest reply, while Aider reports on it
    subject: str | None = None  # the tool entry before a confirmation prompt
    run: str | None = None  # a /run command of the user whose output may be added
    model, clear = None, False
    marks: list[int] = []  # indices into turns where the history was cleared

    def add_reply(body: str) -> Reply:
        if turns and isinstance(turns[-1], Reply):
            turns.append({"role": "user", "content": turns[-1].follow_up()})
        turns.append(Reply(body))
        return turns[-1]

    def flush() -> Reply | None:
        body = "\n".join(reply).strip()
        reply.clear()
        return add_reply(body) if body else None

    for kind, value in entries(text):
        if kind == "text":
            if reply or value.strip():
                reply.append(value)
            continue
        if kind == "user":
            flush()
            last, run = None, None
            word, argument = in_chat_command(value)
            if word in RUNS:
                run = argument
            elif word in CLEARS:
                clear = True
            elif word is None or (word in SENDS_TEXT and argument):
                if clear:
                    marks.append(len(turns))
                clear = False
                turns.append({"role": "user", "content": value if word is None else argument})
            continue
        entry = value
        if not entry:
            continue
        if (found := MODEL.match(entry)) and model is None:
            model = found.group(1)
        if (tokens := TOKENS.match(entry)) is not None:
            last = flush() or (last if last is not None and last.usage is None else add_reply(""))  # or it wrote none
            sent, write, hit, received = (count(g) for g in tokens.groups())
            last.usage = prompt_usage(sent, hit, write, received)
            continue
        if reply:
            last = flush() or last
        if entry.startswith("Added ") and entry.endswith("of output to the chat."):
            lines = entry[len("Added "):-len(" of output to the chat.")]
            if run is not None:
                turns.append({"role": "user", "content": RUN_OUTPUT.format(command=run, lines=lines)})
                run = None
            elif last is not None and last.shell:
                last.shell[-1].lines = lines
            continue
        if last is None:
            subject = entry
            continue
        answer = ANSWER.search(entry)
        if entry.startswith(("Run shell command?", "Run shell commands?")) and subject is not None:
            last.shell.append(Shell(subject, answer is not None and answer.group(1)[:1].lower() == "n"))
        elif entry.startswith("Running ") and last.shell:
            last.shell[-1].ran.append(entry)
        elif entry.startswith("Add file to the chat?") and subject is not None:
            if answer is not None and answer.group(1)[:1].lower() in ("y", "a"):
                last.added.append(subject)
        elif entry.startswith("Applied edit to "):
            last.applied.append(entry[len("Applied edit to "):].strip())
        elif "SEARCH/REPLACE block" in entry or entry.startswith("The LLM did not conform to the edit format"):
            last.failed.append(entry)
        elif answer is None and not entry.startswith(("Commit ", "Add command output", "You can use /undo")):
            last.notes.append(entry)
        subject = entry
    flush()
    if not any(isinstance(turn, Reply) for turn in turns):
        return None
    draft = Draft(name, "aider", [], None, id=name)
    draft.messages.extend(to_messages(turns, draft, marks, model, started))
    draft.goal = opening_task(draft.messages)
    return draft


def edited_files(text: str) -> list[str]:
    """The file of each SEARCH/REPLACE block of a reply, in order: the line before its fence (``diff``), or the
    line after the fence (``diff-fenced``)."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if line.strip() == SEARCH and i >= 1:
            above = lines[i - 1].strip()
            path = lines[i - 2].strip() if above.startswith("```") and i >= 2 else above
            found.append(path.strip("`*: "))
    return found


def same_file(path: str) -> str:
    """A path as compared across the reply and Aider's reports (Windows separators as ``/``)."""
    return path.replace("\\", "/")


def to_messages(turns: list[Reply | dict[str, Any]], draft: Draft, marks: list[int], model: str | None,
                started: str) -> Messages:
    """The turns as OpenAI chat: each reply an assistant message with its calls and the results Aider reported."""
    messages: Messages = []
    calls = 0
    for n, turn in enumerate(turns):
        first = len(messages)
        if isinstance(turn, dict):
            messages.append(turn)
        else:
            assistant: dict[str, Any] = {"role": "assistant", "content": turn.text}
            results = []
            applied = {same_file(path): path for path in turn.applied}
            files: dict[str, str] = {}
            for path in [*edited_files(turn.text), *turn.applied]:
                files.setdefault(same_file(path), path)
            for path in files.values():
                call_id, calls = f"aider_{calls:04d}", calls + 1
                done = applied.get(same_file(path))
                results.append((call_id, "edit", {"path": path}, f"Applied edit to {done}" if done
                                else "\n".join(turn.failed) or None))
            for group in turn.shell:
                call_id, calls = f"aider_{calls:04d}", calls + 1
                output = [*group.ran, *([f"[{group.lines} of output added to the chat; not in the log]"]
                                         if group.lines else [])]
                results.append((call_id, "bash", {"command": group.command},
                                NOT_RUN if group.declined else "\n".join(output) or None))
            if results:
                assistant["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                    "name": tool, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                    for call_id, tool, arguments, _ in results]
            messages.append(assistant)
            messages.extend({"role": "tool", "tool_call_id": call_id, "content": result}
                            for call_id, _, _, result in results if result is not None)
            if turn.usage is not None:
                draft.usage[id(assistant)] = turn.usage
            if model:
                draft.models[id(assistant)] = model
            draft.times[id(assistant)] = started
        if n in marks and len(messages) > first:
            draft.compactions[id(messages[first])] = "clear"
    return messages


FORMATS = (Format("aider", is_aider_history, read_aider_history),)
