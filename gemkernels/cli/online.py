"""``gem online PATH...``: replay recorded runs call by call and count forwarded, cached and priced tokens per
forwarding policy (`gemkernels.evaluate.online_replay`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gemkernels.cli.extras import encoder_extras, require
from gemkernels.compress.encoders import ENCODER_HELP
from gemkernels.compress.tokens import Prices
from gemkernels.evaluate.loaders import PATHS_HELP, SUBAGENTS, SUBAGENTS_HELP
from gemkernels.evaluate.online_policies import POLICIES, PolicyOptions
from gemkernels.evaluate.online_replay import BASELINE, DEFAULT_POLICIES, EVIDENCE_POLICIES, LONG_RUNS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``online`` sub-command on an argparse ``add_subparsers()`` object."""
    parser = subparsers.add_parser("online", help="replay recorded runs call by call: input tokens, prompt cache "
                                                  "and price under each forwarding policy")
    parser.add_argument("paths", nargs="+", help=PATHS_HELP)
    parser.add_argument("--subagents", choices=SUBAGENTS, default="include", help=SUBAGENTS_HELP)
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
    parser.add_argument("--out", type=Path, help="write online.md, online.json, online.png (tokens against price "
                                                 "per policy) and online_by_length.png (per run, against its calls) "
                                                 "here")
    parser.add_argument("--workers", type=int, default=1, help="processes (default %(default)s; MiniLM: keep 1)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """The ``online`` sub-command: replay, print the table, write the files; 2 on bad input or no run."""
    if not require("online", "tokens", *encoder_extras(args.encoder)):
        return 2
    from gemkernels.compress.tokens import o200k_encode
    from gemkernels.evaluate.loaders import load_runs
    from gemkernels.evaluate.online_replay import (
        check_policies,
        evidence_markdown,
        markdown,
        plot,
        plot_by_length,
        pooled,
        pooled_evidence,
        replay_runs,
        report,
        shared_encoder,
    )
    from gemkernels.evaluate.replay import report_reading, write_report

    names = [BASELINE] + [p for p in dict.fromkeys(args.policies.split(",")) if p and p != BASELINE]
    evidence = tuple(p for p in args.evidence_policies.split(",") if p)
    try:
        check_policies(names + list(evidence))
        long_runs = call_counts(args.long_runs)
        options = PolicyOptions(args.window, args.mask_after, args.encoder, args.amortized_budget,
                                args.amortized_keep, Prices(args.price_cached, args.price_uncached))
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        o200k_encode()
        shared_encoder(args.encoder)  # a bad name or a missing extra fails here, not once per run
    except (ValueError, ImportError) as err:
        print(f"gem online: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    runs, load_errors = load_runs(args.paths, args.subagents)
    replays, errors = replay_runs(runs, names, options, workers=args.workers, evidence=evidence)
    report_reading("online", runs, load_errors + errors)
    if not replays:
        print("gem online: no run could be replayed", file=sys.stderr)
        return 2
    groups = pooled(replays, long_runs)
    counts = {group: sum(1 for r in replays if group in r.groups(long_runs)) for group in groups}
    table = markdown(groups, counts, options)
    if any(replay.evidence for replay in replays):
        table += "\n" + evidence_markdown(pooled_evidence(replays, long_runs), options)
    print(f"{len(replays)} runs in {time.perf_counter() - started:.1f} s, encoder {args.encoder}", file=sys.stderr)
    if not args.out:
        print(table)
        return 0

    def plots(summary: dict[str, Any], out: Path) -> list[Path]:
        try:
            return [plot(groups, options, out / "online.png"),
                    plot_by_length(replays, options, out / "online_by_length.png")]
        except ImportError:
            print("gem online: no plot: matplotlib is not installed", file=sys.stderr)
            return []

    write_report(args.out, "online", report(replays, options, long_runs), table, plots)
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

