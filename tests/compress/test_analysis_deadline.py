"""`GEM.compress`'s ``deadline``: past it a request stops analysing its blocks (token counts, features, the
router's lexicons) and goes out as a deferred one does; what it analysed, and what `GEM.prepare` adds after it,
waits in `PendingAnalysis` for the session's next request, which then forwards what a GEM that analysed
everything itself forwards."""

import contextlib
import copy
import json
import time
from dataclasses import replace
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from gemkernels import GEM, GEMConfig
from gemkernels.compress import gem as gem_module
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import HashEncoder
from gemkernels.compress.gem import APPENDED, PASSTHROUGH, RESELECTED, AnalysisDeferred
from gemkernels.compress.sessions import PendingAnalysis, SessionConflict, SessionStore
from gemkernels.testing.histories import synthetic_history

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_session_properties import CONFIGS, check_output, sessions  # noqa: E402

ROUTER = GEMConfig(min_blocks=3, k=3, delta=1.0, ranking="router", keep_recent_size=True, rewrite_above_blocks=6,
                   repay_factor=0.5, thinking_bound=False)
ROUTER_CEILING = GEMConfig(min_blocks=3, k=3, delta=1.0, ranking="router", keep_recent_size=True,
                           rewrite_above_blocks=8, repay_factor=0.5, thinking_bound=False, max_forward_tokens=1500)
#: What an appending request's reason says when the ranking of a rewrite that may repay ran out of time.
RANKING_CUT = "; the rewrite's ranking was deferred"


class CountingClock:
    """``time.monotonic`` that moves one tick per call: a deadline ``ticks`` ahead lets exactly that many deadline
    checks pass."""

    def __init__(self) -> None:
        self.now = 0

    def monotonic(self) -> int:
        self.now += 1
        return self.now

    def patched(self):
        return mock.patch.object(gem_module, "time", SimpleNamespace(monotonic=self.monotonic,
                                                                     perf_counter=time.perf_counter))


def infos_of(gem: GEM, session: str = "s") -> list[tuple]:
    """What the session's saved state holds of each block, comparable across GEMs, and its lexicon (None: not read
    yet)."""
    columns = gem.store.get(session).columns
    return [((info.chars, info.tokens, info.features, info.tools, info.signature, info.embedding.tobytes()),
             None if info.lexicon is None else (info.lexicon.holds.tobytes(), info.lexicon.names.tobytes()))
            for info in columns.infos]


def same_analyses(cut: GEM, reference: GEM) -> None:
    """The blocks' analyses agree; a lexicon the reference read, the other holds too (`prepare` may have read some
    that no ranking of the reference has needed yet)."""
    mine, theirs = infos_of(cut), infos_of(reference)
    assert [info for info, _ in mine] == [info for info, _ in theirs]
    assert all(want is None or got == want for (_, got), (_, want) in zip(mine, theirs))


def cut_ranking(gem: GEM):
    """A patch of ``gem`` whose rankings' lexicon reading is out of time before the first lexicon."""
    def read_lexicons(columns, *args, **kwargs):
        if any(lexicon is None for lexicon in columns.lexicons):
            raise AnalysisDeferred("0 lexicons read at the deadline", {})
        return columns
    return mock.patch.object(gem, "_read_lexicons", read_lexicons)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sessions(), st.sampled_from(CONFIGS + [ROUTER, ROUTER_CEILING]), st.data())
