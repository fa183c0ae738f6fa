"""Per-session memory of the online policy (DESIGN.md §3): the `StateStore` protocol GEM keeps sessions in, and
`SessionStore`, the default: in this process, bounded, thread-safe, LRU + TTL (the Redis store shared by replicas
is `gemkernels.compress.redis_store`); `PendingAnalysis`, what requests that went out before their analysis
finished leave for their sessions' next ones (DESIGN.md §5)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SessionState:
    """What the last request of a session looked like and what was forwarded for it: its block identities, those
    forwarded, a digest of its goal (`goal_digest`), its block count at the last selection, and the per-block work
    that this process keeps for its next request (``block_cache``, identity -> `BlockInfo`; ``columns``, the
    same in block order: `gemkernels.compress.gem.BlockColumns`; ``parsed``, what its parse found:
    `gemkernels.compress.resume.ParsedHistory`)."""

    block_keys: tuple[Hashable, ...]
    forwarded: frozenset[Hashable]
    goal: str
    blocks_at_selection: int
    block_cache: dict[Hashable, Any] = field(default_factory=dict)
    nbytes: int = 0  # what the state holds, estimated by its writer (block embeddings and keys, mostly)
    columns: Any = None
    parsed: Any = None


def goal_digest(goal: str) -> str:
    """What a state keeps of its goal: 32 hex digits of its SHA-256 (equal goals, equal digests)."""
    return hashlib.sha256(goal.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class SessionConflict(RuntimeError):
    """A shared store refused a ``put``: another request of the session saved its state after this one read it."""


class StoreUnavailable(RuntimeError):
    """A shared store could not be reached (or did not answer in time): the request goes out unchanged."""


class StateStore(Protocol):
    """Where GEM keeps its sessions: ``get`` the state saved under a key (None: none), ``put`` one; ``len`` counts
    the states this process holds. A shared store may raise on ``put`` when another request of the session saved
    in between (GEM computes that request again) or when it cannot be reached (the request goes out unchanged).
    A store with a true ``shared`` attribute is read by other processes: GEM then names blocks by identities that
    every process computes alike (`gemkernels.compress.identity.stable_digest`). A store may offer ``local_get``,
    the last state this process saved under a key, without a round trip: GEM resumes that state's parse from it
    (`gemkernels.compress.resume`), which checks the messages it reuses itself."""

    def get(self, session_id: str) -> SessionState | None: ...

    def put(self, session_id: str, state: SessionState) -> None: ...

    def __len__(self) -> int: ...


#: What a `SessionStore`'s states hold in all by default: 1 GiB (`gem serve`'s ``max_session_bytes``).
DEFAULT_MAX_BYTES = 1 << 30


class SessionStore:
    """At most ``max_sessions`` states holding at most ``max_bytes`` in all (their ``nbytes``; None: no byte bound),
    the least recently used dropped first, each dropped ``ttl_s`` seconds after its last use. A state larger than
    ``max_bytes`` alone is not kept (its next request starts afresh)."""

    def __init__(self, max_sessions: int = 10_000, ttl_s: float = 3600.0, max_bytes: int | None = DEFAULT_MAX_BYTES,
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

    local_get = get  # this process's copy is the state itself

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


#: What `PendingAnalysis` holds at most by default: 64 MiB.
DEFAULT_PENDING_BYTES = 64 << 20


class PendingAnalysis:
    """Per session, block analyses (block identity -> a value with ``nbytes``) that a request computed but did not
    save, having gone out before its analysis finished, and those the work after it added: the session's next
    request takes them up. The least recently touched sessions go first past ``max_bytes``; thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_PENDING_BYTES):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[str, dict[Hashable, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: str) -> dict[Hashable, Any]:
        """A copy of the session's pending analyses (empty when none)."""
        with self._lock:
            held = self._items.get(session)
            if held is None:
                return {}
            self._items.move_to_end(session)
            return dict(held)

    def add(self, session: str, values: Mapping[Hashable, Any]) -> None:
        """Hold ``values`` for ``session`` (replacing what it held under the same identities)."""
        if not values:
            return
        with self._lock:
            held = self._items.pop(session, {})
            for key, value in values.items():
                old = held.get(key)
                self.nbytes += value.nbytes - (old.nbytes if old is not None else 0)
                held[key] = value
            self._items[session] = held
            while self._items and self.nbytes > self.max_bytes:
                self.nbytes -= sum(value.nbytes for value in self._items.popitem(last=False)[1].values())

    def discard(self, session: str) -> None:
        """Forget the session's pending analyses (its state now holds what it needs)."""
        with self._lock:
            held = self._items.pop(session, None)
            if held:
                self.nbytes -= sum(value.nbytes for value in held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class SessionLocks:
    """``stripes`` locks, one taken per session, so that a session's requests are compressed one at a time (two
    sessions may share a lock: it only orders them). A request without a session id is named by its first two
    messages, as GEM names such a session by its prefix."""

    def __init__(self, stripes: int = 64):
        self.locks = [threading.Lock() for _ in range(stripes)]

    def of(self, messages: Any, session_id: str | None, tenant: str | None) -> threading.Lock:
        key = session_id if session_id is not None else prefix_key(messages)
        digest = hashlib.blake2b(f"{tenant}\x1f{key}".encode("utf-8", "surrogatepass"), digest_size=4).digest()
        return self.locks[int.from_bytes(digest, "little") % len(self.locks)]


def prefix_key(messages: Any) -> str:
    """The first two messages as JSON, the lock's name for a request without a session id; '' for messages JSON
    cannot write (keys of mixed types, a cycle, nesting past its depth): those requests share a lock."""
    try:
        return json.dumps(messages[:2], default=str, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return ""


#: The proxy's own session header (never forwarded upstream).
GEM_SESSION_HEADER = "x-gem-session"
#: Request headers that name a conversation, first match wins: the proxy's own, Claude Code's, Codex's.
SESSION_HEADERS = (GEM_SESSION_HEADER, "x-claude-code-session-id", "session_id", "session-id")


def request_session(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str | None:
    """The session a request belongs to, or None (GEM then hashes the history's prefix).

    The conversation is named by the first of `SESSION_HEADERS`, else the body's ``prompt_cache_key``, ``user``
    or ``metadata.user_id`` (Claude Code's JSON form gives its ``session_id``); the session is that name plus a hash
    of the request's instructions (system prompt), so a sub-agent or a side request (a title, a summary, a
    classifier) sent under the same name is a session of its own and never resets the main one."""
    name = next((headers.get(h) for h in SESSION_HEADERS if headers is not None and headers.get(h)), None)
    if name is None:
        name = body_session_name(body)
    if name is None:
        return None
    digest = hashlib.blake2b(instructions_text(body).encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"{name}#{digest}"


def body_session_name(body: Mapping[str, Any]) -> str | None:
    """``prompt_cache_key``, else ``user``, else ``metadata.user_id`` (non-empty strings only)."""
    for value in (body.get("prompt_cache_key"), body.get("user")):
        if isinstance(value, str) and value:
            return value
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except (ValueError, RecursionError):  # a string nested past the parser's depth is a name like any other
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("session_id"), str) and parsed["session_id"]:
            return parsed["session_id"]
    return user_id


def instructions_text(body: Mapping[str, Any]) -> str:
    """The text that says which agent is asking: Anthropic's ``system``, the Responses ``instructions``, and the
    leading system or developer messages (cache breakpoints and other part fields left out)."""
    texts = [text_of(body.get("system")), text_of(body.get("instructions"))]
    history = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    for message in history if isinstance(history, list) else ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        texts.append(text_of(message.get("content")))
    return "\x1e".join(texts)


#: The line Claude Code (2.1 and later) opens its system prompt with; its hashes change from request to request.
BILLING_HEADER = re.compile(r"\Ax-anthropic-billing-header:[^\n]*\n?")


def text_of(value: Any) -> str:
    """A string, or the ``text`` of each part of a list ('' for anything else), without Claude Code's billing
    header line."""
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list):
        texts = [part["text"] for part in value if isinstance(part, dict) and isinstance(part.get("text"), str)]
    else:
        texts = []
    return "\n".join(text for text in (BILLING_HEADER.sub("", text) for text in texts) if text)
