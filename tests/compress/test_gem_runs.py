"""GEM.compress invariants replayed over every development run in ../shared/data/trajectories/.

Each run is walked through its checkpoints (``messages[:pos]`` for every assistant turn: the request
that turn answered) with one GEM and one session id per run, so the online policy runs as in
serving: unchanged below 16 blocks, a global reselection at the first eligible request, then
appends. Every step is checked; the module skips when the data folder is absent.
"""

import json

import pytest
from helpers import TRAJECTORIES

from gemkernels import GEM
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import CachedEncoder, HashEncoder
from gemkernels.evaluate.loaders import checkpoints, load_runs

DATA = TRAJECTORIES
if not DATA.is_dir():
    pytest.skip(f"development runs not found at {DATA}", allow_module_level=True)

RUNS, ERRORS = load_runs(DATA)
SESSION = "replay"
MIN_BLOCKS = 16
RECENT = 4
FAMILIES = {"mini-swe-agent-1", "swe-agent", "tau-bench"}


def test_every_development_run_loads():
    assert not ERRORS
    assert {run.format for run in RUNS} >= FAMILIES
    assert sum(len(parse_history(r.messages).spans) >= MIN_BLOCKS for r in RUNS) >= 50
    for family in FAMILIES:  # every family reaches the compressed regime at least once
        assert any(r.format == family and len(parse_history(r.messages).spans) >= MIN_BLOCKS for r in RUNS)


def make_gem(preset: str) -> GEM:
    return GEM(preset, encoder=CachedEncoder(HashEncoder(128)), token_counter=None)


def check_step(request, result, history, where):
    """Invariants every compressed step satisfies; returns the indices of the forwarded blocks."""
    out, stats = result.messages, result.stats
    index = {id(m): i for i, m in enumerate(request)}
    assert all(id(m) in index for m in out), f"{where}: forwarded a message that is not the caller's object"
    positions = [index[id(m)] for m in out]
    assert all(a < b for a, b in zip(positions, positions[1:])), f"{where}: order changed or message repeated"
    parse_history(out)  # every tool result keeps its call and vice versa
    kept = set(positions)
    assert set(range(history.prefix_end)) <= kept, f"{where}: prefix dropped"
    non_block = set(range(len(request))) - history.block_positions
    assert non_block <= kept, f"{where}: a message outside the blocks was dropped"
    forwarded = set()
    for b, span in enumerate(history.spans):
        inside = set(span.positions) & kept
        assert inside in (set(), set(span.positions)), f"{where}: block {b} was split"
        if inside:
            forwarded.add(b)
    n = len(history.spans)
    assert set(range(n - RECENT, n)) <= forwarded, f"{where}: one of the last {RECENT} blocks was dropped"
    assert sorted(stats.removed_blocks) == sorted(set(range(n)) - forwarded), where
    assert stats.forwarded_blocks == len(forwarded) and stats.blocks == n, where
    assert stats.messages_before == len(request) and stats.messages_after == len(out), where
    assert stats.chars_before == len(json.dumps(request)), f"{where}: chars_before"
    assert stats.chars_after == len(json.dumps(out)), f"{where}: chars_after"
    return forwarded


def replay(run, preset):
    """Walk one run; returns (steps compressed, encoded blocks summed, distinct blocks seen)."""
    gem = make_gem(preset)
    delta = gem.config.delta
    snapshot = json.dumps(run.messages)
    prev_keys = prev_forwarded = prev_task = None
    encoded_total = compressed = 0
    distinct: set[str] = set()
    for pos in checkpoints(run.messages):
        request = run.messages[:pos]
        history = parse_history(request)
        n = len(history.spans)
        result = gem.compress(request, session_id=SESSION)
        stats = result.stats
        where = f"{run.name} [{preset}] messages[:{pos}] ({n} blocks, {stats.action}: {stats.reason})"
        if n < MIN_BLOCKS:
            assert result.messages is request and stats.action == "unchanged", where
            assert stats.encoded_blocks == 0, where
            continue
        compressed += 1
        forwarded = check_step(request, result, history, where)
        keys = [span.key for span in history.spans]
        distinct.update(keys)
        encoded_total += stats.encoded_blocks
        task = history.task_text()
        if prev_keys is None:
            assert stats.action == "reselected" and "first eligible" in stats.reason, where
            assert stats.encoded_blocks == n, where
        else:
            assert keys[:len(prev_keys)] == prev_keys, f"{where}: the run is not an extension (data problem)"
            new = range(len(prev_keys), n)
            assert stats.encoded_blocks == len(new), f"{where}: encoded {stats.encoded_blocks}, new {len(new)}"
            if stats.action == "appended":
                still = {b for b in range(len(prev_keys)) if prev_keys[b] in prev_forwarded}
                assert still <= forwarded, f"{where}: previously forwarded blocks {sorted(still - forwarded)} dropped"
                assert set(new) <= forwarded, f"{where}: new blocks {sorted(set(new) - forwarded)} not forwarded"
            else:  # no 256-block runs here and every request extends the last: only a goal change reselects
                assert stats.action == "reselected" and stats.reason == "goal changed" and task != prev_task, where
        if stats.action == "reselected":
            assert stats.chars_after >= (1 - delta) * stats.chars_before, f"{where}: guard exceeded"
            assert set(stats.core) <= forwarded, f"{where}: the selected core was not forwarded"
        prev_keys, prev_forwarded, prev_task = keys, {keys[b] for b in forwarded}, task
    assert encoded_total == len(distinct), f"{run.name} [{preset}]: encoded {encoded_total}, distinct {len(distinct)}"
    assert json.dumps(run.messages) == snapshot, f"{run.name} [{preset}]: the caller's messages were mutated"
    return compressed, encoded_total, len(distinct)


@pytest.mark.parametrize("preset", ["paper", "core"])
@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_online_replay_invariants(run, preset):
    replay(run, preset)


def test_core_preset_actually_removes_blocks_on_real_runs():
    """Guards the replay test against vacuity: deep rewrites on real runs do drop blocks."""
    run = max((r for r in RUNS if r.format == "mini-swe-agent-1"), key=lambda r: len(r.messages))
    stats = make_gem("core").compress(run.messages, session_id=SESSION).stats
    assert stats.action == "reselected" and stats.removed_blocks
    assert stats.chars_after < 0.9 * stats.chars_before


def test_edited_old_observation_is_accounted_at_its_new_size():
    """A caller that masks an old tool output between two requests of one session (same call ids, new content).

    ``chars_before`` must still equal ``len(json.dumps(request))``. Library bug: GEM caches per-block info by
    the tool-call ids (``span.key``), not by content, so the old block's size (and embedding) is reused."""
    run = next(r for r in RUNS if r.format == "mini-swe-agent-1" and len(parse_history(r.messages).spans) >= 24)
    spans = parse_history(run.messages).spans
    gem = make_gem("paper")
    first = gem.compress(run.messages[:spans[19].start], session_id=SESSION)
    assert first.stats.action == "reselected"
    second_request = list(run.messages[:spans[23].start])
    observation = spans[2].positions[1]
    second_request[observation] = {**second_request[observation], "content": "[old output elided]"}
    second = gem.compress(second_request, session_id=SESSION)
    assert second.stats.chars_before == len(json.dumps(second_request))
    assert second.stats.chars_after == len(json.dumps(second.messages))
