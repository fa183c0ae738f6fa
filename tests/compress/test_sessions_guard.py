"""SessionStore (LRU + TTL, thread safety), the forwarding guard, GEMConfig validation and resolve_config."""

import math
import random
import sys
import threading
from dataclasses import replace

import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels.compress.config import PRESETS, GEMConfig, resolve_config  # noqa: E402
from gemkernels.compress.evidence import EvidenceConfig  # noqa: E402
from gemkernels.compress.guard import guarded_removals, one_at_a_time  # noqa: E402
from gemkernels.compress.sessions import SessionState, SessionStore  # noqa: E402


def state(tag: str) -> SessionState:
    return SessionState((tag,), frozenset({tag}), f"goal {tag}", 1)


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# ----------------------------------------------------------------------------- SessionStore


def test_get_put_and_replace():
    store = SessionStore()
    assert store.get("a") is None and len(store) == 0
    s1, s2 = state("1"), state("2")
    store.put("a", s1)
    assert store.get("a") is s1 and store.get("b") is None
    store.put("a", s2)
    assert store.get("a") is s2 and len(store) == 1


def test_lru_eviction_at_max_sessions():
    store = SessionStore(max_sessions=3)
    states = {k: state(k) for k in "abcde"}
    for k in "abc":
        store.put(k, states[k])
    assert store.get("a") is states["a"]  # a is now the most recent; b the least
    store.put("d", states["d"])
    assert len(store) == 3 and store.get("b") is None
    assert store.get("c") is states["c"] and store.get("a") is states["a"]  # order now d, c, a
    store.put("e", states["e"])
    assert store.get("d") is None
    assert [store.get(k) for k in "cae"] == [states[k] for k in "cae"]


def test_put_refreshes_recency():
    store = SessionStore(max_sessions=2)
    store.put("a", state("a"))
    store.put("b", state("b"))
    store.put("a", state("a2"))  # a becomes the most recent
    store.put("c", state("c"))
    assert store.get("b") is None and store.get("a").goal == "goal a2"


def test_max_sessions_one():
    store = SessionStore(max_sessions=1)
    store.put("a", state("a"))
    store.put("b", state("b"))
    assert len(store) == 1 and store.get("a") is None and store.get("b") is not None


def test_ttl_expiry_with_fake_clock():
    clock = FakeClock()
    store = SessionStore(ttl_s=10.0, clock=clock)
    s = state("a")
    store.put("a", s)
    clock.now += 10.0
    assert store.get("a") is s  # exactly ttl_s old: still alive (and refreshed)
    clock.now += 10.5
    assert store.get("a") is None and len(store) == 0  # expired entries are dropped on access
    assert store.get("a") is None


def test_get_refreshes_ttl():
    clock = FakeClock()
    store = SessionStore(ttl_s=10.0, clock=clock)
    s = state("a")
    store.put("a", s)
    for _ in range(5):  # 40 s in all, never 10 s without a use
        clock.now += 8.0
        assert store.get("a") is s
    clock.now += 11.0
    assert store.get("a") is None


def test_put_resets_ttl_and_other_sessions_expire_independently():
    clock = FakeClock()
    store = SessionStore(ttl_s=5.0, clock=clock)
    store.put("a", state("a"))
    clock.now += 3
    store.put("b", state("b"))
    clock.now += 3  # a is 6 s old, b 3 s
    assert store.get("a") is None and store.get("b") is not None
    store.put("b", state("b2"))
    clock.now += 4.9
    assert store.get("b").goal == "goal b2"


def test_the_default_store_and_gems_and_wraps_are_bounded_in_bytes():
    """Without a ``max_bytes`` a store kept every state under its session count: 10,000 sessions of a long history
    (``wrap(client)``'s and a library ``GEM()``'s default store) held gigabytes; now 1 GiB by default."""
    from gemkernels import GEM

    for store in (SessionStore(), GEM("paper", encoder="hash").store):  # wrap(client)'s default is GEM("paper")
        for tag in "abc":
            store.put(tag, replace(state(tag), nbytes=400 << 20))
        assert store.nbytes <= 1 << 30 and store.get("a") is None and store.get("c") is not None


