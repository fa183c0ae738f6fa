"""``--ray [ADDRESS]`` of ``gem replay``, ``gem online`` and ``gem analyze``, and the `Runner` it selects: a Ray
cluster when given, else this machine's process pool (`gemkernels.evaluate.runner`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemkernels.cli.extras import missing_extra
from gemkernels.evaluate.runner import LocalPool, Runner

RAY_HELP = ("run on a Ray cluster: ADDRESS as ray.init takes it (auto, HOST:6379, ray://HOST:10001); without one, "
            "$RAY_ADDRESS, else a new local Ray instance. Each run is a task; encoding runs in batched actors, one "
            "per GPU where the cluster has GPUs. Default: this machine's processes (--workers)")


def add_ray_argument(parser: argparse.ArgumentParser) -> None:
    """Register ``--ray [ADDRESS]`` (``args.ray``: None without it, ``""`` without an address)."""
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help=RAY_HELP)


def open_runner(command: str, address: str | None, workers: int = 1) -> Runner | None:
    """A `LocalPool` of ``workers`` without ``--ray``, else a `RayPool` at ``address`` (it connects on ``with``);
    None after saying on stderr why not: ray not installed (named with its install), ``--workers`` with ``--ray``,
    a bad worker count, or an address that is a path (``--ray`` took one of the runs' paths)."""
    if address is None:
        if workers < 1:
            print(f"gem {command}: --workers must be >= 1, got {workers}", file=sys.stderr)
            return None
        return LocalPool(workers)
    problem = missing_extra(command, "ray")
    if problem is None and workers != 1:
        problem = f"gem {command}: --workers and --ray exclude each other (Ray spreads the runs over the cluster)"
    if problem is None and address and Path(address).exists():
        problem = (f"gem {command}: --ray took the path {address!r} as the cluster's address; put --ray after the "
                   "paths, or write --ray=ADDRESS")
    if problem is not None:
        print(problem, file=sys.stderr)
        return None
    from gemkernels.evaluate.ray_pool import RayPool

    return RayPool(address or None)
