"""`RedisSessionStore`: GEM's sessions shared by every replica of the proxy through one Redis (DESIGN.md §5.1).

Redis holds what a session needs to continue, compactly: its block identities (12 bytes each), which of them were
forwarded (one bit each), its goal digest and its block count at the last selection, under a hash of the session
key, with a TTL. The per-block work (features, token counts, embeddings) stays in each process's own bounded
`SessionStore`; a replica that meets a session for the first time recomputes it, its embeddings coming from the
shared cache (`gemkernels.compress.encoders.redis_cache`).

Ordering: a state carries a version; ``put`` saves only if the version is still the one ``get`` read on this
thread (a Lua compare-and-set, one round trip), else raises `SessionConflict` and GEM computes the request again
from the newer state, so two concurrent requests of one session never interleave their updates. A Redis that
cannot be reached raises `StoreUnavailable` at once for ``retry_s`` seconds (then tries again): GEM forwards those
requests unchanged with that reason, and compression resumes when Redis answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit

import numpy as np
import redis

from gemkernels.compress.identity import DIGEST_BYTES
from gemkernels.compress.sessions import SessionConflict, SessionState, SessionStore, StoreUnavailable

T = TypeVar("T")
logger = logging.getLogger("gemkernels")

#: A state whose identities are all digests: magic, blocks at selection, block count, goal digest, identities, bits.
COMPACT = b"GEM1"
#: Any other state (hand-made keys): magic, then JSON.
GENERAL = b"GEMJ"
GOAL_BYTES = 16

#: KEYS[1]: the session's hash; ARGV: the version read ('' for none, '*' for any), the packed state, the TTL in
#: ms. Returns the new version, or -1 when the saved version is not the one read.
COMPARE_AND_SET = """
local seen = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] ~= '*' and (seen or '') ~= ARGV[1] then return -1 end
local version = (tonumber(seen) or 0) + 1
redis.call('HSET', KEYS[1], 'v', version, 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return version
"""


class RedisConnection:
    """One Redis client shared by the session store and the embedding cache: bounded pool, short timeouts, no
    retries (a request must not wait on a sick Redis), a pause of ``retry_s`` after a failure, each call's round
    trips told to ``count_round_trips``. ``url`` is ``redis://[:password@]host:port/db`` (``rediss://`` for TLS)."""

    def __init__(self, url: str, timeout_s: float = 0.5, retry_s: float = 1.0, max_connections: int = 64,
                 prefix: str = "gem:", clock: Callable[[], float] = time.monotonic,
                 count_round_trips: Callable[[int], None] = lambda trips: None):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        parts = urlsplit(url)
        if not readable(parts):  # said without the URL: it would quote a part of the password
            raise ValueError(f"the store URL ({parts.scheme}://...) cannot be read: its port is not a number, or its "
                             "password holds one of : / ? # @ not percent-encoded (urllib.parse.quote(password, "
                             "safe=''))")
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"--store takes memory or a redis://host:port/db URL, got {self.shown(url)}")
        self.url, self.prefix, self.retry_s, self.clock = url, prefix, retry_s, clock
        self.count_round_trips = count_round_trips
        pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
        self.client = redis.Redis(connection_pool=pool)
        self.failures = 0
        self.down_until = 0.0
        self.lock = threading.Lock()

    @staticmethod
    def shown(url: str) -> str:
        """``url`` without its credentials, for messages and logs."""
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or ''}{':%d' % parts.port if parts.port else ''}{parts.path}"

    def call(self, what: Callable[[], T], round_trips: int = 1) -> T:
        """``what()`` against Redis, counted; `StoreUnavailable` when Redis fails or refuses writes (read-only, at its
        maxmemory), and at once while paused."""
        now = self.clock()
        if now < self.down_until:
            raise StoreUnavailable(f"session store {self.shown(self.url)} unavailable "
                                   f"(retrying in {self.down_until - now:.1f} s)")
        self.count_round_trips(round_trips)
        try:
            return what()
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, redis.OutOfMemoryError, OSError) as err:
            with self.lock:
                self.failures += 1
                self.down_until = self.clock() + self.retry_s
            raise StoreUnavailable(f"session store {self.shown(self.url)} unavailable: "
                                   f"{type(err).__name__}: {err}") from None

    def close(self) -> None:
        self.client.close()


def readable(parts: SplitResult) -> bool:
    """Whether a split URL's credentials end where its host begins: a number for a port, and no ``@`` after the
    host (a password's unencoded ``/ ? #`` moves the host and the rest of the password there)."""
    try:
        parts.port
    except ValueError:
        return False
    return "@" not in parts.path + parts.query + parts.fragment


