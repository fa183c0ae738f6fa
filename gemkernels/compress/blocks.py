"""Interaction blocks of a chat history (DESIGN.md §2.1), OpenAI, Anthropic and Responses API alike.

A removable block is one assistant message that calls tools plus every message answering
those calls: OpenAI ``tool`` messages matched by ``tool_call_id``, or the Anthropic ``user``
message whose ``tool_result`` parts answer the ``tool_use`` parts. Everything else (the
prefix, plain turns, legacy ``function_call``) is never removed. A Responses API ``input`` has its own blocks
(`gemkernels.compress.responses_items`). Blocks refer to the caller's messages by position: parsing copies and
changes nothing. A role/content history without tool calls may carry actions as text (mini-swe-agent, SWE-agent,
Aider): its blocks are an action turn and its observation turn (`gemkernels.compress.text_actions`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gemkernels.compress.text_actions import TextActionProfile

OPENAI, ANTHROPIC, RESPONSES = "openai", "anthropic", "responses"
TEXT_ACTIONS = "text-actions"  # actions written in the messages' text (gemkernels.compress.text_actions)


class BlockStructureError(ValueError):
    """The history cannot be split safely (duplicate, missing or orphan tool-call ids); forward it unchanged."""


@dataclass(frozen=True)
class Action:
    """One tool call: its name and its arguments as text (JSON as the caller sent it)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Span:
    """Where one removable block sits: its message positions (assistant first) and its tool-call ids."""

    positions: tuple[int, ...]
    call_ids: tuple[str, ...]

    @property
    def start(self) -> int:
        return self.positions[0]

    @property
    def key(self) -> str:
        """Stable identity across requests: the tool-call ids (read once per request: not worth a cache)."""
        return "\x1f".join(self.call_ids)


@dataclass(frozen=True)
class Block(Span):
    """One removable block with its normalised content."""

    reasoning: str
    text: str
    actions: tuple[Action, ...]
    observations: tuple[str, ...]
    failed: bool = False  # a result the caller marked as an error (Anthropic ``is_error``)


@dataclass(frozen=True)
class History:
    """A parsed request: the caller's messages, their format, and where the removable blocks are.

    Parsing only matches ids (cheap, every call); a block's content is read on demand by `block`.
    """

    messages: Sequence[dict[str, Any]]
    format: str
    spans: tuple[Span, ...]
    roles: Sequence[Any] | None = None  # each message's role, where the parse read them
    # (n, found): whether the first n messages carry signed thinking, known from a parse they were part of
    thinking_known: tuple[int, bool] = (0, False)

    @property
    def prefix_end(self) -> int:
        """Messages before the first block (system prompt, task) form the prefix."""
        return self.spans[0].start if self.spans else len(self.messages)

    @cached_property
    def block_positions(self) -> frozenset[int]:
        return frozenset(chain.from_iterable([span.positions for span in self.spans]))

    @cached_property
    def other_positions(self) -> list[int]:
        """The positions of the messages outside blocks, ascending."""
        return sorted(set(range(len(self.messages))).difference(self.block_positions))

    @cached_property
    def carries_thinking(self) -> bool:
        """Whether a message carries signed thinking (`carries_thinking`); an Anthropic history (``anthropic``
        format) always counts, as its next response may. Messages `thinking_known` covers are not read again."""
        known, found = self.thinking_known
        return found or self.format == ANTHROPIC or any(map(carries_thinking, self.messages[known:]))

    @cached_property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(self.block(i) for i in range(len(self.spans)))

    def block(self, i: int) -> Block:
        """Block ``i`` with its content read from the messages."""
        if self.format == RESPONSES:
            from gemkernels.compress.responses_items import responses_block

            return responses_block(self.messages, self.spans[i])
        if self.format == TEXT_ACTIONS:
            from gemkernels.compress.text_actions import text_block

            return text_block(self.messages, self.spans[i])
        read = openai_block if self.format == OPENAI else anthropic_block
        return read(self.messages, self.spans[i])

    def task_text(self, which: str = "latest") -> str:
        """The ``latest`` (or ``first``) user instruction that is not a tool result or in a block ('' if none)."""
        roles = self.roles if self.roles is not None else [message.get("role") for message in self.messages]
        users = [i for i, role in enumerate(roles) if role == "user"]
        for i in reversed(users) if which == "latest" else users:
            message = self.messages[i]
            if i not in self.block_positions and not is_tool_result_message(message):
                text = content_text(message.get("content"))
                if text.strip():
                    return text
        return ""


