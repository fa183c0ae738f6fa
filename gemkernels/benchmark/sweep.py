"""``gem bench`` and ``python -m bench``: selection throughput over a grid, against the machine's ceilings.

The grid crosses S (sessions), n (blocks per session), d, dtype, mode and backend; by default the issue's
full grid (S = 8192 only on a GPU), ``--quick`` a small one, and ``-n/-d/-S/--dtype/--mode/--backend``
replace any axis. Points run smallest X first. Each point times every backend on the same inputs
(`gemkernels.benchmark.point`); ceilings (copy bandwidth, matrix-product rate) are measured once at the start.

Output in ``--out``: ``results.jsonl`` (one record per backend and point, appended as the sweep goes, plus
``note`` records for what was left out and why), then ``results.md`` and PNG plots rebuilt from the whole
file (``--report-only`` rebuilds them alone). Exit status 1 when a backend failed at some point.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gemkernels.benchmark.machine import environment, measure_ceilings
from gemkernels.benchmark.point import (
    CONTENDERS,
    DTYPES,
    MODES,
    NUMPY_CONTENDERS,
    VARIANTS,
    Point,
    Settings,
    measure_point,
    split_contender,
)
from gemkernels.benchmark.report import write_report
from gemkernels.benchmark.timing import cpu_call, cuda_call, fmt_seconds
from gemkernels.select.backends import unavailable_reason

AXES = ("mode", "dtype", "sessions", "n", "d", "backend")
FULL_GRID: dict[str, tuple] = {"mode": tuple(MODES), "dtype": tuple(DTYPES), "sessions": (1, 64, 1024),
                               "n": (16, 64, 256, 1024, 4096), "d": (384, 1024, 4096), "backend": CONTENDERS}
GPU_ONLY_SESSIONS = (8192,)
QUICK_GRID: dict[str, dict[str, tuple]] = {
    "cuda": {"mode": ("fixed",), "dtype": ("bf16",), "sessions": (64, 1024), "n": (64, 256, 1024),
             "d": (384, 1024), "backend": tuple(c for c in CONTENDERS if c not in NUMPY_CONTENDERS)},
    "cpu": {"mode": ("fixed",), "dtype": ("fp32",), "sessions": (1, 64), "n": (16, 64, 256), "d": (384,),
            "backend": ("numpy", "numba", "torch")},
}
DEFAULTS = {"cuda": {"repeats": 50}, "cpu": {"repeats": 20}}


def add_arguments(parser: argparse.ArgumentParser, default_out: Path = Path("gem-bench")) -> argparse.ArgumentParser:
    """The benchmark's options, shared by ``gem bench`` and ``python -m bench``."""
    grid = parser.add_argument_group("grid (each option replaces that axis of the full or --quick grid)")
    grid.add_argument("--quick", action="store_true", help="a small grid for this device")
    grid.add_argument("-n", type=int, nargs="+", metavar="N", help="blocks per session")
    grid.add_argument("-d", type=int, nargs="+", metavar="D", help="embedding dimensions")
    grid.add_argument("-S", "--sessions", type=int, nargs="+", metavar="S", help="sessions per batch")
    grid.add_argument("--dtype", nargs="+", choices=list(DTYPES))
    grid.add_argument("--mode", nargs="+", choices=list(MODES),
                      help="fixed: tau=1.0, k=b (exactly b steps); tau: tau=0.9, k=b")
    grid.add_argument("--backend", nargs="+", choices=CONTENDERS + VARIANTS,
                      help="contenders; the -global variants (run only when named) keep the triton greedy's state in "
                           "global memory where the default keeps it in registers")
    grid.add_argument("-b", type=int, default=16, help="steps (k) per session (default %(default)s)")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when torch sees a GPU")
    timing.add_argument("--repeats", type=int, help="most timed runs per point (default 50 on a GPU, 20 on CPU)")
    timing.add_argument("--warmup", type=int, default=2, help="untimed calls per backend first (>= 2)")
    timing.add_argument("--point-seconds", type=float, default=1.0,
                        help="aim for this many seconds of timed runs per point (at least 5 runs)")
    timing.add_argument("--copies", type=int,
                        help="input copies rotated between runs (default: enough to exceed 4x L2 on a GPU, 1 on CPU)")
    timing.add_argument("--time-budget", type=float,
                        help="start no new point after this many seconds; the rest is noted, then reported")
    timing.add_argument("--seed", type=int, default=0)
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=default_out, help="results folder (default %(default)s)")
    out.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    out.add_argument("--report-only", action="store_true",
                     help="only rebuild results.md and the plots from --out/results.jsonl")
    return parser


def main(argv: Sequence[str] | None = None, default_out: Path = Path("gem-bench")) -> int:
    """``python -m bench``: parse ``argv`` (results in ``default_out`` unless ``--out``) and `run`."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    return run(add_arguments(parser, default_out).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Sweep (unless ``--report-only``), then write the report; 0, or 1 if a backend failed in this sweep."""
    out: Path = args.out
    records: list[dict[str, Any]] = []
    if not args.report_only:
        device = resolve_device(args.device)
        try:
            settings = Settings(device=device, repeats=args.repeats or DEFAULTS[device]["repeats"],
                                warmup=args.warmup, point_seconds=args.point_seconds, copies=args.copies,
                                seed=args.seed)
        except ValueError as err:
            raise SystemExit(f"gem bench: {err}") from None
        axes = grid_axes(args, device)
        records = sweep(grid_points(axes, args.b), list(axes["backend"]), settings, out, args.time_budget)
    written = write_report(out, plots=not args.no_plots)
    say("wrote " + ", ".join(str(p) for p in written))
    return int(any(r["status"] == "error" for r in records))


