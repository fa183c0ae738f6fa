"""Block identities: a block is its tool-call ids plus what it says, so a block rewritten under the same ids (an
elided old output) is a new one. Prompt-cache breakpoints (``cache_control``, which clients move to the newest
message every turn) are left out at any depth.

What a block says is one hashable tuple (`said`). A store kept in this process compares identities made with
Python's ``hash()`` of it (an int; fast; salted per process). A store shared by processes (``StateStore.shared``, the
replicas of DESIGN.md §5.1) compares identities made by different processes, so they are 12 bytes of the SHA-256
of an unambiguous encoding of the same tuple (`stable_digest`): equal in every process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gemkernels.compress.blocks import Span

#: Bytes of a stable identity's digest (its hex is the identity; 96 bits: no collision among a session's blocks).
DIGEST_BYTES = 12
#: Values kept as they are (anything else is kept as its repr).
PLAIN = (str, int, float, bool, type(None))


def frozen(value: Any) -> Any:
    """``value`` as nested tuples without ``cache_control`` keys: texts and numbers as they are (not copied)."""
    if value.__class__ in PLAIN:
        return value
    if isinstance(value, dict):
        return ("{", *((key, frozen(item)) for key, item in value.items() if key != "cache_control"))
    if isinstance(value, (list, tuple)):
        return ("[", *map(frozen, value))
    return ("=", repr(value))


def said(messages: Sequence[Any], span: Span) -> tuple[Any, ...]:
    """What a chat block says: its call ids, each message's content and reasoning, each tool call's name and
    arguments."""
    parts: list[Any] = [span.call_ids]
    for p in span.positions:  # runs for every block of every request: kept to plain lookups
        get = messages[p].get
        here = (get("content"), get("reasoning_content"), get("reasoning"))
        if here[0].__class__ not in PLAIN or here[1] is not None or here[2] is not None:
            here = tuple([value if value.__class__ in PLAIN else frozen(value) for value in here])
        calls = get("tool_calls")
        parts.append(here + tuple(map(call_said, calls)) if calls else here)
    return tuple(parts)


def call_said(call: Any) -> Any:
    """What a tool call says: its function's name and arguments."""
    function = call.get("function") if call.__class__ is dict else call
    if function.__class__ is not dict:
        return frozen(function)
    name, arguments = function.get("name"), function.get("arguments")
    if name.__class__ is str and arguments.__class__ is str:  # the usual call: no copy
        return name, arguments
    return frozen(name), frozen(arguments)


def responses_said(items: Sequence[Any], span: Span) -> tuple[Any, ...]:
    """What a Responses API block says: its call ids and every field of its items."""
    return (span.call_ids, *(frozen(items[p]) for p in span.positions))


#: An identity for a store in this process: Python's hash of what the block says (an int: no formatting, and the
#: cheapest key a dict or set compares).
local_digest = hash


def stable_digest(value: tuple[Any, ...]) -> str:
    """An identity every process computes alike: the first `DIGEST_BYTES` of the SHA-256 of ``value`` encoded so
    that two values encode alike only when they are equal (texts with their ``\\x1f`` doubled, each part ended by
    ``\\x1f`` and a tag)."""
    out: list[str] = []
    encode_into(out, value)
    return hashlib.sha256("".join(out).encode("utf-8", "surrogatepass")).digest()[:DIGEST_BYTES].hex()


def encode_into(out: list[str], value: Any) -> None:
    if value.__class__ is str:
        out += (value.replace("\x1f", "\x1f\x1f"), "\x1f;")
    elif value.__class__ is tuple:
        out.append("\x1f(")
        for item in value:
            encode_into(out, item)
        out.append("\x1f)")
    else:  # None, a bool or a number (frozen left nothing else)
        out += (repr(value), "\x1f#")
