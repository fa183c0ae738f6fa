"""``gem analyze PATH...``: geometry against evidence on recorded runs (paper section 4): spectral concentration
against matched controls, the next action's low-energy share, controlled replacement
(`gemkernels.evaluate.analysis`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gemkernels.cli.extras import encoder_extras, require
from gemkernels.cli.help_text import description
from gemkernels.cli.runners import add_ray_argument, open_runner
from gemkernels.compress.encoders import ENCODER_HELP
from gemkernels.compress.encoders.cache import DEFAULT_CACHE_DIR
from gemkernels.evaluate.loaders import PATHS_HELP, SUBAGENTS, SUBAGENTS_HELP
from gemkernels.evaluate.privacy import SHOW_PATHS_HELP, private_paths


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``analyze`` (handler in ``func``)."""
    p = subparsers.add_parser("analyze", help="spectral concentration with controls, low-energy action share, "
                                              "controlled replacement", description=description(__doc__))
    p.add_argument("paths", nargs="+", help=PATHS_HELP)
    p.add_argument("--subagents", choices=SUBAGENTS, default="include", help=SUBAGENTS_HELP)
    p.add_argument("--show-paths", action="store_true", help=SHOW_PATHS_HELP)
    p.add_argument("--encoder", default="minilm", help=ENCODER_HELP)
    p.add_argument("--out", default="analysis-out", help="folder for analysis.md, analysis.json and the plots")
    p.add_argument("--seed", type=int, default=0, help="seed of the control matrices")
    p.add_argument("--min-blocks", type=int, default=16, help="runs need more blocks, checkpoints at least this many")
    p.add_argument("--bands", type=int, default=5, help="rank bands of Figure 3 (default %(default)s)")
    p.add_argument("--tau", type=float, default=0.90, help="coverage target of the greedy counts")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="embedding cache (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_ray_argument(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Load, encode (cached), analyse, and write ``analysis.json``, ``analysis.md`` and the figures."""
    if not require("analyze", "replay", *encoder_extras(args.encoder)):
        return 2
    runner = open_runner("analyze", args.ray)
    if runner is None:
        return 2
    from gemkernels.evaluate.analysis import Tolerance
    from gemkernels.evaluate.analysis_report import analyse, markdown, plot
    from gemkernels.evaluate.replay import load_long_runs, prepare, write_report

    runs = load_long_runs(args.paths, args.min_blocks, "analyze", args.subagents, args.show_paths)
    if not runs:
        return 2
    with runner:
        cache = runner.embedding_cache(args.encoder, args.cache_dir)
        jobs = prepare(runs, cache, args.min_blocks, progress=not args.quiet)
        analysed = analyse(jobs, args.seed, args.bands, args.tau, Tolerance(), not args.quiet, runner)
    summary = {"encoder": cache.name,
               "options": {**{k: v for k, v in vars(args).items() if k not in ("func", "quiet", "ray")},
                           "paths": private_paths(args.paths, args.show_paths)}, **analysed}
    write_report(Path(args.out), "analysis", summary, markdown(summary), plot)
    return 0