def test_a_request_past_its_deadline_forwards_what_a_deferred_one_does_and_the_next_forwards_as_if_never_cut(
        requests, config, data):
    """``cut`` runs each request under a deadline a random number of checks ahead (or none) and sometimes prepares
    after a deferral; ``reference`` defers exactly those requests before analysing anything (and cuts exactly the
    rankings ``cut`` cut short, before any lexicon) and never reuses an analysis. Both forward the same, every
    output keeps the contract, and every saved state holds the same block analyses."""
    cut = GEM(config, encoder=HashEncoder(32), token_counter=len)
    reference = GEM(config, encoder=HashEncoder(32), token_counter=len)
    reference.pending = PendingAnalysis(max_bytes=0)  # holds nothing: every analysis is its own
    clock = CountingClock()
    for text, dry in requests:
        mine, theirs = json.loads(text), json.loads(text)
        before = copy.deepcopy(mine)
        ticks = data.draw(st.one_of(st.none(), st.integers(0, 12)), label="checks before the deadline")
        with clock.patched():
            got = cut.compress(mine, session_id="s", save=not dry,
                               deadline=None if ticks is None else clock.now + ticks)
        assert mine == before
        check_output(mine, got, config.delta)
        deferred = got.stats.reason.startswith("analysis deferred")
        ranking_cut = RANKING_CUT in got.stats.reason
        event("deferred" if deferred else "ranking cut" if ranking_cut else got.stats.action)
        with clock.patched(), (cut_ranking(reference) if ranking_cut else contextlib.nullcontext()):
            want = reference.compress(theirs, session_id="s", save=not dry,
                                      deadline=clock.now if deferred else None)
        assert want.stats.reason.startswith("analysis deferred") == deferred
        assert (RANKING_CUT in want.stats.reason) == ranking_cut
        positions = {id(m): i for i, m in enumerate(mine)}
        theirs_at = {id(m): i for i, m in enumerate(theirs)}
        assert [positions[id(m)] for m in got.messages] == [theirs_at[id(m)] for m in want.messages]
        assert (got.stats.action, got.stats.removed_blocks) == (want.stats.action, want.stats.removed_blocks)
        if deferred:
            assert got.stats.action in (APPENDED, PASSTHROUGH)
            if data.draw(st.booleans(), label="prepare"):
                cut.prepare(json.loads(text), session_id="s")
        else:
            assert got.stats.reason.split(RANKING_CUT)[0] == want.stats.reason.split(RANKING_CUT)[0]
            if not dry and got.stats.action in (APPENDED, RESELECTED):
                same_analyses(cut, reference)


def test_a_request_already_past_its_deadline_analyses_nothing_and_prepare_leaves_its_next_request_nothing(
        monkeypatch):
    """The first eligible request of a 40-block session, its deadline passed: unchanged at once, no block's
    features read; `prepare` analyses all 40 blocks; the next request (no deadline) analyses none and forwards
    what a GEM that never deferred forwards."""
    calls = []
    features = gem_module.block_features
    monkeypatch.setattr(gem_module, "block_features", lambda block: calls.append(block) or features(block))
    config = GEMConfig(min_blocks=16, k=6, delta=1.0)
    gem, fresh = (GEM(config, encoder=HashEncoder(64), token_counter=len) for _ in range(2))
    history = synthetic_history(40, seed=3)
    late = gem.compress(history, session_id="s", deadline=time.monotonic() - 1.0)
    assert late.stats.action == PASSTHROUGH and late.messages is history
    assert late.stats.reason.startswith("analysis deferred: 0 of 40 new blocks analysed at the deadline")
    assert calls == [] and gem.store.get("s") is None
    assert gem.prepare(history, session_id="s") == 40 and len(calls) == 40
    assert gem.store.get("s") is None  # the state is only ever saved by a request
    calls.clear()
    grown = history + synthetic_history(41, seed=3)[-2:]
    out = gem.compress(grown, session_id="s")
    assert len(calls) == 1 and out.stats.encoded_blocks == 1  # only the block the prepared history lacked
    want = fresh.compress(copy.deepcopy(grown), session_id="s")
    assert out.stats.action == want.stats.action == RESELECTED
    assert out.stats.removed_blocks == want.stats.removed_blocks
    assert len(gem.pending) == 0  # the saved state holds them now