def content_text(content: Any) -> str:
    """Plain text of a message ``content``: a string, or the text parts of a list (other parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") == "tool_result":
                    parts.append(content_text(part.get("content")))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def is_tool_result_message(message: dict[str, Any]) -> bool:
    """An OpenAI ``tool``/``function`` message, or an Anthropic user message carrying ``tool_result`` parts."""
    if message.get("role") in ("tool", "function"):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "tool_result" for part in content)


def detect_format(messages: Sequence[dict[str, Any]]) -> str:
    """``anthropic`` when any message carries ``tool_use``/``tool_result`` parts, else ``openai``."""
    contents = list(map(dict.get, messages, repeat("content")))
    if not any(issubclass(kind, list) for kind in set(map(type, contents))):  # text only: one pass in C
        return OPENAI
    for content in contents:
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("tool_use", "tool_result")
                                             for p in content):
            return ANTHROPIC
    return OPENAI


def parse_history(messages: Any, format: str = "auto",
                  text_actions: Sequence[TextActionProfile] | None = None) -> History:
    """Split ``messages`` into blocks; raises `BlockStructureError` on anything unsafe to edit.

    ``text_actions``: the profiles of ``text-actions`` histories (None: every built-in one; ``()``: never), which
    ``auto`` tries on a role/content history without tool calls."""
    if not isinstance(messages, (list, tuple)):
        raise BlockStructureError(f"messages must be a list, got {type(messages).__name__}")
    from gemkernels.compress.responses_items import is_responses_input, responses_spans

    if format == RESPONSES or (format == "auto" and is_responses_input(messages)):
        bad = next((i for i, item in enumerate(messages) if type(item) is not dict), None)
        if bad is not None:
            raise BlockStructureError(f"input item {bad} is {type(messages[bad]).__name__}, not an object")
        return History(messages, RESPONSES, tuple(responses_spans(messages)),
                       list(map(dict.get, messages, repeat("role"))))
    roles = message_roles(messages)
    fmt = detect_format(messages) if format == "auto" else format
    if fmt == OPENAI:
        spans = openai_spans(messages, roles)
        if not spans and format == "auto" and (text := text_spans(messages, text_actions)):
            fmt, spans = TEXT_ACTIONS, text
    elif fmt == TEXT_ACTIONS:
        spans = text_spans(messages, text_actions)
    elif fmt == ANTHROPIC:
        spans = anthropic_spans(messages)
    else:
        raise ValueError(f"unknown message format {format!r}; choose auto, openai, anthropic, responses or "
                         "text-actions")
    return History(messages, fmt, tuple(spans), roles)


def message_roles(messages: Sequence[Any]) -> list[str]:
    """Each message's role; raises `BlockStructureError` for a message that is not an object with a string role."""
    if set(map(type, messages)) <= {dict}:  # the usual history: read in C
        roles = list(map(dict.get, messages, repeat("role")))
        if set(map(type, roles)) <= {str}:
            return roles
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            what = "has no role" if isinstance(message, dict) else f"is {type(message).__name__}, not an object"
            raise BlockStructureError(f"message {i} {what}")
    return [message["role"] for message in messages]


def text_spans(messages: Sequence[dict[str, Any]], profiles: Sequence[TextActionProfile] | None) -> list[Span]:
    """The blocks of actions written as text (`gemkernels.compress.text_actions`; None: every built-in profile)."""
    from gemkernels.compress.text_actions import PROFILES, text_action_spans

    return text_action_spans(messages, tuple(PROFILES.values()) if profiles is None else profiles)


