"""Checkpoint replay: the embedding disk cache, what a checkpoint holds, determinism, and the report end to end."""

import argparse
import json

import numpy as np
import pytest
from helpers import FIXTURES, CountingEncoder, needs_extra

from gemkernels.cli.replay import add_parser
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import HashEncoder
from gemkernels.compress.encoders.cache import EmbeddingCache
from gemkernels.compress.representation import block_text
from gemkernels.evaluate.loaders import final_block, load_runs
from gemkernels.evaluate.replay import Plan, action_text, prepare, replay
from gemkernels.evaluate.runner import LocalPool


def test_cache_encodes_each_text_once_across_instances(tmp_path):
    inner = CountingEncoder()
    cache = EmbeddingCache(inner, tmp_path, shard_size=2)
    first = cache.encode(["a", "b", "a", "c"])
    shards = cache.folder  # tmp_path / the encoder's stored name
    assert inner.seen == ["a", "b", "c"] and len(list(shards.glob("*.npz"))) == 1  # "c" waits for a full shard
    cache.encode(["d"])
    assert len(list(shards.glob("*.npz"))) == 2  # c, d
    cache.encode(["e"])
    cache.flush()
    cache.flush()  # nothing left: no empty shard
    assert len(list(shards.glob("*.npz"))) == 3 and not list(shards.glob(".*"))
    again = EmbeddingCache(CountingEncoder(), tmp_path)
    np.testing.assert_array_equal(again.encode(["c", "a"]), first[[3, 0]])
    assert again.encoder.seen == [] and again.fill(["a", "f"]) == 1


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    runs, errors = load_runs(FIXTURES)
    assert not errors
    return runs, prepare(runs, EmbeddingCache(HashEncoder(64), tmp_path_factory.mktemp("cache")), 2, progress=False)


def test_checkpoints_hold_the_history_before_the_next_action(jobs):
    runs, prepared = jobs
    by_name = {run.name: run for run in runs}
    encoder = HashEncoder(64)
    for job in prepared:
        run = by_name[job.name]
        history = parse_history(run.messages)
        final = final_block(run)  # a run ending on a call without a result: that call is the last next action
        assert job.blocks == history.blocks + ((final,) if final else ())
        assert job.checkpoints == tuple(range(2, len(job.blocks)))
        starts = [span.start for span in history.spans] + [len(run.messages)]
        for c, t in enumerate(job.checkpoints):  # the history a selector sees is the request before block t
            assert parse_history(run.messages[:starts[t]]).spans == history.spans[:t]
            target = action_text(job.blocks[t])
            assert "OBSERVATION" not in target
            np.testing.assert_allclose(job.actions[c], encoder.encode([target])[0], atol=1e-6)
        np.testing.assert_allclose(job.embeddings, encoder.encode([block_text(b) for b in job.blocks]), atol=1e-6)
    no_goal = next(job for job in prepared if job.name == "swe_agent_trajectory")
    assert np.isnan(no_goal.goals).all()
    ending = {job.name: job for job in prepared}["mini_swe_agent_1_1"]  # its final call has no result: a checkpoint
    assert ending.checkpoints == (2, 3) and ending.blocks[3].actions[0].arguments.startswith('{"command": "echo COMPL')


def test_replay_is_deterministic_for_a_seed(jobs):
    _, prepared = jobs
    plan = Plan(("gem", "random", "random_completion"), (1, 2), (0.9,), 2, seed=3)
    first, second = replay(prepared, plan, LocalPool(1), False), replay(prepared, plan, LocalPool(2), False)
    other = replay(prepared, Plan(plan.selectors, plan.ks, plan.taus, plan.k, seed=4), LocalPool(1), False)
    assert flat(first) == flat(second) and flat(first) != flat(other)


def flat(results):
    """Replay rows as comparable tuples (nan as -1)."""
    return [(name, *row[:4], np.nan_to_num(row[4], nan=-1).tolist()) for name, rows in results.items() for row in rows]


def test_replay_command_writes_tables_json_and_plots(tmp_path, capsys):
    needs_extra("replay")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = tmp_path / "out"
    args = parser.parse_args(["replay", str(FIXTURES), "--encoder", "hash", "--k", "2", "--min-blocks", "2",
                              "--sweep", "k", "tau", "--ks", "1-3", "--taus", "0.5,0.9", "--out", str(out),
                              "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert args.func(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["k_sweep.png", "replay.json", "replay.md", "tau_sweep.png"]
    summary = json.loads((out / "replay.json").read_text())
    assert summary["runs"] == 14 and set(summary["same_k"]["selectors"]) == set(args.selectors)
    gem = summary["same_k"]["selectors"]["gem"]
    assert gem["checkpoints"] == 11 and 0 <= gem["pooled"]["top3"] <= 1  # t = 3 in seven runs, t = 4 in four
    assert summary["k_sweep"]["selectors"]["recent"]["3"]["checkpoints"] == 4  # only t = 4 exceeds every K
    assert set(summary["tau_sweep"]["variants"]) == {"gem", "gem_uncapped"}
    report = (out / "replay.md").read_text()
    for heading in ("Selectors at the same retained count K=2", "Exact retained-count sweep",
                    "Coverage-threshold sweep"):
        assert heading in report
    assert "| GEM |" in report and report in capsys.readouterr().out


def test_runs_sharing_a_name_are_told_apart_by_path(tmp_path):
    copy = tmp_path / "swe_agent_fc.traj"
    copy.write_bytes((FIXTURES / "swe_agent_fc.traj").read_bytes())
    runs, _ = load_runs([FIXTURES / "swe_agent_fc.traj", copy])
    prepared = prepare(runs, EmbeddingCache(HashEncoder(16), tmp_path / "cache"), 2, progress=False)
    assert [job.name for job in prepared] == [f"{run.path}:swe_agent_fc" for run in runs]
