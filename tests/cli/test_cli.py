"""``gem compress`` end to end on the bundled example and recorded runs (hash encoder: fast, deterministic)."""

import json

from helpers import EXAMPLE, FIXTURES

from gemkernels.cli import main
from gemkernels.compress.blocks import parse_history


def test_compress_writes_a_valid_shorter_history(tmp_path, capsys):
    out, stats = tmp_path / "out.json", tmp_path / "stats.json"
    code = main(["compress", str(EXAMPLE), "--encoder", "hash", "--preset", "core", "-v", "-o", str(out),
                 "--stats", str(stats)])
    assert code == 0
    forwarded = json.loads(out.read_text())
    original = json.loads(EXAMPLE.read_text())["messages"]
    assert len(parse_history(forwarded).blocks) < 32 and forwarded[:2] == original[:2]
    recorded = json.loads(stats.read_text())
    assert recorded["action"] == "reselected" and recorded["chars_after"] < recorded["chars_before"]
    err = capsys.readouterr().err
    assert "protected by recent: [31, 30, 29, 28]" in err and err.count("block ") >= 32


def test_a_ranked_rewrite_is_reported_without_a_coverage(tmp_path, capsys):
    """The router ranks the cache-aware rewrite: no coverage to print (it once crashed the summary)."""
    out = tmp_path / "out.json"
    code = main(["compress", str(EXAMPLE), "--encoder", "hash", "--preset", "cache-aware", "--set",
                 "rewrite_above_blocks=16", "--set", "repay_factor=None", "-v", "-o", str(out), "--no-whole-run"])
    assert code == 0
    err = capsys.readouterr().err
    assert "reselected" in err and "selected core (" in err and "coverage" not in err
    assert len(parse_history(json.loads(out.read_text())).blocks) < 32


def test_request_on_stdin_keeps_its_other_fields(monkeypatch, capsys):
    messages = json.loads(EXAMPLE.read_text())["messages"]
    request = {"model": "m", "temperature": 0.2, "tools": [{"type": "function"}], "messages": messages}
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(json.dumps(request)))
    assert main(["compress", "-", "--encoder", "hash", "-o", "-"]) == 0
    forwarded = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in forwarded.items() if k != "messages"} == {k: v for k, v in request.items()
                                                                        if k != "messages"}


def test_step_cuts_a_recorded_run(capsys):
    assert main(["compress", str(FIXTURES / "mini_swe_agent.traj.json"), "--encoder", "hash", "--step", "1"]) == 0
    assert "unchanged" in capsys.readouterr().err


def test_bad_inputs_exit_2_with_a_message(tmp_path, capsys):
    assert main(["compress", str(tmp_path / "missing.json"), "--encoder", "hash"]) == 2
    assert main(["compress", str(FIXTURES / "mini_swe_agent.traj.json"), "--encoder", "hash", "--step", "999"]) == 2
    assert "--step must lie" in capsys.readouterr().err


def test_invalid_history_is_forwarded_unchanged(tmp_path, capsys):
    messages = json.loads(EXAMPLE.read_text())["messages"]
    messages[3]["tool_call_id"] = "nope"
    path, out = tmp_path / "broken.json", tmp_path / "out.json"
    path.write_text(json.dumps(messages))
    assert main(["compress", str(path), "--encoder", "hash", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == messages
    assert "passthrough: invalid structure" in capsys.readouterr().err


def test_set_overrides_the_preset(tmp_path, capsys):
    stats = tmp_path / "stats.json"
    recorded = []
    for extra in ([], ["--set", "k=4", "--set", "tau=1.0", "--set", "evidence.recent=2"]):
        assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--preset", "core", *extra, "--stats",
                     str(stats)]) == 0
        recorded.append(json.loads(stats.read_text()))
    default, overridden = recorded
    assert sorted(default["protected"]["recent"]) == [28, 29, 30, 31]
    assert sorted(overridden["protected"]["recent"]) == [30, 31]
    # tau = 1 completes up to K_t = max(k, |protected|) = max(4, |P|): here the protected blocks alone
    protected = {b for picks in overridden["protected"].values() for b in picks}
    assert len(overridden["core"]) == max(4, len(protected)) < len(default["core"])


def test_bad_override_exits_2_naming_it(capsys):
    assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--set", "nope=1"]) == 2
    assert "nope=1" in capsys.readouterr().err
    assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--set", "tau=2"]) == 2
    assert "tau must lie" in capsys.readouterr().err
