"""Blocks of agents that write their actions as text (DESIGN.md §2.1): mini-swe-agent, SWE-agent, Aider, a pattern.

Such an agent sends plain role/content messages: its command sits in the assistant's text (a fenced block, a tag)
and the environment answers in the next user turn. A `TextActionProfile` says how one agent writes both; a removable
block is an adjacent pair the same profile recognises: the assistant turn with its command and the user turn with
the observation, or (``acknowledged`` profiles, Aider) the user turn carrying a command's output and the assistant's
``Ok.`` after it. The first user message (the task) and every user turn that is not an observation (a human
instruction) are never part of a block. A block is one assistant and one user turn, so an alternating history
stays alternating when blocks are dropped; whether a pair is a block depends on it and the messages before it only.
Text blocks have no call ids: their key is their ordinal among the text blocks, stable while the client resends its
whole history.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gemkernels.compress.blocks import Action, Block, Span, content_text, parts

ASSISTANT, USER = "assistant", "user"
#: The assistant turn that acknowledges a command output Aider put into the chat.
ACKNOWLEDGEMENT = re.compile(r"\A\s*Ok\.?\s*\Z")
AUTO, OFF, PATTERN = "auto", "off", "pattern"


@dataclass(frozen=True)
class TextActionProfile:
    """How one agent writes a command into a turn's text and its observation into the next turn.

    ``action`` finds the commands (its last matching group, else the whole match) in the assistant text, or in the
    observation itself when the profile is ``acknowledged``; ``observation`` is searched in the user text and matches
    only what the agent's environment writes. ``rejected`` marks an observation saying the turn was refused unexecuted
    (a format error): such a block has no actions and is ``failed``. ``last_only``: only the last match is the command
    (SWE-agent's parser). A command whose first word is in ``own_tools`` is an action of that name (SWE-agent's file
    viewer and editor); any other is ``bash``."""

    name: str
    action: re.Pattern[str]
    observation: re.Pattern[str]
    rejected: re.Pattern[str] | None = None
    last_only: bool = False
    acknowledged: bool = False
    own_tools: frozenset[str] = frozenset()

    def commands(self, text: str) -> tuple[str, ...]:
        """The commands ``text`` carries, in order (empty: none)."""
        found = tuple(match.group(match.lastindex or 0).strip() for match in self.action.finditer(text))
        return found[-1:] if self.last_only else found

    def actions(self, text: str) -> tuple[Action, ...]:
        """The commands of ``text`` as actions with ``{"command": ...}`` arguments (a converted run's bash calls)."""
        return tuple(Action(self.tool(command), json.dumps({"command": command}, ensure_ascii=False))
                     for command in self.commands(text))

    def tool(self, command: str) -> str:
        """The action name of one command: its first word if that is one of ``own_tools``, else ``bash``."""
        words = command.split(maxsplit=1)
        return words[0] if words and words[0] in self.own_tools else "bash"

    def is_rejection(self, observation: str) -> bool:
        """Whether ``observation`` says the turn was refused without running (``rejected``)."""
        return self.rejected is not None and self.rejected.search(observation) is not None


@dataclass(frozen=True)
class TextSpan(Span):
    """A text-action block's span: its two positions (the user turn first for an ``acknowledged`` profile), its key
    ``text:<ordinal>`` as its one call id, and the profile that recognised it (its reader)."""

    profile: TextActionProfile


MINI_SWE_AGENT = TextActionProfile(
    "mini-swe-agent",
    # 1.x: one ```bash block; 2.x text-based configs: ```mswea_bash_command or <mswea_bash_command> tags
    action=re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```|<mswea_bash_command>(.*?)</mswea_bash_command>",
                      re.S),
    observation=re.compile(r"\A\s*(?:(?:<exception>.*?</exception>\s*)?<returncode>-?\d+</returncode>"
                           r"|Please always provide EXACTLY ONE action|Format error:\s*<error>"
                           r"|The last command <command>.*?</command> timed out)", re.S),
    rejected=re.compile(r"\A\s*(?:Please always provide EXACTLY ONE action|Format error:\s*<error>)"),
)
SWE_AGENT = TextActionProfile(
    "swe-agent",
    # thought_action: the last fenced block (fences at line starts); xml_thought_action: <command> tags
    action=re.compile(r"^```\S*[ \t]*\n(.*?)^```[ \t]*$|<command>(.*?)</command>", re.S | re.M),
    # 0.x: the shell prompt closes every observation; 1.x: the next-step templates; elided old outputs
    observation=re.compile(r"\(Open file: [^\n]*\)\n\(Current directory: [^\n]*\)\s*\n\s*bash-\$\s*\Z"
                           r"|\A\s*(?:OBSERVATION:\n|Your command ran successfully and did not produce any output"
                           r"|Old environment output: \(\d+ lines omitted\))"),
    last_only=True,
    own_tools=frozenset({"open", "goto", "scroll_up", "scroll_down", "create", "edit", "insert", "search_dir",
                         "search_file", "find_file", "submit"}),
)
AIDER = TextActionProfile(
    "aider",
    # the output of the shell commands Aider suggested, or of the user's /run, /test and ! commands
    action=re.compile(r"^Output from ([^\n]+)$|\AI ran this command:\n\n(.*?)\n\nAnd got this output:", re.S | re.M),
    observation=re.compile(r"\A(?:Output from .|I ran this command:\n\n)"),
    acknowledged=True,
)
PROFILES: dict[str, TextActionProfile] = {p.name: p for p in (MINI_SWE_AGENT, SWE_AGENT, AIDER)}


def text_action_profiles(choice: str = AUTO, action_regex: str = "", observation_regex: str = ""
                         ) -> tuple[TextActionProfile, ...]:
    """The profiles ``choice`` names: ``auto`` (every built-in one, after the pattern when one is given), ``off``
    (none), or comma-separated names among the built-in ones and ``pattern`` (the user's own: ``action_regex``, its
    last group the command, and ``observation_regex``, both compiled with DOTALL); ``ValueError`` naming a bad value."""
    if bool(action_regex) != bool(observation_regex):
        raise ValueError("a text-action pattern needs both text_action_regex and text_observation_regex")
    pattern = ()
    if action_regex:
        try:
            pattern = (TextActionProfile(PATTERN, re.compile(action_regex, re.S), re.compile(observation_regex, re.S)),)
        except re.error as err:
            raise ValueError(f"text-action pattern: {err}") from None
    if choice == OFF:
        return ()
    if choice == AUTO:
        return pattern + tuple(PROFILES.values())
    names = [name.strip() for name in choice.split(",")]
    unknown = [name for name in names if name not in PROFILES and name != PATTERN]
    if unknown:
        raise ValueError(f"unknown text-action profile {unknown[0]!r}; choose {AUTO}, {OFF} or names among "
                         f"{', '.join([*PROFILES, PATTERN])}")
    if (PATTERN in names) != bool(pattern):
        raise ValueError("the 'pattern' profile and text_action_regex / text_observation_regex go together")
    return tuple(pattern[0] if name == PATTERN else PROFILES[name] for name in names)


def text_action_spans(messages: Sequence[dict[str, Any]], profiles: Sequence[TextActionProfile], start: int = 0,
                      ordinal: int = 0) -> list[TextSpan]:
    """The text-action blocks of ``messages``, in order: adjacent pairs that one profile recognises (first match);
    the scan starts at ``start`` with the block numbered ``ordinal`` (a resumed parse goes on where the last request's
    stopped: `text_scan_end`)."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == USER), None)
    spans: list[TextSpan] = []
    i = start
    while i + 1 < len(messages):
        profile = None if first_user in (i, i + 1) else pair_profile(messages, i, profiles)
        if profile is None:
            i += 1
            continue
        spans.append(TextSpan((i, i + 1), (f"text:{ordinal + len(spans)}",), profile))
        i += 2
    return spans


def text_scan_end(count: int, spans: Sequence[Span]) -> int:
    """Where `text_action_spans` stopped on ``count`` messages that gave ``spans``: after the last message, or at it
    when no block holds it (it may pair with the next request's first message)."""
    return count if spans and spans[-1].positions[-1] == count - 1 else count - 1


def pair_profile(messages: Sequence[dict[str, Any]], i: int, profiles: Sequence[TextActionProfile]
                 ) -> TextActionProfile | None:
    """The first profile for which ``messages[i:i + 2]`` is a block, if any; roles are checked before any text."""
    first, second = messages[i].get("role"), messages[i + 1].get("role")
    if {first, second} != {ASSISTANT, USER}:
        return None
    text = observation = None
    for profile in profiles:
        if profile.acknowledged != (first == USER):
            continue
        if text is None:
            assistant, answer = (messages[i + 1], messages[i]) if first == USER else (messages[i], messages[i + 1])
            text, observation = content_text(assistant.get("content")), content_text(answer.get("content"))
        if not profile.observation.search(observation):
            continue
        if profile.acknowledged:
            if ACKNOWLEDGEMENT.match(text) and profile.commands(observation):
                return profile
        elif profile.is_rejection(observation) or profile.commands(text):
            return profile
    return None


def text_block(messages: Sequence[dict[str, Any]], span: TextSpan) -> Block:
    """Content of a text-action block: the assistant's reasoning and text, the commands as actions (none when the
    turn was rejected unexecuted, then ``failed``) and the observation."""
    profile = span.profile
    first, second = (messages[p] for p in span.positions)
    assistant, answer = (second, first) if profile.acknowledged else (first, second)
    text, observation = content_text(assistant.get("content")), content_text(answer.get("content"))
    rejected = profile.is_rejection(observation)
    thinking = "\n".join(p.get("thinking", "") for p in parts(assistant) if p.get("type") == "thinking")
    return Block(span.positions, span.call_ids,
                 reasoning=content_text(assistant.get("reasoning_content") or assistant.get("reasoning")) or thinking,
                 text=text, actions=() if rejected else profile.actions(observation if profile.acknowledged else text),
                 observations=(observation,), failed=rejected)
