"""``--ray``: gem online / replay / analyze on a local Ray instance (2 CPUs) write the same tables as the local pool;
encoding goes through the batched encoder actors; results come back in input order; a missing ray is named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, TRAJECTORIES, needs_extra
from hypothesis import given
from hypothesis import strategies as st

from gemkernels.cli import extras, main
from gemkernels.compress.encoders import HashEncoder
from gemkernels.evaluate.loaders import load_runs
from gemkernels.evaluate.runner import LocalPool, run_all
from gemkernels.testing.histories import synthetic_history

#: Development runs replayed besides the fixtures when ../shared is there (a few: Ray's start costs seconds).
DEVELOPMENT_RUNS = sorted((TRAJECTORIES / "mini-swe-agent").glob("*.traj.json"))[:3]


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance (2 CPUs) for the module; every `RayPool` and ``--ray`` in it joins this one."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    """Runs long enough for GEM to select (40 and 52 blocks), as plain OpenAI message files."""
    folder = tmp_path_factory.mktemp("long")
    for seed, blocks in ((1, 40), (2, 52)):
        (folder / f"synthetic-{seed}.json").write_text(json.dumps(synthetic_history(blocks, seed)))
    return folder


def outputs(argv, capsys) -> tuple[dict[str, str], str]:
    """``gem ARGV --out DIR`` run in this process: the text of each .md and .json it wrote, and its stderr."""
    out = argv[argv.index("--out") + 1]
    assert main(argv) == 0
    err = capsys.readouterr().err
    return {path.name: path.read_text() for path in sorted(Path(out).iterdir()) if path.suffix in (".md", ".json")}, err


def encoded_texts(err: str) -> int:
    """How many texts the encoder actor says it encoded (`RayPool.summary`, on stderr at the end of a command)."""
    found = re.search(r"ray: 1 encoder actor \(0 GPUs, 2 CPUs in the cluster\) encoded ([\d,]+) texts", err)
    assert found, err
    return int(found.group(1).replace(",", ""))


def without_out(files: dict[str, str], out: str) -> dict[str, str]:
    """The files with the output folder's name (recorded in replay/analysis options) blanked."""
    return {name: text.replace(out, "OUT") for name, text in files.items()}


def test_gem_online_on_ray_writes_the_local_tables(ray_session, long_runs, tmp_path, capsys):
    needs_extra("tokens")
    paths = [str(FIXTURES), str(long_runs), *map(str, DEVELOPMENT_RUNS)]
    common = ["online", *paths, "--encoder", "hash", "--out"]
    local, _ = outputs([*common, str(tmp_path / "local"), "--workers", "2"], capsys)
    on_ray, err = outputs([*common, str(tmp_path / "ray"), "--ray"], capsys)
    assert on_ray == local and set(local) == {"online.json", "online.md"}
    report = json.loads(local["online.json"])
    assert len(report["runs"]) == len(load_runs(paths)[0])  # every run replayed, none failed
    assert report["pooled"]["all"]["gem-balanced"]["embedding"] > 0  # GEM selected, so blocks were encoded
    assert report["pooled"]["all"]["gem-balanced"]["prefix_breaks"] > 0
    assert encoded_texts(err) >= 40 + 52  # every block of the long runs went through the actor at least once


def test_gem_replay_and_analyze_on_ray_write_the_local_tables(ray_session, long_runs, tmp_path, capsys):
    needs_extra("replay")
    for command, options in (("replay", ["--k", "4", "--min-blocks", "3", "--sweep", "k", "tau", "--ks", "2-5"]),
                             ("analyze", ["--min-blocks", "4"])):
        common = [command, str(FIXTURES), str(long_runs), "--encoder", "hash", *options, "--quiet"]
        local, _ = outputs([*common, "--cache-dir", str(tmp_path / f"{command}-local-cache"), "--out",
                            str(tmp_path / f"{command}-local")], capsys)
        on_ray, err = outputs([*common, "--cache-dir", str(tmp_path / f"{command}-ray-cache"), "--out",
                               str(tmp_path / f"{command}-ray"), "--ray"], capsys)
        assert without_out(on_ray, str(tmp_path / f"{command}-ray")) == \
            without_out(local, str(tmp_path / f"{command}-local"))
        assert json.loads(local[f"{'analysis' if command == 'analyze' else command}.json"])["runs"] > 2
        assert encoded_texts(err) >= 40 + 52  # the driver's cache was filled by the actor, not here


