"""Parsing only what a request adds (DESIGN.md §2.1): a history whose first messages are the last request's,
unchanged, keeps that request's blocks, roles and block identities, and only the messages after them are parsed.

"Unchanged" is checked on values, not objects: the SHA-256 of the bytes the messages are written in, either the
request body's own (a proxy's) or their ``marshal`` bytes (format 2: values only, no object references, so neither
who built the objects nor how often they are referenced matters; a fraction of one ``json.dumps`` of the request).
Resuming is refused, and the whole history parsed, wherever a whole parse could decide otherwise: messages that do
not marshal, a changed or shorter prefix, a format the added messages would change, a block that would span the
boundary (a Responses reasoning item left open, a call id the prefix used); a text-action scan goes on where the
last one stopped (its last message may pair with the first added one).
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any

from gemkernels.compress.blocks import (
    ANTHROPIC,
    OPENAI,
    RESPONSES,
    TEXT_ACTIONS,
    BlockStructureError,
    History,
    Span,
    anthropic_spans,
    detect_format,
    message_roles,
    openai_spans,
    parts,
)
from gemkernels.compress.responses_items import CALL_OUTPUTS, ends_open, is_responses_input, responses_spans
from gemkernels.compress.text_actions import PROFILES, TextActionProfile, text_action_spans, text_scan_end

#: The roles a kept parse may hold (a request with any other, a Responses item's arbitrary value, parses whole).
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", None})
#: marshal's format without object references: equal values, equal bytes (bytes-like values of any buffer type
#: marshal alike, which JSON never gives).
MARSHAL_VERSION = 2
#: A marshalled list starts with its type byte and a 32-bit length; the messages' bytes follow.
LIST_HEADER = 5


@dataclass(frozen=True)
class ParsedHistory:
    """What one request's parse leaves for the next of its session: how many messages it read, the length and
    SHA-256 of the bytes they were written in (`MessageBytes`), and what the parse found (format, blocks, roles,
    block identities, every call id the messages use, and whether they carry signed thinking)."""

    count: int
    nbytes: int
    digest: bytes
    format: str
    spans: tuple[Span, ...]
    roles: tuple[Any, ...]
    keys: tuple[Hashable, ...]
    call_ids: frozenset[str]
    open_end: bool  # messages at its end would join a block that starts after them (Responses reasoning, `ends_open`)
    thinking: bool  # whether a message carries signed thinking (`History.carries_thinking`)

    @property
    def held_bytes(self) -> int:
        """About what keeping it costs: its spans, roles and keys as Python objects, and its call ids' texts (the
        spans hold the same strings; roles are the few `KNOWN_ROLES`)."""
        return 200 * len(self.spans) + 16 * len(self.roles) + 60 * len(self.call_ids) + sum(map(len, self.call_ids))


class MessageBytes:
    """The bytes a request's messages are written in, and digests of their leading bytes; `view` is None when
    there are none to read (then nothing resumes). Two writings: `Marshalled`, and `RawMessages` (a body's)."""

    def __init__(self) -> None:
        self.hashed: tuple[int, Any] = (0, hashlib.sha256())  # the digest so far: of the first n bytes

    @cached_property
    def view(self) -> memoryview | None:
        raise NotImplementedError

    def digest(self, nbytes: int) -> bytes:
        """The SHA-256 of the first ``nbytes`` bytes (continuing from the last digest when it is shorter)."""
        done, hasher = self.hashed if self.hashed[0] <= nbytes else (0, hashlib.sha256())
        hasher = hasher.copy()
        hasher.update(self.view[done:nbytes])
        self.hashed = (nbytes, hasher)
        return hasher.digest()

    def parsed(self, history: History, keys: tuple[Hashable, ...],
               call_ids: frozenset[str] | None) -> ParsedHistory | None:
        """What ``history`` (these messages parsed, ``keys`` its block identities, ``call_ids`` every call id its
        messages use: None to read them) leaves for the next request; None where the next parses whole."""
        if self.view is None:
            return None
        try:
            if not KNOWN_ROLES.issuperset(history.roles or ()):
                return None
        except TypeError:  # an unhashable role
            return None
        messages = history.messages
        open_end = history.format == RESPONSES and ends_open(messages)
        roles = history.roles if type(history.roles) is tuple else tuple(history.roles or ())
        if call_ids is None:
            call_ids = used_call_ids(history.format, messages, history.spans)
        return ParsedHistory(len(messages), len(self.view), self.digest(len(self.view)), history.format,
                             history.spans, roles, keys, call_ids, open_end, history.carries_thinking)


class Marshalled(MessageBytes):
    """The messages marshalled (format 2), after the list's header: equal values, equal bytes, whoever built them."""

    def __init__(self, messages: Sequence[Any]):
        super().__init__()
        self.messages = messages

    @cached_property
    def view(self) -> memoryview | None:
        messages = self.messages
        try:
            data = marshal.dumps(messages if type(messages) in (list, tuple) else list(messages), MARSHAL_VERSION)
        except (ValueError, TypeError):  # an object marshal does not know, or nested deeper than it goes
            return None
        return memoryview(data)[LIST_HEADER:]


class RawMessages(MessageBytes):
    """The messages as a request body writes them: ``body[start of the first : end of the last]`` (``elements``:
    each message's ``[start, end)`` in ``body``, a proxy's byte scan); equal bytes parse to equal values."""

    def __init__(self, body: bytes, elements: Sequence[tuple[int, int]]):
        super().__init__()
        self.body, self.elements = body, elements

    @cached_property
    def view(self) -> memoryview | None:
        if not self.elements or not isinstance(self.body, (bytes, bytearray)):
            return None
        return memoryview(self.body)[self.elements[0][0]:self.elements[-1][1]]


def used_call_ids(format: str, messages: Sequence[Any], spans: Sequence[Span]) -> frozenset[str]:
    """Every call id ``messages`` use: their blocks', and also those of calls in no block (an Anthropic tool_use
    answered by a message that carries other parts too, a Responses call a hosted tool's call follows)."""
    ids = set(chain.from_iterable([span.call_ids for span in spans]))
    if format == RESPONSES:
        ids.update(item["call_id"] for item in messages if type(item.get("type")) is str
                   and item["type"] in CALL_OUTPUTS and isinstance(item.get("call_id"), str))
    elif format == ANTHROPIC:
        ids.update(p.get("id") for m in messages if m.get("role") == "assistant" for p in parts(m)
                   if p.get("type") == "tool_use" and isinstance(p.get("id"), str))
    return frozenset(ids)


def resume(last: ParsedHistory, messages: Sequence[Any], written: MessageBytes,
           identify: Callable[[str, Sequence[Any], Sequence[Span]], tuple[Hashable, ...]],
           text_actions: Sequence[TextActionProfile] | None = None,
           ) -> tuple[History, tuple[Hashable, ...], frozenset[str]] | None:
    """``messages`` parsed from where ``last`` ended, exactly as a whole parse (`parse_history` with
    ``text_actions``) would give them, with its block identities (``identify`` computes those of the added blocks)
    and every call id it uses; None where a whole parse is needed."""
    m = last.count
    if (written.view is None or m == 0 or len(messages) < m or last.open_end
            or len(written.view) < last.nbytes or written.digest(last.nbytes) != last.digest):
        return None
    tail = list(messages[m:])
    try:
        if last.format == RESPONSES:
            if not all(type(item) is dict for item in tail):
                return None
            roles = [item.get("role") for item in tail]
            added = responses_spans(tail)
        else:
            if is_responses_input(tail):
                return None
            roles = message_roles(tail)
            if last.format == OPENAI:
                if not last.spans or detect_format(tail) != OPENAI:  # auto would try text actions, or Anthropic
                    return None
                added = openai_spans(tail, roles)
            elif last.format == ANTHROPIC:
                added = anthropic_spans(tail)
            elif last.format == TEXT_ACTIONS:  # still no tool calls anywhere
                if detect_format(tail) != OPENAI or openai_spans(tail, roles):
                    return None
                profiles = tuple(PROFILES.values()) if text_actions is None else text_actions
                added = text_action_spans(messages, profiles, text_scan_end(m, last.spans), len(last.spans))
                return finished(last, messages, added, roles, identify, frozenset())
            else:
                return None
    except BlockStructureError:  # the whole parse says where
        return None
    added = [Span(tuple([p + m for p in span.positions]), span.call_ids) for span in added]
    ids = used_call_ids(last.format, tail, added)
    if not last.call_ids.isdisjoint(ids):  # a call id of the prefix used again: the whole parse refuses it
        return None
    return finished(last, messages, added, roles, identify, ids)


def finished(last: ParsedHistory, messages: Sequence[Any], added: Sequence[Span], roles: Sequence[Any],
             identify: Callable[[str, Sequence[Any], Sequence[Span]], tuple[Hashable, ...]],
             ids: frozenset[str]) -> tuple[History, tuple[Hashable, ...], frozenset[str]]:
    """The resumed history: the last request's blocks, roles, identities and call ids, and the added ones."""
    history = History(messages, last.format, last.spans + tuple(added), last.roles + tuple(roles),
                      (last.count, last.thinking))
    return history, last.keys + identify(last.format, messages, added), last.call_ids | ids
