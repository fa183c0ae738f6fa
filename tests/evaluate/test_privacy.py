"""Reports name runs, files and projects from the logs only with --show-paths: a marker in the logs' paths (and so in
the run names made from them) never reaches gem online's, gem replay's or gem analyze's output by default, and does
with the flag; the pseudonyms are stable."""

import argparse
import shutil

import pytest
from helpers import FIXTURES, needs_extra

from gemkernels.cli import analyze as analyze_cli
from gemkernels.cli import online as online_cli
from gemkernels.cli import replay as replay_cli
from gemkernels.evaluate.loaders import load_runs
from gemkernels.evaluate.privacy import anonymised, private_errors, pseudonym

MARKER = "Zq7-private-marker"


@pytest.fixture()
def logs(tmp_path):
    """Claude Code and Aider logs under a folder whose name holds the marker, an Aider history named by its folder
    (so the run names hold it too), and a file no reader knows."""
    root = tmp_path / f"home-{MARKER}"
    shutil.copytree(FIXTURES / "claude-code", root / "projects")
    shutil.copytree(FIXTURES / "aider" / "tinycalc", root / f"repo-{MARKER}")
    (root / f"notes-{MARKER}.json").write_text('{"not": "a run"}')
    return root


def command(module, argv):
    parser = argparse.ArgumentParser(prog="gem")
    module.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def outputs(out, capsys):
    """Everything the command printed and wrote (its text files)."""
    printed = capsys.readouterr()
    files = [p.read_text() for p in sorted(out.rglob("*")) if p.suffix in (".md", ".json")]
    return "\n".join([printed.out, printed.err, *files])


@pytest.mark.parametrize("module, argv", [
    (online_cli, ["online", "--encoder", "hash", "--policies", "window", "--evidence-policies", ""]),
    (replay_cli, ["replay", "--encoder", "hash", "--k", "2", "--min-blocks", "2", "--quiet"]),
    (analyze_cli, ["analyze", "--encoder", "hash", "--min-blocks", "2", "--quiet"])])
def test_reports_carry_names_from_the_logs_only_when_asked(module, argv, logs, tmp_path, capsys):
    needs_extra("replay")
    cache = ["--cache-dir", str(tmp_path / "cache")] if module is not online_cli else []
    assert command(module, [*argv, str(logs), *cache, "--out", str(tmp_path / "hidden")]) == 0
    hidden = outputs(tmp_path / "hidden", capsys)
    assert MARKER not in hidden and "file-" in hidden
    assert command(module, [*argv, str(logs), *cache, "--out", str(tmp_path / "shown"), "--show-paths"]) == 0
    assert MARKER in outputs(tmp_path / "shown", capsys)


def test_pseudonyms_are_stable_and_keep_links(logs):
    runs, errors = load_runs(logs)
    again, _ = load_runs(logs)
    assert [anonymised(r).name for r in runs] == [anonymised(r).name for r in again]  # the same on every read
    aider = next(r for r in runs if r.format == "aider")
    assert MARKER in aider.name and anonymised(aider).name == pseudonym("run", aider.name)
    assert len(pseudonym("run", aider.name)) == len("run-") + 10
    child = next(r for r in runs if r.parent is not None)
    parent = next(r for r in runs if r.id == child.parent)
    assert anonymised(child).parent == anonymised(parent).id  # a sub-agent stays linked to its parent
    (path, error), = private_errors(errors, False)
    assert MARKER not in path + error and path == pseudonym("file", errors[0][0])
    assert private_errors(errors, True) == errors


def test_a_mistyped_path_is_named_as_typed(tmp_path):
    """``gem online ~/typo`` once answered 'skipped file-3f2a...: no such file': the user's own argument is shown; a
    file found under a folder they named still gets its pseudonym."""
    typo = str(tmp_path / "no-such-folder")
    bad = tmp_path / "logs" / "broken.json"
    errors = [(typo, "no such file, directory or glob match"), (str(bad), f"ValueError: {bad.name} is not a run")]
    shown = private_errors(errors, False, [typo, str(tmp_path / "logs")])
    assert shown[0] == errors[0]
    assert shown[1][0] == pseudonym("file", str(bad)) and "broken" not in shown[1][1]
