"""Every subcommand parses on a core install and names the extra it needs before doing any work; the whole-run
table of ``gem compress`` agrees with the online replay it summarises."""

from __future__ import annotations

import json

import pytest
from helpers import EXAMPLE, FIXTURES

from gemkernels.cli import SUBCOMMANDS, build_parser, extras, main

NEEDS = {  # a command line, and the extra its first missing module belongs to
    "compress": (["compress", str(EXAMPLE)], "embed"),
    "serve": (["serve", "--upstream", "http://127.0.0.1:9", "--encoder", "hash"], "serve"),
    "replay": (["replay", str(FIXTURES), "--encoder", "hash", "--out", "OUT"], "replay"),
    "online": (["online", str(FIXTURES), "--encoder", "hash", "--out", "OUT"], "tokens"),
    "analyze": (["analyze", str(FIXTURES), "--encoder", "hash", "--out", "OUT"], "replay"),
    "train-router": (["train-router", str(FIXTURES), "--encoder", "hash", "--out", "OUT"], "replay"),
    "bench": (["bench", "--quick", "--out", "OUT"], "bench"),
}


def test_every_subcommand_is_registered_with_a_handler():
    parser = build_parser()
    assert set(NEEDS) == set(SUBCOMMANDS)
    for name, (argv, _) in NEEDS.items():
        args = parser.parse_args(argv)
        assert args.command == name and callable(args.func)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_a_missing_extra_is_named_before_any_work(name, monkeypatch, capsys, tmp_path):
    """With the extra's modules hidden, the subcommand exits 2 saying which install brings them, and writes
    nothing (the output folder it was given does not appear)."""
    argv, extra = NEEDS[name]
    argv = [str(tmp_path / "out") if arg == "OUT" else arg for arg in argv]
    hidden = set(extras.EXTRA_MODULES[extra])
    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module not in hidden and real(module))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"gem {name} needs pip install 'gemkernels[{extra}]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_encoders_name_their_extras():
    assert extras.encoder_extras("minilm") == ("embed",)
    assert extras.encoder_extras("openai:text-embedding-3-small:256") == ("remote",)
    assert extras.encoder_extras("hash-64") == ()


def test_whole_run_table_is_the_online_replay_of_the_history(capsys):
    """The table's ratios are those of `replay_run` over the same messages with the same encoder, and its advice
    names the cheapest preset."""
    pytest.importorskip("bpe_openai")
    from gemkernels.compress.encoders import make_encoder
    from gemkernels.compress.tokens import Prices
    from gemkernels.evaluate.loaders import Run
    from gemkernels.evaluate.online_policies import PolicyOptions
    from gemkernels.evaluate.online_replay import relative, replay_run

    assert main(["compress", str(EXAMPLE), "--encoder", "hash"]) == 0
    err = capsys.readouterr().err
    rows = {line.split()[0]: line.split()[1:] for line in err.splitlines() if line.startswith("  ")
            and line.split()[0] in ("paper", "balanced", "core", "cache-aware")}
    messages = json.loads(EXAMPLE.read_text())["messages"]
    encoder = make_encoder("hash")
    policies = ["full", "gem-paper", "gem-balanced", "gem-core", "gem-cache-aware"]
    replayed = replay_run(Run("run", "openai", messages, None, ""), policies, PolicyOptions(prices=Prices(0.1)),
                          encoder=lambda name: encoder, evidence=())
    rel = relative(replayed.totals(), Prices(0.1))
    for preset, (tokens, price, breaks) in rows.items():
        assert float(tokens) == pytest.approx(rel[f"gem-{preset}"]["tokens"], abs=6e-4)
        assert float(price) == pytest.approx(rel[f"gem-{preset}"]["price"], abs=6e-4)
        assert int(breaks) == replayed.totals()[f"gem-{preset}"].prefix_breaks
    cheapest = min(rows, key=lambda preset: float(rows[preset][1]))
    assert f"choose: here {cheapest} costs least" in err


def test_a_cached_price_out_of_range_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--price-cached", "2", "-o", str(out)]) == 2
    assert "prices must satisfy" in capsys.readouterr().err and not out.exists()


def test_whole_run_table_can_be_left_out(capsys):
    assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--no-whole-run"]) == 0
    assert "whole run" not in capsys.readouterr().err


def test_every_missing_extra_is_named_in_one_install(monkeypatch):
    """gem serve with neither [serve] nor [embed]: one command that installs both (it once named only the first)."""
    hidden = set(extras.EXTRA_MODULES["serve"]) | set(extras.EXTRA_MODULES["embed"])
    monkeypatch.setattr(extras, "installed", lambda module: module not in hidden)
    message = extras.missing_extra("serve", "serve", "embed")
    assert "pip install 'gemkernels[serve,embed]'" in message and "tokenizers" in message and "starlette" in message


def test_every_help_description_is_a_whole_sentence():
    """``gem X --help`` printed the first line of a wrapped docstring, cut mid-sentence, with RST backticks."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "compress" in a.choices).choices
    for name, sub in [("gem", parser), *subparsers.items()]:
        text = sub.description or ""
        assert "``" not in text and text.rstrip(")").rstrip().endswith((".", ")")), (name, text)
