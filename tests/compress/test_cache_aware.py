"""Budgeted, append-mostly forwarding: amortized forgetting by recency, and GEM's cache-aware preset."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from helpers import LOGS, TRAJECTORIES  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels import GEM, GEMConfig, select  # noqa: E402
from gemkernels.compress.blocks import parse_history  # noqa: E402
from gemkernels.compress.config import resolve_config, with_overrides  # noqa: E402
from gemkernels.compress.encoders import CachedEncoder, HashEncoder  # noqa: E402
from gemkernels.compress.evidence import EvidenceConfig  # noqa: E402
from gemkernels.compress.policy import could_repay, least_core_tokens, renewal_gap, repay_reason, rewrite_core  # noqa: E402
from gemkernels.compress.router.ranking import router_order  # noqa: E402
from gemkernels.evaluate.loaders import checkpoints  # noqa: E402
from gemkernels.evaluate.online_policies import AmortizedForgetting  # noqa: E402
from gemkernels.testing.histories import synthetic_history  # noqa: E402


def steps(messages):
    """Histories before each new block: the first 2 + 2b messages for b = 1..."""
    return [messages[:2 + 2 * b] for b in range(1, (len(messages) - 2) // 2 + 1)]


def forwarded_blocks(out):
    return len(parse_history(out).spans)


def test_amortized_forgetting_rewrites_once_per_budget_minus_keep_blocks():
    policy = AmortizedForgetting(budget=10, keep=4)
    counts = [forwarded_blocks(policy(h).messages) for h in steps(synthetic_history(30))]
    assert counts[:10] == list(range(1, 11))
    assert counts[10] == 4 and counts[11:17] == list(range(5, 11)) and counts[17] == 4


def test_amortized_forgetting_prefix_is_stable_between_rewrites():
    policy = AmortizedForgetting(budget=10, keep=4)
    outs = [policy(h).messages for h in steps(synthetic_history(30))]
    for before, after in zip(outs[10:16], outs[11:17]):
        assert after[:len(before)] == before  # append only: the previous request is a prefix


@pytest.mark.parametrize("budget, keep", [(5, 5), (3, 4), (4, -1)])
def test_amortized_forgetting_rejects_bad_sizes(budget, keep):
    with pytest.raises(ValueError):
        AmortizedForgetting(budget, keep)


BUDGET_ONLY = GEMConfig(k=20, tau=1.0, delta=1.0, min_blocks=41, rewrite_above_blocks=40,
                        reselect_on_goal_change=False)


def test_block_budget_rewrites_at_the_budget_and_appends_in_between():
    gem = GEM(BUDGET_ONLY, encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    actions, sizes, outs = [], [], []
    for history in steps(synthetic_history(70, seed=2)):
        result = gem.compress(history, session_id="c")
        actions.append(result.stats.action)
        sizes.append(forwarded_blocks(result.messages))
        outs.append(result.messages)
    assert set(actions[:40]) == {"unchanged"} and actions[40] == "reselected"
    assert sizes[40] <= 20 + 4 and max(sizes) <= 41
    rewrites = [i for i, a in enumerate(actions) if a == "reselected"]
    assert len(rewrites) == 2 and all(actions[i] == "appended" for i in range(41, rewrites[1]))
    for i in range(41, rewrites[1]):  # between rewrites the previous request is a prefix of the next
        assert outs[i][:len(outs[i - 1])] == outs[i - 1]


def test_cache_aware_goal_change_waits_for_the_next_rewrite():
    gem = GEM("cache-aware", encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    history = synthetic_history(45, seed=4)
    gem.compress(history[:-2], session_id="g")
    changed = history[:1] + [{"role": "user", "content": "A new task"}] + history[2:]
    assert gem.compress(changed, session_id="g").stats.action == "appended"


def test_budget_must_exceed_k():
    with pytest.raises(ValueError, match="rewrite_above_blocks"):
        GEMConfig(k=20, rewrite_above_blocks=20)


# --------------------------------------------------------------------------- cost model and triggers

def equal_blocks(num_blocks: int) -> list[dict]:
    """A run whose blocks all serialise to the same size (so each costs the same estimated tokens)."""
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it"}]
    for b in range(num_blocks):
        call_id = f"c{b:03d}"
        messages.append({"role": "assistant", "content": f"step {b:03d}", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": f"ls d{b:03d}"}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"output {b:03d} " + "x" * 200})
    return messages


# Keep exactly the last 4 blocks at a rewrite (recent protection only; the newest k = 4 leave no room),
# so with block size s: F = m s (m forwarded), K = M = 4 s, and a rewrite happens at n blocks iff it repays,
# 0.1 (m - 4) (R + 1) > 0.9 * 4 with R = n / 3, and the saving has reached the renewal gap,
# (m - 4) s >= sqrt(2 * 0.9 * 4 s * s / 0.1) = 8.49 s, i.e. m >= 13. From the full history (m = n): first at
# n = 13 (repays: 0.1 * 9 * 5.33 = 4.8 > 3.6; n = 12 is short of the gap), then m = 4 + n - 13: n = 22 (gap
# again 9 blocks; repays 0.1 * 9 * 8.33 = 7.5). With R = n / 20 the repay rule binds instead: first at n = 22
# (0.1 * 18 * 2.1 = 3.78; n = 21: 0.1 * 17 * 2.05 = 3.49), then m = 4 + n - 22: n = 36 (0.1 * 14 * 2.8 = 3.92;
# n = 35: 0.1 * 13 * 2.75 = 3.58), though the gap is reached at n = 31.
REPAY = GEMConfig(k=4, tau=1.0, delta=1.0, min_blocks=5, repay_factor=1 / 3, cached_price=0.1,
                  keep_recent_size=True, reselect_on_goal_change=False,
                  evidence=EvidenceConfig(recent=4, goal=0, state=0, error=0, source=0))


def walk(config: GEMConfig, messages: list[dict]) -> tuple[list[int], list, list]:
    """Compress every history of ``messages`` in one session: (block counts at rewrites, stats, outputs)."""
    gem = GEM(config, encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    results = [gem.compress(h, session_id="walk") for h in steps(messages)]
    rewrites = [r.stats.blocks for r in results if r.stats.action == "reselected"]
    return rewrites, [r.stats for r in results], [r.messages for r in results]


def test_repay_reason_by_hand():
    sizes = [10] * 30
    # F = 300, K = 100, M = 100 (block 0 dropped first): saving 0.1 * 200 * (R + 1) vs miss 0.9 * 100;
    # the renewal gap sqrt(2 * 0.9 * 100 * 10 / 0.1) = 134 < 200
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes, replace(REPAY, repay_factor=0.1)) is None
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes, replace(REPAY, repay_factor=0.2)) is not None
    assert repay_reason(set(range(30)), set(range(30)), sizes, REPAY) is None  # nothing changes
    # dropping block 28 of 30 re-sends block 29 (M = 10) and saves 0.1 * 10 * (R + 1): with R = 15 it repays
    # (17.5 > 9) but 10 tokens a call is short of the gap sqrt(2 * 0.9 * 10 * 10 / 0.1) = 42: wait and cut deeper
    assert repay_reason(set(range(30)), set(range(30)) - {28}, sizes, replace(REPAY, repay_factor=0.5)) is None
    # without caching (price 1) the gap is 0 and any repaying cut is due; a free cache never repays one
    assert repay_reason(set(range(30)), set(range(30)) - {28}, sizes, replace(REPAY, cached_price=1.0)) is not None
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes, replace(REPAY, cached_price=0.0)) is None
    # a cache-write premium (uncached 1.25) makes the miss dearer: 0.1 * 200 * (R + 1) vs 1.15 * 100, R = 4.5 no
    # longer repays (110 < 115) where it did at uncached 1.0 (110 > 90); R = 6 still does (140 > 115)
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes, replace(REPAY, repay_factor=0.15)) is not None
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes,
                        replace(REPAY, repay_factor=0.15, uncached_price=1.25)) is None
    assert repay_reason(set(range(30)), set(range(20, 30)), sizes,
                        replace(REPAY, repay_factor=0.2, uncached_price=1.25)) is not None


@pytest.mark.parametrize("c, u", [(0.1, 1.0), (0.1, 1.25), (0.5, 1.0), (0.25, 1.25)])
def test_renewal_gap_minimises_the_cost_per_call(c, u):
    resent, per_call, context = 400.0, 25.0, 400.0
    def cost_per_call(g):  # cached context growing by per_call a call, a miss on the re-sent part every g calls
        return c * (context + per_call * (g + 1) / 2) + (u - c) * resent / g
    best = min(range(1, 200), key=cost_per_call)
    assert abs(renewal_gap(resent, per_call, c, u) / per_call - best) < 1


@pytest.mark.parametrize("cached, uncached", [(0.5, 0.4), (-0.1, 1.0), (0.0, 0.0)])
def test_config_refuses_inconsistent_prices(cached, uncached):
    with pytest.raises(ValueError, match="cached_price"):
        GEMConfig(cached_price=cached, uncached_price=uncached)


def test_run_too_short_to_repay_a_rewrite_gets_none():
    rewrites, stats, outs = walk(REPAY, equal_blocks(11))
    assert rewrites == []
    assert all(s.action in ("unchanged", "appended") and s.removed_blocks == [] for s in stats)


def test_long_run_rewrites_at_the_expected_calls():
    assert walk(replace(REPAY, repay_factor=1 / 20), equal_blocks(40))[0] == [22, 36]
    rewrites, stats, outs = walk(REPAY, equal_blocks(30))
    assert rewrites == [13, 22]
    for s in stats:
        if s.action == "reselected":
            assert s.removed_blocks == list(range(s.blocks - 4)) and "repays" in s.reason


def test_token_budget_rewrites_when_passed():
    messages = equal_blocks(30)
    size = -(-sum(len(json.dumps(m)) + 2 for m in messages[2:4]) // 4)  # one block's estimated tokens
    config = replace(REPAY, repay_factor=None, rewrite_above_tokens=10 * size)
    rewrites, stats, _ = walk(config, messages)
    assert rewrites == [11, 18, 25]  # 11 blocks pass 10 blocks' tokens; then 4 kept + 7 new
    assert all("budget" in s.reason for s in stats if s.action == "reselected")


@pytest.mark.parametrize("preset", ["cache-aware", REPAY])
def test_prefix_is_byte_identical_between_rewrites(preset):
    _, stats, outs = walk(preset, synthetic_history(90, seed=5) if preset == "cache-aware" else equal_blocks(30))
    assert sum(s.action == "reselected" for s in stats) >= 2
    for before, after, s in zip(outs, outs[1:], stats[1:]):
        if s.action != "reselected":
            assert json.dumps(after[:len(before)]) == json.dumps(before)


def test_keep_recent_size_keeps_at_most_the_newest_k_blocks_tokens_beyond_protection():
    messages = synthetic_history(60, seed=7)
    gem = GEM("cache-aware", encoder=CachedEncoder(HashEncoder(64)), token_counter=len)
    result = gem.compress(messages, session_id="s")
    assert result.stats.action == "reselected"
    history = parse_history(messages)
    tokens = [sum(len(json.dumps(messages[p], ensure_ascii=False)) for p in span.positions) for span in history.spans]
    kept = sorted(set(range(60)) - set(result.stats.removed_blocks))
    protected = {b for picks in result.stats.protected.values() for b in picks}
    k = resolve_config("cache-aware").k
    assert sum(tokens[b] for b in kept if b not in protected) <= sum(tokens[-k:]) - sum(tokens[b] for b in protected)


# --------------------------------------------------------------------------- every development run

DATA = TRAJECTORIES


VARIANTS = {  # every ranking and rule of issue 22 on the cache-aware schedule
    "router": with_overrides("cache-aware", ()),
    "geometry": with_overrides("cache-aware-geometry", ()),
    "retrieval": with_overrides("cache-aware", ["ranking=retrieval"]),
    "superseded-references": with_overrides("cache-aware-geometry", ["drop_superseded=True",
                                                                     "evidence.reference=2"]),
}


@pytest.mark.skipif(not DATA.is_dir(), reason=f"development runs not found at {DATA}")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cache_aware_invariants_on_every_development_run(variant):
    """Pairing, prefix, order and no mutation at every call of every run; between rewrites the previous
    request is a byte-identical prefix of the next; the preset's budget of forwarded blocks is never passed."""
    from test_gem_runs import RUNS, check_step

    from gemkernels.evaluate.loaders import checkpoints

    config = VARIANTS[variant]
    rewrites = 0
    for run in RUNS:
        rewrites += walk_run(config, run.name, run.messages, [run.messages[:pos] for pos in checkpoints(run.messages)],
                             check_step)
    if LOGS.is_dir():  # Claude Code, Codex, OpenHands... in their own formats: each recorded request, in order
        from gemkernels.evaluate.loaders import load_runs

        for run in load_runs(LOGS)[0]:
            rewrites += walk_run(config, run.name, run.messages, [run.request(c.position) for c in run.calls],
                                 check_step)
    assert rewrites > 0


