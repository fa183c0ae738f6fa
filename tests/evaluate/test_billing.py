"""The billed usage of the logs at list prices, beside each forwarding policy's cost (gem online's per-project and
per-day tables), and the price table: sums checked against hand-computed and independently computed values."""

import argparse
import json
import math

import pytest
from helpers import FIXTURES, needs_extra
from hypothesis import given, settings
from hypothesis import strategies as st

from gemkernels.cli import online as online_cli
from gemkernels.evaluate.billing import Bill, PolicyBill, bill_runs, call_bill, day_of, report
from gemkernels.evaluate.costs import CallCost
from gemkernels.evaluate.loaders import Call, Run, Usage, load_run, load_runs
from gemkernels.evaluate.online_replay import RunReplay
from gemkernels.evaluate.prices import PRICES, ModelPrice, load_prices, model_key, price_for

SONNET = ModelPrice(3.0, 0.30, 3.75, 15.0)  # USD per million tokens, typed from Anthropic's page
GPT5 = ModelPrice(1.25, 0.125, None, 10.0)


@pytest.mark.parametrize("logged, key", [
    ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"), ("anthropic/claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
    ("us.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4"), ("vertex_ai/claude-sonnet-4@20250514",
                                                                        "claude-sonnet-4"),
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"), ("openai/gpt-4o", "gpt-4o"), ("gpt-5-codex", "gpt-5-codex"),
    ("gpt-5.1-codex", "gpt-5.1"), ("o3-mini", "o3-mini"), ("o3", "o3"),
    ("gemini/gemini-2.5-pro-preview-05-06", "gemini-2.5-pro"), ("gemini-2.5-flash-lite", "gemini-2.5-flash-lite"),
    ("lm_studio/qwen3-coder", None), ("Qwen/Qwen3-Coder", None)])
def test_a_logged_model_is_priced_by_its_longest_matching_key(logged, key):
    assert model_key(logged, PRICES) == key
    assert (price_for(logged) is None) == (key is None)


def test_a_price_file_adds_and_replaces_models(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"qwen3-coder": {"input": 0.2, "cache_read": 0.02, "output": 0.8},
                                                 "gpt-4o": {"input": 5, "cache_read": 2.5, "output": 20}}))
    table = load_prices(tmp_path / "p.json")
    assert price_for("lm_studio/qwen3-coder", table) == ModelPrice(0.2, 0.02, None, 0.8)
    assert table["gpt-4o"].input == 5 and table["claude-sonnet-4"] == PRICES["claude-sonnet-4"]
    (tmp_path / "p.toml").write_text('[my-model]\ninput = 1.0\ncache_read = 0.1\ncache_write = 1.25\noutput = 4.0\n')
    assert load_prices(tmp_path / "p.toml")["my-model"] == ModelPrice(1.0, 0.1, 1.25, 4.0)
    (tmp_path / "bad.json").write_text(json.dumps({"m": {"input": 1, "output": 2}}))
    with pytest.raises(ValueError, match="needs input, cache_read, output"):
        load_prices(tmp_path / "bad.json")
    (tmp_path / "neg.json").write_text(json.dumps({"m": {"input": -1, "cache_read": 0, "output": 2}}))
    with pytest.raises(ValueError, match="non-negative"):
        load_prices(tmp_path / "neg.json")


def test_one_call_by_hand():
    usage = Usage(input=200, cache_read=8000, cache_write=1000, output=300)
    costs = {"full": CallCost(10_000, 8_000), "short": CallCost(4_000, 2_000)}
    bill, policies = call_bill(usage, SONNET, costs, writes=True)
    paid_input = (200 * 3 + 8000 * 0.3 + 1000 * 3.75) / 1e6  # 0.00675
    paid_output = 300 * 15 / 1e6
    assert math.isclose(bill.cost, paid_input + paid_output)
    full = (8000 * 0.3 + 2000 * 3.75) / 1e6  # the replay's uncached tokens are written, as the client did
    short = (2000 * 0.3 + 2000 * 3.75) / 1e6
    assert math.isclose(policies["full"].cost, bill.cost)
    assert math.isclose(policies["short"].cost, paid_input * short / full + paid_output)
    assert policies["short"].sent == 4000 and policies["short"].cached == 2000
    _, plain = call_bill(usage, SONNET, costs, writes=False)  # a client that never wrote: fresh at the input price
    assert math.isclose(plain["short"].cost, paid_input * (2000 * 0.3 + 2000 * 3) / (8000 * 0.3 + 2000 * 3)
                        + paid_output)
    unpriced, free = call_bill(usage, None, costs, writes=True)
    assert unpriced == Bill(1, 200, 8000, 1000, 300, 0.0, 1) and free["short"] == PolicyBill(4000, 2000, 0.0)


def fake_run(name, project, calls):
    return Run(name, "openai", [{"role": "user", "content": "x"}], "x", f"/logs/{name}.json", calls=tuple(calls),
               project=project)


