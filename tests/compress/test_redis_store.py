"""The Redis session store and shared embedding cache (`gemkernels.compress.redis_store`,
`gemkernels.compress.encoders.redis_cache`) against a real ``redis-server`` on 127.0.0.1: GEMs sharing one
Redis forward what one GEM forwards, concurrent saves of a session conflict and are computed again, an unreachable
Redis forwards unchanged at once and compression resumes when it returns. Tests that start a Redis of their own
take the ``redis_server`` fixture too, so that they skip with it where there is no ``redis-server``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("redis")

from helpers import CountingEncoder  # noqa: E402

from gemkernels import GEM  # noqa: E402
from gemkernels.compress.blocks import parse_history  # noqa: E402
from gemkernels.compress.config import resolve_config  # noqa: E402
from gemkernels.compress.encoders.redis_cache import RedisEmbeddingCache  # noqa: E402
from gemkernels.compress.gem import PASSTHROUGH  # noqa: E402
from gemkernels.compress.identity import said, stable_digest  # noqa: E402
from gemkernels.compress.redis_store import RedisConnection, RedisSessionStore, pack_state, unpack_state  # noqa: E402
from gemkernels.compress.sessions import SessionConflict, SessionState, StoreUnavailable, goal_digest  # noqa: E402
from gemkernels.testing.histories import synthetic_anthropic_history, synthetic_history  # noqa: E402
from gemkernels.testing.processes import RedisServer  # noqa: E402


def store_on(server: RedisServer, **options) -> RedisSessionStore:
    return RedisSessionStore(RedisConnection(server.url, **options))


digests = st.binary(min_size=12, max_size=12).map(bytes.hex)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(digests, max_size=300, unique=True), data=st.data(), at=st.integers(0, 2**31),
       goal=st.text(max_size=50))
def test_a_state_packs_to_its_identities_and_one_bit_each_and_back(keys, data, at, goal):
    forwarded = frozenset(data.draw(st.lists(st.sampled_from(keys), unique=True)) if keys else [])
    state = SessionState(tuple(keys), forwarded, goal_digest(goal), at)
    packed = pack_state(state)
    assert len(packed) == 4 + 8 + 16 + 12 * len(keys) + -(-len(keys) // 8)
    assert unpack_state(packed) == (tuple(keys), forwarded, goal_digest(goal), at)


def test_a_state_with_other_keys_packs_as_json_and_back():
    state = SessionState(("a", "b\x1fc", "é"), frozenset({"é", "zz"}), "some goal", 3)
    assert unpack_state(pack_state(state)) == (("a", "b\x1fc", "é"), frozenset({"é", "zz"}), "some goal", 3)


@pytest.mark.parametrize("preset", ["paper", "cache-aware"])
@pytest.mark.parametrize("history", [synthetic_history, synthetic_anthropic_history])
def test_gems_sharing_one_redis_forward_what_one_gem_forwards(redis_server, preset, history):
    """Three GEMs (three replicas: their own block caches) take a session's requests in turn; each forwards the
    same messages as one GEM with the in-memory store."""
    config = resolve_config(preset, thinking_bound=False)  # Anthropic histories compress too
    replicas = [GEM(config, encoder="hash", store=store_on(redis_server), token_counter=None) for _ in range(3)]
    alone = GEM(config, encoder="hash", token_counter=None)
    messages = history(70, seed=hash(preset) % 100)
    session = f"{preset}-{history.__name__}"
    actions = set()
    ends = [end for end in range(20, len(messages) + 1) if messages[end - 1]["role"] in ("tool", "user")]
    for i, end in enumerate(ends):
        shared = replicas[i % 3].compress(messages[:end], session_id=session)
        single = alone.compress(messages[:end], session_id=session)
        assert shared.messages == single.messages, (i, shared.stats.reason, single.stats.reason)
        assert (shared.stats.action, shared.stats.reason) == (single.stats.action, single.stats.reason)
        actions.add(shared.stats.action)
    assert {"reselected", "appended"} <= actions  # both paths were compared


def test_a_session_saved_by_another_request_in_between_is_computed_again(redis_server):
    """Two replicas read the same state; the second to save is refused (SessionConflict), and GEM computes that
    request again from the newer state instead of overwriting it."""
    first, second = store_on(redis_server), store_on(redis_server)
    state = SessionState(("a" * 24,), frozenset(), goal_digest("g"), 1)
    first.put("race", state)
    assert first.get("race") is not None and second.get("race") is not None
    first.put("race", state)
    with pytest.raises(SessionConflict):
        second.put("race", state)
    second.get("race")
    second.put("race", state)  # read again: saves

    class Interleaving(RedisSessionStore):
        """Another replica saves this session between this one's get and put, once."""

        raced = False

        def put(self, session_id, state):
            if not self.raced:
                self.raced = True
                other.put(session_id, other.get(session_id) or state)
            super().put(session_id, state)

    other = store_on(redis_server)
    store = Interleaving(RedisConnection(redis_server.url))
    gem = GEM("paper", encoder="hash", store=store, token_counter=None)
    messages = synthetic_history(40, seed=5)
    out = gem.compress(messages, session_id="interleaved")
    reference = GEM("paper", encoder="hash", token_counter=None).compress(messages, session_id="interleaved")
    assert store.raced and out.stats.action != PASSTHROUGH and out.messages == reference.messages