def walk_run(config, name, messages, requests, check_step) -> int:
    """One GEM session over ``requests`` (each a request of the run, in order), every step checked; the rewrites."""
    gem = GEM(config, encoder=CachedEncoder(HashEncoder(128)), token_counter=None)
    snapshot = json.dumps(messages)
    before, previous, rewrites, budget = None, None, 0, config.rewrite_above_blocks
    for request in requests:
        result = gem.compress(request, session_id="dev")
        where = f"{name} messages[:{len(request)}] ({result.stats.action}: {result.stats.reason})"
        if result.stats.action == "unchanged":
            assert result.messages is request, where
        else:
            check_step(request, result, parse_history(request), where)
            assert result.stats.forwarded_blocks <= budget or result.stats.action == "reselected", where
        extends = previous is not None and len(request) >= len(previous) and all(
            a is b for a, b in zip(request, previous))  # the agent appended to its last request (no compaction)
        if result.stats.action == "reselected":
            rewrites += 1
        elif extends:
            assert json.dumps(result.messages[:len(before)]) == json.dumps(before), f"{where}: prefix changed"
        before, previous = result.messages, request
    assert json.dumps(messages) == snapshot, f"{name}: the caller's messages were mutated"
    return rewrites


# --------------------------------------------------------------------------- evidence at rewrites (gem online)

