"""What the logs say the provider billed, beside what each forwarding policy would have cost: per project, per day.

Billed: each recorded call's usage (`Run.calls`: uncached input, cache reads, cache writes, output) at the list
prices of the model the log names (`prices`). A policy's bill, under the same cache model: the replay
(`online_replay`) counts the o200k tokens each policy sends at each call and the part of them the prompt cache would
serve; priced with the same model's prices (uncached tokens at the cache-write price where the provider bills writes
and the run wrote to the cache, as the agent's own client did, else at the input price), its input cost relative to
the full history's at that call scales the call's billed input cost; the output is billed as recorded. So the full
history's bill is the billed one, and a policy's is what the same calls would have cost with its requests. Calls
without usage in the log are left out (counted); calls of a model without a price count their tokens, not dollars.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gemkernels.evaluate.costs import CallCost
from gemkernels.evaluate.loaders import Run, Usage
from gemkernels.evaluate.online_replay import BASELINE, RunReplay, policy_colours
from gemkernels.evaluate.plotting import pyplot
from gemkernels.evaluate.prices import PRICES, ModelPrice, price_for
from gemkernels.evaluate.replay import save

PER_MILLION = 1e6
UNKNOWN_DAY = "unknown"
GROUPINGS = ("project", "day")


@dataclass(frozen=True)
class Bill:
    """Summed over calls: the billed tokens by kind and their cost (USD; ``unpriced`` calls add tokens only)."""

    calls: int = 0
    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    cost: float = 0.0
    unpriced: int = 0

    def __add__(self, other: Bill) -> Bill:
        return Bill(*(getattr(self, name) + getattr(other, name) for name in self.__dataclass_fields__))


@dataclass(frozen=True)
class PolicyBill:
    """One policy summed over calls: the o200k tokens it sends, the cached part, and its projected cost (USD)."""

    sent: int = 0
    cached: int = 0
    cost: float = 0.0

    def __add__(self, other: PolicyBill) -> PolicyBill:
        return PolicyBill(self.sent + other.sent, self.cached + other.cached, self.cost + other.cost)


@dataclass
class Row:
    """One project or day: the billed usage and, per policy, what it would have sent and cost."""

    billed: Bill = field(default_factory=Bill)
    policies: dict[str, PolicyBill] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)


def billed_cost(usage: Usage, price: ModelPrice) -> tuple[float, float]:
    """(input cost, output cost) in USD of one call's usage; cache writes at the input price where the provider
    has no write price."""
    write = price.input if price.cache_write is None else price.cache_write
    return ((usage.input * price.input + usage.cache_read * price.cache_read + usage.cache_write * write)
            / PER_MILLION, usage.output * price.output / PER_MILLION)


def modelled_cost(cost: CallCost, price: ModelPrice, writes: bool) -> float:
    """A replayed request's input cost: cached tokens at the cache-read price, the rest at the cache-write price
    when ``writes`` (the provider bills writes and the run wrote to the cache), else at the input price."""
    fresh = price.cache_write if writes and price.cache_write is not None else price.input
    return (cost.cached * price.cache_read + cost.uncached * fresh) / PER_MILLION


def day_of(time: str | None) -> str:
    """The date (``YYYY-MM-DD``) of a call's recorded time, as recorded (its own time zone)."""
    return time[:10] if time and len(time) >= 10 and time[4] == "-" else UNKNOWN_DAY


def bill_runs(pairs: Iterable[tuple[Run, RunReplay]], table: dict[str, ModelPrice] = PRICES
              ) -> tuple[dict[str, dict[str, Row]], dict[str, int]]:
    """Rows per grouping (``project``, ``day``, and ``total`` under ``all``) in key order, and counts of the calls
    left out: ``no usage`` (the log has none)."""
    groups: dict[str, dict[str, Row]] = {name: {} for name in (*GROUPINGS, "total")}
    left_out = {"no usage": 0}
    for run, replay in pairs:
        writes = any(c.usage is not None and c.usage.cache_write > 0 for c in run.calls)
        for k, call in enumerate(run.calls):
            if call.usage is None:
                left_out["no usage"] += 1
                continue
            price = price_for(call.model, table)
            costs = {policy: calls[k] for policy, calls in replay.calls.items()}
            bill, policies = call_bill(call.usage, price, costs, writes)
            for grouping, key in (("project", run.workspace), ("day", day_of(call.time)), ("total", "all")):
                row = groups[grouping].setdefault(key, Row())
                row.billed += bill
                row.runs.add(run.id or run.name)
                for policy, value in policies.items():
                    row.policies[policy] = row.policies.get(policy, PolicyBill()) + value
    return {name: dict(sorted(rows.items())) for name, rows in groups.items()}, left_out


def call_bill(usage: Usage, price: ModelPrice | None, costs: dict[str, CallCost], writes: bool
              ) -> tuple[Bill, dict[str, PolicyBill]]:
    """One call: its `Bill`, and each policy's tokens and projected cost (the billed input cost scaled by the
    policy's modelled input cost over the full history's; no cost without a price: an ``unpriced`` call)."""
    if price is None:
        bill = Bill(1, usage.input, usage.cache_read, usage.cache_write, usage.output, 0.0, 1)
        return bill, {p: PolicyBill(c.input, c.cached, 0.0) for p, c in costs.items()}
    paid_input, paid_output = billed_cost(usage, price)
    full = modelled_cost(costs[BASELINE], price, writes)
    policies = {}
    for policy, cost in costs.items():
        ratio = modelled_cost(cost, price, writes) / full if full > 0 else 1.0
        policies[policy] = PolicyBill(cost.input, cost.cached, paid_input * ratio + paid_output)
    return Bill(1, usage.input, usage.cache_read, usage.cache_write, usage.output, paid_input + paid_output), policies


