"""``gem serve``'s settings: flag > ``GEM_*`` environment > ``--config`` TOML file > defaults and preset, with
errors that name the bad key or value."""

from __future__ import annotations

import dataclasses

import pytest

from gemkernels.cli import build_parser
from gemkernels.cli.serve import server_config
from gemkernels.cli.settings import SettingsError, resolve
from gemkernels.compress.config import GEMConfig, with_overrides


def settings(argv: list[str], environ: dict[str, str] | None = None):
    args = build_parser().parse_args(["serve", *argv])
    return resolve(args, args.deferred, "serve", environ or {})


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(tmp_path):
    path = tmp_path / "gem.toml"
    path.write_text('upstream = "http://file/v1"\nport = 9001\nmax-body-mb = 8\ncount_compressed = true\n'
                    'preset = "core"\nencoder = "hash"\n')
    only_file = settings(["--config", str(path)])
    assert (only_file.upstream, only_file.port, only_file.max_body_mb, only_file.count_compressed,
            only_file.preset) == ("http://file/v1", 9001, 8.0, True, "core")
    assert only_file.timeout == 600.0 and only_file.compress_endpoint is True  # defaults for the rest
    env = {"GEM_PORT": "9002", "GEM_COUNT_COMPRESSED": "false", "GEM_COMPRESS_ENDPOINT": "no"}
    with_env = settings(["--config", str(path)], env)
    assert (with_env.port, with_env.count_compressed, with_env.compress_endpoint) == (9002, False, False)
    with_flag = settings(["--config", str(path), "--port", "9003", "--count-compressed"], env)
    assert (with_flag.port, with_flag.count_compressed, with_flag.upstream) == (9003, True, "http://file/v1")
    config = server_config(with_flag)
    assert config.max_body_bytes == 8 << 20 and config.preset == "core" and not config.compress_endpoint
    plain = settings(["--upstream", "http://u"])
    assert (plain.port, plain.count_compressed, plain.preset, plain.set) == (8088, False, "paper", [])


def test_gemconfig_fields_come_from_the_file_then_the_environment_then_set(tmp_path):
    path = tmp_path / "gem.toml"
    path.write_text('upstream = "http://u"\n[compression]\nk = 8\ntau = 0.8\ngoal_from = "first"\n'
                    '[compression.evidence]\nrecent = 6\n')
    args = settings(["--config", str(path), "--set", "k=12"], {"GEM_TAU": "0.7", "GEM_EVIDENCE_RECENT": "3"})
    assert args.set == ["k=8", "tau=0.8", "goal_from=first", "evidence.recent=6", "tau=0.7", "evidence.recent=3",
                        "k=12"]
    config = with_overrides(args.preset, args.set)
    assert (config.k, config.tau, config.goal_from, config.evidence.recent) == (12, 0.7, "first", 3)


@pytest.mark.parametrize("text, message", [
    ('upstrem = "http://u"\n', "unknown key 'upstrem' (did you mean 'upstream'?)"),
    ('upstream = "http://u"\n[compression]\ntaus = 1\n', "unknown key 'compression.taus' (did you mean 'tau'?)"),
    ('upstream = "http://u"\n[compression.evidence]\nrecnt = 1\n', "'compression.evidence.recnt'"),
    ('upstream = "http://u"\nport = "eighty"\n', "is not a valid port"),
    ('upstream = "http://u"\npreset = "fast"\n', "'fast' is not one of"),
    ('upstream = "http://u"\ncount_compressed = "maybe"\n', "is not true or false"),
    ('upstream = "http://u"\nheader_timeout = -1\n', "must be a positive number"),
    ("upstream = \n", "is not valid TOML"),
    ('port = 1\n', "--upstream is required (or GEM_UPSTREAM"),
])
def test_bad_settings_are_named(tmp_path, text, message):
    path = tmp_path / "gem.toml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        settings(["--config", str(path)])