def test_actor_encoder_spreads_batches_over_the_actors_and_keeps_the_order(ray_session):
    from gemkernels.evaluate.ray_pool import ActorEncoder, EncoderActor

    actors = [EncoderActor.remote() for _ in range(2)]
    try:
        texts = [f"text {i} " * (i + 1) for i in range(10)]
        encoder = ActorEncoder("hash-32", actors, batch=3)
        assert (encoder.name, encoder.dim) == ("hash-32", 32)
        np.testing.assert_array_equal(encoder.encode(texts), HashEncoder(32).encode(texts))
        counts = ray_session.get([actor.encoded.remote() for actor in actors])
        assert sorted(counts) == [4, 6]  # batches of 3, 3, 3, 1 to alternating actors
        assert encoder.encode([]).shape == (0, 32)
    finally:
        for actor in actors:
            ray_session.kill(actor)


def test_ray_pool_returns_every_result_in_input_order(ray_session):
    from gemkernels.evaluate.ray_pool import RayPool

    items = ["x" * n for n in (5, 0, 9, 1, 7, 3, 8, 2, 6, 4)]  # more than the 4 tasks kept in flight on 2 CPUs
    with RayPool() as pool:
        assert sorted(position for position, _ in pool.completed(len, items)) == list(range(len(items)))
        assert run_all(pool, len, items, progress=False) == [5, 0, 9, 1, 7, 3, 8, 2, 6, 4]
    assert ray_session.is_initialized()  # the session it joined stays open


def test_encoder_actors_take_the_gpus_where_the_cluster_has_them():
    pytest.importorskip("ray")
    from gemkernels.evaluate.ray_pool import encoder_placement

    threads = {"env_vars": {"OMP_NUM_THREADS": "2"}}  # an actor reserving no CPU would get one thread
    assert encoder_placement({"CPU": 2.0}, 2) == (1, {"num_cpus": 0, "scheduling_strategy": "SPREAD",
                                                      "runtime_env": threads})
    count, options = encoder_placement({"CPU": 64.0}, 8)  # four nodes of 8 CPUs: 4 actors of 8 threads
    assert count == 4 and options["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "8"
    count, options = encoder_placement({"CPU": 64.0, "GPU": 8.0}, 32)
    assert count == 8 and options["num_gpus"] == 1 and "runtime_env" not in options


class Completing:
    """A runner whose work completes in a given order of positions."""

    def __init__(self, order):
        self.order = order

    def completed(self, function, items):
        return ((i, function(items[i])) for i in self.order)


@given(st.lists(st.integers(), max_size=30).flatmap(lambda items: st.tuples(st.just(items),
                                                                            st.permutations(range(len(items))))))
def test_results_come_back_in_input_order_whatever_the_completion_order(case):
    items, order = case
    assert run_all(Completing(order), lambda i: -i, items, progress=False) == [-i for i in items]


def test_the_local_pool_returns_results_in_input_order():
    assert run_all(LocalPool(2), abs, [-3, 2, -1, 0, -7], progress=False) == [3, 2, 1, 0, 7]


@pytest.mark.parametrize("command", ["replay", "online", "analyze"])
def test_a_missing_ray_is_named_before_any_work(command, monkeypatch, capsys, tmp_path):
    needs_extra("replay")
    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module != "ray" and real(module))
    assert main([command, str(FIXTURES), "--encoder", "hash", "--out", str(tmp_path / "out"), "--ray"]) == 2
    err = capsys.readouterr().err
    assert f"gem {command} needs pip install 'gemkernels[ray]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, says", [(["--ray", str(FIXTURES), str(FIXTURES)], "took the path"),
                                        ([str(FIXTURES), "--workers", "2", "--ray"], "exclude each other")])
def test_ray_options_that_cannot_be_meant_are_refused(argv, says, capsys, tmp_path):
    pytest.importorskip("ray")
    needs_extra("tokens")
    assert main(["online", *argv, "--encoder", "hash", "--out", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "out").exists()
