"""Per-session memory of the online policy (DESIGN.md §3): a bounded, thread-safe LRU + TTL store."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SessionState:
    """What the last request of a session looked like and what was forwarded for it."""

    block_keys: tuple[str, ...]
    forwarded: frozenset[str]
    goal: str
    blocks_at_selection: int
    block_cache: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0  # what the state holds, estimated by its writer (block embeddings and keys, mostly)


class SessionStore:
    """At most ``max_sessions`` states holding at most ``max_bytes`` in all (their ``nbytes``; None: no byte bound),
    the least recently used dropped first, each dropped ``ttl_s`` seconds after its last use. A state larger than
    ``max_bytes`` alone is not kept (its next request starts afresh)."""

    def __init__(self, max_sessions: int = 10_000, ttl_s: float = 3600.0, max_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if max_sessions < 1 or ttl_s <= 0 or (max_bytes is not None and max_bytes < 0):
            raise ValueError("max_sessions must be >= 1, ttl_s > 0 and max_bytes >= 0")
        self.max_sessions, self.ttl_s, self.max_bytes, self.clock = max_sessions, ttl_s, max_bytes, clock
        self._items: OrderedDict[str, tuple[float, SessionState]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def get(self, session_id: str) -> SessionState | None:
        with self._lock:
            item = self._items.get(session_id)
            if item is None:
                return None
            if self.clock() - item[0] > self.ttl_s:
                del self._items[session_id]
                self.nbytes -= item[1].nbytes
                return None
            self._items[session_id] = (self.clock(), item[1])
            self._items.move_to_end(session_id)
            return item[1]

    def put(self, session_id: str, state: SessionState) -> None:
        with self._lock:
            old = self._items.pop(session_id, None)
            self.nbytes += state.nbytes - (old[1].nbytes if old is not None else 0)
            self._items[session_id] = (self.clock(), state)
            while self._items and (len(self._items) > self.max_sessions
                                   or (self.max_bytes is not None and self.nbytes > self.max_bytes)):
                self.nbytes -= self._items.popitem(last=False)[1][1].nbytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def request_session(body: Mapping[str, Any]) -> str | None:
    """The session a chat request names: its ``user``, else ``metadata.user_id`` (non-empty strings only), else None."""
    if isinstance(body.get("user"), str) and body["user"]:
        return body["user"]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str) and metadata["user_id"]:
        return metadata["user_id"]
    return None