def openai_spans(messages: Sequence[dict[str, Any]], roles: Sequence[str] | None = None) -> list[Span]:
    """Assistant messages with ``tool_calls`` and the ``tool`` messages answering them, ids unique and matched
    (``roles``: each message's, when the caller has read them)."""
    owner: dict[str, int] = {}
    spans: dict[int, tuple[list[int], tuple[str, ...]]] = {}
    early: list[tuple[int, str]] = []
    answered: set[str] = set()
    for i, role in enumerate(roles if roles is not None else [message["role"] for message in messages]):
        if role == "tool":
            call_id = messages[i].get("tool_call_id")
            if call_id.__class__ is not str and not isinstance(call_id, str):
                raise BlockStructureError(f"tool message {i} has a tool_call_id that is not a string")
            start = owner.get(call_id)
            if start is None:
                early.append((i, call_id))
            elif call_id in answered:
                raise BlockStructureError(f"tool call id {call_id!r} is answered twice")
            else:
                answered.add(call_id)
                spans[start][0].append(i)
        elif role == "assistant":
            calls = messages[i].get("tool_calls")
            if not calls:
                continue
            if not isinstance(calls, list):
                raise BlockStructureError(f"message {i} has tool_calls that are not a list")
            ids = tuple([call.get("id") if call.__class__ is dict or isinstance(call, dict) else None
                         for call in calls])
            for call_id in ids:
                if not isinstance(call_id, str) or not call_id:
                    raise BlockStructureError(f"message {i} has a tool call without an id")
                if call_id in owner:
                    raise BlockStructureError(f"tool call id {call_id!r} is used twice (messages {owner[call_id]} "
                                              f"and {i})")
                owner[call_id] = i
            spans[i] = ([i], ids)
    for i, call_id in early:
        if call_id in owner:
            raise BlockStructureError(f"tool message {i} comes before its call (message {owner[call_id]})")
        raise BlockStructureError(f"tool message {i} answers unknown call id {call_id!r}")
    if len(answered) != len(owner):
        missing = min(set(owner) - answered, key=owner.get)
        raise BlockStructureError(f"tool call {missing!r} (message {owner[missing]}) has no result")
    return [Span(tuple(positions), ids) for positions, ids in spans.values()]


def openai_block(messages: Sequence[dict[str, Any]], span: Span) -> Block:
    """Content of an OpenAI block: reasoning, text, function calls and tool results."""
    assistant = messages[span.start]
    actions = []
    for call in assistant["tool_calls"]:
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments", "")
        actions.append(Action(str(function.get("name", "")),
                              arguments if isinstance(arguments, str) else json.dumps(arguments)))
    return Block(span.positions, span.call_ids,
                 reasoning=content_text(assistant.get("reasoning_content") or assistant.get("reasoning")),
                 text=content_text(assistant.get("content")), actions=tuple(actions),
                 observations=tuple(content_text(messages[p].get("content")) for p in span.positions[1:]))


def anthropic_spans(messages: Sequence[dict[str, Any]]) -> list[Span]:
    """Assistant ``tool_use`` messages answered exactly by the next user message's ``tool_result`` parts.

    A block whose answering message also carries other parts, either of whose messages also makes OpenAI calls
    (a history that mixes formats), or that loads deferred tools (`loads_tools`) is valid but not removable."""
    spans = []
    seen: set[str] = set()
    i = 0
    while i < len(messages):
        message = messages[i]
        uses = [p for p in parts(message) if p.get("type") == "tool_use"]
        results = [p for p in parts(message) if p.get("type") == "tool_result"]
        if results:
            raise BlockStructureError(f"message {i} holds tool_result parts that answer no preceding tool_use")
        if message["role"] != "assistant" or not uses:
            i += 1
            continue
        ids = [p.get("id") for p in uses]
        if not all(isinstance(x, str) and x for x in ids):
            raise BlockStructureError(f"message {i} has a tool_use without an id")
        duplicate = next((x for x in ids if x in seen or ids.count(x) > 1), None)
        if duplicate:
            raise BlockStructureError(f"tool_use id {duplicate!r} is used twice")
        seen.update(ids)
        answer = messages[i + 1] if i + 1 < len(messages) else None
        answer_parts = parts(answer) if answer is not None and answer["role"] == "user" else []
        answered = [p.get("tool_use_id") for p in answer_parts if p.get("type") == "tool_result"]
        if not all(isinstance(a, str) for a in answered) or len(answered) != len(ids) or set(answered) != set(ids):
            raise BlockStructureError(f"the tool_use ids of message {i} are not answered exactly by message {i + 1}")
        if all(p.get("type") == "tool_result" for p in answer_parts) and not (
                calls_openai_tools(message) or calls_openai_tools(answer) or loads_tools(parts(message), answer_parts)):
            spans.append(Span((i, i + 1), tuple(ids)))
        i += 2
    return spans