def test_rewrite_evidence_of_amortized_forgetting_by_hand():
    """Amortized(10 -> 4) rewrites at 11 blocks and keeps blocks 7-10; the next action (block 11) names a file
    that only block 0 mentions, so neither the kept nor the equally large recent set retains it."""
    from gemkernels.evaluate.loaders import Run
    from gemkernels.evaluate.online_policies import PolicyOptions
    from gemkernels.evaluate.online_replay import evidence_means, replay_run

    messages = equal_blocks(14)
    messages[3] = {**messages[3], "content": "src/special_module.py: def handler"}
    call = messages[24]["tool_calls"][0]
    messages[24] = {**messages[24], "tool_calls": [{**call, "function": {"name": "bash",
                                                                          "arguments": "cat src/special_module.py"}}]}
    options = PolicyOptions(encoder="hash", amortized_budget=10, amortized_keep=4)
    replay = replay_run(Run("r", "openai", messages, "Fix it", "<memory>"), ["full", "amortized"], options,
                        lambda name: CachedEncoder(HashEncoder(64)), encode=str.split, evidence=("amortized",))
    (rewrite,) = replay.evidence["amortized"]
    assert (rewrite.call, rewrite.blocks, rewrite.kept_blocks, rewrite.recent_blocks) == (11, 11, 4, 4)
    assert rewrite.top3_kept == rewrite.top3_recent  # recency is its own same-size recent set
    assert rewrite.referenced_kept == rewrite.referenced_recent == 0.0
    means = evidence_means(replay.evidence["amortized"])
    assert means["rewrites"] == 1 and means["referenced_kept"] == 0.0
    assert "full" not in replay.evidence


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_could_repay_never_skips_a_rewrite_that_repays(data):
    n = data.draw(st.integers(2, 40))
    sizes = data.draw(st.lists(st.integers(0, 500), min_size=n, max_size=n))
    recent = data.draw(st.integers(0, 6))
    config = replace(REPAY, repay_factor=data.draw(st.sampled_from([0.05, 0.2, 0.5, 2.0])),
                     cached_price=data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
                     evidence=EvidenceConfig(recent=recent, goal=0, state=0, error=0, source=0))
    newest = set(range(max(0, n - recent), n))
    protected = sorted(newest | set(data.draw(st.lists(st.integers(0, n - 1), max_size=4))))
    shape = data.draw(st.sampled_from(["arbitrary", "session", "prefix"]))
    if shape == "arbitrary":
        appended = set(data.draw(st.lists(st.integers(0, n - 1), max_size=n))) | {n - 1}
        kept = set(protected) | set(data.draw(st.lists(st.integers(0, n - 1), max_size=n)))
    elif shape == "prefix":  # a rewrite that keeps an old prefix as it was and drops from a later block on
        appended = set(range(n))
        first = data.draw(st.integers(0, n - 1))
        kept = set(range(first)) | set(protected) | set(data.draw(st.lists(st.integers(first, n - 1), max_size=4)))
    else:  # as in a session: appending forwards all but a few blocks, a rewrite drops a few more
        appended = set(range(n)) - set(data.draw(st.lists(st.integers(0, n - 2), max_size=3)))
        kept = appended - set(data.draw(st.lists(st.integers(0, n - 1), max_size=3))) | set(protected)
    kept_tokens = sum(sizes[b] for b in kept)
    least_kept = data.draw(st.integers(0, kept_tokens))  # any lower bound of what the rewrite keeps, itself included
    if repay_reason(appended, kept, sizes, config) is not None:
        assert could_repay(appended, least_kept, sizes, config)
        assert could_repay(appended, kept_tokens, sizes, config)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 500), min_size=2, max_size=40), recent=st.integers(1, 6),
       factor=st.sampled_from([0.05, 0.2, 0.5, 2.0]), cached=st.sampled_from([0.1, 0.25, 0.5]))