def test_concurrent_requests_of_one_session_never_interleave_their_saves(redis_server):
    """Eight threads on four replicas compress the same session's requests at once: no error, no passthrough but a
    second conflict, and the state left saved is a block list and forwarded set that some request was answered
    with (many requests here are identical, so this catches a corrupt state, not every interleaving)."""
    replicas = [GEM("core", encoder="hash", store=store_on(redis_server), token_counter=None) for _ in range(4)]
    messages = synthetic_history(60, seed=8)
    errors: list[BaseException] = []
    answered: set[tuple[tuple[str, ...], frozenset[str]]] = set()

    def identities(history_messages) -> list[str]:
        history = parse_history(history_messages)
        return [stable_digest(said(history.messages, span)) for span in history.spans]

    def work(t: int) -> None:
        try:
            for end in range(40, len(messages) + 1, 2):
                out = replicas[t % 4].compress(messages[:end], session_id="busy")
                assert out.stats.action != PASSTHROUGH or out.stats.reason.startswith("SessionConflict")
                if out.stats.action != PASSTHROUGH:
                    answered.add((tuple(identities(messages[:end])), frozenset(identities(out.messages))))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    saved = replicas[0].store.get("busy")
    assert saved is not None and (saved.block_keys, saved.forwarded) in answered
    assert len(saved.forwarded) < len(saved.block_keys)  # blocks were dropped: another forwarded set would show


def test_an_unreachable_redis_forwards_unchanged_at_once_and_compression_resumes(redis_server):
    messages = synthetic_history(40, seed=2)
    with RedisServer() as own:
        gem = GEM("paper", encoder="hash", store=store_on(own, retry_s=0.2), token_counter=None)
        assert gem.compress(messages, session_id="s").stats.action == "reselected"
        own.stop()
        for _ in range(3):
            started = time.perf_counter()
            out = gem.compress(messages, session_id="s")
            assert out.messages is messages and out.stats.action == PASSTHROUGH
            assert out.stats.reason.startswith("StoreUnavailable") and time.perf_counter() - started < 0.5
        own.start()
        time.sleep(0.3)
        assert gem.compress(messages, session_id="s").stats.action == "reselected"  # its state went with Redis


def test_the_store_keeps_no_session_name_in_redis_and_expires_sessions(redis_server):
    store = RedisSessionStore(RedisConnection(redis_server.url, prefix="gem-test:"), ttl_s=0.5)
    GEM("paper", encoder="hash", store=store, token_counter=None).compress(
        synthetic_history(30, seed=1), session_id="secret-session-name", tenant="tenant-hash")
    client = store.connection.client
    keys = client.keys("gem-test:*")
    assert len(keys) == 1 and b"secret" not in keys[0] and b"tenant" not in keys[0]
    assert b"secret" not in client.hget(keys[0], "s")
    assert 0 < client.pttl(keys[0]) <= 500
    time.sleep(0.7)
    assert client.keys("gem-test:*") == [] and store.get("tenant-hash\x1fsecret-session-name") is None


@pytest.mark.parametrize("dtype,tolerance", [("float32", 0.0), ("float16", 1e-3)])
def test_a_replica_never_encodes_what_another_encoded(redis_server, dtype, tolerance):
    texts = [f"block {i} " + "x" * i for i in range(50)]
    first = RedisEmbeddingCache(CountingEncoder(), RedisConnection(redis_server.url), dtype=dtype)
    second_model = CountingEncoder()
    second = RedisEmbeddingCache(second_model, RedisConnection(redis_server.url), dtype=dtype)
    rows = first.encode(texts)
    assert first.flush()
    again = second.encode(texts + ["a new one"])
    assert second_model.seen == ["a new one"]
    np.testing.assert_allclose(again[:-1], rows, atol=tolerance, rtol=0)
    np.testing.assert_array_equal(again[-1], CountingEncoder().encode(["a new one"])[0])
    hits_only = second.encode(texts[:3])  # every row from Redis, stored as float16 or float32: float32 out
    assert hits_only.dtype == np.float32 and second_model.seen == ["a new one"]
    first.close()
    second.close()