class RedisSessionStore:
    """GEM's `StateStore` in Redis, shared by replicas (module doc); ``local_*`` bound this process's block work,
    ``ttl_s`` how long Redis keeps a session after its last save."""

    shared = True  # read by other processes: GEM names blocks by stable identities

    def __init__(self, connection: RedisConnection, ttl_s: float = 3600.0, local_max_sessions: int = 10_000,
                 local_max_bytes: int | None = 1 << 30):
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.connection, self.ttl_ms = connection, int(ttl_s * 1000)
        self.local = SessionStore(max_sessions=local_max_sessions, ttl_s=ttl_s, max_bytes=local_max_bytes)
        self.compare_and_set = connection.client.register_script(COMPARE_AND_SET)
        self.seen = threading.local()  # .last: (session key, version) of this thread's last get

    def key(self, session_id: str) -> str:
        """The Redis key of a session: a hash of its id (which holds the tenant's hash), never the id itself."""
        return self.connection.prefix + "s:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, session_id: str) -> SessionState | None:
        version, packed = self.connection.call(lambda: self.connection.client.hmget(self.key(session_id), "v", "s"))
        self.seen.last = (session_id, b"" if version is None else version)
        if packed is None:
            return None
        try:
            block_keys, forwarded, goal, at_selection = unpack_state(packed)
        except ValueError as err:  # the session starts afresh; its next save (this version seen) replaces it
            logger.warning("gemkernels: a session state in Redis cannot be read (%s); the session starts afresh", err)
            return None
        local = self.local.get(session_id)
        if local is None:
            return SessionState(block_keys, forwarded, goal, at_selection)
        columns = local.columns if local.block_keys == block_keys else None  # this process wrote the last state
        return SessionState(block_keys, forwarded, goal, at_selection, local.block_cache, local.nbytes, columns)

    def local_get(self, session_id: str) -> SessionState | None:
        """The last state this process saved for the session (no round trip; Redis may hold a newer one)."""
        return self.local.get(session_id)

    def put(self, session_id: str, state: SessionState) -> None:
        """Save ``state`` if the session's version is still the one this thread's last ``get`` of it read (without
        such a get, whatever is saved); `SessionConflict` if not."""
        last = getattr(self.seen, "last", None)
        seen = last[1] if last is not None and last[0] == session_id else b"*"
        self.seen.last = None
        packed = pack_state(state)
        version = self.connection.call(lambda: self.compare_and_set(keys=[self.key(session_id)],
                                                                    args=[seen, packed, self.ttl_ms]))
        if version == -1:
            raise SessionConflict("the session was saved by another request since this one read it")
        self.local.put(session_id, state)

    def __len__(self) -> int:
        return len(self.local)


def pack_state(state: SessionState) -> bytes:
    """What Redis keeps of a state (module doc): compact when its identities and goal are digests, else JSON."""
    keys = state.block_keys
    try:
        raw = [bytes.fromhex(key) for key in keys]
        goal = bytes.fromhex(state.goal)
    except ValueError:
        raw, goal = [], b""
    index = {key: i for i, key in enumerate(keys)}
    compact = (len(goal) == GOAL_BYTES and all(len(r) == DIGEST_BYTES for r in raw) and len(raw) == len(keys)
               and all(key in index for key in state.forwarded))
    if not compact:
        return GENERAL + json.dumps({"keys": list(keys), "forwarded": sorted(state.forwarded), "goal": state.goal,
                                     "at": state.blocks_at_selection}).encode()
    bits = np.zeros(len(keys), dtype=bool)
    bits[[index[key] for key in state.forwarded]] = True
    return (COMPACT + struct.pack("<II", state.blocks_at_selection, len(keys)) + goal + b"".join(raw)
            + np.packbits(bits).tobytes())


def unpack_state(packed: bytes) -> tuple[tuple[str, ...], frozenset[str], str, int]:
    """(block identities, forwarded identities, goal digest, blocks at selection) from `pack_state`'s bytes;
    ValueError for anything else (another version's state, one cut short, a count its bytes do not hold)."""
    if packed.startswith(GENERAL):
        try:
            data: dict[str, Any] = json.loads(packed[len(GENERAL):])
            keys, forwarded, goal, at = tuple(data["keys"]), frozenset(data["forwarded"]), data["goal"], data["at"]
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise ValueError(f"not a gemkernels session state ({type(err).__name__})") from None
        if not (all(isinstance(key, str) for key in (*keys, *forwarded)) and isinstance(goal, str) and type(at) is int):
            raise ValueError("not a gemkernels session state (fields of other types)")
        return keys, forwarded, goal, at
    start = len(COMPACT) + 8
    if not packed.startswith(COMPACT) or len(packed) < start + GOAL_BYTES:
        raise ValueError("not a gemkernels session state")
    at_selection, n = struct.unpack_from("<II", packed, len(COMPACT))
    if len(packed) != start + GOAL_BYTES + n * DIGEST_BYTES + (n + 7) // 8:
        raise ValueError(f"not a gemkernels session state ({len(packed)} bytes for {n} blocks)")
    goal = packed[start:start + GOAL_BYTES].hex()
    start += GOAL_BYTES
    keys = tuple(packed[start + i * DIGEST_BYTES:start + (i + 1) * DIGEST_BYTES].hex() for i in range(n))
    bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8, offset=start + n * DIGEST_BYTES), count=n)
    return keys, frozenset(key for key, bit in zip(keys, bits) if bit), goal, at_selection