def test_a_ranking_past_its_deadline_keeps_the_lexicons_it_read_for_the_next_request():
    """Under the router, a session that appended (no lexicon read) grows past its budget: its new blocks are
    analysed in time but the ranking's lexicons are cut at the deadline, so it goes out on the append path with the
    lexicons read so far pending (of blocks its saved state holds without one); the next request reads only the
    rest, and holds and forwards what a GEM that was never cut does."""
    gem, reference = (GEM(ROUTER, encoder=HashEncoder(64), token_counter=len) for _ in range(2))
    short, grown = synthetic_history(5, seed=5), synthetic_history(9, seed=5)
    for one in (gem, reference):
        assert one.compress(copy.deepcopy(short), session_id="s").stats.action == APPENDED
        assert all(lexicon is None for lexicon in one.store.get("s").columns.lexicons)
    clock = CountingClock()
    with clock.patched():  # 4 checks pass (the new blocks), then 5 of the ranking's 9 lexicon checks
        late = gem.compress(grown, session_id="s", deadline=clock.now + 4 + 5)
    assert late.stats.action == APPENDED
    assert late.stats.reason.startswith("analysis deferred: 5 of 9 lexicons read at the deadline")
    pending = gem.pending.get("s")
    assert len(pending) == 9  # the 4 new blocks' infos, and 5 with a lexicon read
    assert sum(info.lexicon is not None for info in pending.values()) == 5
    assert all(lexicon is None for lexicon in gem.store.get("s").columns.lexicons)  # the saved state as it was
    read = []
    lexicon = gem_module.block_lexicon
    with mock.patch.object(gem_module, "block_lexicon", lambda block, text: read.append(1) or lexicon(block, text)):
        out = gem.compress(grown, session_id="s")
    want = reference.compress(copy.deepcopy(grown), session_id="s")
    assert out.stats.action == want.stats.action == RESELECTED and len(read) == 4
    assert out.stats.removed_blocks == want.stats.removed_blocks
    assert infos_of(gem) == infos_of(reference)


class Sized:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes


def test_pending_analysis_is_bounded_in_bytes_least_recently_touched_session_first():
    pending = PendingAnalysis(max_bytes=100)
    pending.add("a", {1: Sized(30), 2: Sized(30)})
    pending.add("b", {1: Sized(30)})
    assert pending.nbytes == 90 and len(pending) == 2
    pending.get("a")  # touched: b is now the oldest
    pending.add("c", {9: Sized(20)})
    assert pending.get("b") == {} and set(pending.get("a")) == {1, 2} and pending.nbytes == 80
    pending.add("a", {2: Sized(10)})  # replaced, not added twice
    assert pending.nbytes == 60
    copy_of = pending.get("a")
    copy_of.clear()
    assert len(pending.get("a")) == 2  # get gives a copy
    pending.discard("a")
    assert pending.get("a") == {} and pending.nbytes == 20
    pending.add("d", {1: Sized(500)})  # larger than the bound: nothing is kept
    assert pending.nbytes == 0 and len(pending) == 0


def test_prepare_never_raises_and_skips_short_histories():
    gem = GEM(GEMConfig(min_blocks=16), encoder=HashEncoder(16), token_counter=len)
    assert gem.prepare(synthetic_history(5), session_id="s") == 0
    assert gem.prepare([{"role": "tool", "tool_call_id": ["not", "a", "string"]}], session_id="s") == 0
    assert gem.prepare("not a history") == 0
    assert len(gem.pending) == 0 and gem.pending.nbytes == 0