@pytest.fixture
def fast_thread_switching():
    """Switch threads often so unsynchronised store updates would interleave and show."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(worker, count: int) -> list[BaseException]:
    """Run ``worker(t)`` in ``count`` threads released together; the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def guarded(t):
        try:
            barrier.wait()
            worker(t)
        except BaseException as err:  # noqa: BLE001 -- reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_thread_safety_many_sessions(fast_thread_switching):
    store = SessionStore(max_sessions=50)

    def worker(t):
        rng = random.Random(t)
        for _ in range(2000):
            key = f"s{rng.randrange(200)}"
            if rng.random() < 0.5:
                store.put(key, state(key))
            else:
                got = store.get(key)
                assert got is None or got.block_keys == (key,)
            assert len(store) <= 50

    assert not run_threads(worker, 16)
    assert 0 < len(store) <= 50


def test_thread_safety_same_session_with_expiry(fast_thread_switching):
    clock_lock = threading.Lock()
    ticks = [0.0]

    def clock():
        with clock_lock:
            ticks[0] += 0.001
            return ticks[0]

    store = SessionStore(max_sessions=4, ttl_s=0.05, clock=clock)

    def worker(t):
        for i in range(1500):
            key = f"k{i % 6}"
            if (i + t) % 3:
                store.put(key, state(key))
            else:
                got = store.get(key)
                assert got is None or got.block_keys == (key,)  # never another session's state
            assert len(store) <= 4

    assert not run_threads(worker, 12)
    assert len(store) <= 4


@pytest.mark.parametrize("kwargs", [{"max_sessions": 0}, {"max_sessions": -5}, {"ttl_s": 0}, {"ttl_s": -1.0}])
def test_bad_store_arguments(kwargs):
    with pytest.raises(ValueError):
        SessionStore(**kwargs)


# ----------------------------------------------------------------------------- guarded_removals


def test_larger_first():
    sizes = [10, 50, 30, 20]
    # total 110, delta 0.5: floor 55. 50 first (kept 60), then 30 refused, 20 refused, 10 refused
    assert guarded_removals(sizes, [0, 1, 2, 3], 110, 0.5) == [1]


def test_ties_go_to_the_earliest():
    sizes = [5, 20, 20, 20, 35]
    # total 100, delta 0.2: floor 80; one of the three 20s fits, the earliest wins
    assert guarded_removals(sizes, [3, 2, 1], 100, 0.2) == [1]
    assert guarded_removals(sizes, [3, 2], 100, 0.2) == [2]


def test_continues_to_smaller_blocks_after_a_refusal():
    sizes = [40, 30, 12, 8, 5, 1]
    # total 100, delta 0.25: floor 75. 40 refused, 30 refused, 12 (kept 88), 8 (80), 5 (75, exactly the floor),
    # 1 refused
    assert guarded_removals(sizes, range(6), 100, 0.25) == [2, 3, 4]


def test_only_removable_blocks_are_dropped_and_result_is_sorted():
    sizes = [100, 1, 100, 1, 100]
    out = guarded_removals(sizes, [4, 3, 1], 302, 1.0)
    assert out == [1, 3, 4]


def test_delta_zero_removes_nothing():
    sizes = [3, 9, 27, 1]
    assert guarded_removals(sizes, range(4), sum(sizes) + 10, 0.0) == []


def test_delta_one_removes_all_removable():
    sizes = [3, 9, 27, 1, 81]
    assert guarded_removals(sizes, [0, 2, 3, 4], sum(sizes) + 5, 1.0) == [0, 2, 3, 4]


def test_empty_removable():
    assert guarded_removals([5, 6], [], 11, 0.5) == []


@pytest.mark.parametrize("delta", [-0.01, 1.01, 2, -1, math.nan, math.inf])
def test_bad_delta_raises(delta):
    with pytest.raises(ValueError, match="delta"):
        guarded_removals([1, 2], [0, 1], 3, delta)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=40),
       other=st.integers(0, 50_000), delta=st.floats(0, 1), data=st.data())
def test_guard_properties(sizes, other, delta, data):
    n = len(sizes)
    removable = data.draw(st.lists(st.integers(0, n - 1), unique=True))
    total = sum(sizes) + other
    dropped = guarded_removals(sizes, removable, total, delta)
    floor = (1.0 - delta) * total
    kept = total - sum(sizes[b] for b in dropped)
    assert dropped == sorted(set(dropped)) and set(dropped) <= set(removable)
    assert kept >= floor  # never below (1 - delta) of the request
    for b in set(removable) - set(dropped):
        assert kept - sizes[b] < floor  # greedy is maximal: every refused block would still break the floor


# ----------------------------------------------------------------------------- GEMConfig / resolve_config