def test_could_repay_is_exact_when_a_rewrite_keeps_only_the_newest_blocks(sizes, recent, factor, cached):
    n = len(sizes)
    config = replace(REPAY, repay_factor=factor, cached_price=cached,
                     evidence=EvidenceConfig(recent=recent, goal=0, state=0, error=0, source=0))
    newest = set(range(max(0, n - recent), n))
    due = repay_reason(set(range(n)), newest, sizes, config) is not None
    assert could_repay(set(range(n)), sum(sizes[b] for b in newest), sizes, config) == due


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_least_core_tokens_bounds_every_ranked_core(data):
    """Whatever the scores, the core a ranked rewrite keeps holds at least `least_core_tokens`; and some ranking
    keeps no more than the bound plus the largest block (it is not vacuous)."""
    n = data.draw(st.integers(1, 40))
    sizes = data.draw(st.lists(st.integers(0, 600), min_size=n, max_size=n))
    seeds = data.draw(st.lists(st.integers(0, n - 1), max_size=6))
    eligible = None if data.draw(st.booleans()) else np.array(data.draw(st.lists(st.booleans(), min_size=n,
                                                                                  max_size=n)))
    config = replace(REPAY, k=data.draw(st.integers(1, 20)), keep_recent_size=data.draw(st.booleans()),
                     ranking=data.draw(st.sampled_from(["router", "retrieval", "geometry"])))
    least = least_core_tokens(sizes, seeds, eligible, config)
    num_protected = len(set(seeds))
    orders = []
    for _ in range(4):
        scores = data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n))
        order = router_order(scores, sizes, seeds, eligible, data.draw(st.sampled_from([0.0, 1.0])))
        if config.ranking == "geometry":  # a selection may stop anywhere after the seeds
            order = order[:data.draw(st.integers(num_protected, len(order)))]
        orders.append(order)
    for order in orders:
        assert sum(sizes[b] for b in rewrite_core(order, num_protected, sizes, config)) >= least
    if config.ranking != "geometry" and config.keep_recent_size:  # the largest-first ranking leaves the most room
        order = sorted(set(seeds)) + sorted((b for b in range(n) if b not in set(seeds)
                                             and (eligible is None or eligible[b])), key=lambda b: -sizes[b])
        assert sum(sizes[b] for b in rewrite_core(order, num_protected, sizes, config)) <= least + max(sizes)