def test_bad_environment_values_and_missing_files_are_named(tmp_path, capsys):
    with pytest.raises(SettingsError, match=r"\$GEM_MAX_BODY_MB: 'lots' is not a valid max_body_mb"):
        settings(["--upstream", "http://u"], {"GEM_MAX_BODY_MB": "lots"})
    with pytest.raises(SettingsError, match="cannot read the config file"):
        settings(["--config", str(tmp_path / "absent.toml")])
    from gemkernels.cli import main

    assert main(["serve", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_no_flag_and_gemconfig_field_share_an_environment_variable():
    args = build_parser().parse_args(["serve", "--upstream", "u"])
    flags = {dest.upper() for dest in args.deferred.flags}
    config_fields = {f.name.upper() for f in dataclasses.fields(GEMConfig)}
    assert flags and not flags & config_fields
    assert not any(flag.startswith("EVIDENCE_") for flag in flags)


def test_a_bad_gemconfig_value_names_the_variable_or_file_it_came_from(tmp_path):
    with pytest.raises(ValueError, match=r"'k=abc'.*\(from \$GEM_K\)"):
        server_config(settings(["--upstream", "http://u"], {"GEM_K": "abc"}))
    path = tmp_path / "gem.toml"
    path.write_text('upstream = "http://u"\n[compression]\ntau = "high"\n')
    with pytest.raises(ValueError, match=r"tau=high.*\(from .*gem.toml \[compression\]\)"):
        server_config(settings(["--config", str(path)]))
    with pytest.raises(ValueError, match=r"'k=abc'") as raised:
        server_config(settings(["--upstream", "http://u", "--set", "k=abc"]))
    assert "(from" not in str(raised.value)  # on the command line: the item says it all


def test_workers_store_and_threads_come_from_every_source_and_workers_need_a_shared_store(tmp_path):
    path = tmp_path / "gem.toml"
    path.write_text('upstream = "http://file/v1"\nstore = "redis://10.0.0.5:6379/2"\nworkers = 3\nthreads = 4\n')
    config = server_config(settings(["--config", str(path)]))
    assert (config.store, config.threads) == ("redis://10.0.0.5:6379/2", 4)
    assert settings(["--config", str(path)], {"GEM_WORKERS": "5"}).workers == 5
    with pytest.raises(ValueError, match="--workers 2 needs .*--store redis://"):
        server_config(settings(["--upstream", "http://u", "--workers", "2"]))
    with pytest.raises(ValueError, match="--observe .* --workers 1"):
        server_config(settings(["--upstream", "http://u", "--workers", "2", "--store", "redis://h:1/0", "--observe"]))
    with pytest.raises(ValueError, match="memory or a redis://") as err:
        server_config(settings(["--upstream", "http://u", "--store", "postgres://user:secret@h/db"]))
    assert "secret" not in str(err.value)  # a URL's credentials never reach a message
    assert server_config(settings(["--upstream", "http://u"])).store == "memory"


def test_compress_process_comes_from_the_flag_the_environment_or_the_file(tmp_path):
    """A count of processes (the bare flag, ``true`` and ``1``: one; ``false``: none; absent: ``auto``), from every
    source; what is not a count is an error naming the flag's values."""
    path = tmp_path / "gem.toml"
    path.write_text('upstream = "http://u"\ncompress_process = true\n')
    assert server_config(settings(["--config", str(path)])).compress_process == 1
    path.write_text('upstream = "http://u"\ncompress_process = 3\n')
    assert server_config(settings(["--config", str(path)])).compress_process == 3
    assert server_config(settings(["--upstream", "http://u"], {"GEM_COMPRESS_PROCESS": "1"})).compress_process == 1
    assert server_config(settings(["--upstream", "http://u"], {"GEM_COMPRESS_PROCESS": "4"})).compress_process == 4
    assert server_config(settings(["--upstream", "http://u"], {"GEM_COMPRESS_PROCESS": "no"})).compress_process == 0
    assert server_config(settings(["--upstream", "http://u", "--compress-process"])).compress_process == 1
    assert server_config(settings(["--upstream", "http://u", "--compress-process", "2"])).compress_process == 2
    assert server_config(settings(["--upstream", "http://u", "--compress-process", "0"])).compress_process == 0
    with pytest.raises(SystemExit):
        settings(["--upstream", "http://u", "--compress-process", "-1"])
    with pytest.raises(Exception, match="not a valid compress_process.*0 or more.* or auto"):
        settings(["--upstream", "http://u"], {"GEM_COMPRESS_PROCESS": "many"})
    assert server_config(settings(["--upstream", "http://u"])).compress_niceness == 10
    assert server_config(settings(["--upstream", "http://u", "--compress-niceness", "0"])).compress_niceness == 0
    assert server_config(settings(["--upstream", "http://u"], {"GEM_COMPRESS_NICENESS": "4"})).compress_niceness == 4
    with pytest.raises(SystemExit):
        settings(["--upstream", "http://u", "--compress-niceness", "20"])


@pytest.mark.parametrize(("cores", "workers", "expected"), [
    (1, 1, 0), (2, 1, 2), (3, 1, 3), (16, 1, 4), (16, 4, 4), (16, 8, 2), (4, 2, 2), (4, 4, 0), (3, 2, 0), (2, 4, 0),
    (64, 2, 4)])
def test_compress_process_auto_takes_the_workers_share_of_the_cores(monkeypatch, cores, workers, expected):
    """``auto`` (the default, from every source) is the worker's share of the cores it may run on, at most 4, and no
    process where that share is under two cores."""
    monkeypatch.setattr("gemkernels.serve.config.usable_cores", lambda: cores)
    redis = ["--store", "redis://127.0.0.1:6379/0"]
    args = ["--upstream", "http://u", "--workers", str(workers), *redis]
    assert server_config(settings(args)).compress_process == expected
    assert server_config(settings([*args, "--compress-process", "AUTO"])).compress_process == expected
    assert server_config(settings(args, {"GEM_COMPRESS_PROCESS": "auto"})).compress_process == expected
    assert server_config(settings([*args, "--compress-process", "3"])).compress_process == 3
    monkeypatch.setattr("gemkernels.serve.config.os.name", "nt")
    assert server_config(settings(args)).compress_process == 0  # the processes need POSIX


@pytest.mark.parametrize(("files", "expected", "root_only"), [
    ({}, None, None),
    ({"cpu.max": "max 100000\n"}, None, None),
    ({"cpu.max": "200000 100000\n"}, 2.0, 2.0),
    ({"cpu.max": "150000 100000\n"}, 1.5, 1.5),
    ({"cpu.max": "max 100000\n", "kubepods/pod1/cpu.max": "50000 100000\n"}, 0.5, None),
    ({"cpu.max": "400000 100000\n", "kubepods/pod1/cpu.max": "300000 100000\n"}, 3.0, 4.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None, None),
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.5, 2.5),
    ({"cpu/cpu.cfs_quota_us": "250000\n"}, None, None),
    ({"cpu.max": "garbage\n"}, None, None)])
def test_a_containers_cpu_quota_bounds_the_cores(tmp_path, files, expected, root_only):
    """Docker's ``--cpus`` and Kubernetes CPU limits are cgroup quotas, which the affinity mask does not show: v2's
    ``cpu.max`` in the container's cgroup or the process's own, v1's quota over its period, the least of them
    (``root_only``: without the process's own cgroup)."""
    from gemkernels.serve.config import cgroup_cpus

    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    membership = tmp_path / "membership"
    membership.write_text("4:memory:/kubepods/pod1\n0::/kubepods/pod1\n")
    assert cgroup_cpus(root, membership) == expected
    assert cgroup_cpus(root, tmp_path / "no such file") == root_only


def test_usable_cores_are_the_affinity_within_the_quota(monkeypatch):
    """A quota of 1.5 CPUs on a host of 2 allows 1 core (and so no compression process); no quota, the affinity."""
    from gemkernels.serve import config

    monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(config, "cgroup_cpus", lambda: None)
    assert config.usable_cores() == 4 and config.default_compress_processes() == 4
    monkeypatch.setattr(config, "cgroup_cpus", lambda: 1.5)
    assert config.usable_cores() == 1 and config.default_compress_processes() == 0
    monkeypatch.setattr(config, "cgroup_cpus", lambda: 64.0)
    assert config.usable_cores() == 4
