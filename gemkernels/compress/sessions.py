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


class SessionStore:
    """At most ``max_sessions`` states, each dropped ``ttl_s`` seconds after its last use."""

    def __init__(self, max_sessions: int = 10_000, ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        if max_sessions < 1 or ttl_s <= 0:
            raise ValueError("max_sessions must be >= 1 and ttl_s > 0")
        self.max_sessions, self.ttl_s, self.clock = max_sessions, ttl_s, clock
        self._items: OrderedDict[str, tuple[float, SessionState]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> SessionState | None:
        with self._lock:
            item = self._items.get(session_id)
            if item is None:
                return None
            if self.clock() - item[0] > self.ttl_s:
                del self._items[session_id]
                return None
            self._items[session_id] = (self.clock(), item[1])
            self._items.move_to_end(session_id)
            return item[1]

    def put(self, session_id: str, state: SessionState) -> None:
        with self._lock:
            self._items[session_id] = (self.clock(), state)
            self._items.move_to_end(session_id)
            while len(self._items) > self.max_sessions:
                self._items.popitem(last=False)

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