def test_a_deferred_request_leaves_the_saved_state_as_it_was_and_forwards_as_if_nothing_was_prepared():
    """A saved 8-block session, then a 14-block request deferred, its blocks prepared, and a 15-block request
    deferred: the saved state still holds its 8 blocks (byte count unchanged), and under a token ceiling (which
    weighs blocks by what the state holds) both deferred requests forward what they do on a GEM that never
    prepared."""
    config = GEMConfig(min_blocks=3, k=3, delta=1.0, max_forward_tokens=6000)
    prepared, plain = (GEM(config, encoder=HashEncoder(32), token_counter=len) for _ in range(2))
    histories = [synthetic_history(n, seed=11) for n in (8, 14, 15)]
    for gem in (prepared, plain):
        gem.compress(copy.deepcopy(histories[0]), session_id="s")
    saved = prepared.store.get("s")
    held, nbytes = dict(saved.block_cache), saved.nbytes
    outcomes = []
    for gem in (prepared, plain):
        late = [gem.compress(copy.deepcopy(histories[1]), session_id="s", deadline=time.monotonic() - 1)]
        if gem is prepared:
            assert gem.prepare(copy.deepcopy(histories[1]), session_id="s") == 6
        late.append(gem.compress(copy.deepcopy(histories[2]), session_id="s", deadline=time.monotonic() - 1))
        assert all(result.stats.reason.startswith("analysis deferred") for result in late)
        outcomes.append([(result.stats.action, result.stats.removed_blocks) for result in late])
    assert outcomes[0] == outcomes[1]
    assert prepared.store.get("s") is saved and saved.block_cache == held and saved.nbytes == nbytes


def test_a_rewrite_that_may_repay_and_runs_out_of_time_appends_and_saves_the_lexicons_it_read(monkeypatch):
    """The cost bound lets a ranking through on an appending request whose deadline passes 3 lexicons in: the
    request appends and saves as when the bound says no, its reason says so, the saved state holds those 3
    lexicons, and the next ranking reads only the others."""
    monkeypatch.setattr(gem_module, "could_repay", lambda *args: True)
    config = GEMConfig(min_blocks=3, k=3, delta=1.0, ranking="router", keep_recent_size=True,
                       rewrite_above_blocks=100, repay_factor=0.5, thinking_bound=False)
    gem = GEM(config, encoder=HashEncoder(32), token_counter=len)
    clock = CountingClock()
    with clock.patched():  # its 10 blocks analysed in time, then no lexicon
        first = gem.compress(synthetic_history(10, seed=2), session_id="s", deadline=clock.now + 10)
    assert first.stats.action == APPENDED  # a budgeted first request appends
    assert first.stats.reason.endswith(RANKING_CUT + ": 0 of 10 lexicons read at the deadline")
    assert all(lexicon is None for lexicon in gem.store.get("s").columns.lexicons)
    with clock.patched():  # the new block's check passes, then 3 lexicon checks
        grown = gem.compress(synthetic_history(11, seed=2), session_id="s", deadline=clock.now + 1 + 3)
    assert grown.stats.action == APPENDED and grown.stats.reason.startswith("1 new blocks appended")
    assert RANKING_CUT + ": 3 of 11 lexicons read at the deadline" in grown.stats.reason
    state = gem.store.get("s")
    assert sum(lexicon is not None for lexicon in state.columns.lexicons) == 3
    assert sum(info.lexicon is not None for info in state.block_cache.values()) == 3
    read = []
    lexicon = gem_module.block_lexicon
    monkeypatch.setattr(gem_module, "block_lexicon", lambda block, text: read.append(1) or lexicon(block, text))
    gem.compress(synthetic_history(11, seed=2), session_id="s")
    assert len(read) == 8


