"""What each preset removes at a first rewrite, over recorded runs (the presets' trade-off, measured).

    python -m bench.presets [PATHS ...] [--encoder hash] [--steps 4]

For each run, ``--steps`` checkpoints spread over those with >= 16 blocks are compressed by a
fresh `GEM` per preset (a first, global selection): characters and blocks kept, and how many
blocks evidence protected and the selection added.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from gemkernels import GEM, PRESETS
from gemkernels.compress.blocks import parse_history
from gemkernels.compress.encoders import make_encoder
from gemkernels.evaluate.loaders import checkpoints, load_runs

DEFAULT_RUNS = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RUNS)])
    parser.add_argument("--encoder", default="hash")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    runs, errors = load_runs(args.paths)
    for path, error in errors:
        print(f"skipped {path}: {error}")
    encoder = make_encoder(args.encoder)
    rows = {name: [] for name, config in PRESETS.items() if not config.budgeted}  # budgeted: no first rewrite
    for run in runs:
        eligible = [p for p in checkpoints(run.messages) if len(parse_history(run.messages[:p]).spans) >= 16]
        picks = eligible[:: max(1, len(eligible) // args.steps)][: args.steps]
        for position in picks:
            messages = run.messages[:position]
            for name in rows:
                stats = GEM(name, encoder=encoder, token_counter=None).compress(messages, goal=run.goal).stats
                protected = {b for picks_ in stats.protected.values() for b in picks_}
                rows[name].append((stats.chars_after / stats.chars_before, stats.forwarded_blocks / stats.blocks,
                                   len(protected), len(stats.core) - len(protected)))
    checkpoints_seen = len(rows["paper"])
    print(f"{len(runs)} runs, {checkpoints_seen} checkpoints, encoder {encoder.name}\n")
    print("| preset | delta | characters kept | blocks kept | protected blocks | added by selection |")
    print("|---|---|---|---|---|---|")
    for name, values in rows.items():
        chars, blocks, protected, added = (statistics.mean(column) for column in zip(*values))
        print(f"| {name} | {PRESETS[name].delta} | {chars:.3f} | {blocks:.3f} | {protected:.1f} | {added:.1f} |")


if __name__ == "__main__":
    main()