def test_the_embedding_cache_encodes_here_when_redis_is_down(redis_server):
    with RedisServer() as own:
        model = CountingEncoder()
        cache = RedisEmbeddingCache(model, RedisConnection(own.url, retry_s=0.1))
        own.stop()
        rows = cache.encode(["one", "two"])
        np.testing.assert_array_equal(rows, CountingEncoder().encode(["one", "two"]))
        assert model.seen == ["one", "two"]
        cache.close()


def test_a_password_in_the_store_url_never_reaches_a_reason():
    from gemkernels.testing.processes import free_port

    gem = GEM("paper", encoder="hash", store=RedisSessionStore(
        RedisConnection(f"redis://:hunter2@127.0.0.1:{free_port()}/0")), token_counter=None)
    out = gem.compress(synthetic_history(30, seed=1), session_id="s")
    assert out.stats.reason.startswith("StoreUnavailable") and "127.0.0.1" in out.stats.reason
    assert "hunter2" not in out.stats.reason


def test_the_embedding_writer_outlives_a_redis_that_refuses_writes(redis_server):
    """A Redis at its maxmemory under noeviction (Redis's default policy) answers each SET with an OOM error: those
    rows are not shared, and the writer goes on sharing once Redis takes writes again (it died on that error)."""
    with RedisServer() as own:
        connection = RedisConnection(own.url, retry_s=0.05)
        cache = RedisEmbeddingCache(CountingEncoder(), connection)
        connection.client.config_set("maxmemory-policy", "noeviction")
        connection.client.config_set("maxmemory", 1)
        cache.encode(["refused"])
        assert cache.flush(2.0)
        connection.client.config_set("maxmemory", 0)
        time.sleep(0.1)  # past a pause after the failure
        cache.encode(["shared"])
        assert cache.flush(2.0)
        assert connection.client.exists(cache.key("shared")) and not connection.client.exists(cache.key("refused"))
        cache.close()


@pytest.mark.parametrize("password", ["12/hunter2", "ab#hunter2", "Zm9v+Ym/hunter2=", "12?hunter2", "x@y/hunter2"])
def test_a_password_left_unencoded_in_the_store_url_is_refused_without_quoting_it(password):
    """A password with one of / ? # @ not percent-encoded moves the URL's host into its path (or query, or fragment):
    it is refused, naming the fix, where it would connect elsewhere and quote the password in every reason."""
    from gemkernels.testing.processes import free_port

    with pytest.raises(ValueError, match="percent-encode") as refused:
        RedisConnection(f"redis://:{password}@127.0.0.1:{free_port()}/0")
    assert "hunter2" not in str(refused.value) and password.split("/")[0] not in str(refused.value)


def test_a_redis_server_that_does_not_answer_in_time_is_not_left_running(redis_server):
    server = RedisServer()
    with pytest.raises(RuntimeError, match="did not answer"):
        server.start(timeout=0)
    assert server.process is None


def test_a_redis_that_refuses_writes_is_unavailable_not_a_compression_error(redis_server):
    """A read-only Redis (a demoted primary after a failover) or one at maxmemory under noeviction refuses each save:
    the compression goes out with the refusal in its reason (as after any save the store did not confirm), then
    requests go out unchanged as for a Redis that is down (store_unavailable, a pause before the next try), not as
    a failure of GEM's own logged with a traceback per request."""
    from gemkernels.compress.gem import UNSAVED
    from gemkernels.serve.metrics import passthrough_reason

    messages = synthetic_history(30, seed=1)
    with RedisServer() as own:
        connection = RedisConnection(own.url, retry_s=60)
        gem = GEM("paper", encoder="hash", store=RedisSessionStore(connection), token_counter=None)
        connection.client.execute_command("REPLICAOF", "127.0.0.1", "1")
        out = gem.compress(messages, session_id="s")
        assert out.stats.action == "reselected" and UNSAVED in out.stats.reason and "ReadOnlyError" in out.stats.reason
        again = gem.compress(messages, session_id="s")
        assert again.messages is messages and passthrough_reason(again.stats.reason) == "store_unavailable"
        assert again.stats.reason.endswith("(retrying in 60.0 s)")


