"""Online replay: policies (full, window, masking, GEM), per-call accounting on a hand-built run, reports and CLI."""

import argparse
import copy
import json
from dataclasses import replace

import pytest
from helpers import FIXTURES, call_ids, needs_extra

from gemkernels import GEM
from gemkernels.cli.online import add_parser, run
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.config import resolve_config, with_overrides
from gemkernels.compress.encoders import CachedEncoder, HashEncoder
from gemkernels.compress.tokens import Prices, TokenCache
from gemkernels.evaluate.costs import CallCost, Totals, call_cost
from gemkernels.evaluate.loaders import Run, checkpoints, load_runs
from gemkernels.evaluate.online_policies import POLICIES, GEMPolicy, Masking, PolicyOptions, Window, policy_builder
from gemkernels.evaluate.online_replay import (
    RewriteEvidence,
    evidence_markdown,
    evidence_means,
    markdown,
    pooled,
    relative,
    replay_run,
    replay_runs,
    report,
)
from gemkernels.evaluate.runner import LocalPool

OPTIONS = PolicyOptions(window=1, mask_after=1, encoder="hash")
ENCODER = CachedEncoder(HashEncoder(64))


def encoder_by_name(name: str) -> CachedEncoder:
    """Every GEM policy of a test replay shares one small hash encoder."""
    return ENCODER


