"""Paired retention of cheaper encoders against the reference MiniLM: each candidate's embeddings choose the kept
blocks, the reference's measure them (so Top-3 is always the reference's three nearest blocks to the next action).

    python -m bench.encoder_retention PATH... [--candidates minilm-static,hash] [--reference minilm-torch]
        [--cache-dir DIR]

`gem replay` measures each encoder in its own geometry; this asks the question the encoder swap poses: do the
blocks a cheaper encoder keeps hold the evidence the reference finds? Same runs, checkpoints and seed for every
encoder (`gemkernels.evaluate.replay.prepare`, cached embeddings); rows: GEM at exactly K=16 and GEM as deployed
(tau 0.9, capacity 16), pooled checkpoint means.
"""

from __future__ import annotations

import argparse
import sys
import zlib

import numpy as np

from gemkernels.compress.encoders import make_encoder
from gemkernels.compress.encoders.cache import DEFAULT_CACHE_DIR, EmbeddingCache
from gemkernels.compress.evidence import block_features
from gemkernels.compress.representation import block_text
from gemkernels.evaluate.replay import RunJob, load_long_runs, prepare
from gemkernels.evaluate.retention import METRICS, Targets, action_references, block_words, referenced_blocks
from gemkernels.evaluate.selectors import SELECTORS, View, natural_budget

SHOWN = ("top3", "referenced", "action", "goal", "coverage", "retained")


def paired_rows(reference: RunJob, candidate: RunJob, k: int, tau: float, seed: int) -> list[tuple[str, np.ndarray]]:
    """(selection, METRICS values) at each checkpoint: kept by ``candidate``'s embeddings, measured by the
    reference's."""
    features = tuple(block_features(b) for b in reference.blocks)
    texts = [block_text(b, sys.maxsize) for b in reference.blocks]
    words = [block_words(t) for t in texts]
    rows = []
    for c, t in enumerate(reference.checkpoints):
        goals = [job.goals[c] if np.isfinite(job.goals[c]).all() else None for job in (reference, candidate)]
        refs = referenced_blocks(action_references(reference.blocks[t]), texts[:t], words[:t])
        targets = Targets.build(reference.embeddings[:t], reference.actions[c], reference.embeddings[-1], goals[0],
                                refs)
        view = View(candidate.embeddings[:t], features[:t], goals[1],
                    seed=(seed, zlib.crc32(reference.name.encode()), t))
        if k < t:
            rows.append((f"GEM, K={k}", targets.measure(SELECTORS["gem"](view, k))))
        rows.append((f"GEM deployed, tau={tau}", targets.measure(natural_budget(view, tau, k))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--reference", default="minilm-torch")
    parser.add_argument("--candidates", default="minilm-static,hash")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--tau", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-runs", type=int)
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    args = parser.parse_args(argv)
    runs = load_long_runs(args.paths, 16, "bench.encoder_retention")[:args.max_runs]
    names = [args.reference, *args.candidates.split(",")]
    jobs = {name: prepare(runs, EmbeddingCache(make_encoder(name, cached=False), args.cache_dir), 16, progress=False)
            for name in names}
    columns = [METRICS.index(m) for m in SHOWN]
    print(f"{len(jobs[args.reference])} runs, {sum(len(j.checkpoints) for j in jobs[args.reference])} checkpoints; "
          f"kept by the encoder, measured by {args.reference} (pooled checkpoint means)\n")
    print("| selection | encoder | " + " | ".join(SHOWN) + " |\n|" + "---|" * (len(SHOWN) + 2))
    rows = {name: [row for ref, cand in zip(jobs[args.reference], jobs[name])
                   for row in paired_rows(ref, cand, args.k, args.tau, args.seed)] for name in names}
    for selection in (f"GEM, K={args.k}", f"GEM deployed, tau={args.tau}"):
        for name in names:
            values = np.array([v for s, v in rows[name] if s == selection])
            means = np.nanmean(values[:, columns], axis=0)
            print(f"| {selection} | {name} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
