"""GEM behind a framework's hook: one compressor per hook with a bounded session store, one compression per session
at a time, messages of the framework's own types compressed through OpenAI-format views, and the short record of
each call that the integrations put in the framework's logs."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gemkernels.compress.config import GEMConfig, with_overrides
from gemkernels.compress.encoders import Encoder
from gemkernels.compress.gem import (
    GEM,
    PASSTHROUGH,
    THINKING_CONTENT,
    UNCHANGED,
    Compressed,
    CompressionStats,
    anthropic_thinking,
)
from gemkernels.compress.sessions import SessionLocks, SessionStore

logger = logging.getLogger("gemkernels.integrations")

#: What the sessions of one hook hold in all by default (block embeddings and keys, mostly).
DEFAULT_SESSION_BYTES = 256 << 20


class SessionCompressor:
    """`GEM.compress` for the sessions of one process: their states in a `SessionStore` of at most ``max_sessions``
    states and ``max_session_bytes`` bytes in all (least recently used dropped first, each ``ttl_s`` seconds after
    its last use), so each session's successive calls are compressed by the online policy (cache-aware); the calls
    of one session run one at a time. ``overrides``: ``field=value`` items applied to the preset (``k=24``,
    ``evidence.recent=8``), as ``gem serve --set``."""

    def __init__(self, preset: GEMConfig | str = "cache-aware", encoder: Encoder | str = "minilm",
                 overrides: Sequence[str] = (), max_sessions: int = 10_000,
                 max_session_bytes: int | None = DEFAULT_SESSION_BYTES, ttl_s: float = 3600.0):
        store = SessionStore(max_sessions=max_sessions, ttl_s=ttl_s, max_bytes=max_session_bytes)
        self.gem = GEM(with_overrides(preset, overrides), encoder=encoder, store=store)
        self.locks = SessionLocks()

    def compress(self, messages: Sequence[Any], session_id: str | None = None, goal: str | None = None,
                 tenant: str | None = None, thinking: str = "content") -> Compressed:
        """`GEM.compress` of ``messages`` (OpenAI or Anthropic message dicts) in session ``session_id`` of
        ``tenant`` (None: GEM names the session by the hash of the history's prefix), ``thinking`` as there; never
        raises for bad input and never changes ``messages``."""
        with self.locks.of(messages, session_id, tenant):
            return self.gem.compress(messages, session_id=session_id, goal=goal, tenant=tenant, thinking=thinking)

    def compress_views(self, originals: Sequence[Any], views: Sequence[dict[str, Any]], session_id: str | None = None,
                       goal: str | None = None, tenant: str | None = None, thinking: str = "content"
                       ) -> tuple[list[Any], CompressionStats]:
        """Compress ``views`` (one OpenAI-format dict per object of ``originals``, in order) and return the objects
        of ``originals`` whose views were kept (the very objects, in order) with the stats."""
        if len(views) != len(originals):
            return list(originals), self.passthrough(originals, f"{len(views)} message views for {len(originals)} "
                                                     "messages", session_id)
        out = self.compress(views, session_id=session_id, goal=goal, tenant=tenant, thinking=thinking)
        position = {id(view): p for p, view in enumerate(views)}
        return [originals[position[id(view)]] for view in out.messages], out.stats

    def passthrough(self, messages: Sequence[Any], reason: str, session_id: str | None = None) -> CompressionStats:
        """The stats of a call that goes out unchanged for ``reason``, found before GEM saw it (logged as GEM
        logs its own passthroughs)."""
        logger.info("gemkernels: forwarding unchanged: %s", reason)
        count = len(messages)
        return CompressionStats(PASSTHROUGH, reason, session_id, messages_before=count, messages_after=count,
                                seconds={"total": 0.0})


#: The fields of `CompressionStats` that `summary` keeps.
SUMMARY_FIELDS = ("action", "reason", "session_id", "blocks", "forwarded_blocks", "messages_before", "messages_after",
                  "chars_before", "chars_after", "tokens_before", "tokens_after")


def summary(stats: CompressionStats) -> dict[str, Any]:
    """The short record of one call for a framework's logs: what GEM did and why, the blocks, messages, characters
    and tokens (None without a token counter) before and after, and the seconds it took."""
    record = {name: getattr(stats, name) for name in SUMMARY_FIELDS}
    record["removed_blocks"] = len(stats.removed_blocks)
    record["seconds"] = round(stats.seconds.get("total", 0.0), 4)
    return record


def log_call(stats: CompressionStats) -> None:
    """One INFO line on the ``gemkernels.integrations`` logger for a call GEM compressed or left as it was (a
    passthrough is logged with its reason where it is decided)."""
    if stats.action == PASSTHROUGH:
        return
    if stats.action == UNCHANGED:
        logger.info("gemkernels: session %s: unchanged, %d messages (%s)", stats.session_id, stats.messages_before,
                    stats.reason)
        return
    logger.info("gemkernels: session %s: %s, %d -> %d messages, %d -> %d characters in %.0f ms (%s)",
                stats.session_id, stats.action, stats.messages_before, stats.messages_after, stats.chars_before,
                stats.chars_after, 1000 * stats.seconds.get("total", 0.0), stats.reason)


def model_thinking(model: Any, request: Mapping[str, Any] | None = None) -> str:
    """`GEM.compress`'s ``thinking`` for a call to ``model`` (a name): a Claude model's (``anthropic/...``, any name
    with ``claude``, Bedrock's and Vertex's included) is bound by Anthropic's API, `anthropic_thinking` of the
    ``request`` (``drop`` when it asks ``drop_block``); any other's as its messages show (``content``)."""
    name = model.lower() if isinstance(model, str) else ""
    if "claude" not in name and not name.startswith("anthropic/"):
        return THINKING_CONTENT
    return anthropic_thinking(request or {})
