"""``gem train-router RUNS...``: fit the keep/ready router on recorded runs (`gemkernels.evaluate.router_training`)
and write it as a small JSON file that ``--set ranking=router --set router=FILE`` (or ``GEMConfig(router=...)``)
loads; ``--cross-family`` also measures, for each agent family, a router trained on the others against recency."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemkernels.cli.extras import encoder_extras, require
from gemkernels.cli.help_text import description
from gemkernels.compress.encoders import ENCODER_HELP
from gemkernels.compress.encoders.cache import DEFAULT_CACHE_DIR
from gemkernels.evaluate.loaders import PATHS_HELP, SUBAGENTS, SUBAGENTS_HELP


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``train-router`` (handler in ``func``)."""
    p = subparsers.add_parser("train-router", help="fit the learned keep/ready router on recorded runs",
                              description=description(__doc__))
    p.add_argument("paths", nargs="+", help=PATHS_HELP)
    p.add_argument("--subagents", choices=SUBAGENTS, default="include", help=SUBAGENTS_HELP)
    p.add_argument("--encoder", default="minilm", help=ENCODER_HELP + " (use the encoder GEM will run with)")
    p.add_argument("--out", default="router.json", help="the router file to write (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-run checkpoint draw (default 0)")
    p.add_argument("--max-per-run", type=int,
                   help="at most this many checkpoints drawn per run, so long runs weigh less (default: all)")
    p.add_argument("--l2", type=float, default=1e-3, help="L2 penalty of the logistic heads (default 1e-3)")
    p.add_argument("--min-blocks", type=int, default=16, help="checkpoints need this many blocks (default 16)")
    p.add_argument("--cross-family", metavar="DIR",
                   help="also write router_families.md / .json here: each family scored by a router trained on "
                        "the other families, against recency")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="embedding cache (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Load and encode the runs (cached), fit, write the router; optionally the cross-family report."""
    if not require("train-router", "replay", *encoder_extras(args.encoder)):
        return 2
    from gemkernels.compress.encoders import make_encoder
    from gemkernels.compress.encoders.cache import EmbeddingCache
    from gemkernels.evaluate.replay import load_long_runs, prepare, write_report
    from gemkernels.evaluate.router_training import cross_family, markdown, run_samples, train

    runs = load_long_runs(args.paths, args.min_blocks, "train-router", args.subagents, show_paths=False)
    if not runs:
        return 2
    cache = EmbeddingCache(make_encoder(args.encoder), args.cache_dir)
    jobs = prepare(runs, cache, args.min_blocks, progress=not args.quiet)
    samples = [s for job in jobs for s in run_samples(job)]
    router = train(samples, args.seed, args.max_per_run, args.l2, {"encoder": cache.name})
    router.save(args.out)
    print(f"gem train-router: {router.meta['checkpoints']} checkpoints of {len(jobs)} runs "
          f"({router.meta['rows']} block rows); wrote {args.out}", file=sys.stderr)
    if args.cross_family:
        if len({s.family for s in samples}) < 2:
            print("gem train-router: --cross-family needs runs of at least two agent families", file=sys.stderr)
            return 2
        report = cross_family(samples, seed=args.seed, max_per_run=args.max_per_run, l2=args.l2)
        write_report(Path(args.cross_family), "router_families", report, markdown(report), lambda summary, out: [])
    return 0
