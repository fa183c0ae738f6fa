"""Online cost replay: every model call of every recorded run, under each forwarding policy.

At each call of a run (each assistant turn; the request is the history before it) every
policy of `online_policies` forwards its request; `costs` counts its o200k input tokens,
the part a provider's prompt cache would serve (common prefix with the same policy's
previous request), and the embedding tokens the policy caused. Totals per run and pooled
(per run format and over all runs) are reported relative to the full history, as a
markdown table, JSON and a PNG (tokens against price per policy).

    gem online PATH... [--policies full,masking,window,gem-paper,...] [--price-cached 0.1]
        [--window 10] [--mask-after 5] [--amortized-budget 40 --amortized-keep 20] [--encoder minilm|hash]
        [--out DIR] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from .costs import CACHED_PRICE, CallCost, Encode, TokenCache, Totals, call_cost, o200k_encode
from .encoders import Encoder, make_encoder
from .loaders import Run, checkpoints, load_runs
from .online_policies import POLICIES, PolicyOptions, policy_label

BASELINE = "full"
DEFAULT_POLICIES = ("full", "masking", "window", "amortized", "gem-paper", "gem-balanced", "gem-core",
                    "gem-cache-aware")
ALL_RUNS = "all"


@dataclass(frozen=True)
class RunReplay:
    """One run replayed: per policy, the cost of each call in order."""

    name: str
    format: str
    path: str
    calls: dict[str, list[CallCost]]

    def totals(self) -> dict[str, Totals]:
        return {policy: Totals.of(costs) for policy, costs in self.calls.items()}


# One encoder per name and process: each distinct block text is embedded once for all presets and runs.
shared_encoder: Callable[[str], Encoder] = cache(make_encoder)


def replay_run(run: Run, policies: Sequence[str], options: PolicyOptions,
               encoder: Callable[[str], Encoder] = shared_encoder, encode: Encode | None = None) -> RunReplay:
    """Replay ``run`` call by call under each named policy (fresh policy objects, one token cache).

    ``encoder`` maps an encoder name to the encoder GEM policies use; ``encode`` is the tokenizer (default o200k).
    """
    check_policies(policies)
    live = {name: POLICIES[name](run, options, encoder) for name in policies}
    tokens = TokenCache(encode)
    previous: dict[str, list[tuple[int, ...]] | None] = dict.fromkeys(policies)
    calls: dict[str, list[CallCost]] = {name: [] for name in policies}
    for position in checkpoints(run.messages):
        request = run.messages[:position]
        for name, policy in live.items():
            forwarded = policy(request)
            current = tokens.request(forwarded.messages)
            embedding = sum(len(tokens.text(text)) for text in forwarded.embedded)
            calls[name].append(call_cost(previous[name], current, embedding))
            previous[name] = current
    return RunReplay(run.name, run.format, run.path, calls)


def check_policies(names: Iterable[str]) -> None:
    """``ValueError`` naming any policy that is not registered in `POLICIES`."""
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")


def replay_or_error(run: Run, policies: Sequence[str], options: PolicyOptions) -> RunReplay | tuple[str, str]:
    """`replay_run`, or (run name, error) so that one failing run does not stop the others."""
    try:
        return replay_run(run, policies, options)
    except Exception as err:  # reported with the run's name instead of ending the whole replay
        return run.name, f"{type(err).__name__}: {err}"


def replay_runs(runs: Sequence[Run], policies: Sequence[str], options: PolicyOptions, workers: int = 1,
                progress: bool = True) -> tuple[list[RunReplay], list[tuple[str, str]]]:
    """Every run replayed, in input order (``workers`` > 1: in that many processes); failures as (name, error)."""
    check_policies(policies)
    job = partial(replay_or_error, policies=policies, options=options)
    replays: list[RunReplay] = []
    errors: list[tuple[str, str]] = []
    with ProcessPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        for result in with_progress((pool.map if pool else map)(job, runs), len(runs), progress):
            (replays if isinstance(result, RunReplay) else errors).append(result)
    return replays, errors


def with_progress(items: Iterable[Any], total: int, enabled: bool) -> Iterable[Any]:
    """A tqdm bar over runs on a terminal when tqdm is installed; the items unchanged otherwise."""
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, total=total, unit="run", disable=None)
    return items


def pooled(replays: Iterable[RunReplay]) -> dict[str, dict[str, Totals]]:
    """Totals per group (``all`` and each run format) and policy."""
    groups: dict[str, dict[str, Totals]] = {}
    for replay in replays:
        for group in (ALL_RUNS, replay.format):
            into = groups.setdefault(group, {})
            for policy, totals in replay.totals().items():
                into[policy] = into.get(policy, Totals()) + totals
    return groups


def relative(totals: dict[str, Totals], cached_price: float) -> dict[str, dict[str, float]]:
    """Per policy: input tokens, price and tokens + embedding relative to the full history; cached share."""
    base = totals[BASELINE]
    out = {}
    for policy, t in totals.items():
        out[policy] = {
            "tokens": t.input / base.input if base.input else 1.0,
            "price": t.price(cached_price) / base.price(cached_price) if base.input else 1.0,
            "cached_fraction": t.cached / t.input if t.input else 0.0,
            "embedding": t.embedding / base.input if base.input else 0.0,
            "combined": (t.input + t.embedding) / base.input if base.input else 1.0,
        }
    return out


def markdown(groups: dict[str, dict[str, Totals]], runs_per_group: dict[str, int], options: PolicyOptions,
             cached_price: float) -> str:
    """One table per group: tokens, price, cached share, prefix breaks and embedding tokens vs the full history."""
    lines = [f"Cached input priced at {cached_price:g}, uncached at 1; ratios are pooled sums over runs.", ""]
    order = [ALL_RUNS] + sorted(g for g in groups if g != ALL_RUNS)
    for group in order:
        totals = groups[group]
        rel = relative(totals, cached_price)
        lines += [f"**{group}** ({runs_per_group[group]} runs, {totals[BASELINE].calls} calls)", "",
                  "| policy | input tokens | tokens vs full | price vs full | cached | prefix breaks / call "
                  "| embedding tokens | tokens + embedding vs full |",
                  "|---|---|---|---|---|---|---|---|"]
        for policy, t in totals.items():
            r = rel[policy]
            lines.append(f"| {policy_label(policy, options)} | {t.input:,} | {r['tokens']:.3f} | {r['price']:.3f} "
                         f"| {r['cached_fraction']:.3f} | {t.prefix_breaks / max(t.calls, 1):.3f} "
                         f"| {t.embedding:,} | {r['combined']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def report(replays: Sequence[RunReplay], options: PolicyOptions, cached_price: float) -> dict[str, Any]:
    """Everything as JSON-ready data: options, per-run totals and per-call costs, pooled totals and ratios."""
    pooled_out: dict[str, dict[str, Any]] = {}
    for group, totals in pooled(replays).items():
        rel = relative(totals, cached_price)
        pooled_out[group] = {policy: {**asdict(t), "price": t.price(cached_price), "relative": rel[policy]}
                             for policy, t in totals.items()}
    return {
        "options": asdict(options), "cached_price": cached_price, "pooled": pooled_out,
        "runs": [{"name": r.name, "format": r.format, "path": r.path,
                  "totals": {policy: asdict(t) for policy, t in r.totals().items()},
                  "calls": {policy: [[c.input, c.cached, c.embedding, int(c.prefix_broken)] for c in costs]
                            for policy, costs in r.calls.items()}} for r in replays],
    }


def plot(groups: dict[str, dict[str, Totals]], options: PolicyOptions, cached_price: float, path: Path) -> None:
    """Tokens vs price relative to the full history: one colour per policy, one marker per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    markers = dict(zip(sorted(groups, key=lambda g: g != ALL_RUNS), "o^sDvP*X"))
    colours = {}
    for group, totals in groups.items():
        for policy, r in relative(totals, cached_price).items():
            colour = colours.setdefault(policy, f"C{len(colours)}")
            ax.scatter(r["tokens"], r["price"], color=colour, marker=markers[group], s=70 if group == ALL_RUNS else 35,
                       label=policy_label(policy, options) if group == ALL_RUNS else None)
    for group, marker in markers.items():
        ax.scatter([], [], color="grey", marker=marker, label=group)
    ax.axhline(1, color="grey", lw=0.5)
    ax.axvline(1, color="grey", lw=0.5)
    ax.set_xlabel("input tokens vs full history")
    ax.set_ylabel(f"price vs full history (cached at {cached_price:g})")
    ax.set_title("Online replay: tokens and price per forwarding policy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``online`` sub-command on an argparse ``add_subparsers()`` object."""
    parser = subparsers.add_parser("online", help="replay recorded runs call by call: input tokens, prompt cache "
                                                  "and price under each forwarding policy")
    parser.add_argument("paths", nargs="+", help="run files, directories or globs (any format `gem compress` reads)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help=f"comma-separated, from {', '.join(POLICIES)} (full is always added); "
                             "default %(default)s")
    parser.add_argument("--price-cached", type=float, default=CACHED_PRICE,
                        help="price of a cached input token relative to an uncached one (default %(default)s)")
    parser.add_argument("--window", type=int, default=PolicyOptions.window, help="K of window (default %(default)s)")
    parser.add_argument("--mask-after", type=int, default=PolicyOptions.mask_after,
                        help="masking keeps the tool outputs of this many last blocks (default %(default)s)")
    parser.add_argument("--amortized-budget", type=int, default=PolicyOptions.amortized_budget,
                        help="amortized forgetting: rewrite once more than this many blocks are forwarded "
                             "(default %(default)s)")
    parser.add_argument("--amortized-keep", type=int, default=PolicyOptions.amortized_keep,
                        help="amortized forgetting: the newest blocks kept at a rewrite (default %(default)s)")
    parser.add_argument("--encoder", default=PolicyOptions.encoder,
                        help="GEM's encoder: minilm, hash, hash-<dim>, openai:<model>[:<dimensions>] "
                             "(default %(default)s)")
    parser.add_argument("--out", type=Path, help="write online.md, online.json and online.png here")
    parser.add_argument("--workers", type=int, default=1, help="processes (default %(default)s; MiniLM: keep 1)")
    return parser


def run(args: argparse.Namespace) -> int:
    """The ``online`` sub-command: replay, print the table, write the files; 2 on bad input or no run."""
    names = [BASELINE] + [p for p in dict.fromkeys(args.policies.split(",")) if p and p != BASELINE]
    try:
        check_policies(names)
        options = PolicyOptions(args.window, args.mask_after, args.encoder, args.amortized_budget,
                                args.amortized_keep)
        if args.price_cached < 0 or args.workers < 1:
            raise ValueError(f"--price-cached must be >= 0 and --workers >= 1, got {args.price_cached}, {args.workers}")
        o200k_encode()
        shared_encoder(args.encoder)  # a bad name or a missing extra fails here, not once per run
    except (ValueError, ImportError) as err:
        print(f"gem online: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    runs, load_errors = load_runs(args.paths)
    replays, errors = replay_runs(runs, names, options, workers=args.workers)
    for where, error in load_errors + errors:
        print(f"gem online: skipped {where}: {error}", file=sys.stderr)
    if not replays:
        print("gem online: no run could be replayed", file=sys.stderr)
        return 2
    groups = pooled(replays)
    counts = {group: sum(1 for r in replays if group in (ALL_RUNS, r.format)) for group in groups}
    table = markdown(groups, counts, options, args.price_cached)
    print(table)
    print(f"{len(replays)} runs in {time.perf_counter() - started:.1f} s, encoder {args.encoder}", file=sys.stderr)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "online.md").write_text(table)
        (args.out / "online.json").write_text(json.dumps(report(replays, options, args.price_cached), indent=1))
        try:
            plot(groups, options, args.price_cached, args.out / "online.png")
        except ImportError:
            print("gem online: no plot: matplotlib is not installed", file=sys.stderr)
    return 0