def test_a_save_whose_answer_comes_too_late_forwards_what_it_saved(redis_server):
    """A save that lands after the store's timeout: the request goes out as the saved state says (compressed), so
    the next request, which builds on that state, extends what the upstream received; it went out unchanged, so the
    state described a body never sent and the next request missed the prompt cache."""
    from gemkernels.compress.gem import UNSAVED

    class LateAnswers(RedisSessionStore):
        """Saves land, but their answers are lost (as when Redis answers after the timeout)."""

        def put(self, session_id, state):
            super().put(session_id, state)
            raise StoreUnavailable("session store unavailable: TimeoutError: Timeout reading from socket")

    messages = synthetic_history(44, seed=3)
    store = LateAnswers(RedisConnection(redis_server.url))
    gem = GEM("core", encoder="hash", store=store, token_counter=None)
    first = gem.compress(messages[:40], session_id="late")
    assert first.stats.action == "reselected" and UNSAVED in first.stats.reason
    assert len(first.messages) < 40  # compressed, as saved
    second = gem.compress(messages, session_id="late")
    assert second.stats.action == "appended" and second.messages[:len(first.messages)] == first.messages


def test_a_compression_whose_state_was_not_saved_is_counted():
    pytest.importorskip("prometheus_client")
    from gemkernels.compress.gem import UNSAVED, Compressed, CompressionStats
    from gemkernels.serve.metrics import Metrics

    metrics = Metrics()
    for action, reason in [("appended", "2 new blocks appended"),
                           ("appended", f"2 new blocks appended{UNSAVED} (StoreUnavailable: timeout)"),
                           ("passthrough", f"invalid structure: a client's text quoting it{UNSAVED}")]:
        metrics.observe_compression("/v1/chat/completions", Compressed([], CompressionStats(action, reason)))
    assert "gem_store_unsaved_total 1.0" in metrics.exposition().decode()  # not the passthrough quoting it


@pytest.mark.parametrize("packed", [
    b"GEM2" + bytes(40),  # another version's
    b"GEM1" + (0).to_bytes(4, "little") + (2**32 - 1).to_bytes(4, "little") + bytes(16),  # 4 billion blocks claimed
    pack_state(SessionState(("ab" * 12,) * 3, frozenset(), "cd" * 16, 2))[:-3],  # cut short
    b"GEMJ" + b'{"keys": [1, 2], "forwarded": [], "goal": "g", "at": 0}',  # fields of other types
    b"GEMJ" + b"[" * 100_000,  # nested past the parser's depth
], ids=["another-version", "4-billion-blocks", "cut-short", "other-types", "nested"])
def test_an_unreadable_state_is_no_state_and_the_next_save_replaces_it(redis_server, packed):
    """A state this version cannot read (or whose count its bytes do not hold: a forged 2^32 made a tuple of
    billions of keys) starts the session afresh, and its save replaces the bad one; every request of the session
    went out unchanged with a traceback until the key expired."""
    with pytest.raises(ValueError):
        unpack_state(packed)
    store = store_on(redis_server)
    store.connection.client.hset(store.key("bad"), mapping={"v": 7, "s": packed})
    started = time.perf_counter()
    out = GEM("core", encoder="hash", store=store, token_counter=None).compress(synthetic_history(40, seed=4),
                                                                                 session_id="bad")
    assert out.stats.action == "reselected" and time.perf_counter() - started < 5
    assert store.connection.client.hget(store.key("bad"), "v") == b"8"  # saved over it (the version it read)
    assert store.get("bad") is not None


@pytest.mark.parametrize(("store_ttl", "kept"), [(3600.0, 7 * 86400), (30 * 86400.0, 30 * 86400)])
def test_gem_serve_keeps_shared_embeddings_a_week_at_least(redis_server, store_ttl, kept):
    """As DESIGN.md §5.1 says (the wiring gave them a day), or a session's TTL when that is longer."""
    pytest.importorskip("starlette")
    from gemkernels.compress.encoders import make_encoder
    from gemkernels.serve.compressor import shared_state
    from gemkernels.serve.config import ServerConfig

    config = ServerConfig(upstream="http://127.0.0.1:9", store=redis_server.url, store_ttl=store_ttl)
    _, shared, close = shared_state(config, make_encoder("hash"), lambda trips: None)
    try:
        assert shared.ttl_s == kept
    finally:
        close()