@pytest.mark.parametrize("preset", ["cache-aware", "cache-aware-geometry"])
def test_skipping_the_selection_changes_no_decision(preset, monkeypatch):
    """The bound only skips selections: a session forwards the same messages with it as with a selection on every
    appending call, and selects less often."""
    from gemkernels.compress import gem as gem_module

    messages = json.loads((Path(__file__).resolve().parents[2] / "examples" / "django-11276.json").read_text())[
        "messages"]
    histories = [messages[:cut] for cut in checkpoints(messages)]

    def replayed(always: bool) -> tuple[list, int]:
        calls = []
        real = gem_module.GEM._rewrite

        def counted(self, *args):
            calls.append(1)
            return real(self, *args)

        with monkeypatch.context() as patch:
            patch.setattr(gem_module.GEM, "_rewrite", counted)
            if always:
                patch.setattr(gem_module, "could_repay", lambda *args: True)
            gem = GEM(preset, encoder=CachedEncoder(HashEncoder(64)))
            outs = [gem.compress(h, session_id="s").messages for h in histories]
        return outs, len(calls)

    bounded, selections = replayed(always=False)
    every, all_selections = replayed(always=True)
    assert bounded == every
    assert selections < all_selections


def test_appending_calls_skip_the_selection_until_a_rewrite_could_be_due():
    calls = []
    def counting_select(*args, **kwargs):
        calls.append(1)
        return select(*args, **kwargs)
    gem = GEM(REPAY, encoder=CachedEncoder(HashEncoder(64)), token_counter=None, select_fn=counting_select)
    actions = []
    for history in steps(equal_blocks(30)):
        before = len(calls)
        actions.append((gem.compress(history, session_id="s").stats.action, len(calls) - before))
    # rewrites at 13 and 22 blocks (test_long_run_rewrites_at_the_expected_calls); with K >= 4 recent blocks
    # a cut needs F - 4 blocks >= the gap for M >= 4 blocks (8.49 blocks): m >= 13 forwarded, so appends
    # below that select nothing
    assert [b + 1 for b, (action, _) in enumerate(actions) if action == "reselected"] == [13, 22]
    assert all(used == 0 for action, used in actions[:12]) and all(used == 0 for _, used in actions[13:21])