def test_presets():
    assert PRESETS["paper"] == GEMConfig()
    assert (PRESETS["paper"].delta, PRESETS["balanced"].delta, PRESETS["core"].delta) == (0.05, 0.5, 1.0)
    paper = PRESETS["paper"]
    assert (paper.tau, paper.k, paper.min_blocks, paper.reselect_every, paper.max_text_chars) == (0.9, 16, 16, 256,
                                                                                                  12_000)
    assert paper.evidence == EvidenceConfig() and paper.evidence.recent == 4


@pytest.mark.parametrize("field, value", [
    ("tau", 0), ("tau", -0.5), ("tau", 1.01), ("tau", math.nan),
    ("delta", -0.1), ("delta", 1.5), ("delta", math.nan),
    ("k", -1), ("min_blocks", 0), ("reselect_every", 0), ("max_text_chars", 0), ("max_text_chars", -10),
])
def test_config_validation(field, value):
    with pytest.raises(ValueError, match=field):
        GEMConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("tau", 1.0), ("delta", 0.0), ("delta", 1.0), ("k", 0), ("min_blocks", 1)])
def test_config_accepts_bounds(field, value):
    assert getattr(GEMConfig(**{field: value}), field) == value


def test_resolve_config():
    assert resolve_config(None) is PRESETS["paper"]
    assert resolve_config("core") is PRESETS["core"]
    custom = GEMConfig(k=8)
    assert resolve_config(custom) is custom
    over = resolve_config("balanced", k=32, tau=0.8)
    assert (over.delta, over.k, over.tau) == (0.5, 32, 0.8)
    assert PRESETS["balanced"].k == 16  # presets are not changed by overrides
    assert resolve_config(custom, delta=0.2) == GEMConfig(k=8, delta=0.2)


def test_resolve_config_errors():
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        resolve_config("nope")
    with pytest.raises(TypeError):
        resolve_config(42)
    with pytest.raises(ValueError, match="delta"):
        resolve_config("paper", delta=3)  # overrides are validated too
    with pytest.raises(TypeError):
        resolve_config("paper", no_such_field=1)


def test_the_session_store_is_bounded_in_bytes_as_well_as_in_count():
    """Five sessions of a long history each held their whole block cache, whatever it weighed; with a byte budget
    the least recently used go first, and a state larger than the budget alone is not kept. (GEM ignored a store
    it was given while the store was empty, since an empty store is falsy: the server's limits never applied.)"""
    from gemkernels import GEM
    from gemkernels.compress.encoders import HashEncoder
    from gemkernels.compress.sessions import SessionState, SessionStore
    from gemkernels.testing.histories import synthetic_history

    one = GEM("paper", encoder=HashEncoder(64), token_counter=None)
    one.compress(synthetic_history(40), session_id="probe")
    weight = one.store.nbytes
    assert weight >= 40 * 64 * 4  # at least the block embeddings
    store = SessionStore(max_bytes=int(2.5 * weight))
    gem = GEM("paper", encoder=HashEncoder(64), token_counter=None, store=store)
    for s in range(5):
        gem.compress(synthetic_history(40, seed=s), session_id=f"s{s}")
        assert store.nbytes <= store.max_bytes
    assert len(store) == 2 and store.get("s4") is not None and store.get("s0") is None
    store.put("huge", SessionState((), frozenset(), "", 0, nbytes=10 * weight))
    assert store.get("huge") is None and store.nbytes <= store.max_bytes
    store.put("s4", SessionState((), frozenset(), "", 0, nbytes=1))  # a state replaced is counted once
    assert store.nbytes == sum(item[1].nbytes for item in store._items.values())


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 10**7) | st.integers(0, 30), min_size=1, max_size=60), data=st.data(),
       delta=st.floats(0, 1) | st.sampled_from([0.0, 0.05, 0.25, 0.5, 1.0]), extra=st.integers(0, 10**6))
def test_the_guard_decides_as_one_candidate_at_a_time_would(sizes, data, delta, extra):
    """The guard skips to the next candidate that fits (a search over the sorted sizes) and takes the run after it
    that fits in turn (a search over their running sums), exactly as trying each (`one_at_a_time`, the definition
    read literally, which the hand-worked cases above pin); small sizes make long runs and many ties."""
    removable = data.draw(st.lists(st.sampled_from(range(len(sizes))), unique=True))
    total = sum(sizes) + extra
    assert guarded_removals(sizes, removable, total, delta) == one_at_a_time(sizes, removable, total, delta)


