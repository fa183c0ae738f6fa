"""How often the budgeted presets' appending calls run a selection only to learn that no rewrite repays, with the
bound `could_repay` checks first and without it (a selection on every appending call), over recorded runs.

    python -m bench.repay_bound [PATHS ...] [--presets cache-aware cache-aware-geometry] [--encoder hash]
                                [--max-calls 80]

Each run's checkpoints (its first ``--max-calls``) are compressed in one session per preset and mode, with the
default token counter. Per agent family (the folder under the given path): calls, selections with the bound and
without it, rewrites, whether every forwarded history is the same both ways (the bound must only skip work), and
`GEM.compress`'s mean CPU time per call both ways (process time, the two modes one after the other per run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from bench.presets import DEFAULT_RUNS
from gemkernels.compress import gem as gem_module
from gemkernels.compress.encoders import make_encoder
from gemkernels.evaluate.loaders import Run, checkpoints, load_runs


def family(run: Run, roots: list[Path]) -> str:
    """The folder under the root that holds the run's file (its agent family), else the file's folder."""
    path = Path(run.path).resolve()
    for root in roots:
        if root in path.parents:
            return path.relative_to(root).parts[0]
    return path.parent.name


def replay(run: Run, preset: str, encoder_name: str, max_calls: int, bounded: bool
           ) -> tuple[list[list], list[float], int, int]:
    """One session of ``run``'s checkpoints: (forwarded histories, CPU seconds a call, selections, rewrites)."""
    selections = []
    real = gem_module.GEM._rewrite

    def counted(self, *args):
        selections.append(1)
        return real(self, *args)

    outs, seconds, rewrites = [], [], 0
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(gem_module.GEM, "_rewrite", counted))
        if not bounded:
            patches.enter_context(mock.patch.object(gem_module, "could_repay", lambda *args: True))
        gem = gem_module.GEM(preset, encoder=make_encoder(encoder_name))
        for cut in checkpoints(run.messages)[:max_calls]:
            started = time.process_time()
            result = gem.compress(run.messages[:cut], session_id="s", goal=run.goal)
            seconds.append(time.process_time() - started)
            outs.append(result.messages)
            rewrites += result.stats.action == "reselected"
    return outs, seconds, len(selections), rewrites


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RUNS)])
    parser.add_argument("--presets", nargs="+", default=["cache-aware", "cache-aware-geometry"])
    parser.add_argument("--encoder", default="hash")
    parser.add_argument("--max-calls", type=int, default=80, help="checkpoints replayed per run")
    args = parser.parse_args(argv)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    roots = [Path(p).resolve() for p in args.paths]
    runs, errors = load_runs(args.paths)
    for path, error in errors:
        print(f"skipped {path}: {error}")
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(list))
    work = [(preset, run) for preset in args.presets for run in runs]
    for preset, run in (tqdm(work, desc="runs", leave=False) if tqdm is not None else work):
        row = rows[(preset, family(run, roots))]
        bounded = replay(run, preset, args.encoder, args.max_calls, bounded=True)
        every = replay(run, preset, args.encoder, args.max_calls, bounded=False)
        row["runs"].append(1)
        row["calls"].append(len(bounded[0]))
        row["same"].append(bounded[0] == every[0])
        row["selections"].append(bounded[2])
        row["selections_every"].append(every[2])
        row["rewrites"].append(bounded[3])
        row["ms"].extend(1e3 * s for s in bounded[1])
        row["ms_every"].extend(1e3 * s for s in every[1])
    print(f"{len(runs)} runs from {', '.join(args.paths)}; encoder {args.encoder}; first {args.max_calls} calls each\n")
    print("| preset | family | runs | calls | rewrites | selections, bound / every call | same forwarded | "
          "CPU ms a call, bound / every call |")
    print("|---|---|---|---|---|---|---|---|")
    for (preset, name), row in sorted(rows.items()):
        if not sum(row["calls"]):
            continue
        print(f"| {preset} | {name} | {len(row['runs'])} | {sum(row['calls'])} | {sum(row['rewrites'])} | "
              f"{sum(row['selections'])} / {sum(row['selections_every'])} | {all(row['same'])} | "
              f"{statistics.fmean(row['ms']):.2f} / {statistics.fmean(row['ms_every']):.2f} |")


if __name__ == "__main__":
    main()
