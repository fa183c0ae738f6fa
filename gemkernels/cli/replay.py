"""``gem replay PATH...``: offline checkpoint replay of recorded runs: what each selector keeps of the next
action's evidence at the same K, and K / tau sweeps (`gemkernels.evaluate.replay`)."""

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
from gemkernels.evaluate.replay import DEFAULT_KS, DEFAULT_TAUS
from gemkernels.evaluate.selectors import SELECTORS


def int_list(text: str) -> tuple[int, ...]:
    """``8-20`` or ``8,12,16`` as integers."""
    low, dash, high = text.partition("-")
    return tuple(range(int(low), int(high) + 1)) if dash else tuple(int(v) for v in text.split(","))


def float_list(text: str) -> tuple[float, ...]:
    """``0.85,0.9`` as floats."""
    return tuple(float(v) for v in text.split(","))


def name_list(text: str) -> tuple[str, ...]:
    """Comma-separated selector names, each one of `SELECTORS`."""
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in names if v not in SELECTORS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown selectors {unknown}; choose from {', '.join(SELECTORS)}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``replay`` (handler in ``func``)."""
    p = subparsers.add_parser("replay", help="offline checkpoint replay: selectors at the same K, K and tau sweeps",
                              description=description(__doc__),
                              epilog="Per-call tokens, prompt cache and price of whole runs under each forwarding "
                                     "policy (GEM presets, amortized forgetting, window, masking): gem online.")
    p.add_argument("paths", nargs="+", help=PATHS_HELP)
    p.add_argument("--subagents", choices=SUBAGENTS, default="include", help=SUBAGENTS_HELP)
    p.add_argument("--show-paths", action="store_true", help=SHOW_PATHS_HELP)
    p.add_argument("--encoder", default="minilm", help=ENCODER_HELP)
    p.add_argument("--k", type=int, default=16, help="retained count of the selector table (default %(default)s)")
    p.add_argument("--sweep", nargs="*", choices=("k", "tau"), default=[], help="also sweep exact K and/or tau")
    p.add_argument("--ks", type=int_list, default=DEFAULT_KS, help="K values of the sweep (default 8-20)")
    p.add_argument("--taus", type=float_list, default=DEFAULT_TAUS, help="tau values (default 0.85,...,0.95)")
    p.add_argument("--selectors", type=name_list, default=tuple(SELECTORS), help="comma-separated (default: all)")
    p.add_argument("--min-blocks", type=int, default=16, help="checkpoints need this many blocks (default 16)")
    p.add_argument("--out", default="replay-out", help="folder for replay.md, replay.json and the plots")
    p.add_argument("--workers", type=int, default=1, help="processes replaying runs (encoding stays in one)")
    add_ray_argument(p)
    p.add_argument("--max-runs", type=int, help="replay only the first N runs that have checkpoints")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="embedding cache (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random selectors")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Load, encode (cached), replay, and write ``replay.json``, ``replay.md`` and the sweep plots to ``--out``."""
    if not require("replay", "replay", *encoder_extras(args.encoder)):
        return 2
    runner = open_runner("replay", args.ray, args.workers)
    if runner is None:
        return 2
    from gemkernels.evaluate.replay import (
        Plan,
        load_long_runs,
        markdown,
        plot,
        prepare,
        replay,
        summary_json,
        write_report,
    )

    runs = load_long_runs(args.paths, args.min_blocks, "replay", args.subagents, args.show_paths)[:args.max_runs]
    if not runs:
        return 2
    sweep_ks = tuple(args.ks) if "k" in args.sweep else ()
    plan = Plan(tuple(args.selectors), tuple(sorted({args.k, *sweep_ks})),
                tuple(args.taus) if "tau" in args.sweep else (), args.k, args.seed)
    with runner:
        cache = runner.embedding_cache(args.encoder, args.cache_dir)
        jobs = prepare(runs, cache, args.min_blocks, progress=not args.quiet)
        results = replay(jobs, plan, runner, progress=not args.quiet)
    options = {key: list(value) if isinstance(value, tuple) else value
               for key, value in vars(args).items() if key not in ("func", "quiet", "ray")}
    options["paths"] = private_paths(args.paths, args.show_paths)
    summary = summary_json(results, plan, sweep_ks, options, cache.name, {job.name: job.format for job in jobs})
    write_report(Path(args.out), "replay", summary, markdown(summary), plot)
    return 0