def test_rows_per_project_and_day_add_up():
    runs = [fake_run("a", "/p/one", [Call(0, (), Usage(100, 0, 0, 10), "gpt-5", "2025-11-14T23:59:00Z"),
                                     Call(0, (), Usage(50, 900, 0, 5), "gpt-5", "2025-11-15T00:01:00Z"),
                                     Call(0, (), None, "gpt-5", "2025-11-15T00:02:00Z")]),
            fake_run("b", None, [Call(0, (), Usage(7, 0, 0, 1), "claude-sonnet-4-5", None)])]
    replays = [RunReplay(r.name, r.format, r.path, {"full": [CallCost(100, 0)] * len(r.calls),
                                                    "half": [CallCost(50, 0)] * len(r.calls)}, {}) for r in runs]
    groups, left_out = bill_runs(zip(runs, replays))
    assert left_out == {"no usage": 1}
    assert list(groups["project"]) == ["/logs", "/p/one"]  # b names no project: its file's folder
    assert list(groups["day"]) == ["2025-11-14", "2025-11-15", "unknown"]
    one = groups["project"]["/p/one"].billed
    assert (one.calls, one.input, one.cache_read, one.output) == (2, 150, 900, 15)
    assert math.isclose(one.cost, (150 * 1.25 + 900 * 0.125 + 15 * 10) / 1e6)
    total = groups["total"]["all"]
    assert math.isclose(total.billed.cost, one.cost + (7 * 3 + 15) / 1e6)
    for grouping in ("project", "day"):
        assert math.isclose(sum(row.billed.cost for row in groups[grouping].values()), total.billed.cost)
        assert math.isclose(sum(row.policies["half"].cost for row in groups[grouping].values()),
                            total.policies["half"].cost)
    assert "| /p/one | 1 | 2 |" in report(groups, left_out, ["full", "half"], "2025-11-20")
    assert day_of("2025-11-14T23:59:00Z") == "2025-11-14" and day_of("t") == "unknown"


@settings(max_examples=100, deadline=None)
@given(usage=st.builds(Usage, *[st.integers(0, 10**6)] * 4), writes=st.booleans(),
       full=st.tuples(st.integers(0, 10**5), st.integers(0, 10**5)),
       other=st.tuples(st.integers(0, 10**5), st.integers(0, 10**5)))
def test_the_full_history_is_billed_as_recorded_and_a_cheaper_request_costs_no_more(usage, writes, full, other):
    full_cost, other_cost = CallCost(sum(full), full[1]), CallCost(sum(other), other[1])
    bill, policies = call_bill(usage, SONNET, {"full": full_cost, "other": other_cost}, writes)
    assert math.isclose(policies["full"].cost, bill.cost, rel_tol=1e-12, abs_tol=1e-15)
    if other_cost.cached <= full_cost.cached and other_cost.uncached <= full_cost.uncached and sum(full):
        assert policies["other"].cost <= bill.cost + 1e-12


def test_gem_online_bills_each_project_and_day_at_list_prices(tmp_path, capsys):
    needs_extra("replay")
    trees = [str(FIXTURES / "cline"), str(FIXTURES / "gemini"), str(FIXTURES / "aider"), str(FIXTURES / "codex")]
    parser = argparse.ArgumentParser(prog="gem")
    online_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["online", *trees, "--encoder", "hash", "--policies", "window,gem-cache-aware",
                              "--evidence-policies", "", "--out", str(tmp_path), "--show-paths"])
    assert args.func(args) == 0
    assert "per project" in capsys.readouterr().out
    data = json.loads((tmp_path / "online.json").read_text())["billing"]
    runs, _ = load_runs(trees)
    expected, days, projects, priced = 0.0, {}, {}, 0  # independently: every call's usage at its model's price
    for run in runs:
        for call in run.calls:
            price = price_for(call.model)
            if call.usage is None or price is None:
                continue
            u = call.usage
            cost = (u.input * price.input + u.cache_read * price.cache_read + u.output * price.output
                    + u.cache_write * (price.input if price.cache_write is None else price.cache_write)) / 1e6
            expected += cost
            days[call.time[:10]] = days.get(call.time[:10], 0.0) + cost
            projects[run.project or run.path.rsplit("/", 1)[0]] = projects.get(
                run.project or run.path.rsplit("/", 1)[0], 0.0) + cost
            priced += 1
    total = data["total"]["all"]
    assert math.isclose(total["billed"]["cost"], expected) and total["billed"]["calls"] - total["billed"][
        "unpriced"] == priced
    assert {day: row["billed"]["cost"] for day, row in data["day"].items()} == pytest.approx(days)
    assert math.isclose(total["policies"]["full"]["cost"], expected)  # the full history is billed as recorded
    assert {p: row["billed"]["cost"] for p, row in data["project"].items() if row["billed"]["cost"]} == pytest.approx(
        projects)
    cline = load_run(FIXTURES / "cline" / "tasks" / "1731577800000")  # by hand: Sonnet 3.7 and 4 cost the same
    replay = RunReplay(cline.name, cline.format, cline.path, {"full": [CallCost(1, 0)] * len(cline.calls)}, {})
    alone = bill_runs([(cline, replay)])[0]["total"]["all"].billed
    assert cline.project == "/home/dev/tinycalc" and (alone.calls, alone.unpriced) == (6, 0)
    assert math.isclose(alone.cost, (30 * 3 + 41410 * 0.3 + 10820 * 3.75 + 458 * 15) / 1e6)
    assert (tmp_path / "online.md").read_text().startswith("Billed:") and (tmp_path / "billing.png").stat().st_size