def resolve_device(name: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; "cuda" without one is an error."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if name == "cuda" and not has_cuda:
        raise SystemExit("--device cuda: torch sees no CUDA device")
    return name if name != "auto" else ("cuda" if has_cuda else "cpu")


def grid_axes(args: argparse.Namespace, device: str) -> dict[str, tuple]:
    """The full grid (or ``--quick``'s) for ``device``, with every axis given on the command line replaced."""
    axes = dict(QUICK_GRID[device]) if args.quick else dict(FULL_GRID)
    if device == "cuda" and not args.quick:
        axes["sessions"] += GPU_ONLY_SESSIONS
    for axis in AXES:
        given = getattr(args, axis)
        if given:
            axes[axis] = tuple(dict.fromkeys(given))
    return axes


def grid_points(axes: dict[str, tuple], b: int) -> list[Point]:
    """Every point of the grid, smallest X first (so a time budget cuts off the largest)."""
    points = [Point(mode, dtype, s, n, d, b) for mode, dtype, s, n, d in
              itertools.product(axes["mode"], axes["dtype"], axes["sessions"], axes["n"], axes["d"])]
    return sorted(points, key=lambda p: (p.x_bytes, p.sessions, p.n, p.d, p.dtype, p.mode))


def left_out(contenders: Iterable[str], device: str) -> dict[str, str]:
    """Contenders that cannot run in this sweep at all, and why."""
    why = {}
    for c in contenders:
        backend, _ = split_contender(c)
        reason = unavailable_reason(backend)
        if reason is None and backend == "triton":
            interpreted = os.environ.get("TRITON_INTERPRET") == "1"
            if device == "cuda" and interpreted:
                reason = "TRITON_INTERPRET=1 is set: the interpreter would be timed, not the GPU"
            elif device == "cpu" and not interpreted:
                reason = "--device cpu: the triton backend would run on the GPU; use --device cuda"
        if reason is not None:
            why[c] = reason
    return why


def sweep(points: list[Point], contenders: list[str], settings: Settings, out: Path,
          time_budget: float | None = None) -> list[dict[str, Any]]:
    """Measure every point, appending records to ``out/results.jsonl``; returns this sweep's records. With
    ``time_budget`` (seconds from this call, the ceilings' measurement included), a point starts only when the
    one before it would still fit; the points left are noted."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    env = environment(settings.device)
    say(f"gemkernels bench: {len(points)} points x {len(contenders)} backends on {settings.device} "
        f"({env['gpu'] or env['cpu']}), commit {env['git_commit'] or 'unknown'}; results in {out}")
    excluded = left_out(contenders, settings.device)
    contenders = [c for c in contenders if c not in excluded]
    notes = [f"{c} left out: {why}" for c, why in excluded.items()]
    if "bf16" in {p.dtype for p in points}:
        notes += [f"{c} left out at bf16 points: numpy has no bfloat16" for c in contenders if c in NUMPY_CONTENDERS]
    dtypes = sorted({p.dtype for p in points})
    ceilings = measure_ceilings(settings.device, {name: DTYPES[name] for name in dtypes})
    say(f"ceilings: copy {ceilings.copy_bytes_per_s / 1e9:.1f} GB/s (read + write), matmul " +
        ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in ceilings.matmul_flop_per_s.items()))
    timer = cuda_call if settings.device == "cuda" else cpu_call
    extra = {"ceilings": ceilings.to_dict(), "env": env}
    records: list[dict[str, Any]] = []
    last_point = 0.0  # seconds the previous point took
    with (out / "results.jsonl").open("a") as sink:
        def emit(rec: dict[str, Any]) -> None:
            rec |= extra
            records.append(rec)
            sink.write(json.dumps(rec) + "\n")
            sink.flush()

        for i, point in enumerate(progress(points)):
            if time_budget is not None and time.perf_counter() - start + last_point > time_budget:
                notes.append(f"time budget of {time_budget:g} s spent: {len(points) - i} of {len(points)} points "
                             f"not run (from {point})")
                break
            names = [c for c in contenders if not (c in NUMPY_CONTENDERS and point.dtype == "bf16")]
            if not names:
                continue
            point_started = time.perf_counter()
            point_records = measure_point(point, names, settings, ceilings, timer)
            last_point = time.perf_counter() - point_started
            for rec in point_records:
                emit(rec)
            say(point_line(point, point_records))
            release(settings.device)
        for note in notes:
            say(f"note: {note}")
            emit({"kind": "note", "status": "note", "note": note})
    return records


def point_line(point: Point, records: list[dict[str, Any]]) -> str:
    """One progress line: each backend's median and speed-up over torch, or its status."""
    parts = []
    for rec in records:
        name = rec["config"]["backend"]
        if rec["status"] != "ok":
            parts.append(f"{name} {rec['status']}: {rec['note']}")
            continue
        speedup = rec["metrics"]["speedup_vs_torch"]
        parts.append(f"{name} {fmt_seconds(rec['timing']['median_s'])}" +
                     (f" ({speedup:.2f}x torch)" if speedup is not None and name != "torch" else ""))
    return f"{point}: " + "; ".join(parts)


def release(device: str) -> None:
    """Hand cached GPU memory back between points, so the next point's free-memory estimate is true."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def progress(items: list[Point]) -> Iterable[Point]:
    """A tqdm bar over the points, or the bare list (with a note) when tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        say("note: tqdm is not installed (pip install 'gemkernels[bench]'): no progress bar")
        return items
    return tqdm(items, desc="points", unit="pt", file=sys.stderr)


def say(text: str) -> None:
    """Print a line without tearing a tqdm bar."""
    try:
        from tqdm import tqdm
    except ImportError:
        print(text, flush=True)
        return
    tqdm.write(text)