def summary(groups: dict[str, dict[str, Row]], left_out: dict[str, int], as_of: str) -> dict[str, Any]:
    """The rows as JSON-ready data."""
    return {"prices_as_of": as_of, "left_out": left_out,
            **{grouping: {key: {"runs": len(row.runs), "billed": asdict(row.billed),
                                "policies": {p: asdict(b) for p, b in row.policies.items()}}
                          for key, row in rows.items()} for grouping, rows in groups.items()}}


def dollars(value: float) -> str:
    """``$1,234.57``."""
    return f"${value:,.2f}"


def tokens(value: int) -> str:
    """A token count: as it is below 10,000, else in thousands (``12.3k``) or millions (``1.23M``)."""
    if value < 10_000:
        return f"{value:,}"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def table_rows(rows: dict[str, Row], policies: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and cells: the billed usage by kind and its cost, then each policy's projected cost and its ratio to
    the billed one."""
    header = ["", "runs", "calls", "cache reads", "cache writes", "uncached input", "output", "billed"] + [
        f"{p}" for p in policies]
    cells = []
    for key, row in rows.items():
        b = row.billed
        line = [key, str(len(row.runs)), str(b.calls), tokens(b.cache_read), tokens(b.cache_write), tokens(b.input),
                tokens(b.output), dollars(b.cost)]
        for policy in policies:
            cost = row.policies.get(policy, PolicyBill()).cost
            line.append(f"{dollars(cost)} ({cost / b.cost:.2f})" if b.cost > 0 else dollars(cost))
        cells.append(line)
    return header, cells


def sent_rows(rows: dict[str, Row], policies: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and cells: the o200k tokens each policy sends, and the cached share."""
    header = [""] + list(policies)
    return header, [[key] + [f"{tokens(row.policies[p].sent)} ({row.policies[p].cached / row.policies[p].sent:.0%} "
                             "cached)" if row.policies.get(p) and row.policies[p].sent else "0"
                             for p in policies] for key, row in rows.items()]


def markdown_table(header: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(line) + " |" for line in cells]


def text_table(header: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Columns aligned for a terminal: the first left, the others right."""
    widths = [max(len(str(x)) for x in column) for column in zip(header, *cells)]
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))
    return [line(header), "  ".join("-" * w for w in widths)] + [line(values) for values in cells]


def report(groups: dict[str, dict[str, Row]], left_out: dict[str, int], policies: Sequence[str], as_of: str,
           terminal: bool = False) -> str:
    """The billed usage beside each policy's cost per project, per day and in total (markdown, or aligned text for
    a terminal), and the tokens each policy sends."""
    render = text_table if terminal else markdown_table
    note = (f"Billed: the usage the logs record at list prices as of {as_of} (USD); each policy: the same calls with "
            "its requests under the same cache model (its cost / the billed cost in brackets).")
    if left_out["no usage"]:
        note += f" {left_out['no usage']} calls without usage in their log are left out."
    unpriced = groups["total"].get("all", Row()).billed.unpriced
    if unpriced:
        note += f" {unpriced} calls of models without a price count tokens, not dollars (--prices adds them)."
    lines = [note, ""]
    for grouping in (*GROUPINGS, "total"):
        if groups[grouping]:
            lines += [f"**per {grouping}**" if grouping != "total" else "**total**", "",
                      *render(*table_rows(groups[grouping], policies)), ""]
    if groups["total"]:
        lines += ["**input tokens sent (o200k, replayed)**", "", *render(*sent_rows(groups["total"], policies)), ""]
    return "\n".join(lines)


def plot(groups: dict[str, dict[str, Row]], policies: Sequence[str], path: Path) -> Path:
    """Cost per project (bars: billed, then each policy) and per day (lines), in USD."""
    plt = pyplot()
    colours = policy_colours(policies)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    projects = list(groups["project"])
    width = 0.8 / (len(policies) + 1)
    for i, (label, values) in enumerate([("billed", [groups["project"][p].billed.cost for p in projects])] + [
            (policy, [groups["project"][p].policies.get(policy, PolicyBill()).cost for p in projects])
            for policy in policies]):
        left.bar([x + i * width for x in range(len(projects))], values, width,
                 color="black" if label == "billed" else colours[label], label=label)
    left.set_xticks([x + 0.4 - width / 2 for x in range(len(projects))], projects, rotation=30, ha="right", fontsize=7)
    left.set_ylabel("USD")
    left.set_title("per project")
    days = list(groups["day"])
    right.plot(days, [groups["day"][d].billed.cost for d in days], color="black", marker="o", label="billed")
    for policy in policies:
        right.plot(days, [groups["day"][d].policies.get(policy, PolicyBill()).cost for d in days],
                   color=colours[policy], marker=".", label=policy)
    right.tick_params(axis="x", rotation=30, labelsize=7)
    right.set_title("per day")
    right.legend(fontsize=7)
    fig.suptitle("What the logs say was billed, and what each policy would have cost")
    return save(fig, path)

