"""Block identities that every process computes alike: a block is its tool-call ids plus a digest of what it says.

Replicas of the proxy sharing one session store (DESIGN.md §5.1) compare identities computed in different
processes, so they are SHA-256 digests (hardware-accelerated on current CPUs) of an unambiguous encoding of the
block's values, never Python's ``hash()``, which is salted per process. Prompt-cache breakpoints
(``cache_control``, which clients move to the newest message every turn) are left out at any depth.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gemkernels.compress.blocks import Span

#: Bytes of a block identity's digest (its hex is the identity; 96 bits: no collision among a session's blocks).
DIGEST_BYTES = 12
#: Message fields that say something (an OpenAI or Anthropic message; the tool calls are read apart).
SAID_FIELDS = ("content", "reasoning_content", "reasoning")


def feed(parts: list[str], value: Any) -> None:
    """Append ``value`` to ``parts`` so that two values give the same parts only when they are equal: texts after
    their length, numbers and constants as their repr, containers bracketed, ``cache_control`` keys skipped."""
    if value.__class__ is str:
        parts += (str(len(value)), value)
    elif isinstance(value, dict):
        parts.append("{")
        for key, item in value.items():
            if key != "cache_control":
                feed(parts, key)
                feed(parts, item)
        parts.append("}")
    elif isinstance(value, (list, tuple)):
        parts.append("[")
        for item in value:
            feed(parts, item)
        parts.append("]")
    else:
        parts += ("=", repr(value))


def digest_of(parts: list[str]) -> str:
    """The hex digest of ``parts`` (the first `DIGEST_BYTES` of the SHA-256 of their UTF-8, one separator apart)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).digest()[:DIGEST_BYTES].hex()


def block_identity(messages: Sequence[Any], span: Span) -> str:
    """A chat block's identity: its tool-call ids and a digest of each message's content and reasoning and each
    tool call's name and arguments, so a block rewritten under the same ids (an elided old output) is a new one."""
    parts = [span.key]
    for p in span.positions:
        message = messages[p]
        for name in SAID_FIELDS:
            feed(parts, message.get(name))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else call
            if isinstance(function, dict):
                feed(parts, function.get("name"))
                feed(parts, function.get("arguments"))
            else:
                feed(parts, function)
    return digest_of(parts)


def responses_identity(items: Sequence[Any], span: Span) -> str:
    """`block_identity` for a Responses API ``input``: the call ids and a digest of every field of its items."""
    parts = [span.key]
    for p in span.positions:
        feed(parts, items[p])
    return digest_of(parts)