@pytest.mark.parametrize("config", ["cache-aware", "cache-aware, no rewrite"])
def test_the_router_reads_lexicons_only_when_a_rewrite_ranks(config, monkeypatch):
    """Lexicons read lazily (when a rewrite ranks) give every call the same forwarded history and the session the
    same lexicons as lexicons read with each new block; none are read while no rewrite ranks."""
    from gemkernels.compress import gem as gem_module

    messages = json.loads((Path(__file__).resolve().parents[2] / "examples" / "django-11276.json").read_text())[
        "messages"]
    histories = [messages[:cut] for cut in checkpoints(messages)]

    def replayed(eager: bool) -> tuple[list, list, int]:
        read = []
        real = gem_module.block_lexicon

        def counted(*args):
            read.append(1)
            return real(*args)

        with monkeypatch.context() as patch:
            patch.setattr(gem_module, "block_lexicon", counted)
            preset = resolve_config("cache-aware")
            gem = GEM(preset if config == "cache-aware" else replace(preset, repay_factor=None),
                      encoder=CachedEncoder(HashEncoder(64)))
            if eager:
                gem.reads_lexicons, gem.ranks_lexicons = True, False
            outs = [gem.compress(h, session_id="s").messages for h in histories]
            state = gem.store.get(gem_module.session_key("s", None))
        lexicons = [(lex.holds.tolist(), lex.names.tolist()) if lex is not None else None
                    for lex in state.columns.lexicons]
        assert state.nbytes == state.columns.nbytes + (state.parsed.held_bytes if state.parsed is not None else 0)
        return outs, lexicons, len(read)

    lazy, lazy_lexicons, lazy_reads = replayed(eager=False)
    eager, eager_lexicons, eager_reads = replayed(eager=True)
    assert lazy == eager
    assert eager_reads == len(eager_lexicons)
    read = [b for b, lexicon in enumerate(lazy_lexicons) if lexicon is not None]
    assert all(lazy_lexicons[b] == eager_lexicons[b] for b in read)
    if config == "cache-aware":  # this run rewrites: every block read by its last rewrite
        assert lazy_reads == len(read) > 0
    else:
        assert lazy_reads == len(read) == 0
