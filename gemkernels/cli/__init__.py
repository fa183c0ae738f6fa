"""``gem``: the command line (also ``python -m gemkernels``), one module per subcommand.

``gem compress``: GEM on one request or recorded run (`gemkernels.cli.compress`).
``gem serve``: the compressing OpenAI/Anthropic-compatible proxy (`gemkernels.cli.serve`).
``gem replay``: checkpoint replay with retention metrics and K / tau sweeps (`gemkernels.cli.replay`).
``gem online``: call-by-call tokens, prompt cache and price per forwarding policy (`gemkernels.cli.online`).
``gem analyze``: geometry against evidence, the paper's section 4 (`gemkernels.cli.analyze`).
``gem train-router``: fit the learned keep/ready router on recorded runs (`gemkernels.cli.train_router`).
``gem bench``: the selection throughput sweep (`gemkernels.cli.bench`).

Each module registers its arguments with ``set_defaults(func=run)`` and imports its heavy stack inside
``run``, so ``gem --help`` and every ``gem X --help`` work on a core install (numpy alone).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from gemkernels.cli.help_text import description

SUBCOMMANDS = ("compress", "serve", "replay", "online", "analyze", "train-router", "bench")


def build_parser() -> argparse.ArgumentParser:
    """The ``gem`` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="gem", description=description(__doc__))
    commands = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name.replace('-', '_')}").add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; its exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
