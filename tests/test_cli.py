"""``gem select`` end to end on the bundled example (hash encoder: fast, deterministic)."""

import json
from pathlib import Path

from gemkernels.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django-11276.json"


def test_select_protects_recent_blocks_then_completes(capsys):
    assert main(["select", str(EXAMPLE), "--encoder", "hash", "--json", "--k", "10", "--tau", "0.99"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["blocks"] == 32 and out["protected"] == 4
    assert out["selection_order"][:4] == [28, 29, 30, 31]
    assert out["kept"] == len(out["selection_order"]) == 10 and out["stop"] == "capacity"
    assert len(set(out["selection_order"])) == 10
    assert 0 < out["kept_chars"] < out["block_chars"]


def test_select_table_marks_kept_blocks(capsys):
    assert main(["select", str(EXAMPLE), "--encoder", "hash"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "recent" in line]
    assert len(table) == 4


def test_invalid_history_is_reported_not_selected(tmp_path, capsys):
    messages = json.loads(EXAMPLE.read_text())["messages"]
    messages[3]["tool_call_id"] = "nope"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(messages))
    assert main(["select", str(path), "--encoder", "hash"]) == 1
    assert "forwarded unchanged" in capsys.readouterr().err