def block(b: int, output: str) -> list[dict]:
    call_id = f"c{b}"
    return [{"role": "assistant", "content": "a",
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "x"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": output}]


def three_call_run() -> Run:
    """system, task, two blocks and a last assistant turn: three calls (before each assistant message)."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                *block(1, "out one"), *block(2, "out two"), {"role": "assistant", "content": "done"}]
    return Run("three", "openai", messages, "task", "<memory>")


def test_three_calls_by_hand():
    # Whitespace tokens of the JSON: system 4, task 4, assistant 14, tool 7 (masked tool 7 too).
    replay = replay_run(three_call_run(), ["full", "window", "masking"], OPTIONS, encoder_by_name, encode=str.split)
    assert replay.calls["full"] == [CallCost(8, 0), CallCost(29, 8), CallCost(50, 29)]
    # window(1), third call: [sys, task, block 2]; block 2's assistant shares its first 6 tokens (up to "c1"/"c2").
    assert replay.calls["window"] == [CallCost(8, 0), CallCost(29, 8), CallCost(29, 8 + 6, prefix_broken=True)]
    # masking(1), third call: block 1's output masked; the tool message keeps its first 5 tokens.
    assert replay.calls["masking"] == [CallCost(8, 0), CallCost(29, 8), CallCost(50, 8 + 14 + 5, prefix_broken=True)]
    totals = replay.totals()
    assert totals["full"] == Totals(3, 87, 37, 0, 0)
    assert totals["full"].price() == pytest.approx(3.7 + 50)
    assert totals["window"].price() == pytest.approx(2.2 + 44)
    assert totals["masking"].price() == pytest.approx(3.5 + 52)
    write_premium = relative(totals, Prices(0.1, 1.25))["window"]["price"]
    assert write_premium == pytest.approx((2.2 + 44 * 1.25) / (3.7 + 50 * 1.25))
    rel = relative(totals, Prices())
    assert rel["full"] == {"tokens": 1.0, "price": 1.0, "cached_fraction": pytest.approx(37 / 87), "embedding": 0.0,
                           "combined": 1.0}
    assert rel["window"]["tokens"] == pytest.approx(66 / 87)
    assert rel["window"]["price"] == pytest.approx(46.2 / 53.7)
    assert rel["masking"]["price"] == pytest.approx(55.5 / 53.7)


def synthetic(num_blocks: int, plain_turn_at: int | None = None) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the failing test in models.py"}]
    for b in range(num_blocks):
        if b == plain_turn_at:
            messages.append({"role": "user", "content": "Also keep the docs in sync."})
        messages += block(b, f"output {b}: " + " ".join(f"w{(b * 7 + i) % 50}" for i in range(40)))
    return messages


def test_window_keeps_the_prefix_plain_turns_and_the_last_k_blocks():
    messages = synthetic(20, plain_turn_at=5)
    out = Window(3)(messages).messages
    assert call_ids(out) == ["c17", "c18", "c19"]
    non_block = [m for m in messages if m["role"] in ("system", "user")]
    assert [m for m in out if m["role"] in ("system", "user")] == non_block
    assert all(any(m is original for original in messages) for m in out)  # the caller's own objects
    parse_history(out)
    assert Window(30)(messages).messages == messages
    assert call_ids(Window(0)(messages).messages) == []


@pytest.mark.parametrize("keep", [0, 2, 5, 40])
def test_masking_never_mutates_and_keeps_tool_pairing(keep):
    messages = synthetic(12)
    before = copy.deepcopy(messages)
    out = Masking(keep)(messages).messages
    assert messages == before
    parse_history(out)
    assert call_ids(out) == call_ids(messages) and len(out) == len(messages)
    masked = [i for i, (a, b) in enumerate(zip(messages, out)) if a is not b]
    tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    assert masked == tools[:max(0, len(tools) - keep)]
    for i in masked:
        assert out[i] == {**messages[i], "content": "[output omitted]"}


def test_masking_anthropic_tool_results():
    messages = [{"role": "user", "content": "task"}]
    for b in range(3):
        messages += [{"role": "assistant", "content": [{"type": "text", "text": "look"},
                                                        {"type": "tool_use", "id": f"t{b}", "name": "bash",
                                                         "input": {"command": "ls"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{b}",
                                                   "content": f"files {b}"}]}]
    before = copy.deepcopy(messages)
    out = Masking(1, placeholder="[gone]")(messages).messages
    assert messages == before
    parse_history(out)
    assert [m["content"][0]["content"] for m in out[2::2]] == ["[gone]", "[gone]", "files 2"]
    assert out[2]["content"][0]["tool_use_id"] == "t0"


def test_gem_policy_equals_calling_gem_directly():
    messages = synthetic(40)
    policy = GEMPolicy("balanced", ENCODER, "s1", "Fix the failing test")
    gem = GEM("balanced", encoder=ENCODER, token_counter=None)
    embedded: list[str] = []
    for position in checkpoints(messages):
        forwarded = policy(messages[:position])
        direct = gem.compress(messages[:position], session_id="s1", goal="Fix the failing test").messages
        assert forwarded.messages == direct
        embedded += forwarded.embedded
    assert len(embedded) == len(set(embedded)) == 39 + 1   # blocks seen at calls with >= 16 blocks, and the goal
    assert "Fix the failing test" in embedded


def test_preset_overrides_build_the_config_they_name():
    pytest.importorskip("bpe_openai")  # replay_run's default token cache
    config = with_overrides("cache-aware", ["k=20", "evidence.recent=4", "repay_factor=None", "tau=1"])
    base = resolve_config("cache-aware")
    assert config == replace(base, k=20, repay_factor=None, tau=1, evidence=replace(base.evidence, recent=4))
    name = "gem-cache-aware:k=20:evidence.recent=4"
    run_ = Run("r", "openai", synthetic(60), "Fix it", "<memory>")
    replayed = replay_run(run_, ["full", name], OPTIONS, encoder_by_name).calls[name]
    direct = GEMPolicy(with_overrides("cache-aware", ["k=20", "evidence.recent=4"]), ENCODER, "online:r", None)
    tokens = TokenCache()
    previous = None
    for cost, position in zip(replayed, checkpoints(run_.messages)):
        forwarded = direct(run_.messages[:position])
        current = tokens.request(forwarded.messages)
        embedding = sum(len(tokens.text(text)) for text in forwarded.embedded)
        assert cost == call_cost(previous, current, embedding)
        previous = current
    assert any(c.prefix_broken for c in replayed)  # the overridden preset did rewrite


def test_gem_policies_plan_with_the_replay_prices():
    options = replace(OPTIONS, prices=Prices(0.25, 1.25))
    run_ = Run("r", "openai", synthetic(20), "Fix it", "<memory>")
    for name in ("gem-cache-aware", "gem-cache-aware:k=12"):
        config = policy_builder(name)(run_, options, encoder_by_name).gem.config
        assert (config.cached_price, config.uncached_price) == (0.25, 1.25)
    with pytest.raises(ValueError, match="cached_price"):
        policy_builder("gem-cache-aware:cached_price=0.5")  # prices come from the replay, not the policy name


@pytest.mark.parametrize("name", ["gem-nope:k=2", "window:k=1", "gem-paper:", "gem-paper:k", "gem-paper:nope=1",
                                  "gem-paper:k=1.5", "gem-paper:k=None", "gem-paper:keep_recent_size=1",
                                  "gem-paper:tau=2", "gem-paper:evidence.recent=-1", "gem-paper:evidence.nope=1"])
def test_bad_policy_names_are_refused_with_the_reason(name):
    with pytest.raises(ValueError):
        policy_builder(name)


def test_replay_is_deterministic_in_and_across_processes():
    pytest.importorskip("bpe_openai")  # replay_run's default token cache
    messages = synthetic(30)
    runs = [Run(f"r{i}", "openai", messages[:len(messages) - 6 * i], "Fix it", "<memory>") for i in range(3)]
    names = list(POLICIES)
    first = [replay_run(r, names, OPTIONS) for r in runs]  # the encoder replay_runs uses (hash, 256 dims)
    assert first == [replay_run(r, names, OPTIONS) for r in runs]
    (parallel, errors), (serial, _) = (replay_runs(runs, names, OPTIONS, LocalPool(w), progress=False) for w in (2, 1))
    assert not errors and parallel == serial
    assert [p.totals() for p in parallel] == [f.totals() for f in first]


def test_gem_presets_cost_embedding_tokens_only_past_16_blocks():
    pytest.importorskip("bpe_openai")  # replay_run's default token cache
    short, long = (Run(name, "openai", synthetic(n), "Fix it", "<memory>") for name, n in (("s", 10), ("l", 25)))
    for r, expect_embedding in ((short, False), (long, True)):
        totals = replay_run(r, ["full", "gem-paper"], OPTIONS, encoder_by_name).totals()
        assert (totals["gem-paper"].embedding > 0) == expect_embedding
        assert totals["full"].embedding == 0


def test_report_and_table_pool_runs_by_format():
    replays = [replay_run(three_call_run(), ["full", "window"], OPTIONS, encoder_by_name, encode=str.split)] * 2
    groups = pooled(replays)
    assert set(groups) == {"all", "openai"}
    assert groups["all"]["full"] == Totals(6, 174, 74, 0, 0)
    table = markdown(groups, {"all": 2, "openai": 2}, OPTIONS)
    assert "| window(1) | 132 | 0.759 | 0.860 | 44 | 88 |" in table
    data = json.loads(json.dumps(report(replays, OPTIONS)))
    assert data["pooled"]["all"]["window"]["relative"]["tokens"] == pytest.approx(66 / 87)
    assert data["runs"][0]["calls"]["window"][2] == [29, 14, 0, 1]


def test_runs_pool_into_length_groups_after_the_format_groups():
    three = replay_run(three_call_run(), ["full", "window"], OPTIONS, encoder_by_name, encode=str.split)
    assert three.groups((2, 3, 4)) == ["all", "openai", "2+ calls", "3+ calls"]
    groups = pooled([three, three], long_runs=(4, 3))
    assert list(groups) == ["all", "openai", "3+ calls"]  # no run reaches 4 calls
    assert groups["3+ calls"] == groups["all"] and groups["all"]["full"] == Totals(6, 174, 74, 0, 0)
    data = json.loads(json.dumps(report([three], OPTIONS, long_runs=(3,))))
    assert data["long_runs"] == [3] and set(data["pooled"]) == {"all", "openai", "3+ calls"}


def evidence_row(top3: tuple[float, float], referenced: tuple[float, float] | None) -> RewriteEvidence:
    return RewriteEvidence(0, 20, 10, 8, 100, *top3, *(referenced or (None, None)))


def test_evidence_means_pair_kept_with_recent_per_rewrite():
    rows = [evidence_row((1.0, 0.0), (0.5, 0.5)), evidence_row((1 / 3, 2 / 3), None),
            evidence_row((1.0, 1.0), (1.0, 0.0))]
    m = evidence_means(rows)
    # top3 deltas 1, -1/3, 0: mean 2/9, sample sd sqrt(((7/9)^2 + (5/9)^2 + (2/9)^2) / 2), se = sd / sqrt(3)
    assert m["rewrites"] == 3 and m["top3_kept"] == pytest.approx(7 / 9) and m["top3_delta"] == pytest.approx(2 / 9)
    assert m["top3_delta_se"] == pytest.approx(((49 + 25 + 4) / 81 / 2) ** 0.5 / 3 ** 0.5)
    assert (m["top3_better"], m["top3_worse"]) == (1, 1)
    # referenced only where the action names an earlier block: deltas 0 and 1
    assert m["referenced_delta"] == pytest.approx(0.5) and (m["referenced_better"], m["referenced_worse"]) == (1, 0)
    single = evidence_means(rows[:1])
    assert single["top3_delta"] == 1.0 and single["top3_delta_se"] != single["top3_delta_se"]  # nan: one rewrite
    table = evidence_markdown({"all": {"amortized": rows}}, OPTIONS)
    assert ("| amortized(40->20) | 3 | 0.778 | 0.556 | +0.222 ± 0.401 (1 / 1) | 0.750 | 0.250 "
            "| +0.500 ± 0.500 (1 / 0) |") in table


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    needs_extra("replay")
    code = run(parse(["online", str(FIXTURES), "--encoder", "hash", "--window", "2", "--out", str(tmp_path),
                      "--policies", "window,gem-paper:delta=0.5,amortized"]))
    assert code == 0
    table = capsys.readouterr().out
    assert "| full |" in table and "| window(2) |" in table and "| gem-paper:delta=0.5 |" in table
    assert (tmp_path / "online.md").read_text().strip() == table.strip()
    data = json.loads((tmp_path / "online.json").read_text(), parse_constant=pytest.fail)  # strict: no NaN
    assert data["pooled"]["all"]["full"]["relative"]["tokens"] == 1.0
    assert len(data["runs"]) == len(load_runs(FIXTURES)[0])
    assert data["evidence"]["all"]["amortized"]["top3_kept"] is None  # no rewrite on these short runs: null
    assert (tmp_path / "online.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "online_by_length.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bills_with_the_given_prices(tmp_path, capsys):
    needs_extra("replay")
    argv = ["online", str(FIXTURES), "--encoder", "hash", "--policies", "window", "--window", "2", "--long-runs", "",
            "--evidence-policies", "", "--price-cached", "0.25", "--price-uncached", "1.25", "--out", str(tmp_path)]
    assert run(parse(argv)) == 0
    assert "Cached input priced at 0.25, uncached at 1.25" in capsys.readouterr().out
    data = json.loads((tmp_path / "online.json").read_text())
    assert data["options"]["prices"] == {"cached": 0.25, "uncached": 1.25} and data["long_runs"] == []
    totals = {policy: Totals(**{k: v for k, v in t.items() if k in ("calls", "input", "cached", "embedding",
                                                                      "prefix_breaks")})
              for policy, t in data["pooled"]["all"].items()}
    expected = (totals["window"].cached * 0.25 + totals["window"].uncached * 1.25) / (
        totals["full"].cached * 0.25 + totals["full"].uncached * 1.25)
    assert data["pooled"]["all"]["window"]["relative"]["price"] == pytest.approx(expected)


@pytest.mark.parametrize("argv", [["--policies", "nope"], ["--window", "-1"], ["--price-cached", "-0.1"],
                                  ["--workers", "0"], ["--encoder", "nope"], ["--long-runs", "40,x"],
                                  ["--price-cached", "0.5", "--price-uncached", "0.4"],
                                  ["--long-runs", "0"]])
def test_cli_rejects_bad_options(argv, capsys):
    assert run(parse(["online", str(FIXTURES), *argv])) == 2
    assert "gem online" in capsys.readouterr().err


def test_a_model_encoder_writes_one_cache_shard_per_run(tmp_path):
    pytest.importorskip("bpe_openai")  # replay_run's default token cache
    from gemkernels.evaluate import online_replay

    cache = online_replay.EmbeddingCache(CachedEncoder(HashEncoder(16)), tmp_path)
    run_ = Run("r", "openai", synthetic(40), "Fix it", "<memory>")
    replayed = replay_run(run_, ["full", "gem-cache-aware"], OPTIONS, lambda name: cache)
    assert sum(c.embedding > 0 for c in replayed.calls["gem-cache-aware"]) > 2  # blocks encoded over many calls
    assert len(list(tmp_path.glob("*/*.npz"))) == 1 and not cache.unsaved


def test_evidence_table_shows_no_nan_for_rewrites_it_does_not_have():
    """A policy with no rewrites, or none whose action references an earlier block, printed ``+nan ± nan (0 / 0)``;
    one rewrite printed ``± nan``."""
    from gemkernels.evaluate.online_replay import RewriteEvidence, evidence_markdown

    one = RewriteEvidence(call=3, blocks=20, kept_blocks=8, recent_blocks=6, kept_tokens=900, top3_kept=0.5,
                          top3_recent=0.25, referenced_kept=None, referenced_recent=None)
    table = evidence_markdown({"all": {"gem-core": [one], "gem-paper": []}}, PolicyOptions())
    assert "nan" not in table
    row = next(line for line in table.splitlines() if "| 1 |" in line)
    assert "| 0.500 | 0.250 | +0.250 (1 / 0) | – | – | – |" in row
