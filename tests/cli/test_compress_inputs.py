"""``gem compress`` on inputs a user gets wrong or brings from other agents: each is read for what it is, or refused
with exit 2 and a message that names the file or flag, before any work (hash encoder)."""

import io
import json

import pytest
from helpers import EXAMPLE

from gemkernels.cli import main
from gemkernels.cli.serve import server_config
from gemkernels.cli.settings import resolve
from gemkernels.compress.blocks import parse_history


def compress(capsys, *argv):
    code = main(["compress", *map(str, argv), "--encoder", "hash", "--no-whole-run"])
    return code, capsys.readouterr()


def test_another_agents_records_are_not_taken_for_chat_messages(tmp_path, capsys):
    """A Gemini CLI session ({sessionId, projectHash, messages}) and a Gemini API history (role/parts) once went
    through as 'messages' and exited 0; they are read by their run reader, or refused naming the file."""
    gemini = tmp_path / "checkpoint-x.json"
    gemini.write_text(json.dumps([{"role": "user", "parts": [{"text": "fix it"}]},
                                  {"role": "model", "parts": [{"text": "ok"}]}]))
    code, out = compress(capsys, gemini)
    assert code == 0 and "unchanged" in out.err  # the Gemini reader's run: too short to compress
    other = tmp_path / "object.json"  # an object that is neither a request nor a run (KeyError once)
    other.write_text(json.dumps({"model": "m", "input": "a string input"}))
    code, out = compress(capsys, other)
    assert code == 2 and "object.json" in out.err and "Traceback" not in out.err
    unknown = tmp_path / "records.json"
    unknown.write_text(json.dumps({"messages": [{"ts": 1, "type": "say", "text": "hi"}]}))
    code, out = compress(capsys, unknown)
    assert code == 2 and "records.json" in out.err


def test_a_responses_request_is_compressed_in_its_input(tmp_path, capsys):
    """{"model", "input": [...]} (a Codex request) was refused; its input is compressed and its other fields kept."""
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the tests"}]}]
    for b in range(24):
        items += [{"type": "function_call", "name": "shell", "call_id": f"c{b}",
                   "arguments": json.dumps({"command": ["grep", "-rn", f"word{b}", "src"]})},
                  {"type": "function_call_output", "call_id": f"c{b}", "output": f"src/m{b}.py: word{b} " * 40}]
    request = {"model": "gpt-5-codex", "store": False, "input": items}
    path, out_path = tmp_path / "request.json", tmp_path / "out.json"
    path.write_text(json.dumps(request))
    code, _ = compress(capsys, path, "--preset", "core", "-o", out_path)
    assert code == 0
    forwarded = json.loads(out_path.read_text())
    assert {k: v for k, v in forwarded.items() if k != "input"} == {"model": "gpt-5-codex", "store": False}
    assert len(forwarded["input"]) < len(items) and parse_history(forwarded["input"]).format == "responses"


@pytest.mark.parametrize("content, named", [("", "is empty"), ("{nope", "is not JSON"), ("\ufeff[]", "bad.json")])
def test_empty_and_broken_files_are_named(tmp_path, capsys, content, named):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    code, out = compress(capsys, path)
    assert code == 2 and named in out.err and "Traceback" not in out.err


def test_a_folder_is_refused_naming_the_commands_that_read_folders(tmp_path, capsys):
    code, out = compress(capsys, tmp_path)
    assert code == 2 and "gem replay" in out.err


def test_outputs_that_cannot_be_written_are_refused_before_the_work(tmp_path, capsys):
    """-o into a missing folder, or onto a folder, crashed with a traceback after compressing."""
    for flag, target in (("-o", tmp_path / "absent" / "out.json"), ("--stats", tmp_path)):
        code, out = compress(capsys, EXAMPLE, flag, target)
        assert code == 2 and flag in out.err and "reselected" not in out.err


@pytest.mark.parametrize("argv, named", [(["--set", "backend=bogus"], "unknown backend"),
                                         (["--set", "k=-1"], "k must be at least 0"),
                                         (["--run", "x"], "--run picks")])
def test_bad_settings_exit_2_naming_them(capsys, argv, named):
    code, out = compress(capsys, EXAMPLE, *argv)
    assert code == 2 and named in out.err


def test_a_bad_encoder_name_exits_2(capsys):
    assert main(["compress", str(EXAMPLE), "--encoder", "bogus"]) == 2
    assert "unknown encoder 'bogus'" in capsys.readouterr().err
    assert main(["compress", str(EXAMPLE), "--encoder", "hash-x"]) == 2
    assert "hash-<dim>" in capsys.readouterr().err


def test_a_closed_pipe_on_stdout_is_not_an_error(monkeypatch, capsys):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            return self.devnull.fileno()

    closed = Closed()
    closed.devnull = open("/dev/null", "w")  # noqa: SIM115 (closed below)
    monkeypatch.setattr("sys.stdout", closed)
    monkeypatch.setattr("os.dup2", lambda fd, fd2: None)  # the real one would redirect pytest's own stdout
    try:
        assert main(["compress", str(EXAMPLE), "--encoder", "hash", "--no-whole-run", "-o", "-"]) == 0
    finally:
        closed.devnull.close()


@pytest.mark.parametrize("argv, named", [(["--upstream", "notaurl"], "--upstream takes"),
                                         (["--upstream", "http://u", "--anthropic-upstream", "ftp://x"],
                                          "--anthropic-upstream takes"),
                                         (["--upstream", "http://u", "--port", "-1"], "--port must lie"),
                                         (["--upstream", "https://api.openai.com:99999/v1"], "--upstream takes"),
                                         (["--upstream", "http://u:abc/v1"], "--upstream takes"),
                                         (["--upstream", "http://[::1/v1"], "--upstream takes"),
                                         (["--upstream", "http://u", "--encoder", "bogus"], "unknown encoder"),
                                         (["--upstream", "http://u", "--set", "backend=bogus"], "unknown backend")])
def test_serve_refuses_bad_settings_before_it_starts(argv, named):
    from gemkernels.cli import build_parser

    args = build_parser().parse_args(["serve", *argv])
    with pytest.raises(ValueError, match=named):
        server_config(resolve(args, args.deferred, "serve", {}))