class ConflictOnce(SessionStore):
    """A store whose first save finds another request's saved first."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 1

    def put(self, session_id, state) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise SessionConflict("another request of the session saved first")
        super().put(session_id, state)


def test_a_save_that_conflicts_keeps_the_pending_analyses_for_its_retry(monkeypatch):
    calls = []
    features = gem_module.block_features
    monkeypatch.setattr(gem_module, "block_features", lambda block: calls.append(block) or features(block))
    gem = GEM(GEMConfig(min_blocks=3, k=3), encoder=HashEncoder(32), store=ConflictOnce(), token_counter=len)
    history = synthetic_history(12, seed=4)
    assert gem.prepare(history, session_id="s") == 12
    calls.clear()
    out = gem.compress(history, session_id="s")
    assert out.stats.action == RESELECTED and gem.store.get("s") is not None
    assert calls == []  # the retry found them still pending
    assert len(gem.pending) == 0


def test_lexicons_prepared_for_saved_blocks_are_kept_by_the_next_save_even_when_it_appends(monkeypatch):
    """A budgeted router session that appended (no lexicon read), a deferred request prepared (lexicons for every
    block), then an appending request: its save holds every prepared lexicon, so the next ranking reads only
    the newest block's."""
    gem = GEM(ROUTER, encoder=HashEncoder(32), token_counter=len)
    assert gem.compress(synthetic_history(5, seed=6), session_id="s").stats.action == APPENDED
    six = synthetic_history(6, seed=6)
    assert gem.compress(six, session_id="s", deadline=time.monotonic() - 1).stats.reason.startswith(
        "analysis deferred")
    assert gem.prepare(six, session_id="s") == 6
    monkeypatch.setattr(gem_module, "could_repay", lambda *args: False)  # no ranking: it appends
    assert gem.compress(six, session_id="s").stats.action == APPENDED
    assert all(lexicon is not None for lexicon in gem.store.get("s").columns.lexicons)
    assert len(gem.pending) == 0
    read = []
    lexicon = gem_module.block_lexicon
    monkeypatch.setattr(gem_module, "block_lexicon", lambda block, text: read.append(1) or lexicon(block, text))
    monkeypatch.setattr(gem_module, "could_repay", lambda *args: True)
    gem.compress(synthetic_history(7, seed=6), session_id="s")
    assert len(read) == 1


class SavedMeanwhile(SessionStore):
    """A store whose second read finds that a request saved since the first."""

    def __init__(self, saved) -> None:
        super().__init__()
        self.reads, self.saved = 0, saved

    def get(self, session_id):
        self.reads += 1
        return None if self.reads == 1 else self.saved

    local_get = get


def test_prepare_keeps_nothing_when_the_session_saved_meanwhile():
    other = GEM(GEMConfig(min_blocks=3), encoder=HashEncoder(32), token_counter=len)
    other.compress(synthetic_history(6, seed=8), session_id="s")
    gem = GEM(GEMConfig(min_blocks=3), encoder=HashEncoder(32), token_counter=len,
              store=SavedMeanwhile(other.store.get("s")))
    assert gem.prepare(synthetic_history(6, seed=8), session_id="s") == 0
    assert len(gem.pending) == 0


def test_a_folded_lexicon_keeps_the_blocks_own_counts_and_embedding():
    """Another replica's analysis of a block (same identity, its counts taken with other cache marks, say) gives only
    its lexicon: the block keeps its own tokens, characters and embedding, and the byte count grows by the
    lexicon's."""
    gem = GEM(ROUTER, encoder=HashEncoder(16), token_counter=len)
    history = synthetic_history(4, seed=9)
    gem.compress(history, session_id="s")
    columns = gem.store.get("s").columns
    keys = list(gem.store.get("s").block_keys)
    bare = replace(columns, infos=tuple(replace(i, lexicon=None) for i in columns.infos),
                   lexicons=(None,) * len(keys))
    theirs = replace(bare.infos[1], tokens=12345, chars=1, embedding=np.zeros(16, np.float32),
                     lexicon=gem_module.block_lexicon(parse_history(history).block(1), "a/b.py"))
    cache = {}
    folded = GEM._with_lexicons(bare, keys, {keys[1]: theirs}, cache)
    assert folded.infos[1].lexicon is theirs.lexicon and folded.lexicons[1] is theirs.lexicon
    assert (folded.infos[1].tokens, folded.infos[1].chars) == (bare.infos[1].tokens, bare.infos[1].chars)
    assert folded.infos[1].embedding is bare.infos[1].embedding and cache == {keys[1]: folded.infos[1]}
    assert folded.nbytes == bare.nbytes + theirs.lexicon.nbytes
    assert [i.lexicon for i in folded.infos[:1] + folded.infos[2:]] == [None] * (len(keys) - 1)
