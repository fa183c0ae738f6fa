"""Which files a path names and how one is read (`gemkernels.evaluate.loaders.files`): the edges a user's folders
and editors bring (a quoted ~, installed packages beside the logs, one-line JSON Lines, byte order marks, empty
files, lines nested past the parser)."""

import json

import pytest
from helpers import FIXTURES

from gemkernels.evaluate.loaders import load_runs, read_runs
from gemkernels.evaluate.loaders.files import expand_paths, read_document


def test_a_quoted_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """``gem online "~/logs"``: the shell leaves the ~, which once named nothing."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run.jsonl").write_text((FIXTURES / "openai_lines.jsonl").read_text())
    files, errors = expand_paths("~/logs")
    assert errors == [] and files == [tmp_path / "logs" / "run.jsonl"]
    files, errors = expand_paths("~/logs/*.jsonl")
    assert errors == [] and files == [tmp_path / "logs" / "run.jsonl"]


def test_a_folder_scan_skips_installed_packages_and_version_control(tmp_path):
    """A project folder's node_modules, .git and virtual environments hold JSON that is no agent's log: once every
    one of them was read (and a chat-like one taken for a run)."""
    run = (FIXTURES / "openai_lines.jsonl").read_text()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run.jsonl").write_text(run)
    for folder in ("node_modules/pkg", ".git/objects", ".venv/lib/site-packages/x", "sub/__pycache__"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "run.jsonl").write_text(run)
    files, errors = expand_paths(tmp_path)
    assert errors == [] and files == [tmp_path / "logs" / "run.jsonl"]
    (tmp_path / "logs" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")  # a dead link is no file to read
    files, errors = expand_paths(tmp_path)
    assert errors == [] and files == [tmp_path / "logs" / "run.jsonl"]
    explicit, _ = expand_paths(tmp_path / "node_modules" / "pkg" / "run.jsonl")  # named: read
    assert explicit == [tmp_path / "node_modules" / "pkg" / "run.jsonl"]


def test_one_line_json_lines_is_a_list_of_one_record(tmp_path):
    """A ``.jsonl`` file of one line parsed as one JSON document (an object), which no JSON Lines reader takes."""
    first = (FIXTURES / "openai_lines.jsonl").read_text().splitlines()[0]
    path = tmp_path / "one.jsonl"
    path.write_text(first + "\n")
    assert read_document(path).data == [json.loads(first)]


def test_a_byte_order_mark_is_not_content(tmp_path):
    text = (FIXTURES / "openai_messages.json").read_text()
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_document(path).data == json.loads(text)
    lines = tmp_path / "bom.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "openai_lines.jsonl").read_bytes())
    assert read_document(lines).skipped == 0


def test_an_empty_file_is_named(tmp_path):
    for name in ("empty.json", "empty.jsonl"):
        (tmp_path / name).write_text("\n \n")
        with pytest.raises(ValueError, match=name.replace(".", r"\.") + " is empty"):
            read_document(tmp_path / name)
    runs, errors = load_runs(tmp_path)
    assert runs == [] and len(errors) == 2


def test_a_line_nested_past_the_parser_is_skipped_not_fatal(tmp_path):
    """One line of 100,000 nested brackets raised RecursionError for the whole file."""
    lines = (FIXTURES / "openai_lines.jsonl").read_text().splitlines()
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join([lines[0], "[" * 100_000 + "]" * 100_000, *lines[1:]]) + "\n")
    document = read_document(path)
    assert document.skipped == 1 and len(document.data) == len(lines)
    assert read_runs(path)[0].skipped == 1


def test_a_json_array_saved_as_jsonl_is_still_one_document(tmp_path):
    """A chat history saved as an indented array under ``.jsonl`` (one element a line) read as one document before
    the one-line rule; it must still, and a one-line file is still a list of one record."""
    messages = json.loads((FIXTURES / "openai_messages.json").read_text())
    path = tmp_path / "array.jsonl"
    path.write_text("[\n" + ",\n".join(json.dumps(m) for m in messages) + "\n]\n")
    assert read_document(path).data == messages and read_document(path).skipped == 0
