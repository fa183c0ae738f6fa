"""What GEM computes once per new block, stage by stage, on recorded runs: the CPU a proxy spends on each block it
has not seen (`GEM._block_infos`), the part of a request's cost that grows with its new blocks.

    python -m bench.block_costs [PATHS ...] [--runs 20] [--repeats 3]

Every block of the first ``--runs`` runs (default ``../shared/data/trajectories``, else the bundled example) goes
through each stage in turn, ``--repeats`` times; the table gives the median process time per block of each stage,
and of the pieces of the lexicon (`gemkernels.compress.references`), the largest stage.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.presets import DEFAULT_RUNS
from gemkernels.compress.blocks import Block, History, parse_history
from gemkernels.compress.encoders import make_encoder
from gemkernels.compress.evidence import block_features
from gemkernels.compress.gem import default_token_counter
from gemkernels.compress.references import action_references, block_lexicon, held_tokens, split_paths
from gemkernels.compress.representation import block_text
from gemkernels.compress.tokens import serialise
from gemkernels.evaluate.loaders import load_run, load_runs

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django-11276.json"


def stages(blocks: list[tuple[History, Block]], texts: list[str]) -> dict[str, Callable[[], object]]:
    """Each stage over every block: name -> a call that runs it."""
    count, encoder = default_token_counter(), make_encoder("hash", cached=False)
    timed = {
        "representation text": lambda: [block_text(block) for _, block in blocks],
        "lexicon": lambda: [block_lexicon(block, text) for (_, block), text in zip(blocks, texts)],
        "  held tokens": lambda: [held_tokens(text) for text in texts],
        "    path scan": lambda: [split_paths(text) for text in texts],
        "  action references": lambda: [action_references(block) for _, block in blocks],
        "evidence features": lambda: [block_features(block) for _, block in blocks],
        "serialised messages": lambda: [[serialise(h.messages[p]) for p in block.positions] for h, block in blocks],
        "hash encoder (256)": lambda: [encoder.encode([text]) for text in texts],
    }
    if count is not None:
        timed["o200k token count"] = lambda: [sum(count(serialise(h.messages[p])) for p in block.positions)
                                              for h, block in blocks]
    return timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RUNS)])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    existing = [p for p in args.paths if Path(p).exists()]
    runs = load_runs(existing)[0][:args.runs] if existing else [load_run(EXAMPLE)]
    histories = [parse_history(run.messages) for run in runs]
    blocks = [(h, h.block(b)) for h in histories for b in range(len(h.spans))]
    texts = [block_text(block) for _, block in blocks]
    print(f"{len(runs)} runs, {len(blocks)} blocks, {statistics.mean(map(len, texts)):.0f} characters of text a block"
          " on average\n")
    print("| stage | CPU µs a block (median of runs) |")
    print("|---|---|")
    for name, run_stage in stages(blocks, texts).items():
        seconds = []
        for _ in range(args.repeats):
            started = time.process_time()
            run_stage()
            seconds.append(time.process_time() - started)
        print(f"| {name} | {statistics.median(seconds) / len(blocks) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