#: Anthropic content parts the API checks when they come back: the last assistant turn's must (a tool loop fails
#: without them), and models with preserved thinking bind each to the messages before it.
THINKING_PARTS = frozenset({"thinking", "redacted_thinking"})


def carries_thinking(message: dict[str, Any]) -> bool:
    """Whether ``message`` holds signed thinking: a ``thinking`` or ``redacted_thinking`` part, LangChain's v1 forms
    (a ``reasoning`` part with a signature, a ``non_standard`` one wrapping thinking), or a non-empty
    ``thinking_blocks`` (LiteLLM) or ``reasoning_details`` (OpenRouter) list."""
    content = message.get("content")
    if message.get("thinking_blocks") or message.get("reasoning_details"):
        return True
    return isinstance(content, list) and any(map(is_thinking_part, content))


def is_thinking_part(part: Any) -> bool:
    """A content part that carries signed thinking (`carries_thinking`)."""
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    if kind == "reasoning":
        return isinstance(part.get("extras"), dict) and "signature" in part["extras"]
    if kind == "non_standard":
        return isinstance(part.get("value"), dict) and part["value"].get("type") in THINKING_PARTS
    return kind in THINKING_PARTS


def loop_start(messages: Sequence[dict[str, Any]]) -> int:
    """Where the current tool loop starts: after the last user message that is no tool result (0 if none)."""
    return next((i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"
                 and not is_tool_result_message(messages[i])), 0)


def loads_tools(assistant: list[dict[str, Any]], answer: list[dict[str, Any]]) -> bool:
    """Whether a block loads deferred tools (Anthropic tool search): a ``tool_search_tool_result`` part, or a
    ``tool_reference`` in a tool result; removing it would unload tools the conversation may still call."""
    return any(p.get("type") == "tool_search_tool_result" for p in assistant) or any(
        isinstance(p.get("content"), list) and any(isinstance(c, dict) and c.get("type") == "tool_reference"
                                                   for c in p["content"]) for p in answer)


def calls_openai_tools(message: dict[str, Any]) -> bool:
    """Whether ``message`` also makes OpenAI calls (``tool_calls``, legacy ``function_call``), whose results are other
    messages: in an Anthropic history such a message is never removed, or its results would lose their call."""
    return bool(message.get("tool_calls") or message.get("function_call"))


def anthropic_block(messages: Sequence[dict[str, Any]], span: Span) -> Block:
    """Content of an Anthropic block: thinking, text, tool_use inputs and tool_result contents."""
    assistant, answer = parts(messages[span.start]), parts(messages[span.positions[1]])
    return Block(span.positions, span.call_ids,
                 reasoning="\n".join(p.get("thinking", "") for p in assistant if p.get("type") == "thinking"),
                 text="\n".join(p.get("text", "") for p in assistant if p.get("type") == "text"),
                 actions=tuple(Action(str(p.get("name", "")), json.dumps(p.get("input", {}), ensure_ascii=False))
                               for p in assistant if p.get("type") == "tool_use"),
                 observations=tuple(content_text(p.get("content")) for p in answer if p.get("type") == "tool_result"),
                 failed=any(p.get("is_error") is True for p in answer if p.get("type") == "tool_result"))


def parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The dict parts of a message's list content ([] for string content)."""
    content = message.get("content")
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def reconstruct(history: History, kept_blocks: set[int]) -> list[dict[str, Any]]:
    """The caller's message objects minus the blocks not in ``kept_blocks``, in original order.

    Only whole blocks of a history that parsed are dropped, so the result keeps the parse's guarantees
    (unique ids, every call with all its results, the prefix and every non-block message) by construction;
    the tests parse every output again on every development run."""
    keep = [True] * len(history.messages)
    for b, span in enumerate(history.spans):
        if b not in kept_blocks:
            for p in span.positions:
                keep[p] = False
    return list(compress(history.messages, keep))


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None when it is not one (a raw command, a non-JSON body)."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return value if isinstance(value, dict) else None
