"""``gem online PATH...``: replay recorded runs call by call and count forwarded, cached and priced tokens per
forwarding policy (`gemkernels.evaluate.online_replay`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gemkernels.cli.extras import encoder_extras, require
from gemkernels.cli.help_text import description
from gemkernels.cli.runners import add_ray_argument, open_runner
from gemkernels.compress.encoders import ENCODER_HELP
from gemkernels.compress.tokens import Prices
from gemkernels.evaluate.loaders import PATHS_HELP, SUBAGENTS, SUBAGENTS_HELP
from gemkernels.evaluate.online_policies import POLICIES, PolicyOptions
from gemkernels.evaluate.online_replay import BASELINE, DEFAULT_POLICIES, EVIDENCE_POLICIES, LONG_RUNS
from gemkernels.evaluate.prices import PRICES_AS_OF
from gemkernels.evaluate.privacy import SHOW_PATHS_HELP


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``online`` sub-command on an argparse ``add_subparsers()`` object."""
    parser = subparsers.add_parser("online", help="replay recorded runs call by call: input tokens, prompt cache "
                                                  "and price under each forwarding policy",
                                   description=description(__doc__))
    parser.add_argument("paths", nargs="+", help=PATHS_HELP)
    parser.add_argument("--subagents", choices=SUBAGENTS, default="include", help=SUBAGENTS_HELP)
    parser.add_argument("--show-paths", action="store_true", help=SHOW_PATHS_HELP)
    parser.add_argument("--prices", type=Path, metavar="FILE",
                        help="a JSON or TOML table {model: {input, cache_read, cache_write, output}} in USD per "
                             f"million tokens, over the built-in list prices (as of {PRICES_AS_OF}) that price the "
                             "billed usage per project and day")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help=f"comma-separated, from {', '.join(POLICIES)}, or gem-<preset>:field=value:... "
                             "(a preset with GEMConfig overrides, evidence.<field> for evidence limits; "
                             "full is always added); default %(default)s")
    parser.add_argument("--price-cached", type=float, default=Prices.cached,
                        help="price of a cached input token relative to a plain one (default %(default)s)")
    parser.add_argument("--price-uncached", type=float, default=Prices.uncached,
                        help="price of an uncached input token relative to a plain one: 1.25 where writing the "
                             "cache costs extra, as Anthropic's does (default %(default)s); GEM policies plan "
                             "with both prices")
    parser.add_argument("--window", type=int, default=PolicyOptions.window, help="K of window (default %(default)s)")
    parser.add_argument("--mask-after", type=int, default=PolicyOptions.mask_after,
                        help="masking keeps the tool outputs of this many last blocks (default %(default)s)")
    parser.add_argument("--amortized-budget", type=int, default=PolicyOptions.amortized_budget,
                        help="amortized forgetting: rewrite once more than this many blocks are forwarded "
                             "(default %(default)s)")
    parser.add_argument("--amortized-keep", type=int, default=PolicyOptions.amortized_keep,
                        help="amortized forgetting: the newest blocks kept at a rewrite (default %(default)s)")
    parser.add_argument("--encoder", default=PolicyOptions.encoder, help=f"GEM's encoder: {ENCODER_HELP}")
    parser.add_argument("--evidence-policies", default=",".join(EVIDENCE_POLICIES),
                        help="comma-separated policies whose rewrites get the next-action evidence metrics "
                             "(default %(default)s; empty: none)")
    parser.add_argument("--long-runs", default=",".join(map(str, LONG_RUNS)),
                        help="comma-separated call counts N: also pool the runs with at least N calls "
                             "(default %(default)s; empty: none)")
    parser.add_argument("--out", type=Path, help="write online.md and online.json (with the billed and each "
                                                 "policy's costs per project and day), online.png (tokens against "
                                                 "price per policy), online_by_length.png (per run, against its "
                                                 "calls) and billing.png (costs per project and day) here")
    parser.add_argument("--workers", type=int, default=1, help="processes (default %(default)s; MiniLM: keep 1)")
    add_ray_argument(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """The ``online`` sub-command: replay, print the table, write the files; 2 on bad input or no run."""
    if not require("online", "tokens", *encoder_extras(args.encoder)):
        return 2
    from gemkernels.compress.tokens import o200k_encode
    from gemkernels.evaluate.billing import bill_runs
    from gemkernels.evaluate.billing import plot as billing_plot
    from gemkernels.evaluate.billing import report as billing_report
    from gemkernels.evaluate.billing import summary as billing_summary
    from gemkernels.evaluate.loaders import load_runs
    from gemkernels.evaluate.online_replay import (
        check_policies,
        evidence_markdown,
        markdown,
        plot,
        plot_by_length,
        plot_evidence,
        pooled,
        pooled_evidence,
        replay_runs,
        report,
        shared_encoder,
    )
    from gemkernels.evaluate.prices import PRICES, load_prices
    from gemkernels.evaluate.privacy import private_errors, private_runs
    from gemkernels.evaluate.replay import report_reading, write_report
    from gemkernels.evaluate.runner import progress_bar

    names = [BASELINE] + [p for p in dict.fromkeys(args.policies.split(",")) if p and p != BASELINE]
    evidence = tuple(p for p in args.evidence_policies.split(",") if p)
    try:
        check_policies(names + list(evidence))
        long_runs = call_counts(args.long_runs)
        options = PolicyOptions(args.window, args.mask_after, args.encoder, args.amortized_budget,
                                args.amortized_keep, Prices(args.price_cached, args.price_uncached))
        o200k_encode()
        prices = load_prices(args.prices) if args.prices else PRICES
    except (ValueError, ImportError, OSError) as err:
        print(f"gem online: {err}", file=sys.stderr)
        return 2
    runner = open_runner("online", args.ray, args.workers)
    if runner is None:
        return 2
    with runner:
        try:
            shared_encoder(args.encoder, make=runner.encoder)  # a bad name or a missing extra fails here, not per run
        except (ValueError, ImportError) as err:
            print(f"gem online: {err}", file=sys.stderr)
            return 2
        started = time.perf_counter()
        runs, load_errors = load_runs(args.paths, args.subagents,
                                      progress=lambda files: progress_bar(files, len(files), True, "reading files"))
        runs = private_runs(runs, args.show_paths)
        replays, errors = replay_runs(runs, names, options, runner, evidence=evidence)
    report_reading("online", runs, private_errors(load_errors, args.show_paths, args.paths) + errors)
    if not replays:
        print("gem online: no run could be replayed", file=sys.stderr)
        return 2
    groups = pooled(replays, long_runs)
    counts = {group: sum(1 for r in replays if group in r.groups(long_runs)) for group in groups}
    table = markdown(groups, counts, options)
    if any(replay.evidence for replay in replays):
        table += "\n" + evidence_markdown(pooled_evidence(replays, long_runs), options)
    print(f"{len(replays)} runs in {time.perf_counter() - started:.1f} s, encoder {args.encoder}", file=sys.stderr)
    replayed = {(r.path, r.name): r for r in replays}
    bills, left_out = bill_runs([(run, replayed[run.path, run.name]) for run in runs
                                 if (run.path, run.name) in replayed], prices)
    as_of = PRICES_AS_OF + (f", with {args.prices.name}" if args.prices else "")
    if not args.out:
        print(billing_report(bills, left_out, names, as_of, terminal=True))
        print(table)
        return 0

    def plots(summary: dict[str, Any], out: Path) -> list[Path]:
        try:
            return [plot(groups, options, out / "online.png"),
                    plot_by_length(replays, options, out / "online_by_length.png"),
                    *([plot_evidence(replays, options, out / "evidence.png")]
                      if any(replay.evidence for replay in replays) else []),
                    *([billing_plot(bills, names, out / "billing.png")] if bills["total"] else [])]
        except ImportError:
            print("gem online: no plot: matplotlib is not installed", file=sys.stderr)
            return []

    summary = {**report(replays, options, long_runs), "billing": billing_summary(bills, left_out, as_of)}
    write_report(args.out, "online", summary, billing_report(bills, left_out, names, as_of) + "\n" + table, plots)
    return 0


def call_counts(text: str) -> tuple[int, ...]:
    """``"40,60"`` -> (40, 60): positive call counts, ascending, without repeats; ``ValueError`` otherwise."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--long-runs must be comma-separated call counts, got {text!r}") from None
    if counts and counts[0] < 1:
        raise ValueError(f"--long-runs call counts must be positive, got {text!r}")
    return tuple(counts)

