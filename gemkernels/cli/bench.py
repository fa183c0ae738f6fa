"""``gem bench``: the selection throughput sweep against the machine's ceilings (`gemkernels.benchmark.sweep`)."""

from __future__ import annotations

import argparse
from typing import Any

from gemkernels.cli.extras import require
from gemkernels.cli.help_text import description


def add_parser(subparsers: Any) -> None:
    """Register ``gem bench``."""
    from gemkernels.benchmark import sweep

    parser = subparsers.add_parser("bench", help="selection throughput sweep against the machine's ceilings",
                                   description=description(sweep.__doc__))
    sweep.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The sweep and its report; 0, or 1 if a backend failed; 2 without the bench extra."""
    if not require("bench", "bench"):
        return 2
    from gemkernels.benchmark.sweep import run as sweep

    return sweep(args)