def test_negative_or_huge_integer_sizes_are_tried_one_at_a_time():
    """Running sums need sizes that do not shrink them and cannot overflow int64: else the definition decides."""
    overflowing = [4506402125543680327, 6, 5287632283461410170, 6737377472505923688, 4, 3, 15, 13, 4,
                   8992849135678201599, 2577572578560057200, 12, 1, 7, 2]  # their running sums wrap int64
    for sizes, total in (([5, -3, 4, 2], 20), ([2**61, 2**61, 1], 2**52), ([2**40] * 5000, 2**52), (overflowing, 75)):
        removable = list(range(len(sizes)))
        for delta in (0.3, 0.5):
            assert guarded_removals(sizes, removable, total, delta) == one_at_a_time(sizes, removable, total, delta)


def test_fractional_sizes_are_compared_exactly():
    """Sizes that are not integers are not truncated: 10.6 + 10.6 would leave 78.8 of 100 under a floor of 80."""
    assert guarded_removals([10.6, 10.6, 5.0], [0, 1, 2], 100, 0.2) == [0, 2]
    assert guarded_removals([2**64, 1, 1], [0, 1, 2], 2**65, 0.5) == [0]  # beyond int64: no overflow
    assert guarded_removals([2**63, 2**63], [0, 1], 2**65, 0.25) == [0]  # numpy reads these as uint64


# ----------------------------------------------------------------------------- the guard across a session


class DeferringEncoder:
    """A hash encoder that defers (as the server's queue past its budget) while ``deferring`` is set."""

    def __init__(self):
        from gemkernels.compress.encoders import HashEncoder

        self.inner, self.deferring = HashEncoder(64), False
        self.name, self.dim = self.inner.name, self.inner.dim

    def encode(self, texts):
        from gemkernels.compress.encoders import EncodingDeferred

        if self.deferring:
            raise EncodingDeferred("over budget")
        return self.inner.encode(texts)


@settings(max_examples=40, deadline=None)
@given(preset=st.sampled_from(["paper", "balanced"]), notes=st.integers(2_000, 60_000), kept=st.integers(0, 1_000),
       deferred=st.booleans())
def test_an_append_never_forwards_less_than_the_guard_allows(preset, notes, kept, deferred):
    """A client that shortens a message outside blocks (here a long assistant note, not a goal) while its blocks
    stay: appending to the saved forwarded set, which the guard sized for the longer request, forwarded less than
    1 - delta of this one (balanced: 42% of it); it reselects instead, or goes out unchanged when encoding defers."""
    from gemkernels import GEM
    from gemkernels.testing.histories import synthetic_history

    encoder = DeferringEncoder()
    gem = GEM(preset, encoder=encoder, token_counter=None)
    history = synthetic_history(41, seed=1)
    note = {"role": "assistant", "content": "notes " * (notes // 6)}
    first = gem.compress(history[:2] + [note] + history[2:-2], session_id="s")
    assert first.stats.removed_blocks
    encoder.deferring = deferred
    shortened = {"role": "assistant", "content": note["content"][:kept]}
    result = gem.compress(history[:2] + [shortened] + history[2:], session_id="s")
    stats = result.stats
    assert stats.action == "passthrough" or stats.chars_after >= (1 - gem.config.delta) * stats.chars_before


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(st.none() | st.text("a\x1f[]\"", max_size=4), st.text("a\x1f[]\"", max_size=4)),
                      min_size=2, max_size=2, unique=True))
def test_sessions_of_two_tenants_never_meet_whatever_ids_they_send(pairs):
    """The store key was ``tenant\\x1fsession`` (the bare id without a tenant): tenant ``a`` with session ``b\\x1fc``
    and tenant ``a\\x1fb`` with session ``c`` shared one session, and so did no tenant with ``a\\x1fb`` and tenant
    ``a`` with ``b``. Every (tenant, session id) pair has a key of its own, and a server tenant's keys are as before."""
    from gemkernels.compress.gem import session_key

    (tenant, session), (other_tenant, other_session) = pairs
    assert session_key(session, tenant) != session_key(other_session, other_tenant)
    assert session_key("s", "0f3a") == "0f3a\x1fs" and session_key("s", None) == "s"


def test_a_tenant_never_reaches_another_tenants_session_through_the_separator():
    from gemkernels import GEM
    from gemkernels.compress.encoders import HashEncoder
    from gemkernels.testing.histories import synthetic_history

    gem = GEM("paper", encoder=HashEncoder(64), token_counter=None)
    messages = synthetic_history(30, seed=2)
    gem.compress(messages, session_id="b\x1fc", tenant="a")
    gem.compress(messages, session_id="b", tenant="a")
    for session, tenant in (("c", "a\x1fb"), ("a\x1fb", None)):
        assert gem.compress(messages, session_id=session, tenant=tenant).stats.reason == \
            "first eligible request of the session"
